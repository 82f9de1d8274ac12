"""Exact zero-padding repair, the writer: stream a padded, loadable checkpoint to OUT.

The writer streams: a safetensors tensor, padded or not, is a list of source byte ranges and
zero runs (:meth:`~gac_check.padding.plan.TensorEdit.byte_pieces`) that go into the output file's
buffers (:class:`~gac_check.padding.sink.Sink`: aligned, written with O_DIRECT beside the
reading), so peak memory is those few buffers whatever the model's size; only a tensor that must
be rescaled, or one read from a torch zip archive, is materialised (about twice its size). OUT
appears all at once (:func:`gac_check.checkpoint.outdir.atomic_output_dir`) or not at all.
"""
from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gac_check.checkpoint.files import open_regular
from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.outdir import (
    atomic_output_dir,
    check_output_dir,
    copy_side_files,
    weight_file_names,
)
from gac_check.checkpoint.safetensors_header import header_length, index_header
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.contract.rules import Finding
from gac_check.errors import BadInput
from gac_check.padding.class_proof import prove_on_class
from gac_check.padding.completeness import require_complete
from gac_check.padding.pickled import prepare_pickled
from gac_check.padding.plan import ConfigEdit, RepairPlan, TensorEdit
from gac_check.padding.sink import Sink

#: The provenance file every repaired directory carries (what was padded, what was refused).
PROVENANCE = "gac-repair.json"
#: Zero padding is copied into the output from blocks of at most this size.
ZERO_BLOCK = 1 << 20


# ---------------------------------------------------------------------------------- applying
@dataclass
class RepairReport:
    """What a repair wrote: the plan, the output, and anything a user must know about it."""

    source: Path
    out: Path
    plan: RepairPlan
    container_in: str
    container_out: str
    files: list[str]
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: findings of the re-check of ``out`` (refused sites, and warnings a minimal repair keeps)
    remaining: list[Finding] = field(default_factory=list)
    #: values rewritten in JSON sidecars (SliceGPT's slicing config): file, field, index, from, to
    sidecar_changes: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "out": str(self.out),
            "strategy": self.plan.strategy,
            "hardware": {"profile": self.plan.profile, "dtype": self.plan.dtype},
            "container": {"in": self.container_in, "out": self.container_out},
            "repaired": [{"name": r.site.name, "role": r.site.role.value,
                          "from": r.site.value, "to": r.target,
                          "padding_params": r.padding_params} for r in self.plan.repairs],
            "refused": [{"name": r.site.name, "role": r.site.role.value, "value": r.site.value,
                         "would_be": r.target, "reason": r.reason} for r in self.plan.refused],
            "config_changes": [{"file": "config.json", "field": list(e.path), "index": e.index,
                                "from": e.old, "to": e.new} for e in self.plan.config_edits]
            + self.sidecar_changes,
            "padding_params": self.plan.padding_params,
            "params_before": self.plan.params,
            "repair_overhead_fraction": self.plan.overhead_fraction,
            "files": self.files,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "remaining": [{"name": f.site.name, "value": f.site.value, "severity": f.severity,
                           "rules": [r.id for r in f.rules]} for f in self.remaining],
        }


#: seconds a repair runs before it starts printing progress lines
PROGRESS_AFTER = 2.0


class Progress:
    """A line on stderr per step once a repair has run for a while (at most one a second)."""

    def __init__(self, total_bytes: int, stream=None, after: float = PROGRESS_AFTER) -> None:
        self.total, self.done, self.stream = total_bytes, 0, stream or sys.stderr
        self.start, self.last = time.perf_counter(), -math.inf
        self.after, self.shown = after, False

    def advance(self, nbytes: int, what: str) -> None:
        self.done += nbytes
        now = time.perf_counter()
        if now - self.start >= self.after and now - self.last >= 1.0:
            self.last, self.shown = now, True
            pct = 100 * self.done / self.total if self.total else 100.0
            self.stream.write(f"gac-check repair: {pct:5.1f}% ({self.done / 1e9:.2f} of "
                              f"{self.total / 1e9:.2f} GB) {what}\n")
            self.stream.flush()


def apply(repair_plan: RepairPlan, ckpt: Checkpoint, out_dir: Path | str, *,
          force: bool = False, progress: Progress | None = None,
          recheck: Callable[[Path], list[Finding]] | None = None,
          extra_notes: Sequence[str] = (), show_progress: bool = True) -> RepairReport:
    """Write ``ckpt`` padded as planned to ``out_dir``, atomically; the input is only read.

    ``recheck`` checks the finished output before it appears, so the provenance file records
    what the re-check still finds rather than an empty list; ``extra_notes`` (how the dtype
    was chosen) go into the report and that file. ``show_progress=False`` keeps stderr quiet
    (``--format json``: whoever reads the output is a program, not a person at a terminal).
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    check_output_dir(out, force, ckpt.path)
    _check_plan_fits(repair_plan, ckpt)
    require_complete(repair_plan, ckpt.shapes, ckpt.auxiliary)
    repair_plan = prove_on_class(repair_plan, ckpt)  # table-read widths: their config key
    notes = list(extra_notes)
    progress = progress or Progress(sum(_nbytes(t) for t in ckpt.tensors.values()),
                                    after=PROGRESS_AFTER if show_progress else math.inf)
    # a torch pickle is rewritten in its own layout; what cannot be is refused before OUT exists
    pickled = prepare_pickled(repair_plan, ckpt) if ckpt.container != "safetensors" else None
    with atomic_output_dir(out, force) as tmp:
        if pickled is None:
            files = _write_safetensors_shards(repair_plan, ckpt, tmp, progress)
        else:
            files = pickled.write(tmp, progress.advance)
            notes.append(pickled.note)
        container_out = ckpt.container
        sidecars, sidecar_changes = _edited_sidecars(repair_plan, ckpt)
        for name, data in sidecars.items():
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n")
        files += sorted(sidecars)
        skip = set(files) | {"config.json", PROVENANCE} | weight_file_names(ckpt.path)
        copy_side_files(ckpt.path, tmp, skip)
        if (ckpt.path / "config.json").exists():
            config = _edited_config(ckpt.config, repair_plan.config_edits)
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            files.append("config.json")
        report = RepairReport(ckpt.path, out.resolve(), repair_plan, ckpt.container,
                              container_out, files, 0.0, notes,
                              sidecar_changes=sidecar_changes)
        if repair_plan.refused:
            notes.append(f"{len(repair_plan.refused)} misaligned sites were refused (for the "
                         "reasons above) and remain misaligned")
        if recheck is not None:
            report.remaining = recheck(tmp)
        report.seconds = time.perf_counter() - t0
        (tmp / PROVENANCE).write_text(json.dumps(
            {"source": str(ckpt.path), **report.to_json()}, indent=2) + "\n")
    report.seconds = time.perf_counter() - t0
    if progress.shown:
        progress.stream.write(f"gac-check repair: done in {report.seconds:.1f}s\n")
    return report


def _check_plan_fits(repair_plan: RepairPlan, ckpt: Checkpoint) -> None:
    for name, edit in repair_plan.edits.items():
        info = ckpt.tensors.get(name)
        if info is None or info.shape != edit.shape:
            raise BadInput(f"the repair plan expects tensor {name!r} with shape {edit.shape}, "
                           "which the checkpoint does not have", ckpt.path)


def _nbytes(info: TensorInfo) -> int:
    from gac_check.checkpoint.pickled.torchzip import DTYPE_ITEMSIZE

    return info.numel * DTYPE_ITEMSIZE.get(info.dtype, 1)


def _edited_sidecars(repair_plan: RepairPlan, ckpt: Checkpoint
                     ) -> tuple[dict[str, dict], list[dict]]:
    """JSON sidecars that record padded sizes (SliceGPT's slicing config), rewritten, and
    each value changed (for the provenance's ``config_changes``).

    A site names them in ``attrs``: ``sidecar`` (file name) and ``sidecar_fields`` (``[key,
    index]`` pairs, index "" for a scalar); a value is changed only where it records exactly
    the site's old size, as with config.json.
    """
    out: dict[str, dict] = {}
    changes: list[dict] = []
    for rep in repair_plan.repairs:
        name = rep.site.attrs.get("sidecar")
        if not isinstance(name, str) or name not in ckpt.sidecars:
            continue
        data = out.setdefault(name, json.loads(json.dumps(ckpt.sidecars[name])))
        for key, index in rep.site.attrs.get("sidecar_fields") or []:  # type: ignore[union-attr]
            table = data.get(key)
            if index == "" and table == rep.site.value:
                data[key] = rep.target
            elif isinstance(table, dict) and table.get(str(index)) == rep.site.value:
                table[str(index)] = rep.target
            else:
                continue
            changes.append({"file": name, "field": [key], "index": index or None,
                            "from": rep.site.value, "to": rep.target})
    return out, changes


def _edited_config(config: dict, edits: list[ConfigEdit]) -> dict:
    out = json.loads(json.dumps(config))
    for e in edits:
        node = out
        for key in e.path[:-1]:
            node = node[key]
        if e.index is None:
            node[e.path[-1]] = e.new
        else:
            node[e.path[-1]][e.index] = e.new
    return out


# ------------------------------------------------------------------------ safetensors writing
@dataclass(frozen=True)
class _Entry:
    """One tensor of an output file: where its bytes come from and what it becomes."""

    info: TensorInfo
    st_dtype: str
    shape: tuple[int, ...]
    nbytes: int
    edit: TensorEdit | None


#: Said when a shard is not the file the check read: another process replaced or rewrote it
#: while the repair ran (a pipeline's own download or compression step still writing).
CHANGED = "changed while it was being repaired; nothing was written: run again once it is complete"


def _identity(path: Path) -> tuple[int, int, int, int]:
    """What tells one file from its replacement (rename: another inode) or a rewrite in place
    (another size or modification time)."""
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _read_header(path: Path, checked: dict[str, TensorInfo]) -> dict:
    """The shard's header read again for what the writer copies (metadata, dtype names), under
    the same bounds and rules as the check's read, and held to it: a file that no longer
    describes the tensors the check read is refused in one line, never copied."""
    with open_regular(path) as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        raw = fh.read(header_length(fh.read(8), size, path))
    if index_header(raw, size, path) != checked:
        raise BadInput(CHANGED, path)
    return json.loads(raw)  # index_header has validated every byte of it


def _write_safetensors_shards(repair_plan: RepairPlan, ckpt: Checkpoint, tmp: Path,
                              progress: Progress) -> list[str]:
    """Every shard rewritten under its own name; the index's sizes recomputed. Each shard must
    be the same file from its header to its last byte copied, or nothing is written."""
    files, sizes = [], {}
    for src in ckpt.files:
        before = _identity(src)
        infos = sorted((i for i in ckpt.tensors.values() if i.file == src),
                       key=lambda i: i.begin)
        header = _read_header(src, {i.name: i for i in infos})
        entries = [_entry(i, header[i.name]["dtype"], repair_plan.edits.get(i.name))
                   for i in infos]
        sizes[src.name] = _write_file(tmp / src.name, entries, header.get("__metadata__"),
                                      progress)
        if _identity(src) != before:
            raise BadInput(CHANGED, src)
        files.append(src.name)
    index = ckpt.path / "model.safetensors.index.json"
    if index.exists():
        _write_index(index, tmp / index.name, sum(sizes.values()))
        files.append(index.name)
    return files


def _entry(info: TensorInfo, st_dtype: str, edit: TensorEdit | None) -> _Entry:
    shape = edit.new_shape if edit else info.shape
    itemsize = _nbytes(info) // info.numel if info.numel else 0
    return _Entry(info, st_dtype, shape, math.prod(shape) * itemsize, edit)


def _write_index(src: Path, dst: Path, total: int) -> None:
    index = json.loads(src.read_text(encoding="utf-8"))
    meta = index.get("metadata") if isinstance(index.get("metadata"), dict) else {}
    index["metadata"] = {**meta, "total_size": total}
    dst.write_text(json.dumps(index, indent=2) + "\n")


def _write_file(dst: Path, entries: list[_Entry], metadata: dict | None,
                progress: Progress) -> int:
    """A safetensors file written header first, then tensor by tensor; returns data bytes."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for e in entries:
        header[e.info.name] = {"dtype": e.st_dtype, "shape": list(e.shape),
                               "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)  # data starts 8-byte aligned, as safetensors writes
    with Sink(dst) as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for e in entries:
            _write_tensor(out, e)
            progress.advance(_nbytes(e.info), f"{e.info.name} ({dst.name})")
    return offset


def _write_tensor(out: Sink, e: _Entry) -> None:
    info = e.info
    if info.storage is None and (e.edit is None or not e.edit.scaled):
        if e.edit is None:
            out.read(info.file, info.begin, info.end - info.begin)
        else:
            _write_pieces(out, info, e.edit.byte_pieces(_nbytes(info) // max(info.numel, 1)))
        return
    from gac_check.checkpoint.tensors import read_tensor

    tensor = read_tensor(info)
    if e.edit is not None:
        tensor = e.edit.apply(tensor)
    data = tensor.contiguous().reshape(-1)
    if data.numel():
        import torch

        out.write(data.view(torch.uint8).numpy())


def _zeros(n: int) -> bytes:
    """The padding itself (one function, so a test can prove the suites notice non-zeros)."""
    return bytes(n)


def _write_pieces(out: Sink, info: TensorInfo, pieces: list[tuple[int | None, int]]) -> None:
    """Padded bytes without a tensor: source pieces read from the file straight into the
    output buffer, zero pieces copied in between; a run of equal rows each followed by equal
    zeros (a column-padded matrix) goes to :meth:`Sink.read_rows` whole."""
    zero_cache: dict[int, bytes] = {}

    def zeros(n: int) -> bytes:
        return zero_cache.get(n) or zero_cache.setdefault(n, _zeros(n))

    i = 0
    while i < len(pieces):
        src, n = pieces[i]
        rows = _row_run(pieces, i)
        if src is not None and rows > 1:
            out.read_rows(info.file, info.begin + src, n, zeros(pieces[i + 1][1]), rows)
            i += 2 * rows
            continue
        if src is not None:
            out.read(info.file, info.begin + src, n)
        while src is None and n > 0:
            k = min(n, ZERO_BLOCK)
            out.write(zeros(k))
            n -= k
        i += 1


def _row_run(pieces: list[tuple[int | None, int]], i: int) -> int:
    """How many (source, n), (None, z) pairs from ``i`` on repeat with the same n and z and
    sources one after another (0 or 1: no run)."""
    if i + 1 >= len(pieces) or pieces[i][0] is None or pieces[i + 1][0] is not None:
        return 0
    (src, n), (_, z) = pieces[i], pieces[i + 1]
    if z > ZERO_BLOCK:
        return 0
    count, j = 1, i + 2
    while (j + 1 < len(pieces) and pieces[j] == (src + count * n, n)
           and pieces[j + 1] == (None, z)):
        count, j = count + 1, j + 2
    return count
