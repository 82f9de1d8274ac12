"""A target's "not modelled" notes are those that apply to the model's own layout, scheme and
targets, each once and short, the rest one line pointing to docs/targets.md (issue 39: every
``--target vllm`` run printed about fifteen paragraphs, most about schemes and layouts the
model did not have). Real tiny models, real CLI.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from gac_check.targets.packs import PACKS_DIR, PackError, parse_pack
from gac_check.testing.models import build
from tests import helpers, per_layer_models
from tests import quantized_models as qm

POINTER = 'docs/targets.md, "Not modelled yet"'


def screen_rows(text: str, columns: int = 100) -> int:
    """The rows ``text`` takes on a terminal ``columns`` wide (long lines wrap)."""
    return sum(max(1, math.ceil(len(line) / columns)) for line in text.splitlines())


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    model = build("llama", {**qm.BASE, "intermediate_size": 688}, dtype=torch.bfloat16)
    return helpers.save_pretrained(model, tmp_path_factory.mktemp("bf16") / "llama")


@pytest.mark.parametrize("target", ["vllm", "vllm,tp=2"])
def test_a_dense_bf16_models_vllm_output_fits_on_one_screen(bf16, target):
    run = helpers.gac(bf16, "--gpu", "h100", "--target", target)
    assert run.returncode in (0, 1), run.stderr
    assert screen_rows(run.stdout) <= 40, run.stdout
    assert POINTER in run.stdout
    for other in ("Mixture of experts", "MXFP4", "MLA", "fp8_block", "AWQ"):
        assert other not in run.stdout.split("not modelled by")[1], run.stdout


def test_a_note_is_printed_where_its_scheme_or_layout_applies(bf16, tmp_path):
    """sglang's vocabulary-padding note is about tp > 1; vLLM's fp8_block note about a
    block-FP8 checkpoint: each printed once, there and only there."""
    one = helpers.gac(bf16, "--gpu", "h100", "--target", "sglang").stdout
    two = helpers.gac(bf16, "--gpu", "h100", "--target", "sglang,tp=2",
                      "--target", "sglang,tp=4").stdout
    assert "Vocabulary: from v0.5.23" not in one
    assert two.count("Vocabulary: from v0.5.23") == 1, two
    fp8 = qm.block_fp8(tmp_path / "fp8", 688)
    text = helpers.gac(fp8, "--gpu", "h100", "--target", "vllm").stdout
    assert text.count("fp8_block is judged for loading only") == 1, text
    assert "Mixture of experts" not in text and "MoE read" not in text


def test_the_per_layer_note_is_printed_for_a_per_layer_model_only(bf16, tmp_path):
    """vLLM's per-layer note: a model whose MLP widths differ by layer, not a uniform one
    (whose query and key/value head counts differ: not a per-layer width)."""
    note = "Per-layer widths: refused for the native model classes"
    root = per_layer_models.write_per_layer(tmp_path / "per_layer")
    varied = helpers.gac(root, "--gpu", "h100", "--target", "vllm").stdout
    uniform = helpers.gac(bf16, "--gpu", "h100", "--target", "vllm").stdout
    assert varied.count(note) == 1, varied
    assert note not in uniform


def test_the_moe_notes_are_printed_for_a_mixture_of_experts_only(bf16, tmp_path):
    """A real Mixtral (transformers' own class, saved): vLLM's MoE note, short, once."""
    import transformers

    cfg = transformers.MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     num_key_value_heads=1, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    root = helpers.save_pretrained(transformers.MixtralForCausalLM(cfg).eval(),
                                   tmp_path / "mixtral")
    moe = helpers.gac(root, "--gpu", "h100", "--target", "vllm").stdout
    dense = helpers.gac(bf16, "--gpu", "h100", "--target", "vllm").stdout
    assert moe.count("MoE read at v0.33.0 only") == 1, moe
    assert "MoE read at v0.33.0 only" not in dense


def test_a_note_scope_that_starts_no_note_is_refused():
    raw = json.loads((PACKS_DIR / "vllm.json").read_text())
    raw["note_scope"].append({"starts": "A note nobody wrote", "applies": ["moe"]})
    with pytest.raises(PackError, match="starts no note"):
        parse_pack(raw, "vllm")
    raw["note_scope"][-1] = {"starts": raw["notes"][0][:30], "applies": ["tensor_cores"]}
    with pytest.raises(PackError, match="is not one of"):
        parse_pack(raw, "vllm")
