"""Issue 38 item 2 for the families read through transformers' class table (format
``derived``): ``--repair`` pads their MLP / expert widths (GPT-2's transposed Conv1D, biases
with zeros, fused gate_up, expert banks), finds the config.json key that records each padded
width by building the family's own class on the meta device
(gac_check/padding/class_proof.py), and writes only for the types PROVEN lists.

The proof is tests/test_repair_families.py's: OUT loads strictly with
``AutoModelForCausalLM.from_pretrained`` and its fp32 logits equal the input's (max abs
<= 1e-5: zero rows and columns add exact zeros; only the wider GEMM's summation order moves).
The sweep over every PROVEN type, these included, is that file's slow tier.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gac_check.checkpoint.index import open_checkpoint
from gac_check.contract.select import for_hardware
from gac_check.errors import BadInput
from gac_check.formats.reading import read_sites
from gac_check.padding.class_proof import prove_on_class
from gac_check.padding.families import PROVEN
from gac_check.padding.plan import ConfigEdit, plan
from tests import family_models
from tests.helpers import gac
from tests.test_repair_families import _assert_exact

#: one of each layout the table reads: Conv1D (transposed), GPT-NeoX, Falcon, StarCoder2's
#: biases, an MoE with indexed experts (OLMoE) and one with fused expert banks (Granite-MoE)
REPRESENTATIVE = ("gpt2", "gpt_neox", "falcon", "starcoder2", "olmoe", "granitemoe")


@pytest.mark.parametrize("model_type", REPRESENTATIVE)
def test_table_read_family_is_repaired_exactly_in_its_own_class(tmp_path: Path,
                                                                model_type: str) -> None:
    _assert_exact(model_type, tmp_path)


def test_the_representatives_are_read_through_the_table_and_proven() -> None:
    assert set(REPRESENTATIVE) <= PROVEN


def _saved(model_type: str, root: Path) -> Path:
    family_models.build(model_type).save_pretrained(root / "in")
    return root / "in"


def test_the_config_key_is_found_from_the_class_not_a_list(tmp_path: Path) -> None:
    """A plan that records no config key for GPT-2's padded MLP: the class built on the meta
    device from each candidate says the width is ``n_inner`` (the class's own key)."""
    ckpt = open_checkpoint(_saved("gpt2", tmp_path))
    fmt, sites, _ = read_sites(ckpt)
    assert fmt.name == "derived"
    bare = plan(sites, for_hardware("h100", "bfloat16"), shapes=ckpt.shapes)  # no config
    assert bare.repairs and not bare.config_edits
    proven = prove_on_class(bare, ckpt)
    assert proven.config_edits == [ConfigEdit(("n_inner",), None, 173, 176)]


def test_a_padded_width_no_config_key_builds_is_refused_in_one_line(tmp_path: Path) -> None:
    """GPT-NeoX with config.json's intermediate_size removed: its class would build its
    default width, not the padded one, so --repair refuses naming the tensor, writes nothing."""
    src = _saved("gpt_neox", tmp_path)
    config = json.loads((src / "config.json").read_text())
    del config["intermediate_size"]
    (src / "config.json").write_text(json.dumps(config))
    run = gac(src, "--gpu", "h100", "--repair", tmp_path / "out")
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no config.json key that holds the padded width" in lines[0]
    assert "dense_4h_to_h.weight would be (64, 24576)" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_a_layer_count_beyond_the_tensors_is_not_built(tmp_path: Path) -> None:
    """The class is built from config.json only at counts the tensors show."""
    ckpt = open_checkpoint(_saved("gpt_neox", tmp_path))
    _, sites, _ = read_sites(ckpt)
    repair_plan = plan(sites, for_hardware("h100", "bfloat16"), shapes=ckpt.shapes,
                       config=ckpt.config)
    ckpt.config["num_hidden_layers"] = 50  # beyond the 2 the tensors hold
    with pytest.raises(BadInput, match="num_hidden_layers=50 is more than"):
        prove_on_class(repair_plan, ckpt)


def test_a_norm_over_the_mlp_width_is_refused_as_inexact(tmp_path: Path) -> None:
    """BitNet normalises its MLP's intermediate activations (``ffn_sub_norm``): zeros in the
    padded units would change that norm's statistics, so the site is refused with why."""
    ckpt = open_checkpoint(_saved("bitnet", tmp_path))
    fmt, sites, _ = read_sites(ckpt)
    assert fmt.name == "derived"
    repair_plan = plan(sites, for_hardware("h100", "bfloat16"), shapes=ckpt.shapes,
                       config=ckpt.config)
    reasons = {r.site.name: r.reason for r in repair_plan.refused}
    mlp = [n for n in reasons if n.endswith(":intermediate")]
    assert mlp and "ffn_sub_norm.weight normalises over this width" in reasons[mlp[0]], reasons
    assert not any(r.site.name.endswith(":intermediate") for r in repair_plan.repairs)


def _zoo_logits(path: Path):
    import torch

    model = family_models.load(path)
    if hasattr(model, "set_default_language"):  # X-MOD runs one language's adapters
        model.set_default_language(model.config.languages[0])
    with torch.no_grad():
        ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 64], [4, 4, 100, 8, 0, 17, 3, 127]])
        return model(ids, use_cache=False).logits  # a hybrid's cache needs attention layers


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(family_models.ZOO_BUILT))
def test_zoo_built_family_is_repaired_exactly_in_its_own_class(tmp_path: Path,
                                                               model_type: str) -> None:
    """PROVEN types tests/family_models.py does not build: the zoo's tiny mlp173 build
    (gac_check/testing/zoo.py), repaired by the CLI, OUT strict with equal fp32 logits."""
    from gac_check.testing.zoo import build_tiny

    build_tiny(model_type, "mlp173", tmp_path / "in")
    run = gac(tmp_path / "in", "--gpu", "h100", "--dtype", "bfloat16", "--repair",
              tmp_path / "out")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "176" in (tmp_path / "out" / "config.json").read_text()
    diff = (_zoo_logits(tmp_path / "out") - _zoo_logits(tmp_path / "in")).abs().max().item()
    assert diff <= 1e-5, f"{model_type}: logits differ by {diff}"
