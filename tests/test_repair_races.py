"""A shard another process replaces or rewrites while ``--repair`` runs (a pipeline's own
download or compression step still writing) is refused in one line, exit 2, nothing written.

The writer reads each shard's header a second time, for what it copies: that read used to be
unbounded and unchecked, so a shard replaced by one whose header is not JSON ended in an
internal error (exit 3); and a shard replaced by a valid but different file was copied, half
old plan, half new bytes. The races are made deterministic here: the replacement happens at a
known point (after the check; after the first tensor is copied), not after a sleep.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from safetensors.torch import save_file

from gac_check.analysis import check
from gac_check.checkpoint.index import open_checkpoint
from gac_check.errors import BadInput
from gac_check.padding.plan import plan
from gac_check.padding.write import CHANGED, Progress, apply
from tests import helpers


def _checked(tmp_path: Path):
    """A misaligned tiny Llama on disk, checked: its checkpoint and a repair plan for it."""
    root = tmp_path / "model"
    helpers.tiny_llama(intermediate_size=170).save_pretrained(root)
    ckpt = open_checkpoint(root)
    before = check(ckpt, "gpu")
    return root, ckpt, plan(before.sites, before.contract, shapes=ckpt.shapes,
                            config=ckpt.config)


def _replace(path: Path, data: bytes) -> None:
    """Swap ``path`` for a file holding ``data`` the way a writer does: by rename."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_a_shard_replaced_by_a_broken_one_after_the_check_is_one_line(tmp_path: Path) -> None:
    root, ckpt, repair_plan = _checked(tmp_path)
    _replace(root / "model.safetensors", struct.pack("<Q", 10) + b'{"w": {"dt')
    with pytest.raises(BadInput, match="header is not valid JSON"):
        apply(repair_plan, ckpt, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()


def test_a_shard_replaced_by_another_valid_one_is_not_copied(tmp_path: Path) -> None:
    root, ckpt, repair_plan = _checked(tmp_path)
    other = tmp_path / "other.safetensors"
    state = {k: v.contiguous() for k, v in
             helpers.tiny_llama(seed=1, intermediate_size=171).state_dict().items()}
    save_file(state, other, metadata={"format": "pt"})
    _replace(root / "model.safetensors", other.read_bytes())
    with pytest.raises(BadInput, match=CHANGED):
        apply(repair_plan, ckpt, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()


class _SwapOnFirstTensor(Progress):
    """Progress that, after the first tensor is copied, rewrites the shard with the same bytes
    by rename: the names and shapes stay true, only the file is another one."""

    def __init__(self, shard: Path) -> None:
        super().__init__(1, after=float("inf"))
        self.shard, self.swapped = shard, False

    def advance(self, nbytes: int, what: str) -> None:
        if not self.swapped:
            self.swapped = True
            _replace(self.shard, self.shard.read_bytes())
        super().advance(nbytes, what)


def test_a_shard_replaced_during_the_copy_is_refused(tmp_path: Path) -> None:
    root, ckpt, repair_plan = _checked(tmp_path)
    progress = _SwapOnFirstTensor(root / "model.safetensors")
    with pytest.raises(BadInput, match=CHANGED):
        apply(repair_plan, ckpt, tmp_path / "out", progress=progress, show_progress=False)
    assert progress.swapped and not (tmp_path / "out").exists()
