"""Geometry for the realign section's charts: per matrix, what each choice of ranks keeps of
its energy, and each choice's measured output error.

Split from :mod:`gac_check.report.charts` (the alignment map and the latency staircase): a
realign's charts read ``fix.quality``, nothing else in a run. Plain numbers and strings, as
there, so the template stays declarative and escapes every string.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gac_check.report.charts import nice_ticks

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
