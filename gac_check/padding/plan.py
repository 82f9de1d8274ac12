"""Exact zero-padding repair, the plan: which sites to pad, to what, and what that edits.

A site is padded on every tensor axis that carries it, all at once, so producer rows, consumer
columns and biases stay consistent; zeros are inserted *after each segment* of the site on an
axis (one per head in a q_proj, one per group in a PaLU VT). Several sites on one tensor axis
compose through a single index map per axis, computed from all their segments, so padding
group 0 of a VT never shifts the rows group 1 is read from. What is exact and why is in
docs/design.md ("Exactness"); a site whose adapter says padding is not exact
(``DimSite.inexact``) is refused with that reason, and the rest are repaired. A low-rank
rank or latent whose padded factors would hold more parameters than the dense matrix they
stand for is refused too, with both costs: no fix is dearer than dense without saying so.

Planning is pure (sites, contract and shapes in; a :class:`RepairPlan` out), so the check can
report exactly the repair ``--repair`` would carry out; :mod:`gac_check.padding.write` writes it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import product

from gac_check.contract.rules import ERROR, WARNING, Contract
from gac_check.errors import BadInput
from gac_check.formats.accounting import site_axes
from gac_check.formats.declared import unrecorded_head_dim
from gac_check.padding.dense_cost import dearer_than_dense
from gac_check.padding.families import unrecorded, with_width_keys
from gac_check.sites import AxisKind, DimSite, Role
from gac_check.targets.blocks import FFN_MULT, ffn_mult_for

STRATEGIES = {"minimal": (ERROR,), "optimal": (ERROR, WARNING)}
NO_SCALE_ROWS = (
    "a q/k head_dim repair needs the query rows that carry the softmax-scale compensation "
    "(attrs['softmax_scale_rows']); this site does not name them"
)


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
    """A value in config.json that records a padded size: ``path`` (and list ``index``).

    Most record the size itself; a DeciLM MLP's is the ``ffn_mult`` (a float) that builds
    it, under ``block_configs`` (a list index inside ``path``)."""

    path: tuple[str | int, ...]
    index: int | None
    old: int | float | None  # None: config.json did not record it (head_dim, _recorded_head_dim)
    new: int | float


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
    #: every (tensor, axis) some site says carries a dimension, padded or not: an axis no site
    #: names is what :mod:`gac_check.padding.completeness` looks for
    claimed: frozenset[tuple[str, int]] = frozenset()

    @property
    def padding_params(self) -> int:
        return sum(r.padding_params for r in self.repairs)

    @property
    def overhead_fraction(self) -> float:
        return self.padding_params / self.params if self.params else 0.0


def plan(sites: Iterable[DimSite], contract: Contract, strategy: str = "minimal", *,
         shapes: Mapping[str, tuple[int, ...]], config: Mapping | None = None,
         widths: Mapping[str, int] | None = None) -> RepairPlan:
    """Which sites to pad to which size, and exactly how every tensor and config value changes.

    ``minimal`` pads to the smallest size clearing the contract's error rules, ``optimal`` to
    the smallest clearing its warnings too; ``widths`` are sizes the caller decided for some
    sites (``--uniform``: every layer's MLP at one width), which config.json then records. A
    site is refused when zero padding is not exact (``site.inexact``), when its axes do not
    fit the tensors, when its padded factors would cost more than the dense matrix, or when
    config.json records one value for several sites that would not all get the same new value.
    """
    if strategy not in STRATEGIES:
        raise BadInput(f"--strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    sites = list(sites) if config is None else with_width_keys(sites, config)
    severities = STRATEGIES[strategy]
    widths = dict(widths or {})
    repairs: list[SiteRepair] = []
    refused: list[Refusal] = []
    for site in sites:
        target = widths.get(site.name) or contract.target(site, severities)
        if target <= site.value:
            continue
        reason = (_refusal(site, shapes) or dearer_than_dense(site, target, shapes)
                  or (config is not None and unrecorded(site, config)))
        if reason:
            refused.append(Refusal(site, target, reason))
        else:
            repairs.append(SiteRepair(site, target,
                                      (target - site.value) * site.params_per_unit(dict(shapes))))
    repairs = _refuse_overlaps(repairs, refused)
    config_edits: list[ConfigEdit] = []
    if config is not None:
        config_edits, conflicts = _config_edits(sites, repairs, config)
        config_edits += _uniform_config_edits(sites, widths, config, config_edits)
        config_edits += _ffn_mult_edits(sites, repairs)
        config_edits += _recorded_head_dim(sites, config)
        refused += [Refusal(r.site, r.target, conflicts[r.site.name]) for r in repairs
                    if r.site.name in conflicts]
        repairs = [r for r in repairs if r.site.name not in conflicts]
    params = sum(math.prod(s) for s in shapes.values())
    return RepairPlan(strategy, contract.profile, contract.dtype, repairs, refused, params,
                      _tensor_edits(repairs, shapes), config_edits, site_axes(sites))


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


def _ffn_mult_edits(sites: list[DimSite], repairs: list[SiteRepair]) -> list[ConfigEdit]:
    """Each DeciLM MLP's ``ffn_mult`` rewritten where it does not build the layer's width as
    OUT holds it (padded, or as the tensors have it), and its ``intermediate_size`` (ModelOpt
    Puzzletron's explicit width) where it says another: the engines build each layer from
    them, so OUT's block_configs then describes OUT's tensors. A width no ffn_mult builds (a
    site left unpadded) keeps its ffn_mult."""
    new_of = {r.site.name: r.target for r in repairs}
    out = []
    for site in sites:
        rec = site.attrs.get(FFN_MULT)
        if not isinstance(rec, dict):
            continue
        layer, width = rec["block_config"], new_of.get(site.name, site.value)
        old = rec["ffn_mult"]
        new = ffn_mult_for(width, rec["hidden_size"], old) if old is not None else None
        if new is not None and new != old:
            out.append(ConfigEdit(("block_configs", layer, "ffn", "ffn_mult"), None, old, new))
        explicit = rec.get("intermediate_size")
        if explicit is not None and explicit != width:
            out.append(ConfigEdit(("block_configs", layer, "ffn", "intermediate_size"), None,
                                  explicit, width))
    return out


def _recorded_head_dim(sites: list[DimSite], config: Mapping) -> list[ConfigEdit]:
    """config.json's head_dim where it records none and derives another (Torch-Pruning's
    configs, formats/declared.py): OUT records the tensors' own, so the class built from it
    fits the weights; no tensor changes, so it is exact."""
    conflict = unrecorded_head_dim(config, sites)
    return [ConfigEdit(("head_dim",), None, None, conflict.tensors)] if conflict else []


def _uniform_config_edits(sites: list[DimSite], widths: Mapping[str, int],
                          config: Mapping, done: list[ConfigEdit]) -> list[ConfigEdit]:
    """With one width decided for every layer, config.json's single width records it, even
    where it recorded none of the layers' old widths (LLM-Pruner keeps the dense size)."""
    out: list[ConfigEdit] = []
    for site in sites:
        new = widths.get(site.name)
        field_ = site.config_field
        if new is None or not field_ or len(field_) != 1:
            continue
        old = config.get(field_[0])
        if (isinstance(old, int) and not isinstance(old, bool) and old != new
                and not any(e.path == field_ for e in done + out)):
            out.append(ConfigEdit(field_, None, old, new))
    return out


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
                axis.inserts.append((off + n, pad * ax.unit))
                if ax.tensor in scaled and ax.kind in (AxisKind.PRODUCER, AxisKind.BIAS):
                    axis.scales.append((off, n, factor))
    return edits
