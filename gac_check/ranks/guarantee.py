"""What keeps ``--realign`` from costing quality: menus bounded near the compressor's own ranks,
the roundings computed beside the knapsack's plan, and the best one measured written.

The knapsack minimises a sum of per-matrix energies (discarded ``s^2``). Those energies are on
each matrix's own scale (a ``down_proj``'s and an ``lm_head``'s are not worth the same on the
output), so the sum's optimum can cut one matrix far below the compressor's rank to raise
another and make the model worse (issue 40: ASVD's plan cut a ``down_proj`` 130 -> 8 while the
energy kept rose from 49% to 76% and the model's cosine fell from 0.57 to 0.36). Two things
stop that:

- the compressor's own allocation is the starting point: each matrix may go at most
  :data:`STEPS_BELOW` menu step below its rank rounded down (so never more than two
  alignments below the compressor's rank) to pay for raising another, and at most
  :data:`STEPS_ABOVE` steps above its rank rounded up (dense only where it costs no more). The
  compressor chose its ranks from its own calibration (ASVD's sensitivity, SVD-LLM's and
  PaLU's whitened losses); the energies alone cannot say a bigger move is worth it, so nothing
  larger is offered either way (unbounded upward, the plain energies stored a MiniLM's query
  and key projections dense, paid for by a step down everywhere else: the weight error fell
  from 0.32 to 0.23 and the embeddings' cosine to dense from 0.651 to 0.631, issue 40's demo).
  A budget below what the bounded menus can meet (``--budget`` well under the compressor's
  own) needs larger cuts, and then the full menus are used and the notes say so;
- the plan is compared with each rank rounded down and rounded to the nearest aligned rank
  within the budget: where ``--base`` measures them (the whole model's output with
  ``--calib``, else each matrix's mean relative output error), the best measured is written,
  so what is written is never measured worse than rounding down (:func:`keep_best`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gac_check.ranks.candidates import RankMenu
from gac_check.ranks.knapsack import DENSE, Choice, Matrix, Rank, RankPlan

#: Menu steps a matrix may go below its rank rounded down to pay for another (see above).
STEPS_BELOW = 1
#: Menu steps a matrix may go above its rank rounded up (0: no further than rounding up).
STEPS_ABOVE = 0

#: The plans within the budget that are compared and may be written, knapsack's first (ties
#: keep it); the names are :mod:`gac_check.ranks.kept`'s choices.
WRITABLE = ("realigned", "round nearest", "round down")


def rounded(menu: RankMenu, how: str) -> Rank:
    """The input's rank rounded to its menu: the largest rank on it at or below (``down``;
    the smallest on the menu when none is), or the smallest at or above (``up``; dense when
    none is and dense is offered, else the largest)."""
    ranks = sorted(int(r) for r in menu.candidates if r != DENSE)
    if not ranks:
        return DENSE
    if how == "down":
        below = [r for r in ranks if r <= menu.rank]
        return below[-1] if below else ranks[0]
    above = [r for r in ranks if r >= menu.rank]
    if above:
        return above[0]
    return DENSE if DENSE in menu.candidates else ranks[-1]


def bounded(menu: RankMenu) -> tuple[Rank, ...]:
    """``menu``'s candidates from :data:`STEPS_BELOW` steps below its rank rounded down to
    :data:`STEPS_ABOVE` steps above its rank rounded up; dense where it costs no more than
    that highest rank (or where rounding up is dense)."""
    ranks = sorted(int(r) for r in menu.candidates if r != DENSE)
    down, up = rounded(menu, "down"), rounded(menu, "up")
    if down == DENSE:
        return menu.candidates
    floor = ranks[max(ranks.index(int(down)) - STEPS_BELOW, 0)]
    top = (ranks[-1] if up == DENSE else
           ranks[min(ranks.index(int(up)) + STEPS_ABOVE, len(ranks) - 1)])
    dense = up == DENSE or menu.dense_params <= menu.params(top)
    return tuple(r for r in menu.candidates
                 if (dense if r == DENSE else floor <= int(r) <= top))


def lowest(menu: RankMenu) -> int | None:
    """The lowest rank :func:`bounded` offers ``menu`` (the largest cut a plan may make there;
    None where only dense is offered)."""
    ranks = [int(r) for r in bounded(menu) if r != DENSE]
    return min(ranks) if ranks else None


def nearest_within(menus: Sequence[RankMenu], budget: int) -> dict[str, Rank]:
    """Each rank rounded to the nearer of its menu's ranks below and above; where that spends
    more than ``budget``, the matrices rounded up farthest from their own rank go back down
    first until it fits (rounding down everywhere is the floor)."""
    ranks = {m.module: rounded(m, "down") for m in menus}
    ups = []
    for m in menus:
        up, down = rounded(m, "up"), ranks[m.module]
        if up == down:
            continue
        up_dist = (m.dense_params if up == DENSE else m.params(up)) - m.params(m.rank)
        down_dist = m.params(m.rank) - m.params(down)
        if up_dist < down_dist:
            ups.append((up_dist, m.module, up))
    spent = sum(m.params(ranks[m.module]) for m in menus)
    by_name = {m.module: m for m in menus}
    for _, module, up in sorted(ups):  # nearest first: those kept up when the budget runs out
        extra = by_name[module].params(up) - by_name[module].params(ranks[module])
        if spent + extra <= budget:
            ranks[module] = up
            spent += extra
    return ranks


def plan_of(matrices: Sequence[Matrix], ranks: Mapping[str, Rank], budget: int,
            method: str) -> RankPlan:
    """``ranks`` as a plan (error and energy kept per matrix), for writing in the knapsack's
    place."""
    choices = tuple(Choice(m.name, m.m, m.n, ranks[m.name], m.params(ranks[m.name]),
                           m.error(ranks[m.name]), m.energy - m.error(ranks[m.name]))
                    for m in matrices)
    return RankPlan(choices, budget, method, optimal=False)


@dataclass(frozen=True)
class Verdict:
    """Which plan was written, on what measure, and each plan's figure on it."""

    written: str
    measure: str  # what the figures are, "" where nothing measured them
    higher_is_better: bool
    figures: dict[str, float]  # per writable choice within the budget

    def margin(self, over: str) -> float | None:
        """How much better the written plan measured than ``over`` (>= 0), None unmeasured."""
        if not self.measure or over not in self.figures:
            return None
        diff = self.figures[self.written] - self.figures[over]
        return diff if self.higher_is_better else -diff

    def sentence(self) -> str:
        if not self.measure:
            return ("written: the knapsack's plan (not measured: --base measures it against "
                    "each rank rounded down and to the nearest within the budget)")
        figs = ", ".join(f"{c} {v:.4f}" for c, v in self.figures.items())
        lead = ("the knapsack's plan" if self.written == "realigned"
                else f"each rank {self.written.removeprefix('round ')} rounded"
                .replace("each rank nearest rounded", "each rank rounded to the nearest"))
        by = self.margin("round down")
        return (f"written: {lead}, the best measured on {self.measure} ({figs}); "
                f"{by:+.4f} against each rank rounded down" if by is not None else
                f"written: {lead} ({figs})")

    def to_json(self) -> dict:
        return {"written": self.written, "measure": self.measure,
                "higher_is_better": self.higher_is_better, "figures": self.figures,
                "over_round_down": self.margin("round down")}


def choose(figures_by_choice: Mapping[str, float], within: Mapping[str, bool], measure: str,
           higher_is_better: bool) -> Verdict:
    """The best measured of the writable choices within the budget (the knapsack's on a tie,
    then the nearer rounding's)."""
    figures = {c: float(figures_by_choice[c]) for c in WRITABLE
               if within.get(c) and c in figures_by_choice}
    sign = 1.0 if higher_is_better else -1.0
    best = max(figures, key=lambda c: (sign * figures[c], -WRITABLE.index(c)))
    return Verdict(best, measure, higher_is_better, figures)
