"""The accounting's classes at their edges (gac_check/formats/accounting.py): the classes are
tried in order (a tensor some site reads is in sites even where a layout also recorded it; one
a layout recorded is auxiliary even where it looks like a kind with no dimension), and a kind
with no dimension is that kind only at its rank and dtype (a 2-D ``inv_freq`` or a float
``position_ids`` is a tensor nobody read: refused). Each seen red under its mutant.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from gac_check.analysis import check
from gac_check.checkpoint.index import open_checkpoint
from gac_check.errors import BadInput
from tests import helpers

ROTARY = "model.layers.0.self_attn.rotary_emb.inv_freq"
POSITIONS = "model.position_ids"


def _llama(tmp_path: Path, extra: dict[str, torch.Tensor]) -> Path:
    """A tiny transformers Llama saved by save_pretrained, then re-saved with ``extra``."""
    model = helpers.tiny_llama()
    root = tmp_path / "model"
    model.save_pretrained(root)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file({**state, **extra}, root / "model.safetensors", metadata={"format": "pt"})
    return root


@pytest.mark.parametrize("name, tensor, kind", [
    (ROTARY, torch.ones(8), "rotary"),
    (POSITIONS, torch.arange(16).unsqueeze(0), "index buffer"),
    (POSITIONS, torch.arange(16, dtype=torch.int32).unsqueeze(0), "index buffer"),
])
def test_a_kind_with_no_dimension_is_read_at_its_rank_and_dtype(tmp_path, name, tensor, kind):
    books = check(open_checkpoint(_llama(tmp_path, {name: tensor})), "gpu").accounting
    assert (books.classes[name], books.kinds[name]) == ("no_dimension", kind)


@pytest.mark.parametrize("name, tensor", [
    (ROTARY, torch.ones(2, 8)),  # a matrix named like rotary frequencies
    (ROTARY, torch.ones(())),
    (POSITIONS, torch.arange(16).unsqueeze(0).float()),  # float weights named like indices
    (POSITIONS, torch.arange(16).unsqueeze(0).half()),
])
def test_the_same_name_at_another_rank_or_dtype_is_refused(tmp_path, name, tensor):
    with pytest.raises(BadInput, match=rf"1 tensor gac-check did not read, first {name}"):
        check(open_checkpoint(_llama(tmp_path, {name: tensor})), "gpu")


def test_a_tensor_a_site_reads_is_in_sites_before_auxiliary(tmp_path):
    """A layout's reader may record a tensor as auxiliary that a site also reads: the site
    read its widths, so it is counted in sites (the first class that holds it)."""
    ckpt = open_checkpoint(_llama(tmp_path, {}))
    ckpt.auxiliary["model.layers.0.mlp.down_proj.weight"] = "recorded by a layout"
    books = check(ckpt, "gpu").accounting
    assert books.classes["model.layers.0.mlp.down_proj.weight"] == "in_sites"
    assert books.tensors.auxiliary == 0


def test_a_tensor_a_layout_recorded_is_auxiliary_before_no_dimension(tmp_path):
    """An ``inv_freq`` a layout's reader recorded is auxiliary (what the reader said), not
    a rotary buffer: the reader's word comes before the kinds with no dimension."""
    ckpt = open_checkpoint(_llama(tmp_path, {ROTARY: torch.ones(8)}))
    ckpt.auxiliary[ROTARY] = "recorded by a layout"
    books = check(ckpt, "gpu").accounting
    assert books.classes[ROTARY] == "auxiliary" and ROTARY not in books.kinds
    assert (books.tensors.auxiliary, books.tensors.no_dimension) == (1, 0)
