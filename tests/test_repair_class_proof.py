"""Issue 38's repair goal on the zoo types the class proof (gac_check/padding/class_proof.py)
refused falsely: it must read OUT's config.json as ``from_pretrained`` reads it and bound the
class's counts as its config class reads them, or a family whose MLP pads exactly is refused.

Each test builds the zoo's tiny MLP-173 build (gac_check/testing/zoo.py) and holds the repair
plan to the family's own class on the meta device; the logits of every type named here are
proven (OUT strict in its own class, fp32 max abs <= 1e-5) in the slow tier of
tests/test_repair_derived.py (``family_models.ZOO_BUILT``).
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
from gac_check.padding.plan import ConfigEdit, RepairPlan, plan
from gac_check.testing.zoo import build_tiny


def _planned(model_type: str, root: Path, **config: object):
    """The zoo's MLP-173 build of ``model_type`` (config.json keys overridden), opened, and
    its repair plan before the class proof."""
    build_tiny(model_type, "mlp173", root)
    if config:
        path = root / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    ckpt = open_checkpoint(root)
    _, sites, _ = read_sites(ckpt)
    return ckpt, plan(sites, for_hardware("h100", "bfloat16"), shapes=ckpt.shapes,
                      config=ckpt.config)


def _moves(repair_plan: RepairPlan) -> set[tuple[str, int, int]]:
    return {(e.path[-1], e.old, e.new) for e in repair_plan.config_edits}


@pytest.mark.parametrize("model_type", ["bamba", "nemotron_h"])
def test_a_mamba2_hybrids_infinity_is_read_as_from_pretrained_reads_it(
        tmp_path: Path, model_type: str) -> None:
    """transformers writes the mixers' ``time_step_limit`` (0, inf) as
    ``{"__float__": "Infinity"}``; handed to the strict config class as it stands, every
    candidate config failed and the MLP width was refused."""
    ckpt, repair_plan = _planned(model_type, tmp_path)
    assert "__float__" in (tmp_path / "config.json").read_text()
    proven = prove_on_class(repair_plan, ckpt)
    assert ("intermediate_size", 173, 176) in _moves(proven), proven.config_edits


def test_a_shared_layer_depth_is_no_count_of_tensors(tmp_path: Path) -> None:
    """ALBERT shares one layer group across num_hidden_layers=2: one layer of tensors is all
    its class builds, at any depth."""
    ckpt, repair_plan = _planned("albert", tmp_path)
    assert ckpt.config["num_hidden_layers"] == 2
    proven = prove_on_class(repair_plan, ckpt)
    assert proven.config_edits == [ConfigEdit(("intermediate_size",), None, 173, 176)]


def test_a_count_building_no_module_is_no_count_of_tensors(tmp_path: Path) -> None:
    """Doge's default num_experts=16384 builds no expert unless is_moe."""
    ckpt, repair_plan = _planned("doge", tmp_path)
    assert ckpt.config["num_experts"] == 16384 and not ckpt.config["is_moe"]
    assert ("intermediate_size", 173, 176) in _moves(prove_on_class(repair_plan, ckpt))


def test_a_count_is_bounded_as_its_config_class_reads_it(tmp_path: Path) -> None:
    """Dory's config.json counts attention and MLP sub-layers (num_hidden_layers=4 over 2
    layers of tensors); DoryConfig halves it, so the class builds 2."""
    ckpt, repair_plan = _planned("dory", tmp_path)
    assert ckpt.config["num_hidden_layers"] == 4
    assert ("intermediate_size", 173, 176) in _moves(prove_on_class(repair_plan, ckpt))


def test_a_huge_count_is_refused_before_any_class_reads_it(tmp_path: Path) -> None:
    """Shared layers build nothing per layer, but their config class is not even read at a
    count beyond any real model (it may make a list per layer)."""
    ckpt, repair_plan = _planned("albert", tmp_path, num_hidden_layers=1 << 21)
    with pytest.raises(BadInput, match="num_hidden_layers=2097152 is more than"):
        prove_on_class(repair_plan, ckpt)


@pytest.mark.parametrize("model_type", ["gptj", "codegen"])
def test_the_zoo_builds_rope_inside_the_heads(tmp_path: Path, model_type: str) -> None:
    """GPT-J's and CodeGen's default rotary_dim (64) is wider than the zoo's head_dim (16),
    so their tiny builds did not run and their repair could not be proven."""
    import torch
    from transformers import AutoModelForCausalLM

    build_tiny(model_type, "mlp173", tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 3]])).logits
    assert logits.shape == (1, 4, 512)


def test_biogpt_zoo_build_records_its_mlp_under_its_own_key(tmp_path: Path) -> None:
    """The zoo's BioGPT is read through OPT's fc1 / fc2 layout, whose key is ffn_dim; BioGPT
    records the width as intermediate_size (padding/families.py WIDTH_KEYS), so the MLP was
    left unpadded. Now OUT loads strictly in BioGptForCausalLM with the input's logits."""
    import torch

    from tests import family_models
    from tests.helpers import gac

    build_tiny("biogpt", "mlp173", tmp_path / "in")
    run = gac(tmp_path / "in", "--gpu", "h100", "--dtype", "bfloat16", "--repair",
              tmp_path / "out")
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())["intermediate_size"] == 176
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 64]])
    with torch.no_grad():
        logits = [family_models.load(tmp_path / d)(ids).logits for d in ("in", "out")]
    assert (logits[1] - logits[0]).abs().max().item() <= 1e-5


def test_a_bias_under_a_prefix_named_norm_is_no_norm(tmp_path: Path) -> None:
    """Every tensor of RoBERTa-PreLayerNorm sits under ``roberta_prelayernorm.``: its MLP's
    ``intermediate.dense.bias`` was taken for a norm over the MLP width by that prefix, and
    the width refused as inexact; it is the bias it is, padded with zeros."""
    ckpt, repair_plan = _planned("roberta-prelayernorm", tmp_path)
    assert not repair_plan.refused, [r.reason for r in repair_plan.refused]
    padded = {r.site.name for r in repair_plan.repairs}
    assert "roberta_prelayernorm.encoder.layer.0.intermediate:intermediate" in padded, padded
    assert ("intermediate_size", 173, 176) in _moves(prove_on_class(repair_plan, ckpt))
