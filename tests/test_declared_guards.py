"""config.json's attention sizes held to a real grouped-query Llama's tensors
(gac_check/formats/declared.py): an explicit head_dim must split k's width into whole heads as
well as q's, and every value the tensors refute is reported whether or not the other values
agree (a lie beside a lie is still a note, each naming both values). Seen red under the
mutants named in issue 42's report."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gac_check.analysis import check
from gac_check.sites import Role
from tests import helpers

#: tests.helpers' Llama with grouped-query attention: 4 heads of 16 (q 64 wide), 2 KV heads
#: (k 32 wide), hidden 64
HEAD_DIM_LIE = "the config says head_dim={}, tensors have q/k/v widths 64/32/32, not whole heads"
HIDDEN_LIE = "the config says hidden_size=96, tensors have 64"
FROM_TENSORS = ("head_dim from the tensors' attention width 64 / num_attention_heads=4, not "
                "from the config's hidden_size=96")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gqa") / "model"
    helpers.tiny_llama(num_key_value_heads=2).save_pretrained(root)
    return root


def _checked(saved: Path, tmp_path: Path, edits: dict) -> tuple[set[int], str]:
    """The head_dim sites and every note of ``saved`` with config.json edited (a key edited
    to None dropped)."""
    root = tmp_path / "model"
    root.mkdir()
    shutil.copy(saved / "model.safetensors", root / "model.safetensors")
    config = {**json.loads((saved / "config.json").read_text()), **edits}
    config = {k: v for k, v in config.items() if v is not None}
    (root / "config.json").write_text(json.dumps(config))
    result = check(root, "gpu")
    return ({s.value for s in result.sites if s.role is Role.HEAD_DIM},
            " | ".join(n for s in result.sites for n in s.notes))


@pytest.mark.parametrize("head_dim", [64, 32 + 16])
def test_an_explicit_head_dim_must_split_k_as_well_as_q(saved, tmp_path, head_dim):
    """head_dim=64 splits q (64) into one head but k (32) into none; 48 splits neither: both
    are refuted by the tensors, noted, and head_dim is 16 as the tensors say."""
    dims, notes = _checked(saved, tmp_path, {"head_dim": head_dim})
    assert dims == {16}
    assert HEAD_DIM_LIE.format(head_dim) in notes, notes


@pytest.mark.parametrize("head_dim, hidden, says", [
    (24, 64, [HEAD_DIM_LIE.format(24)]),
    (24, 96, [HEAD_DIM_LIE.format(24), HIDDEN_LIE, FROM_TENSORS]),
    (None, 96, [HIDDEN_LIE, FROM_TENSORS]),
    (16, 96, [HIDDEN_LIE]),
    (16, 64, []),
])
def test_each_refuted_value_is_reported_whatever_the_others_say(saved, tmp_path, head_dim,
                                                                hidden, says):
    """head_dim 24 (no whole heads) and hidden_size 96 (the tensors have 64), alone and
    together: each lie is a note whether the other field agrees or lies too; the true
    values (16, 64) none; without head_dim, hidden_size's lie is noted as well."""
    dims, notes = _checked(saved, tmp_path, {"head_dim": head_dim, "hidden_size": hidden})
    assert dims == {16}
    for note in says:
        assert note in notes, (note, notes)
    for lie in {HEAD_DIM_LIE.format(24), HIDDEN_LIE, FROM_TENSORS} - set(says):
        assert lie not in notes, (lie, notes)


def test_an_explicit_head_dim_must_split_v_as_well(saved, tmp_path):
    """head_dim=16 splits q (64) and k (32) into whole heads; a v 24 wide it does not: the
    config is refuted by v alone (it used to be checked against q and k only)."""
    from safetensors.torch import load_file, save_file

    root = tmp_path / "v24"
    root.mkdir()
    shutil.copy(saved / "config.json", root / "config.json")
    weights = load_file(saved / "model.safetensors")
    for i in (0, 1):
        weights[f"model.layers.{i}.self_attn.v_proj.weight"] = torch.zeros(24, 64)
    save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "head_dim": 16}))
    notes = " | ".join(n for s in check(root, "gpu").sites for n in s.notes)
    assert "tensors have q/k/v widths 64/32/24, not whole heads" in notes, notes
