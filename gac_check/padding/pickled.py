"""Repairing a torch pickle in its own layout: what the padded tensors and pickled integers
become, handed to :mod:`gac_check.checkpoint.torchzip_write`.

Users load these files with their compressor's own call (``torch.load(path,
weights_only=False)['model']`` for LLM-Pruner and SVD-LLM, ``load_state_dict(torch.load(
'<name>.pt'))`` for SliceGPT), so OUT keeps the file names, the container and the object
inside: a pickled model stays a pickled model whose padded modules say their new sizes
(``nn.Linear.in_features``/``out_features``, an MLP's ``intermediate_size``, a low-rank
module's rank) wherever they recorded the old ones.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.pickled.torchzip import DTYPE_ITEMSIZE
from gac_check.checkpoint.torchzip_write import (
    ArchiveRewrite,
    IntEdit,
    plan_rewrite,
    write_archive,
)
from gac_check.padding.plan import RepairPlan
from gac_check.sites import Role

#: Attributes a module keeps per axis of its weight (nn.Linear's [out, in], nn.Embedding's).
WEIGHT_ATTRIBUTES = (("out_features", 0), ("in_features", 1),
                     ("num_embeddings", 0), ("embedding_dim", 1))
#: Attributes that record a site's size on the module the site names.
ROLE_ATTRIBUTES = {Role.INTERMEDIATE: ("intermediate_size",),
                   Role.RANK: ("rank", "low_rank", "truncation_rank"),
                   Role.HEAD_DIM: ("head_dim", "attention_head_size")}
PICKLE_INDEX = "pytorch_model.bin.index.json"


@dataclass
class PickledRepair:
    """A checked plan for rewriting every torch zip file of a checkpoint in place."""

    ckpt: Checkpoint
    plan: RepairPlan
    archives: list[ArchiveRewrite]

    def write(self, tmp: Path, progress: Callable[[int, str], None]) -> list[str]:
        """Write every file under its own name into ``tmp`` (and the shard index, if any)."""
        files = []
        for rw in self.archives:
            write_archive(rw, tmp / rw.src.name, self._padded_bytes, progress)
            files.append(rw.src.name)
        index = self.ckpt.path / PICKLE_INDEX
        if index.exists():
            data = json.loads(index.read_text(encoding="utf-8"))
            meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
            data["metadata"] = {**meta, "total_size": self.total_bytes()}
            (tmp / PICKLE_INDEX).write_text(json.dumps(data, indent=2) + "\n")
            files.append(PICKLE_INDEX)
        return files

    def _padded_bytes(self, name: str) -> memoryview:
        import torch

        from gac_check.checkpoint.tensors import read_tensor

        tensor = self.plan.edits[name].apply(read_tensor(self.ckpt.tensors[name]))
        return memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())

    def total_bytes(self) -> int:
        total = 0
        for rw in self.archives:
            for name, shape in rw.shapes.items():
                n = DTYPE_ITEMSIZE[self.ckpt.tensors[name].dtype]
                for d in shape:
                    n *= d
                total += n
        return total

    @property
    def note(self) -> str:
        """One line on what changed inside the pickle besides the tensors."""
        applied = [e for rw in self.archives for e in rw.applied]
        kinds = Counter(str(e.path[-1] if isinstance(e.path[-1], str) else e.path[-2])
                        for e in applied)
        attrs = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none recorded sizes"
        return (f"the torch pickle was rewritten in its own layout (same files, same objects, "
                f"never unpickled): {len(self.plan.edits)} tensors padded; pickled attributes "
                f"updated: {attrs}")


def prepare_pickled(repair_plan: RepairPlan, ckpt: Checkpoint) -> PickledRepair:
    """Plan the rewrite of every file; refuses (BadInput, nothing written) where the pickle
    cannot be edited in place."""
    new_shapes = {name: edit.new_shape for name, edit in repair_plan.edits.items()}
    archives = plan_rewrite(ckpt, new_shapes, int_edits(repair_plan))
    return PickledRepair(ckpt, repair_plan, archives)


def int_edits(repair_plan: RepairPlan) -> list[IntEdit]:
    """Every pickled integer that may record a padded size, each applied only where it holds
    exactly the old size."""
    edits = []
    for name, edit in repair_plan.edits.items():
        module, _, leaf = name.rpartition(".")
        if leaf != "weight" or len(edit.shape) != 2:
            continue
        for attr, axis in WEIGHT_ATTRIBUTES:
            if edit.shape[axis] != edit.new_shape[axis]:
                edits.append(IntEdit(module, (attr,), edit.shape[axis], edit.new_shape[axis]))
    for rep in repair_plan.repairs:
        site = rep.site
        for attr in ROLE_ATTRIBUTES.get(site.role, ()):
            edits.append(IntEdit(site.module, (attr,), site.value, rep.target))
        group = site.attrs.get("group")
        if site.role is Role.KV_LATENT and isinstance(group, int):
            edits.append(IntEdit(site.module, ("ranks", group), site.value, rep.target))
    for ce in repair_plan.config_edits:  # config.json agreed: the pickled config follows it
        path = ("config", *ce.path, *(() if ce.index is None else (ce.index,)))
        edits.append(IntEdit("", path, ce.old, ce.new))
    return edits
