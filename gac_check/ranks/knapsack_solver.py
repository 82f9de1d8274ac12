"""The exact multi-choice knapsack solver behind :func:`gac_check.ranks.knapsack.realign_plan`.

The solver is exact. The error of a rank is convex in its cost (singular values are sorted), so
(1) a Lagrangian relaxation gives a lower bound and, with a greedy repair, a near-optimal
feasible solution; (2) reduced-cost fixing removes every candidate that cannot be part of a
solution better than that incumbent, leaving a narrow band per matrix; (3) matrices whose band is
an evenly spaced convex run (the usual case) are merged exactly, per step size, by sorting their
marginal gains (separable convex allocation: greedy is optimal); (4) a dynamic programme over the
budget, in units of the gcd of all candidate costs and restricted to the window the bound allows,
combines those merged groups with the few irregular matrices (a band that holds the dense
option, a custom candidate set). Every elimination is a proof, so the result is optimal; scipy's
MILP (HiGHS) and brute force are the cross-checks; they live in
:mod:`gac_check.testing.knapsack`, which only tests and benchmarks need.

The worst case is bounded. Where the bound proves little (flat or tied spectra, whose
Lagrangian bound sits far below any integer plan; tiny cost units, when rows + columns differ
per matrix), the DP of step (4) could need billions of cells. Its size is counted before it
runs: past ``work_limit`` cells (:data:`WORK_LIMIT`, about a second here) or
:data:`TABLE_LIMIT` bytes of tables, the solver returns its best incumbent instead (the greedy,
then leftover budget spent on any candidate, not only hull vertices) with ``optimal=False``
and the Lagrangian bound, so :attr:`RankPlan.gap` is a proven bound on how far it can be from
the optimum. The limit counts cells, not seconds, so the same
instance gets the same plan on any machine.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

#: DP cells (budget units x options) the exact step may touch: about 1 s on a 2-core VM.
WORK_LIMIT = 1_000_000_000
#: Cells charged per option visited (the Python loop's own cost, about 1 us).
OPTION_CELLS = 1_000
#: Bytes of DP tables the exact step may hold.
TABLE_LIMIT = 200 << 20
#: Moves the incumbent's leftover budget may buy (each costs one pass over all candidates).
FILL_MOVES = 64


class _Options(Protocol):
    """One matrix's candidates as the solver sees them (``knapsack._Options``): parameters and
    error per candidate, in the same order."""

    costs: np.ndarray
    errors: np.ndarray


def cost_unit(options: Sequence[_Options]) -> int:
    """gcd of every candidate cost: the budget unit in which the DP and the MILP count."""
    return int(np.gcd.reduce(np.concatenate([o.costs for o in options])))


@dataclass
class _Padded:
    """Dominance-filtered candidates in a rectangle: rows = matrices, columns by cost."""

    cost: np.ndarray  # float64 budget units (exact integers), padding = beyond every real cost
    err: np.ndarray  # float64, padding = +inf
    keep: list[np.ndarray]  # per row: original option index of each column
    width: np.ndarray  # per row: number of real columns

    def picked(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.arange(len(idx))
        return self.cost[rows, idx], self.err[rows, idx]


def _pad(options: Sequence[_Options], unit: int) -> _Padded:
    """Sort by cost and drop dominated candidates (no cheaper-or-equal one is as good)."""
    keep = []
    for opt in options:
        order = np.lexsort((opt.errors, opt.costs))
        errs = opt.errors[order]
        best_before = np.minimum.accumulate(np.concatenate(([np.inf], errs[:-1])))
        keep.append(order[errs < best_before])
    width = np.array([len(k) for k in keep])
    n_rows, n_cols = len(options), int(width.max())
    cost = np.empty((n_rows, n_cols))
    err = np.full((n_rows, n_cols), np.inf)
    top = max(int(o.costs.max()) for o in options) // unit + 1
    for i, (opt, k) in enumerate(zip(options, keep, strict=True)):
        cost[i, : len(k)] = opt.costs[k] // unit
        cost[i, len(k):] = top
        err[i, : len(k)] = opt.errors[k]
    return _Padded(cost, err, keep, width)


def solve(options: Sequence[_Options], budget: int, work_limit: int
           ) -> tuple[list[int], float, bool]:
    """Option index per matrix, the Lagrangian lower bound, and whether the picks are proven
    optimal (False: the DP would have needed more than ``work_limit`` cells)."""
    unit = cost_unit(options)
    pad = _pad(options, unit)
    cap = budget // unit  # all costs are multiples of unit, so this loses nothing
    rows = np.arange(len(options))
    last = pad.width - 1
    if pad.cost[rows, last].sum() <= cap:  # everything at its best fits: nothing to trade
        best = pad.err[rows, last]
        return _original(pad, last), float(best.sum()), True
    lam, incumbent = _lagrange(pad, cap)
    incumbent = _fill_any(pad, incumbent, cap)
    reduced = pad.err + lam * pad.cost
    best = reduced.min(axis=1, keepdims=True)
    bound = float(best.sum() - lam * cap)  # L(lam): a lower bound whatever lam is
    reduced -= best
    gap = max(float(pad.picked(incumbent)[1].sum()) - bound, 0.0)
    tol = 1e-9 * (abs(bound) + gap) + 1e-300
    alive = reduced <= gap + tol
    idx = np.argmax(alive, axis=1)  # lowest surviving column: final for single-survivor rows
    items = _items(pad, alive, reduced, lam, gap + tol)
    room = cap - int(pad.picked(idx)[0].sum())
    # The objective is L(lam) + sum of reduced costs + lam * (unspent units), so a plan that
    # leaves more than (gap / lam) units unspent cannot beat the incumbent.
    lowest = max(0, math.ceil(room - (gap + tol) / lam) - 1)
    cells, table = _dp_size(items, room, lowest)
    if cells > work_limit or table > TABLE_LIMIT:
        return _original(pad, incumbent), bound, False
    picks = _dp(items, room, lowest)
    for item, k in zip(items, picks, strict=True):
        for row, col in item.expand(k):
            idx[row] = col
    return _original(pad, idx), bound, True


def _original(pad: _Padded, idx: np.ndarray) -> list[int]:
    return [int(pad.keep[i][j]) for i, j in enumerate(idx)]


def _lagrange(pad: _Padded, cap: int) -> tuple[float, np.ndarray]:
    """The LP relaxation's multiplier, and a greedy feasible incumbent (column per row).

    The LP of a multi-choice knapsack walks every row's lower convex hull: segments taken in
    order of falling efficiency (error saved per unit) until the budget splits one. That
    split efficiency is the optimal multiplier lam, and L(lam) = sum_i min_j (e_ij + lam c_ij)
    - lam cap is the LP value, the best Lagrangian bound.
    """
    row, head, tail = _hull_segments(pad)
    d_cost = pad.cost[row, tail] - pad.cost[row, head]
    d_err = pad.err[row, head] - pad.err[row, tail]
    # Efficiencies fall along each row's hull; clamp rounding noise so that the stable sort
    # never puts a row's later segment before its earlier one.
    eff = d_err / d_cost
    bounds = np.flatnonzero(np.r_[True, row[1:] != row[:-1], True])
    for a, b in itertools.pairwise(bounds):
        eff[a:b] = np.minimum.accumulate(eff[a:b])
    order = np.argsort(-eff, kind="stable")
    left = cap - pad.cost[:, 0].sum() - np.cumsum(d_cost[order])
    split = int(np.argmax(left < 0))  # the caller has checked that not everything fits
    lam = float(eff[order[split]])
    idx = np.zeros(pad.cost.shape[0], dtype=np.int64)
    taken = order[:split]
    np.maximum.at(idx, row[taken], tail[taken])
    hull = _Hull(row, head, tail, d_cost, order, split)
    tries = [np.zeros_like(idx)]  # all cheapest: feasible, the caller checked
    if pad.picked(idx)[0].sum() <= cap:
        tries.append(_greedy_fill(pad, hull, idx, int(cap - pad.picked(idx)[0].sum())))
    dropped = _drop_to_fit(pad, hull, idx, cap)
    if dropped is not None:
        tries.append(_greedy_fill(pad, hull, *dropped))
    feasible = [t for t in tries if pad.picked(t)[0].sum() <= cap]
    return lam, min(feasible, key=lambda t: pad.picked(t)[1].sum())


@dataclass
class _Hull:
    """Hull segments (row, from column, to column, cost) and their order of efficiency."""

    row: np.ndarray
    head: np.ndarray
    tail: np.ndarray
    d_cost: np.ndarray
    order: np.ndarray
    split: int


def _drop_to_fit(pad: _Padded, hull: _Hull, idx: np.ndarray, cap: int
                 ) -> tuple[np.ndarray, int] | None:
    """The other rounding of the LP: take the split segment whole, then give back the least
    efficient segments taken (each row's last first) until the budget holds again."""
    s = hull.order[hull.split]
    idx = idx.copy()
    idx[hull.row[s]] = hull.tail[s]
    over = pad.picked(idx)[0].sum() - cap
    back = hull.order[: hull.split][::-1]
    back = back[hull.row[back] != hull.row[s]]
    freed = np.cumsum(hull.d_cost[back])
    enough = int(np.searchsorted(freed, over))  # first prefix that frees `over` units
    if enough >= len(back):
        return None
    for t in back[: enough + 1]:
        idx[hull.row[t]] = hull.head[t]
    return idx, int(cap - pad.picked(idx)[0].sum())


def _hull_segments(pad: _Padded) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, from column, to column) of every lower-convex-hull segment.

    Rows whose points are convex, or convex but for the last one (aligned ranks then the dense
    option: the common case), are done in bulk; any other row by a monotone chain. A vertex that
    is off the hull by rounding noise only moves the bound by as much, which the 1e-9 tolerance
    of the fixing step absorbs.
    """
    n_rows, n_cols = pad.cost.shape
    rows = np.arange(n_rows)
    last = pad.width - 1
    on_hull = np.zeros((n_rows, n_cols), dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = (pad.err[:, :-1] - pad.err[:, 1:]) / (pad.cost[:, 1:] - pad.cost[:, :-1])
        to_last = (pad.err - pad.err[rows, last][:, None]) / (
            pad.cost[rows, last][:, None] - pad.cost)
    cols = np.arange(n_cols)
    real_step = cols[None, :-1] < last[:, None] - 1  # steps among columns 0..last-1
    rising = (eff[:, 1:] > eff[:, :-1] * (1 + 1e-12)) & real_step[:, 1:]
    convex_head = ~rising.any(axis=1)
    to_last = np.where(cols[None, :] < last[:, None], to_last, np.inf)
    knee = np.argmin(to_last, axis=1)  # last hull vertex before the final point
    for i in rows:
        if convex_head[i]:
            on_hull[i, : knee[i] + 1] = True
            on_hull[i, last[i]] = True
        else:
            end = last[i] + 1
            on_hull[i, _monotone_chain(pad.cost[i, :end], pad.err[i, :end])] = True
    r, c = np.nonzero(on_hull)
    same = r[1:] == r[:-1]
    return r[1:][same], c[:-1][same], c[1:][same]


def _monotone_chain(cost: np.ndarray, err: np.ndarray) -> list[int]:
    """Lower hull of points sorted by cost (Andrew's monotone chain)."""
    hull: list[int] = []
    for j in range(len(cost)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            turn = (cost[b] - cost[a]) * (err[j] - err[a]) - (err[b] - err[a]) * (cost[j] - cost[a])
            if turn > 0:
                break
            hull.pop()
        hull.append(j)
    return hull


def _greedy_fill(pad: _Padded, hull: _Hull, idx: np.ndarray, slack: int) -> np.ndarray:
    """The classic MCKP greedy: keep taking a row's next hull segment, best efficiency first,
    while one fits. Only the solver's speed (never its optimum) depends on this incumbent."""
    idx = idx.copy()
    nxt = np.full(pad.cost.shape, -1)
    nxt[hull.row, hull.head] = np.arange(len(hull.row))
    eff = np.empty(len(hull.row))
    eff[hull.order] = -np.arange(len(hull.order), dtype=np.float64)  # rank by efficiency
    rows = np.arange(len(idx))
    for _ in range(10_000):
        seg = nxt[rows, idx]
        ok = (seg >= 0) & (hull.d_cost[seg] <= slack)
        if not ok.any():
            break
        i = int(np.argmax(np.where(ok, eff[seg], -np.inf)))
        slack -= int(hull.d_cost[seg[i]])
        idx[i] = hull.tail[seg[i]]
    return idx


def _fill_any(pad: _Padded, idx: np.ndarray, cap: int) -> np.ndarray:
    """Spend what the incumbent leaves unspent on the single move that saves the most error,
    over every candidate (the greedy moves along hull vertices only, so a row whose next hull
    vertex is far, e.g. dense after a flat run of ranks, would otherwise keep its slack)."""
    idx = idx.copy()
    for _ in range(FILL_MOVES):
        cur_cost, cur_err = pad.picked(idx)
        slack = cap - cur_cost.sum()
        extra = pad.cost - cur_cost[:, None]
        gain = np.where((extra > 0) & (extra <= slack), cur_err[:, None] - pad.err, 0.0)
        flat = int(np.argmax(gain))
        if gain.flat[flat] <= 0:
            break
        row, col = divmod(flat, pad.cost.shape[1])
        idx[row] = col
    return idx


# ----------------------------------------------------------------------------- DP items

@dataclass
class _Item:
    """A unit of the final DP: options with costs relative to a base, and how to expand one."""

    costs: np.ndarray  # int64 units above the base
    errors: np.ndarray
    rows: np.ndarray  # the matrices it decides
    base_cols: np.ndarray  # column of each row at option 0
    order: np.ndarray | None = None  # group: row position of each successive step

    def expand(self, k: int) -> list[tuple[int, int]]:
        if self.order is None:  # a single irregular matrix: option k is a column list entry
            return [(int(self.rows[0]), int(self.base_cols[k]))]
        steps = np.bincount(self.order[:k], minlength=len(self.rows))
        return [(int(r), int(c + s)) for r, c, s in zip(self.rows, self.base_cols, steps,
                                                        strict=True)]


def _items(pad: _Padded, alive: np.ndarray, reduced: np.ndarray, lam: float,
           limit: float) -> list[_Item]:
    """Rows with more than one surviving column, as DP items: evenly spaced convex runs merge
    per step size; any other band stays a one-row item. Costs are above the lowest survivor."""
    groups: dict[int, list[int]] = {}
    items: list[_Item] = []
    for i in np.flatnonzero(alive.sum(axis=1) > 1):
        cols = np.flatnonzero(alive[i])
        c, e = pad.cost[i, cols].astype(np.int64), pad.err[i, cols]
        steps, gains = np.diff(c), -np.diff(e)
        if np.all(np.diff(cols) == 1) and np.all(steps == steps[0]) and np.all(
                np.diff(gains) <= 0):
            groups.setdefault(int(steps[0]), []).append(i)
        else:
            items.append(_Item(c - c[0], e, np.array([i]), cols))
    for step, members in groups.items():
        items.append(_group(pad, alive, reduced, members, step, lam, limit))
    # Small items first: the DP window is widest in the middle, so the big merged groups
    # go last, where the window has narrowed to what the bound allows.
    items.sort(key=lambda it: int(it.costs[-1]))
    return items


def _group(pad: _Padded, alive: np.ndarray, reduced: np.ndarray, members: list[int],
           step: int, lam: float, limit: float) -> _Item:
    """Exact merge of convex, equal-step matrices: k steps are best spent on the k largest
    marginal gains overall (separable convex allocation), so the group is one DP item."""
    base_cols, gains, owner = [], [], []
    base_err = 0.0
    base_reduced = 0.0
    for pos, i in enumerate(members):
        cols = np.flatnonzero(alive[i])
        base_cols.append(cols[0])
        base_err += pad.err[i, cols[0]]
        base_reduced += reduced[i, cols[0]]
        g = -np.diff(pad.err[i, cols])
        gains.append(g)
        owner.append(np.full(len(g), pos))
    g_all, owner_all = np.concatenate(gains), np.concatenate(owner)
    order = np.argsort(-g_all, kind="stable")
    errors = base_err - np.concatenate(([0.0], np.cumsum(g_all[order])))
    k = np.arange(len(errors))
    # Reduced-cost fixing at group level: a group total whose bound exceeds the incumbent
    # cannot be optimal. Its reduced cost is base + lam * k * step - gains, relative to the
    # members' minima.
    group_reduced = base_reduced + lam * step * k - (base_err - errors)
    usable = np.flatnonzero(group_reduced <= limit)
    lo_k, hi_k = int(usable.min()), int(usable.max())
    if lo_k > 0:  # rebase on the first usable total
        base_cols = [c + s for c, s in zip(base_cols, np.bincount(owner_all[order[:lo_k]],
                                                                  minlength=len(members)),
                                           strict=True)]
    return _Item(step * k[lo_k: hi_k + 1], errors[lo_k: hi_k + 1],
                 np.array(members), np.array(base_cols), owner_all[order[lo_k:]])


def _windows(items: list[_Item], room: int, lowest: int) -> list[tuple[int, int]]:
    """Per DP stage, the spent units that can still end in [lowest, room]."""
    widest = [int(it.costs[-1]) for it in items]
    after = list(itertools.accumulate(reversed(widest[1:]), initial=0))[::-1]
    before = list(itertools.accumulate(widest))
    return [(max(0, lowest - a), min(b, room)) for a, b in zip(after, before, strict=True)]


def _dp_size(items: list[_Item], room: int, lowest: int) -> tuple[int, int]:
    """What :func:`_dp` would cost, counted without running it: cells touched (each option's
    reachable part of each window, plus a fixed charge per option for the loop itself) and
    bytes (the backtracking tables it keeps and its widest float rows)."""
    cells, table, widest, f_lo, f_hi = 0, 0, 0, 0, 0
    for it, (lo, hi) in zip(items, _windows(items, room, lowest), strict=True):
        a = np.maximum(lo, f_lo + it.costs)
        b = np.minimum(hi, f_hi + it.costs)
        cells += int(np.maximum(b - a + 1, 0).sum()) + OPTION_CELLS * len(it.costs)
        table += (hi - lo + 1) * np.min_scalar_type(len(it.costs)).itemsize
        widest = max(widest, hi - lo + 1)
        f_lo, f_hi = lo, hi
    return cells, table + 4 * 8 * widest  # + the float rows alive at once


def _dp(items: list[_Item], room: int, lowest: int) -> list[int]:
    """Min-plus DP over spent units, kept to the window that can still end in [lowest, room]."""
    f = np.zeros(1)
    f_lo = 0
    choices: list[tuple[int, np.ndarray]] = []
    for it, (lo, hi) in zip(items, _windows(items, room, lowest), strict=True):
        g = np.full(hi - lo + 1, np.inf)
        arg = np.zeros(hi - lo + 1, dtype=np.min_scalar_type(len(it.costs)))
        f_hi = f_lo + len(f) - 1
        for j, (w, e) in enumerate(zip(it.costs.tolist(), it.errors.tolist(), strict=True)):
            a, b = max(lo, f_lo + w), min(hi, f_hi + w)  # targets reachable with option j
            if a > b:
                continue
            cand = f[a - w - f_lo: b - w - f_lo + 1] + e
            seg = g[a - lo: b - lo + 1]
            better = cand < seg
            seg[better] = cand[better]
            arg[a - lo: b - lo + 1][better] = j
        choices.append((lo, arg))
        f, f_lo = g, lo
    end = int(np.argmin(f)) + f_lo
    assert np.isfinite(f[end - f_lo]), "DP found no feasible completion (bound too tight)"
    picks = []
    for it, (lo, arg) in zip(reversed(items), reversed(choices), strict=True):
        j = int(arg[end - lo])
        picks.append(j)
        end -= int(it.costs[j])
    return picks[::-1]
