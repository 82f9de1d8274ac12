"""Exact zero-padding repair: plan which sites to pad, then write a padded, loadable checkpoint.

A site is padded on every tensor axis that carries it, all at once, so producer rows, consumer
columns and biases stay consistent; zeros are inserted *after each segment* of the site on an
axis (one per head in a q_proj, one per group in a PaLU VT). Several sites on one tensor axis
compose through a single index map per axis, computed from all their segments, so padding
group 0 of a VT never shifts the rows group 1 is read from. What is exact and why is in
DESIGN.md ("Exactness"); a site whose adapter says padding is not exact (``DimSite.inexact``)
is refused with that reason, and the rest are repaired.

The writer streams: it reads one tensor's bytes at a time (byte ranges for safetensors, the
archive member for torch zip files), pads it, writes it, and copies untouched tensors byte for
byte, so peak memory is about twice the largest padded tensor whatever the model's size.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

from gac_check.checkpoint import SAFETENSORS_DTYPES, Checkpoint, TensorInfo
from gac_check.contract import ERROR, WARNING, Contract, Finding
from gac_check.errors import BadInput
from gac_check.outdir import (
    atomic_output_dir,
    check_output_dir,
    copy_side_files,
    weight_file_names,
)
from gac_check.sites import AxisKind, DimSite, Role

STRATEGIES = {"minimal": (ERROR,), "optimal": (ERROR, WARNING)}
#: The provenance file every repaired directory carries (what was padded, what was refused).
PROVENANCE = "gac-repair.json"
NO_SCALE_ROWS = (
    "a q/k head_dim repair needs the query rows that carry the softmax-scale compensation "
    "(attrs['softmax_scale_rows']); this site does not name them"
)
PICKLE_NOTE = (
    "the input is a pickled torch checkpoint; a whole-model pickle cannot and must not be "
    "written, so the output holds the same tensors as safetensors (a state dict) plus config"
)
ST_DTYPES = {v: k for k, v in SAFETENSORS_DTYPES.items()}
#: Writes go out in pieces of a few MiB: on this project's VMs dd ran 5x slower at bs=64M than
#: at bs=1M, and a few MiB was never slower than whole-tensor writes in our timings.
WRITE_CHUNK = 4 << 20
#: Source pieces at least this large on average go file to file (copy_file_range).
COPY_PIECE = 256 << 10
#: Buffers per writev call (Linux's IOV_MAX is 1024).
IOV_BATCH = 1024


# ---------------------------------------------------------------------------------- planning
@dataclass(frozen=True)
class SiteRepair:
    """One site padded from ``site.value`` to ``target``, and what that costs."""

    site: DimSite
    target: int
    padding_params: int

    @property
    def added(self) -> int:
        return self.target - self.site.value


@dataclass(frozen=True)
class Refusal:
    """A misaligned site left as it is, and why padding it would not be exact (or safe)."""

    site: DimSite
    target: int
    reason: str


@dataclass
class AxisEdit:
    """How one axis of one tensor changes: zeros inserted at old positions, rows rescaled.

    ``inserts`` are (old position, count): ``count`` zeros go before old index ``position``.
    ``scales`` are (old offset, length, factor) ranges multiplied after the move (the query
    rows of a head_dim repair). Everything downstream derives from these two lists, which is
    how several sites on one axis compose.
    """

    length: int
    inserts: list[tuple[int, int]] = field(default_factory=list)
    scales: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def new_length(self) -> int:
        return self.length + sum(c for _, c in self.inserts)

    def new_index(self, old: int) -> int:
        """Where old index ``old`` lands (zeros inserted at ``old`` go before it)."""
        return old + sum(c for p, c in self.inserts if p <= old)

    def runs(self) -> list[tuple[int, int, int]]:
        """(old start, length, new start) of the contiguous stretches that move unchanged."""
        out, old, shift = [], 0, 0
        for pos, count in sorted(self.inserts):
            if pos > old:
                out.append((old, pos - old, old + shift))
            old, shift = max(old, pos), shift + count
        if self.length > old:
            out.append((old, self.length - old, old + shift))
        return out


@dataclass
class TensorEdit:
    """All axis edits of one tensor; ``apply`` builds the padded copy in one pass."""

    name: str
    shape: tuple[int, ...]
    axes: dict[int, AxisEdit] = field(default_factory=dict)

    @property
    def new_shape(self) -> tuple[int, ...]:
        return tuple(self.axes[i].new_length if i in self.axes else n
                     for i, n in enumerate(self.shape))

    def apply(self, tensor):
        """The padded tensor: each unchanged stretch copied once into a zero tensor."""
        if tuple(tensor.shape) != self.shape:
            raise BadInput(f"tensor {self.name!r} is {tuple(tensor.shape)}, the plan expected "
                           f"{self.shape}")
        out = tensor.new_zeros(self.new_shape)
        per_axis = [self.axes[i].runs() if i in self.axes else [(0, n, 0)]
                    for i, n in enumerate(self.shape)]
        for combo in product(*per_axis):
            src = tuple(slice(o, o + n) for o, n, _ in combo)
            dst = tuple(slice(d, d + n) for _, n, d in combo)
            out[dst] = tensor[src]
        for axis, edit in self.axes.items():
            for off, length, factor in edit.scales:
                out.narrow(axis, edit.new_index(off), length).mul_(factor)
        return out

    @property
    def scaled(self) -> bool:
        return any(a.scales for a in self.axes.values())

    def byte_pieces(self, itemsize: int) -> list[tuple[int | None, int]]:
        """The padded tensor's bytes in order, as (source byte offset, length) pieces and
        (None, length) zero pieces, adjacent ones merged.

        This is ``apply`` without materialising anything: a writer can copy the source
        pieces file to file and write zeros between them (scaled tensors need ``apply``).
        """
        pieces: list[tuple[int | None, int]] = []
        last = max(self.axes)
        new_shape = self.new_shape

        def add(src: int | None, n: int) -> None:
            if n <= 0:
                return
            if pieces:
                p_src, p_n = pieces[-1]
                if (src is None and p_src is None) or (
                        src is not None and p_src is not None and p_src + p_n == src):
                    pieces[-1] = (p_src, p_n + n)
                    return
            pieces.append((src, n))

        runs = [self.axes[i].runs() if i in self.axes else [(0, n, 0)]
                for i, n in enumerate(self.shape)]

        def emit(axis: int, src: int) -> None:
            s_stride = math.prod(self.shape[axis + 1:]) * itemsize
            d_stride = math.prod(new_shape[axis + 1:]) * itemsize
            pos = 0
            for old, n, new in runs[axis]:
                add(None, (new - pos) * d_stride)
                if axis == last:
                    add(src + old * s_stride, n * s_stride)
                else:
                    for i in range(old, old + n):
                        emit(axis + 1, src + i * s_stride)
                pos = new + n
            add(None, (new_shape[axis] - pos) * d_stride)

        emit(0, 0)
        return pieces


@dataclass(frozen=True)
class ConfigEdit:
    """A value in config.json that records a padded size: ``path`` (and list ``index``)."""

    path: tuple[str, ...]
    index: int | None
    old: int
    new: int


@dataclass
class RepairPlan:
    """Per-site targets, the resulting tensor and config edits, and the refused sites."""

    strategy: str
    profile: str
    dtype: str
    repairs: list[SiteRepair]
    refused: list[Refusal]
    params: int
    edits: dict[str, TensorEdit] = field(default_factory=dict)
    config_edits: list[ConfigEdit] = field(default_factory=list)

    @property
    def padding_params(self) -> int:
        return sum(r.padding_params for r in self.repairs)

    @property
    def overhead_fraction(self) -> float:
        return self.padding_params / self.params if self.params else 0.0


def plan(sites: Iterable[DimSite], contract: Contract, strategy: str = "minimal", *,
         shapes: Mapping[str, tuple[int, ...]], config: Mapping | None = None) -> RepairPlan:
    """Which sites to pad to which size, and exactly how every tensor and config value changes.

    ``minimal`` pads to the smallest size clearing the contract's error rules, ``optimal`` to
    the smallest clearing its warnings too. A site is refused when zero padding is not exact
    (``site.inexact``), when its axes do not fit the tensors, or when config.json records one
    value for several sites that would not all get the same new value.
    """
    if strategy not in STRATEGIES:
        raise BadInput(f"--strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    sites = list(sites)
    severities = STRATEGIES[strategy]
    repairs: list[SiteRepair] = []
    refused: list[Refusal] = []
    for site in sites:
        target = contract.target(site, severities)
        if target <= site.value:
            continue
        reason = _refusal(site, shapes)
        if reason:
            refused.append(Refusal(site, target, reason))
        else:
            repairs.append(SiteRepair(site, target,
                                      (target - site.value) * site.params_per_unit(dict(shapes))))
    repairs = _refuse_overlaps(repairs, refused)
    config_edits: list[ConfigEdit] = []
    if config is not None:
        config_edits, conflicts = _config_edits(sites, repairs, config)
        refused += [Refusal(r.site, r.target, conflicts[r.site.name]) for r in repairs
                    if r.site.name in conflicts]
        repairs = [r for r in repairs if r.site.name not in conflicts]
    params = sum(math.prod(s) for s in shapes.values())
    return RepairPlan(strategy, contract.profile, contract.dtype, repairs, refused, params,
                      _tensor_edits(repairs, shapes), config_edits)


def _refusal(site: DimSite, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    if site.inexact:
        return site.inexact
    if not site.axes:
        return "no tensor axis carries this dimension, so there is nothing to pad"
    if site.role is Role.HEAD_DIM and "softmax_scale_rows" not in site.attrs:
        return NO_SCALE_ROWS
    for ax in site.axes:
        shape = shapes.get(ax.tensor)
        if shape is None or ax.axis >= len(shape):
            return f"names {ax.tensor!r} axis {ax.axis}, which the checkpoint does not have"
        end = max(off + n for off, n in ax.segments(site.value))
        if end > shape[ax.axis]:
            return (f"{ax.tensor} axis {ax.axis} has {shape[ax.axis]} entries but the site "
                    f"spans {end}; tensors and site disagree")
    return None


def _segments(rep: SiteRepair) -> Iterable[tuple[str, int, int, int]]:
    for ax in rep.site.axes:
        for off, n in ax.segments(rep.site.value):
            yield ax.tensor, ax.axis, off, off + n


def _refuse_overlaps(repairs: list[SiteRepair], refused: list[Refusal]) -> list[SiteRepair]:
    """Two sites claiming overlapping stretches of one axis cannot both be padded; refuse the
    later one (appended to ``refused``) rather than guess which adapter is right."""
    taken: dict[tuple[str, int], list[tuple[int, int]]] = {}
    kept = []
    for rep in repairs:
        clash = None
        for tensor, axis, lo, hi in _segments(rep):
            for a, b in taken.get((tensor, axis), []):
                if lo < b and a < hi:
                    clash = f"{tensor} axis {axis}"
        if clash:
            refused.append(Refusal(rep.site, rep.target,
                                   f"overlaps another repaired site on {clash}"))
            continue
        kept.append(rep)
        for tensor, axis, lo, hi in _segments(rep):
            taken.setdefault((tensor, axis), []).append((lo, hi))
    return kept


def _config_location(site: DimSite, config: Mapping) -> tuple[tuple[str, ...], int | None,
                                                             int] | None:
    """Where config.json records this site's value, when it records exactly that value."""
    if not site.config_field:
        return None
    node: object = config
    for key in site.config_field:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    index = None
    if isinstance(node, list):
        index = site.attrs.get("group")
        if not isinstance(index, int) or not 0 <= index < len(node):
            return None
        node = node[index]
    if isinstance(node, bool) or node != site.value:
        return None  # the config records something else (LLM-Pruner keeps dense sizes)
    return site.config_field, index, site.value


def _config_edits(sites: list[DimSite], repairs: list[SiteRepair], config: Mapping):
    """The config values to rewrite, and the repaired sites refused because config.json records
    one value for sites that would end up with different sizes."""
    new_of = {r.site.name: r.target for r in repairs}
    wants: dict[tuple, dict[int, list[str]]] = {}
    for site in sites:
        loc = _config_location(site, config)
        if loc:
            path, index, _ = loc
            new = new_of.get(site.name, site.value)
            wants.setdefault((path, index, site.value), {}).setdefault(new, []).append(site.name)
    edits, conflicts = [], {}
    for (path, index, old), by_new in wants.items():
        if len(by_new) > 1:
            why = (f"config.json records one {'.'.join(path)} for sites that would get "
                   f"different sizes ({', '.join(map(str, sorted(by_new)))})")
            conflicts.update({n: why for names in by_new.values() for n in names})
        elif (new := next(iter(by_new))) != old:
            edits.append(ConfigEdit(path, index, old, new))
    return edits, conflicts


def _tensor_edits(repairs: list[SiteRepair],
                  shapes: Mapping[str, tuple[int, ...]]) -> dict[str, TensorEdit]:
    edits: dict[str, TensorEdit] = {}
    for rep in repairs:
        site, pad = rep.site, rep.added
        scaled = set(site.attrs.get("softmax_scale_rows", ()))  # type: ignore[arg-type]
        factor = math.sqrt(rep.target / site.value)
        for ax in site.axes:
            edit = edits.setdefault(ax.tensor, TensorEdit(ax.tensor, tuple(shapes[ax.tensor])))
            axis = edit.axes.setdefault(ax.axis, AxisEdit(shapes[ax.tensor][ax.axis]))
            for off, n in ax.segments(site.value):
                axis.inserts.append((off + n, pad))
                if ax.tensor in scaled and ax.kind in (AxisKind.PRODUCER, AxisKind.BIAS):
                    axis.scales.append((off, n, factor))
    return edits


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
            "config_changes": [{"field": list(e.path), "index": e.index, "from": e.old,
                                "to": e.new} for e in self.plan.config_edits],
            "padding_params": self.plan.padding_params,
            "params_before": self.plan.params,
            "repair_overhead_fraction": self.plan.overhead_fraction,
            "files": self.files,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "remaining": [{"name": f.site.name, "value": f.site.value, "severity": f.severity,
                           "rules": [r.id for r in f.rules]} for f in self.remaining],
        }

    def render_text(self) -> str:
        p = self.plan
        lines = [f"repair ({p.strategy}, {p.profile} contract, {p.dtype}) -> {self.out}",
                 f"  padded {len(p.repairs)} sites, adding {p.padding_params:,} parameters "
                 f"({p.overhead_fraction:.2%}); wrote {len(self.files)} files "
                 f"in {self.seconds:.1f}s"]
        folded: dict[tuple, int] = {}
        for r in p.repairs:
            key = (r.site.role.value, r.site.value, r.target)
            folded[key] = folded.get(key, 0) + 1
        lines += [f"    {n} x {role} {a} -> {b}" for (role, a, b), n in sorted(folded.items())]
        if p.refused:
            lines.append(f"  refused {len(p.refused)} sites (left as they are):")
            reasons: dict[str, list[str]] = {}
            for r in p.refused:
                reasons.setdefault(r.reason, []).append(r.site.name)
            for why, names in reasons.items():
                more = f" and {len(names) - 3} more" if len(names) > 3 else ""
                lines.append(f"    {', '.join(names[:3])}{more}: {why}")
        lines += [f"  note: {n}" for n in self.notes]
        errors = sum(f.severity == ERROR for f in self.remaining)
        lines.append(f"  re-check of {self.out.name}: {len(self.remaining)} sites still "
                     f"misaligned ({errors} errors, {len(self.remaining) - errors} warnings)")
        return "\n".join(lines)


class Progress:
    """A line on stderr per step once a repair has run for a while (at most one a second)."""

    def __init__(self, total_bytes: int, stream=None, after: float = 2.0) -> None:
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
          force: bool = False, progress: Progress | None = None) -> RepairReport:
    """Write ``ckpt`` padded as planned to ``out_dir``, atomically; the input is only read."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    check_output_dir(out, force, ckpt.path)
    _check_plan_fits(repair_plan, ckpt)
    notes: list[str] = []
    progress = progress or Progress(sum(_nbytes(t) for t in ckpt.tensors.values()))
    with atomic_output_dir(out, force) as tmp:
        if ckpt.container == "safetensors":
            files = _write_safetensors_shards(repair_plan, ckpt, tmp, progress)
            container_out = "safetensors"
        else:
            files = _write_converted(repair_plan, ckpt, tmp, progress)
            container_out = "safetensors (converted from a torch pickle)"
            notes.append(PICKLE_NOTE)
        sidecars = _edited_sidecars(repair_plan, ckpt)
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
                              container_out, files, 0.0, notes)
        if repair_plan.refused:
            notes.append(f"{len(repair_plan.refused)} misaligned sites were refused (not exact "
                         "in the stock architecture) and remain misaligned")
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
    from gac_check.torchzip import DTYPE_ITEMSIZE

    return info.numel * DTYPE_ITEMSIZE.get(info.dtype, 1)


def _edited_sidecars(repair_plan: RepairPlan, ckpt: Checkpoint) -> dict[str, dict]:
    """JSON sidecars that record padded sizes (SliceGPT's slicing config), rewritten.

    A site names them in ``attrs``: ``sidecar`` (file name) and ``sidecar_fields`` (``[key,
    index]`` pairs, index "" for a scalar); a value is changed only where it records exactly
    the site's old size, as with config.json.
    """
    out: dict[str, dict] = {}
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
    return out


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


def _read_header(path: Path) -> tuple[dict, int]:
    with path.open("rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(n)), 8 + n


def _write_safetensors_shards(repair_plan: RepairPlan, ckpt: Checkpoint, tmp: Path,
                              progress: Progress) -> list[str]:
    """Every shard rewritten under its own name; the index's sizes recomputed."""
    files, sizes = [], {}
    for src in ckpt.files:
        header, _ = _read_header(src)
        infos = sorted((i for i in ckpt.tensors.values() if i.file == src),
                       key=lambda i: i.begin)
        entries = [_entry(i, header[i.name]["dtype"], repair_plan.edits.get(i.name))
                   for i in infos]
        sizes[src.name] = _write_file(tmp / src.name, entries, header.get("__metadata__"),
                                      progress)
        files.append(src.name)
    index = ckpt.path / "model.safetensors.index.json"
    if index.exists():
        _write_index(index, tmp / index.name, None, sum(sizes.values()))
        files.append(index.name)
    return files


def _write_converted(repair_plan: RepairPlan, ckpt: Checkpoint, tmp: Path,
                     progress: Progress) -> list[str]:
    """Torch zip shards become safetensors shards of the same stem (model-0000x-of-0000y)."""
    renamed = {f.name: _safetensors_name(f.name) for f in ckpt.files}
    files, total = [], 0
    for src in ckpt.files:
        infos = [i for i in ckpt.tensors.values() if i.file == src]
        entries = []
        for i in infos:
            if i.dtype not in ST_DTYPES:
                raise BadInput(f"tensor {i.name!r} has dtype {i.dtype}, which safetensors "
                               "cannot hold", src)
            entries.append(_entry(i, ST_DTYPES[i.dtype], repair_plan.edits.get(i.name)))
        total += _write_file(tmp / renamed[src.name], entries, {"format": "pt"}, progress)
        files.append(renamed[src.name])
    index = ckpt.path / "pytorch_model.bin.index.json"
    if index.exists():
        _write_index(index, tmp / "model.safetensors.index.json", renamed, total)
        files.append("model.safetensors.index.json")
    return files


def _safetensors_name(name: str) -> str:
    stem = name.rsplit(".", 1)[0]
    if stem.startswith("pytorch_model"):
        stem = "model" + stem[len("pytorch_model"):]
    return stem + ".safetensors"


def _entry(info: TensorInfo, st_dtype: str, edit: TensorEdit | None) -> _Entry:
    shape = edit.new_shape if edit else info.shape
    itemsize = _nbytes(info) // info.numel if info.numel else 0
    return _Entry(info, st_dtype, shape, math.prod(shape) * itemsize, edit)


def _write_index(src: Path, dst: Path, renamed: dict[str, str] | None, total: int) -> None:
    index = json.loads(src.read_text(encoding="utf-8"))
    if renamed is not None:
        index["weight_map"] = {k: renamed.get(Path(v).name, v)
                               for k, v in index["weight_map"].items()}
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
    with dst.open("wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for e in entries:
            _write_tensor(out, e)
            progress.advance(_nbytes(e.info), f"{e.info.name} ({dst.name})")
    return offset


def _write_tensor(out, e: _Entry) -> None:
    info = e.info
    if info.storage is None and (e.edit is None or not e.edit.scaled):
        if e.edit is None:
            _copy_range(info.file, info.begin, info.end - info.begin, out)
        else:
            _write_pieces(out, info, e.edit.byte_pieces(_nbytes(info) // max(info.numel, 1)))
        return
    from gac_check.tensors import read_tensor

    tensor = read_tensor(info)
    if e.edit is not None:
        tensor = e.edit.apply(tensor)
    data = tensor.contiguous().reshape(-1)
    if data.numel():
        import torch

        raw = memoryview(data.view(torch.uint8).numpy())
        for i in range(0, len(raw), WRITE_CHUNK):
            out.write(raw[i:i + WRITE_CHUNK])


def _zeros(n: int) -> bytes:
    """The padding itself (one function, so a test can prove the suites notice non-zeros)."""
    return bytes(n)


def _write_pieces(out, info: TensorInfo, pieces: list[tuple[int | None, int]]) -> None:
    """Padded bytes without a tensor: large source pieces copied file to file in the kernel,
    small ones (one row of a column-padded matrix) sliced from one read of the source."""
    sources = [n for src, n in pieces if src is not None]
    if sources and sum(sources) / len(sources) >= COPY_PIECE:
        for src, n in pieces:
            if src is None:
                _write_zeros(out, n)
            else:
                _copy_range(info.file, info.begin + src, n, out)
        return
    buf = bytearray(info.end - info.begin)
    with info.file.open("rb") as fh:
        fh.seek(info.begin)
        if fh.readinto(buf) != len(buf):
            raise BadInput(f"is truncated inside tensor {info.name!r}", info.file)
    view = memoryview(buf)
    out.flush()
    fd = out.fileno()
    zero_cache: dict[int, bytes] = {}
    iov: list = []
    for src, n in pieces:
        iov.append(zero_cache.setdefault(n, _zeros(n)) if src is None else view[src:src + n])
        if len(iov) == IOV_BATCH:
            _writev_all(fd, iov)
            iov = []
    _writev_all(fd, iov)


def _writev_all(fd: int, iov: list) -> None:
    """os.writev until every buffer is out (a write may stop short)."""
    first = 0
    while first < len(iov):
        done = os.writev(fd, iov[first:] if first else iov)
        while first < len(iov) and done >= len(iov[first]):
            done -= len(iov[first])
            first += 1
        if done:
            iov[first] = memoryview(iov[first])[done:]


def _write_zeros(out, n: int) -> None:
    while n > 0:
        k = min(n, WRITE_CHUNK)
        out.write(_zeros(k))
        n -= k


def _copy_range(src: Path, begin: int, length: int, out) -> None:
    """Copy bytes file to file in the kernel where it can (no user-space buffer)."""
    out.flush()
    with src.open("rb") as fh:
        done = 0
        copy = getattr(os, "copy_file_range", None)
        if copy is not None:
            try:
                while done < length:
                    n = copy(fh.fileno(), out.fileno(), length - done, begin + done)
                    if n == 0:
                        break
                    done += n
            except OSError:
                pass  # other filesystems: fall back to a buffered copy of what is left
        fh.seek(begin + done)
        while done < length:
            chunk = fh.read(min(64 << 20, length - done))
            if not chunk:
                raise BadInput("is truncated", src)
            out.write(chunk)
            done += len(chunk)


# ------------------------------------------------------------------------------ entry point
def repair_dir(model_dir: Path | str, out: Path | str, gpu: str = "auto",
               strategy: str = "minimal", dtype: str | None = None,
               force: bool = False) -> RepairReport:
    """Check ``model_dir`` against ``gpu``'s contract and write its exact repair to ``out``.

    Refuses exactly what the checker refuses (BadInput before anything is written), and an
    existing ``out`` unless ``force``.
    """
    from gac_check.analysis import check

    if strategy not in STRATEGIES:
        raise BadInput(f"--strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    result = check(model_dir, gpu, dtype)
    ckpt = result.checkpoint
    check_output_dir(Path(out), force, ckpt.path)
    repair_plan = plan(result.sites, result.contract, strategy, shapes=ckpt.shapes,
                       config=ckpt.config)
    report = apply(repair_plan, ckpt, out, force=force)
    report.remaining = check(report.out, gpu, result.contract.dtype).findings
    return report
