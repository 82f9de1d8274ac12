"""Geometry for the report's inline SVG: the alignment map and the latency staircase.

The staircase plots what the perf verdict was computed on: for records judged relative to a
reference kernel (``basis`` "relative"), the case's time over the reference's (x); for
records judged on absolute time (published baselines), milliseconds. Absolute times of
relative records are secondary: they are in each point's hover text, labelled.

Computed here in plain Python (numbers and strings only) so the template stays declarative
and the report needs no JavaScript and no network; the template escapes every string.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

#: aligned / warning / error, chosen to stay apart for the common colour-vision deficiencies
#: (blue-green vs orange vs red-purple differ in lightness as well as hue).
COLOURS = {"aligned": "#2b8a5a", "warning": "#f0a320", "error": "#c8283c"}
TEXT_ON = {"aligned": "#ffffff", "warning": "#1d1d1d", "error": "#ffffff"}
RUN_PALETTE = ("#2f6fb5", "#8e44ad", "#16837a", "#b85c00", "#5d6d7e")
LAYER_WORDS = ("layers", "layer", "h", "blocks")


def site_state(site: dict) -> str:
    if site.get("aligned"):
        return "aligned"
    return "error" if site.get("severity") == "error" else "warning"


def site_kind(site: dict) -> str:
    """The site's name with its layer prefix removed: the map's column."""
    name, layer = site["name"], site.get("layer")
    if layer is None:
        return name
    module, sep, role = name.partition(":")
    parts = module.split(".")
    for i in range(len(parts) - 1):
        if parts[i] in LAYER_WORDS and parts[i + 1] == str(layer):
            rest = ".".join(parts[i + 2:])
            return f"{rest}{sep}{role}" if rest else role or name
    return name


def site_title(site: dict) -> str:
    state = site_state(site)
    text = f"{site['name']} = {site['value']}: {state}"
    if state != "aligned":
        text += f" ({', '.join(site.get('rules') or [])})"
        if site.get("refusal"):
            text += "; no exact zero-padding repair"
        elif site.get("repair_to"):
            text += f"; pad to {site['repair_to']}"
    return text


@dataclass
class Cell:
    x: float
    y: float
    w: float
    h: float
    fill: str
    text: str
    text_fill: str
    title: str
    state: str


@dataclass
class Grid:
    """One SVG grid: rows are layers (or one model-wide row), columns are site kinds."""

    width: float
    height: float
    cells: list[Cell] = field(default_factory=list)
    row_labels: list[tuple[float, str]] = field(default_factory=list)
    col_labels: list[tuple[float, float, str]] = field(default_factory=list)


CELL_W, CELL_H, LABEL_W, CHAR_W = 54, 20, 64, 6.2


def alignment_grids(sites: list[dict]) -> tuple[Grid | None, Grid | None]:
    """The per-layer grid and the model-wide strip (hidden size, vocabulary, ...)."""
    layered = [s for s in sites if s.get("layer") is not None]
    wide = [s for s in sites if s.get("layer") is None]
    return (_grid(layered, lambda s: f"layer {s['layer']}", by_layer=True) if layered else None,
            _grid(wide, lambda s: "model", by_layer=False) if wide else None)


def _grid(sites: list[dict], row_of, by_layer: bool) -> Grid:
    kinds: dict[str, int] = {}
    rows: dict[str, int] = {}
    ordered = sorted(sites, key=lambda s: s["layer"]) if by_layer else sites
    for s in ordered:
        kinds.setdefault(site_kind(s), len(kinds))
        rows.setdefault(row_of(s), len(rows))
    longest = max(len(k) for k in kinds)
    header = 14 + CHAR_W * min(longest, 40) * math.sin(math.radians(40))
    overhang = CHAR_W * min(longest, 40) * math.cos(math.radians(40))
    grid = Grid(width=LABEL_W + CELL_W * len(kinds) + overhang,
                height=header + CELL_H * len(rows) + 4)
    for kind, col in kinds.items():
        label = kind if len(kind) <= 40 else "…" + kind[-39:]
        grid.col_labels.append((LABEL_W + CELL_W * (col + 0.5), header - 6, label))
    for row_name, row in rows.items():
        grid.row_labels.append((header + CELL_H * (row + 0.5) + 4, row_name))
    for s in sites:
        state = site_state(s)
        grid.cells.append(Cell(
            x=LABEL_W + CELL_W * kinds[site_kind(s)] + 1, y=header + CELL_H * rows[row_of(s)] + 1,
            w=CELL_W - 2, h=CELL_H - 2, fill=COLOURS[state], text=str(s["value"]),
            text_fill=TEXT_ON[state], title=site_title(s), state=state))
    return grid


def layers_text(layers: list[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``0–3, 7``: a finding repeated in many layers reads as one line."""
    if not layers:
        return "model-wide"
    spans, start, prev = [], layers[0], layers[0]
    for n in [*layers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        spans.append(f"{start}–{prev}" if prev > start else str(start))
        if n is not None:
            start = prev = n
    return ", ".join(spans)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


@dataclass
class Point:
    x: float
    y: float
    fill: str
    ring: str | None
    title: str


@dataclass
class Band:
    colour: str
    polygon: str
    median: str


@dataclass
class Chart:
    """A latency staircase: x = the swept dimension, y = latency; baseline band + points."""

    title: str
    x_label: str
    y_label: str
    width: int
    height: int
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    plot: tuple[float, float, float, float]  # left, top, right, bottom
    bands: list[Band] = field(default_factory=list)
    lines: list[tuple[str, str]] = field(default_factory=list)  # (colour, points)
    points: list[Point] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    relative: bool = False  # y is time relative to ``reference``, not milliseconds
    reference: str | None = None


@dataclass(frozen=True)
class Axis:
    """Which numbers of a perf record a chart plots: the verdict's basis."""

    relative: bool

    def now(self, rec: dict) -> float:
        return rec["measured_rel"] if self.relative else rec["measured_ms"]

    def base(self, rec: dict) -> float | None:
        return rec.get("baseline_rel") if self.relative else rec.get("baseline_ms")

    def base_iqr(self, rec: dict) -> float:
        return (rec.get("baseline_rel_iqr") if self.relative else rec.get("baseline_iqr_ms")) or 0.0


def is_relative(rec: dict) -> bool:
    return rec.get("basis") == "relative" and rec.get("measured_rel") is not None


def parse_case(case: str) -> tuple[str, dict[str, str]]:
    """``sdpa/B=4,S=2048,D=107`` -> ``("sdpa", {"B": "4", "S": "2048", "D": "107"})``."""
    workload, _, rest = case.partition("/")
    params = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        params[key.strip()] = value.strip()
    return workload, params


def _series(workload: str, params: dict[str, str], dim: str) -> str:
    return f"{workload}/" + ",".join(f"{k}={v}" for k, v in params.items() if k != dim)


Sweeps = dict[tuple[str, str], set[str]]


def sweep_sizes(records: list[dict]) -> Sweeps:
    """For every (series, parameter): the values that parameter takes with all others fixed."""
    seen: Sweeps = {}
    for rec in records:
        workload, params = parse_case(rec["case"])
        for k, v in params.items():
            if v.isdigit():
                seen.setdefault((_series(workload, params, k), k), set()).add(v)
    return seen


def staircase_key(rec: dict, sweeps: Sweeps) -> tuple[str, str, int] | None:
    """(series name, x parameter, x value) of a perf record, or None when it is not a sweep.

    The record may name its swept parameter in ``dim``; otherwise it is the numeric parameter
    that takes the most values while all the others stay fixed (so a CPU job's small shapes
    and a GPU job's large ones form separate staircases rather than none).
    """
    workload, params = parse_case(rec["case"])
    dim = rec.get("dim")
    if dim is None:
        sizes = {k: len(sweeps.get((_series(workload, params, k), k), ())) for k in params}
        best = max(sizes, key=sizes.__getitem__, default=None)
        dim = best if best is not None and sizes[best] >= 2 else None
    if dim is None or not str(params.get(dim, "")).isdigit():
        return None
    return _series(workload, params, dim), dim, int(params[dim])


def staircases(runs: list[tuple[str, list[dict]]]) -> list[Chart]:
    """One chart per swept series, every run's baseline band and points overlaid."""
    sweeps = sweep_sizes([r for _, recs in runs for r in recs])
    series: dict[tuple[str, str], list[tuple[int, int, dict]]] = {}
    for run_index, (_, recs) in enumerate(runs):
        for rec in recs:
            key = staircase_key(rec, sweeps)
            if key is not None and rec.get("measured_ms") is not None:
                series.setdefault(key[:2], []).append((run_index, key[2], rec))
    labels = [label for label, _ in runs]
    return [_chart(name, dim, pts, labels) for (name, dim), pts in series.items()
            if len({x for _, x, _ in pts}) >= 2]


W, H, LEFT, TOP, RIGHT, BOTTOM = 600, 260, 62, 14, 16, 40


def _chart(name: str, dim: str, pts: list[tuple[int, int, dict]], labels: list[str]) -> Chart:
    refs = {r.get("reference") for _, _, r in pts}
    axis = Axis(all(is_relative(r) for _, _, r in pts) and len(refs) == 1)
    reference = next(iter(refs)) if axis.relative else None
    xs = [x for _, x, _ in pts]
    ys = [v for _, _, r in pts for v in _extent(r, axis)]
    x_ticks = nice_ticks(min(xs), max(xs), 6)
    x_lo, x_hi = min(min(xs), x_ticks[0]), max(max(xs), x_ticks[-1])
    y_ticks = nice_ticks(0, max(ys) * 1.08, 5)
    y_hi = max(y_ticks[-1], max(ys))

    def sx(x: float) -> float:
        return LEFT + (x - x_lo) / ((x_hi - x_lo) or 1) * (W - LEFT - RIGHT)

    def sy(y: float) -> float:
        return H - BOTTOM - y / (y_hi or 1) * (H - TOP - BOTTOM)

    chart = Chart(title=name, x_label=dim,
                  y_label="time ÷ reference kernel (×)" if axis.relative else "latency (ms)",
                  width=W, height=H,
                  x_ticks=[(sx(t), _fmt(t)) for t in x_ticks if x_lo <= t <= x_hi],
                  y_ticks=[(sy(t), _fmt(t)) for t in y_ticks], plot=(LEFT, TOP, W - RIGHT,
                                                                     H - BOTTOM),
                  relative=axis.relative, reference=reference)
    for run_index in sorted({i for i, _, _ in pts}):
        colour = RUN_PALETTE[run_index % len(RUN_PALETTE)]
        mine = sorted((x, r) for i, x, r in pts if i == run_index)
        base = [(x, r) for x, r in mine if axis.base(r) is not None]
        if len(base) >= 1:
            half = [axis.base_iqr(r) / 2 for _, r in base]
            upper = [f"{sx(x):.1f},{sy(axis.base(r) + h):.1f}"
                     for (x, r), h in zip(base, half, strict=True)]
            lower = [f"{sx(x):.1f},{sy(max(axis.base(r) - h, 0)):.1f}"
                     for (x, r), h in zip(base, half, strict=True)]
            chart.bands.append(Band(colour, " ".join(upper + lower[::-1]),
                                    " ".join(f"{sx(x):.1f},{sy(axis.base(r)):.1f}"
                                             for x, r in base)))
        chart.lines.append((colour, " ".join(f"{sx(x):.1f},{sy(axis.now(r)):.1f}"
                                             for x, r in mine)))
        for x, r in mine:
            chart.points.append(Point(sx(x), sy(axis.now(r)), colour,
                                      COLOURS["error"] if r.get("verdict") == "regressed"
                                      else None, perf_title(dim, x, r, labels[run_index])))
        if len(labels) > 1:
            chart.legend.append((colour, labels[run_index]))
    return chart


def _extent(rec: dict, axis: Axis) -> list[float]:
    vals = [axis.now(rec)]
    if axis.base(rec) is not None:
        vals.append(axis.base(rec) + axis.base_iqr(rec) / 2)
    return vals


def perf_title(dim: str, x: int, rec: dict, label: str) -> str:
    """A point's hover text: the verdict's numbers first, absolute times after, labelled."""
    if is_relative(rec):
        text = (f"{label}: {dim}={x}: {rec['measured_rel']:.4g}x the time of "
                f"{rec.get('reference')} now")
        if rec.get("baseline_rel") is not None:
            text += f" vs {rec['baseline_rel']:.4g}x in the baseline"
    else:
        text = f"{label}: {dim}={x}: measured {rec['measured_ms']:.4g} ms"
        if rec.get("baseline_ms") is not None:
            text += f" vs baseline {rec['baseline_ms']:.4g} ms"
    if rec.get("delta") is not None:
        text += f" ({rec['delta']:+.1%})"
    text += f"; {rec.get('verdict', 'no verdict')}"
    if is_relative(rec):
        text += f"; absolute (not judged): {rec['measured_ms']:.4g} ms now"
        if rec.get("baseline_ms") is not None:
            text += f", {rec['baseline_ms']:.4g} ms in the baseline"
    return text


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"



# ------------------------------------------------------------------- realign: what is kept
#: Each choice a realign is compared with: its colour and what the legend calls it (the
#: knapsack's blue, the roundings in the palette's orange and purple, the input grey).
KEPT_STYLE = {"input": ("#8a93a3", "input's ranks (misaligned)"),
              "realigned": ("#2f6fb5", "--realign (knapsack)"),
              "round down": ("#b85c00", "each rank rounded down"),
              "round nearest": ("#2a8a57", "each rank rounded to the nearest within the budget"),
              "round up": ("#8e44ad", "each rank rounded up")}
KEPT_ROW, KEPT_LABEL, KEPT_PLOT, KEPT_RANKS, KEPT_TOP, KEPT_BOTTOM = 20, 300, 380, 150, 30, 8
CHOICE_ORDER = list(KEPT_STYLE)
KEPT_GAP = 28  # between the plot's 100% and the rank column
#: Each choice's vertical offset in its row, so equal fractions stay apart: the knapsack's
#: large mark on the line, drawn first, the others small above, on and below it.
KEPT_DY = {"realigned": 0.0, "input": -5.0, "round down": 0.0, "round nearest": 2.5,
           "round up": 5.0}


@dataclass
class KeptMark:
    x: float
    y: float
    colour: str
    choice: str
    fraction: float  # of the matrix's energy
    title: str


@dataclass
class KeptRow:
    y: float
    label: str
    module: str
    ranks: str  # "107 → 104"
    marks: list[KeptMark] = field(default_factory=list)


@dataclass
class KeptChart:
    """Per matrix, the fraction of its energy each choice keeps: one row, one mark a choice."""

    width: int
    height: int
    plot: tuple[float, float, float, float]  # left, top, right, bottom
    x_ticks: list[tuple[float, str]]
    rows: list[KeptRow]
    legend: list[tuple[str, str]]
    ranks_x: float  # where the rank column starts


def kept_fraction(kept: float, energy: float) -> float:
    return kept / energy if energy > 0 else 1.0


def kept_chart(quality: dict) -> KeptChart:
    """The realign's quality chart from its run document's ``fix.quality``."""
    choices = sorted((c for c in quality["choices"] if c in KEPT_STYLE),
                     key=lambda c: c != "realigned")  # the large mark first, under the others
    mats = quality["matrices"]
    fractions = [kept_fraction(k["kept"][c], k["energy"]) for k in mats for c in choices]
    lo = min(fractions, default=0.0)
    lo = max(0.0, lo - 0.05 * (1 - lo) - 1e-3)
    ticks = nice_ticks(lo, 1.0, 5)
    x_lo = min(lo, ticks[0])
    left, right = KEPT_LABEL, KEPT_LABEL + KEPT_PLOT
    height = KEPT_TOP + KEPT_ROW * len(mats) + KEPT_BOTTOM

    def sx(f: float) -> float:
        return left + (f - x_lo) / ((1.0 - x_lo) or 1) * KEPT_PLOT

    rows = _rows(mats, choices, sx, lambda k, c: kept_fraction(k["kept"][c], k["energy"]),
                 lambda k, c, f: f"keeps {f:.4%} of its energy, {k['params'][c]:,} parameters")
    return KeptChart(right + KEPT_GAP + KEPT_RANKS, height,
                     (left, KEPT_TOP, right, height - KEPT_BOTTOM),
                     [(sx(t), _percent(t, ticks)) for t in ticks if x_lo <= t <= 1.0],
                     rows, [KEPT_STYLE[c] for c in sorted(choices, key=CHOICE_ORDER.index)],
                     right + KEPT_GAP)


def kept_label(choice: str) -> str:
    """What the legend calls ``choice`` (the knapsack's plan, a rounding)."""
    return KEPT_STYLE.get(choice, (None, choice))[1]


def kept_totals(quality: dict) -> list[dict]:
    """The chart's summary: per choice, its parameters against the budget and the fraction of
    all matrices' energy it keeps."""
    out = []
    for c in quality["choices"]:
        t = quality["totals"][c]
        out.append({"choice": c, "label": KEPT_STYLE.get(c, (None, c))[1],
                    "colour": KEPT_STYLE.get(c, ("#000000",))[0], "params": t["params"],
                    "within": t["params"] <= quality["budget"],
                    "fraction": kept_fraction(t["kept"], t["energy"])})
    return out


def output_chart(quality: dict) -> KeptChart:
    """The realign's output-error panel from ``fix.quality``: per matrix, each choice's
    relative output error ``||X(W - W_r)||/||XW||`` (0 at the left: smaller is better)."""
    choices = sorted((c for c in quality["choices"] if c in KEPT_STYLE),
                     key=lambda c: c != "realigned")
    mats = quality["matrices"]
    hi = max((k["output_error"][c] for k in mats for c in choices), default=0.0)
    ticks = nice_ticks(0.0, hi * 1.05 if hi > 0 else 1.0, 5)
    x_hi = max(ticks[-1], hi) or 1.0
    left, right = KEPT_LABEL, KEPT_LABEL + KEPT_PLOT
    height = KEPT_TOP + KEPT_ROW * len(mats) + KEPT_BOTTOM

    def sx(e: float) -> float:
        return left + e / x_hi * KEPT_PLOT

    rows = _rows(mats, choices, sx, lambda k, c: k["output_error"][c],
                 lambda k, c, e: f"relative output error {e:.4g}")
    return KeptChart(right + KEPT_GAP + KEPT_RANKS, height,
                     (left, KEPT_TOP, right, height - KEPT_BOTTOM),
                     [(sx(t), f"{t:g}") for t in ticks if t <= x_hi], rows,
                     [KEPT_STYLE[c] for c in sorted(choices, key=CHOICE_ORDER.index)],
                     right + KEPT_GAP)


def _rows(mats: list[dict], choices: list[str], sx: Callable[[float], float],
          value: Callable[[dict, str], float],
          says: Callable[[dict, str, float], str]) -> list[KeptRow]:
    """One row per matrix of a realign chart, one mark per choice at ``sx(value)``, titled
    with the choice's rank and what ``says`` of its value."""
    rows = []
    for i, k in enumerate(mats):
        ranks = k["ranks"]
        row = KeptRow(KEPT_TOP + KEPT_ROW * (i + 0.5), _short(k["module"], 46), k["module"],
                      f"{ranks['input']} → {ranks['realigned']}")
        for c in choices:
            v = value(k, c)
            row.marks.append(KeptMark(sx(v), row.y + KEPT_DY[c], KEPT_STYLE[c][0], c, v,
                                      f"{k['module']}: {c}: rank {ranks[c]}, {says(k, c, v)}"))
        rows.append(row)
    return rows


def _percent(t: float, ticks: list[float]) -> str:
    """A tick as a percentage with as many decimals as the ticks' step needs to tell them
    apart (a chart of fractions between 99.9% and 100% is common without --base)."""
    step = (ticks[1] - ticks[0]) * 100 if len(ticks) > 1 else 1.0
    return f"{t * 100:.{max(0, math.ceil(-math.log10(step) - 1e-9))}f}%"


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]
