"""Issue 38 item 2: ``--repair`` writes a dense checkpoint only of a family whose repair is
proven in the family's own class, and that proof is here.

Each family in gac_check.padding.families.PROVEN is built tiny from its own transformers
config class with every MLP / expert width 173 (tests/family_models.py), saved with
save_pretrained (safetensors), repaired by the real CLI (``gac-check DIR --repair OUT``),
loaded strictly by ``AutoModelForCausalLM.from_pretrained(OUT)`` (no missing, unexpected or
mismatched key) and compared with the original's logits in fp32: a zero-padded gate/up row
and down column add act(0) * 0 = 0 to every output, so the only difference is the summation
order of the wider GEMM (max abs <= 1e-5 on logits of order 1). Every family in REFUSED is
refused in one line naming why, nothing written. The sweep over every causal-LM type
transformers ships (slow) holds the invariant that matters most: no ``--repair`` exits 0
with an OUT its own class cannot load, and the tables list every type it repairs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gac_check.padding.families import PROVEN
from tests import family_models
from tests.helpers import gac

#: proven on every run (the issue's bug reports); the rest of PROVEN in the slow tier
FAST = ("opt", "phi", "phi3", "cohere2_moe", "llama")
IDS = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 64], [4, 4, 100, 8, 0, 17, 3, 127]])
ATOL = 1e-5


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def _repaired(model_type: str, root: Path, **overrides: object):
    """(original model, OUT loaded strictly, OUT's config.json) after ``--repair``."""
    model = family_models.build(model_type, **overrides)
    model.save_pretrained(root / "in")
    run = gac(root / "in", "--gpu", "h100", "--repair", root / "out")
    assert run.returncode == 0, run.stdout + run.stderr
    config = json.loads((root / "out" / "config.json").read_text())
    return model, family_models.load(root / "out"), config


def _assert_exact(model_type: str, root: Path, **overrides: object) -> None:
    model, out, config = _repaired(model_type, root, **overrides)
    widths = {k: config[k] for k in family_models.WIDTH_KEYS if isinstance(config.get(k), int)}
    # padded and recorded (an MoE config's dense intermediate_size builds no tensor when
    # every layer has experts, so it may stay 173)
    assert any(w > 173 and w % 8 == 0 for w in widths.values()), widths
    diff = (_logits(out) - _logits(model)).abs().max().item()
    assert diff <= ATOL, f"{model_type}: logits differ by {diff}"


@pytest.mark.parametrize("model_type", FAST)
def test_repair_is_exact_in_the_familys_own_class(tmp_path: Path, model_type: str) -> None:
    _assert_exact(model_type, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(PROVEN - set(FAST) - {"bert"}
                                               - family_models.ZOO_BUILT
                                               - set(family_models.SAVED_AS.values())))
def test_repair_is_exact_in_every_proven_familys_own_class(tmp_path: Path,
                                                            model_type: str) -> None:
    """bert is proven as BertModel (suites/test_repair_equivalence.py): its causal-LM head
    class is not read by the check yet (issue 38 item 5, another branch)."""
    _assert_exact(model_type, tmp_path)


def test_cohere2_moe_experts_padded_in_config_json_too(tmp_path: Path) -> None:
    """The bug: experts padded 173 -> 176 with config.json's intermediate_size (Cohere2-MoE's
    expert width key) left at 173, so its class refused OUT; now the key is rewritten."""
    _, out, config = _repaired("cohere2_moe", tmp_path)
    assert config["intermediate_size"] == 176 and "moe_intermediate_size" not in config
    assert out.model.layers[0].mlp.experts.down_proj.shape[-1] == 176


def test_a_padded_width_config_json_does_not_record_is_refused(tmp_path: Path) -> None:
    """Qwen2-MoE's experts padded with no ``moe_intermediate_size`` in config.json: OUT's
    class would build the old width, so --repair refuses that site, names the key, and writes
    no expert wider than the input's."""
    family_models.build("qwen2_moe").save_pretrained(tmp_path / "in")
    path = tmp_path / "in" / "config.json"
    config = json.loads(path.read_text())
    del config["moe_intermediate_size"]
    path.write_text(json.dumps(config))
    run = gac(tmp_path / "in", "--gpu", "h100", "--repair", tmp_path / "out")
    assert "config.json has no moe_intermediate_size" in run.stdout + run.stderr
    from safetensors import safe_open

    out = tmp_path / "out" / "model.safetensors"
    if out.exists():  # the other sites may be repaired; the experts are not
        with safe_open(out, "pt") as f:
            assert f.get_slice("model.layers.0.mlp.experts.0.up_proj.weight").get_shape()[0] \
                == 173


def test_a_family_no_test_proves_is_refused_in_one_line(tmp_path: Path) -> None:
    """A Llama-named checkpoint whose config says another model_type: the layout is read,
    but that type's class is not proven to load OUT, so --repair refuses, writing nothing."""
    family_models.build("llama").save_pretrained(tmp_path / "in")
    path = tmp_path / "in" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "bitnet"}))
    run = gac(tmp_path / "in", "--gpu", "h100", "--repair", tmp_path / "out")
    assert run.returncode == 2, run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "model_type 'bitnet'; --repair refuses it" in lines[0], lines
    assert "no test builds it in its own class" in lines[0]
    assert not (tmp_path / "out").exists()


def test_an_unproven_familys_refusal_names_what_padding_could_not_make_exact(
        tmp_path: Path) -> None:
    """BitNet, built by its own class at MLP width 173: not proven, and its ``ffn_sub_norm``
    normalises the MLP width, so a proof would not bring an exact repair either; the one
    line says both, and nothing is written."""
    from gac_check.testing.zoo import build_tiny

    build_tiny("bitnet", "mlp173", tmp_path / "in")
    run = gac(tmp_path / "in", "--gpu", "h100", "--dtype", "bfloat16", "--repair",
              tmp_path / "out")
    assert run.returncode == 2, run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no test builds it in its own class" in lines[0], lines
    assert ("; and model.layers.0.mlp:intermediate = 173 could not be padded exactly anyway: "
            "model.layers.0.mlp.ffn_sub_norm.weight normalises over this width") in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_fast_families_are_proven() -> None:
    assert set(FAST) <= PROVEN


@pytest.mark.slow
def test_no_repair_exits_0_with_an_output_its_class_cannot_load(tmp_path: Path) -> None:
    """Every causal-LM type transformers ships, built tiny: each is repaired exactly, refused
    in one line (exit 2, nothing written), or not built at the tiny sizes; a repair that
    writes OUT (exit 0, or 1 for sites it refused) loads strictly in its own class with equal
    logits, and every PROVEN type that builds is repaired. MLA types (glm4_moe_lite, ...)
    are repaired under the ``mla`` format, not PROVEN's dense one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    repaired, built, wrong = set(), set(), []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        root = tmp_path / model_type
        try:
            model = family_models.build(model_type)
            before = _logits(model)
            model.save_pretrained(root / "in")
        except Exception:  # a family its defaults do not build (or run) tiny
            continue
        built.add(model_type)
        run = gac(root / "in", "--gpu", "h100", "--repair", root / "out")
        if run.returncode == 2:  # refused: one line, nothing written
            if len(run.stderr.strip().splitlines()) != 1 or (root / "out").exists():
                wrong.append((model_type, run.stderr[-300:]))
            continue
        try:  # 0 or 1 (the re-check's verdict): OUT was written, and must load
            diff = (_logits(family_models.load(root / "out")) - before).abs().max()
            assert diff <= ATOL, diff
        except Exception as err:  # the finding is what is reported
            wrong.append((model_type, repr(err)[:300]))
        repaired.add(model_type)
    assert not wrong, wrong
    # the table is not stale: every proven type that builds here is repaired (bert is
    # proven as BertModel; its causal-LM head class is not read yet)
    stale = (PROVEN - {"bert"}) & built - repaired
    assert not stale, sorted(stale)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma2"])
def test_a_rope_head_dim_is_refused_with_why_and_the_rest_repaired(tmp_path: Path,
                                                                   model_type: str) -> None:
    """head_dim 20 under RoPE cannot be zero-padded exactly (the rotary frequencies derive
    from head_dim): --repair names that, pads the MLPs anyway, and OUT loads strictly in its
    own class with the original's logits; the exit code is the re-check's (head_dim still
    misaligned)."""
    model = family_models.build(model_type, head_dim=20)
    model.save_pretrained(tmp_path / "in")
    run = gac(tmp_path / "in", "--gpu", "h100", "--dtype", "bfloat16", "--repair",
              tmp_path / "out")  # 20 x 2 bytes: no 16-byte multiple
    assert run.returncode in (0, 1), run.stdout + run.stderr
    assert "rotary frequencies" in run.stdout, run.stdout
    out = family_models.load(tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["head_dim"] == 20 and config["intermediate_size"] == 176
    diff = (_logits(out) - _logits(model)).abs().max().item()
    assert diff <= ATOL, diff


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3", "minicpm3", "youtu",
                                        "sarvam_mla"])
def test_latent_attention_families_repair_exactly_in_their_own_class(
        tmp_path: Path, model_type: str) -> None:
    """The MLA types (the ``mla`` format: DeepSeek's module names) at one KV head per query
    head, as their classes build: whatever --repair pads (the MLPs, v_head_dim), OUT loads
    strictly in the type's own class with the original's logits; the exit code is the
    re-check's (the latents and the q/k head are refused, with why)."""
    model = family_models.build(model_type, num_key_value_heads=4)
    model.save_pretrained(tmp_path / "in")
    run = gac(tmp_path / "in", "--gpu", "h100", "--repair", tmp_path / "out")
    assert run.returncode in (0, 1), run.stdout + run.stderr
    assert "padded" in run.stdout, run.stdout
    diff = (_logits(family_models.load(tmp_path / "out")) - _logits(model)).abs().max().item()
    assert diff <= ATOL, diff
