"""Multi-choice knapsack rank re-selection (GAC) under a parameter budget: the instance.

A compressor picks per-matrix ranks such as 107 or 1131 that GPUs run slowly. Padding them to
an aligned size spends memory; re-selecting aligned ranks under the compressor's own parameter
budget keeps the memory and moves the approximation error to where it costs least. Per matrix
``i`` (shape ``m x n``) we choose one candidate: an aligned rank ``r`` (cost ``r (m + n)``
parameters, error = the discarded squared singular values ``sum_{k > r} s_k^2``) or keeping the
matrix dense (cost ``m n``, error 0), minimising the total error subject to the total cost
staying within the budget.

Rank 0 is never a candidate: a rank must be at least ``align``. Deleting a matrix changes the
architecture (most loaders cannot build a zero-width factor), which is not a re-selection.
Ranks whose factors hold at least as many parameters as the dense matrix are not candidates
either when the dense option is allowed: dense is then cheaper and exact.

This module holds the nouns (matrices, choices, plans), the budgets and the candidate menus;
the exact solver that picks among them is :mod:`gac_check.ranks.knapsack_solver`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gac_check.errors import BadInput
from gac_check.ranks.knapsack_solver import WORK_LIMIT, solve

DENSE = "dense"
DEFAULT_ALIGN = 8

Rank = int | str  # an int rank, or DENSE


@dataclass(eq=False)
class Matrix:
    """One low-rank site: its dense shape and how much value each rank keeps.

    Give either ``sv`` (singular values of the dense weight, or of an activation-scaled weight
    for an activation-aware objective) or ``retained`` (the value kept at each rank
    ``0..min(m, n)``, nondecreasing, ``retained[0] == 0``). Values beyond ``len(sv)`` are zero.
    """

    name: str
    m: int
    n: int
    sv: np.ndarray | None = None
    retained: np.ndarray | None = None
    error_curve: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.m, int) and isinstance(self.n, int)) or self.m < 1 or self.n < 1:
            raise BadInput(f"matrix {self.name!r}: shape must be positive ints, got "
                           f"{self.m!r} x {self.n!r}")
        if (self.sv is None) == (self.retained is None):
            raise BadInput(f"matrix {self.name!r}: give exactly one of sv or retained")
        self.error_curve = (self._curve_from_sv() if self.sv is not None
                            else self._curve_from_retained())

    @property
    def full_rank(self) -> int:
        return min(self.m, self.n)

    @property
    def dense_params(self) -> int:
        return self.m * self.n

    def params(self, rank: Rank) -> int:
        return self.dense_params if rank == DENSE else int(rank) * (self.m + self.n)

    def error(self, rank: Rank) -> float:
        """Discarded value at ``rank`` (0 when dense or at full rank)."""
        if rank == DENSE:
            return 0.0
        return float(self.error_curve[min(int(rank), self.full_rank)])

    @property
    def energy(self) -> float:
        """Total value (the error of rank 0); retained = energy - error."""
        return float(self.error_curve[0])

    def max_useful_rank(self) -> int:
        """Largest rank whose factors are still smaller than the dense matrix."""
        return min(self.full_rank, (self.dense_params - 1) // (self.m + self.n))

    def _curve_from_sv(self) -> np.ndarray:
        s = np.asarray(self.sv, dtype=np.float64).ravel()
        if s.size > self.full_rank or not np.all(np.isfinite(s)) or np.any(s < 0):
            raise BadInput(f"matrix {self.name!r}: singular values must be finite, >= 0 and at "
                           f"most min(m, n) = {self.full_rank} of them")
        energy = np.zeros(self.full_rank, dtype=np.float64)
        energy[: s.size] = np.sort(s)[::-1] ** 2
        # Suffix sums directly (not total - prefix) so small tails keep their precision.
        curve = np.zeros(self.full_rank + 1, dtype=np.float64)
        curve[:-1] = np.cumsum(energy[::-1])[::-1]
        return curve

    def _curve_from_retained(self) -> np.ndarray:
        v = np.asarray(self.retained, dtype=np.float64).ravel()
        if (v.size != self.full_rank + 1 or not np.all(np.isfinite(v)) or v[0] != 0
                or np.any(np.diff(v) < 0)):
            raise BadInput(f"matrix {self.name!r}: retained must have min(m, n) + 1 = "
                           f"{self.full_rank + 1} finite nondecreasing values starting at 0")
        return v[-1] - v


@dataclass(frozen=True)
class Choice:
    """What one matrix became: a rank (or DENSE), its parameters and its error."""

    name: str
    m: int
    n: int
    rank: Rank
    params: int
    error: float
    retained: float

    @property
    def dense(self) -> bool:
        return self.rank == DENSE


@dataclass(frozen=True)
class RankPlan:
    """A rank per matrix, with the budget it was chosen under and how it was chosen.

    ``lower_bound`` is a proven bound on the best objective (the Lagrangian bound for the exact
    solver); ``optimal`` says whether the method proves this plan is a best one. When it is not
    (the solver's work limit was reached), :attr:`gap` bounds how much better a plan can be.
    """

    choices: tuple[Choice, ...]
    budget: int
    method: str
    optimal: bool
    lower_bound: float | None = None

    @property
    def total_params(self) -> int:
        return sum(c.params for c in self.choices)

    @property
    def objective(self) -> float:
        """Total discarded value (sum of per-matrix errors): what the knapsack minimises."""
        return math.fsum(c.error for c in self.choices)

    @property
    def retained(self) -> float:
        return math.fsum(c.retained for c in self.choices)

    @property
    def gap(self) -> float | None:
        """Proven bound on objective - optimum: 0 when optimal, None without a lower bound."""
        if self.optimal:
            return 0.0
        if self.lower_bound is None:
            return None
        return max(self.objective - self.lower_bound, 0.0)

    @property
    def relative_gap(self) -> float | None:
        """:attr:`gap` as a fraction of the objective (0 for a zero objective)."""
        gap = self.gap
        if gap is None:
            return None
        return gap / self.objective if self.objective > 0 else 0.0

    @property
    def within_budget(self) -> bool:
        return self.total_params <= self.budget

    @property
    def ranks(self) -> dict[str, Rank]:
        return {c.name: c.rank for c in self.choices}

    def aligned(self, align: int) -> bool:
        return all(c.dense or c.rank % align == 0 for c in self.choices)

    def as_dict(self) -> dict:
        return {
            "method": self.method, "budget": self.budget, "total_params": self.total_params,
            "objective": self.objective, "lower_bound": self.lower_bound,
            "optimal": self.optimal, "gap": self.gap, "relative_gap": self.relative_gap,
            "choices": [{"name": c.name, "m": c.m, "n": c.n, "rank": c.rank,
                         "params": c.params, "error": c.error} for c in self.choices],
        }


# ----------------------------------------------------------------------------- budgets

def budget_from_ranks(matrices: Sequence[Matrix], ranks: Mapping[str, Rank]) -> int:
    """Parameter count of the given ranks (``--budget same``: the compressor's own choice)."""
    missing = [mat.name for mat in matrices if mat.name not in ranks]
    if missing:
        raise BadInput(f"no rank given for matrix {missing[0]!r} ({len(missing)} missing)")
    for mat in matrices:
        r = ranks[mat.name]
        if r != DENSE and (not isinstance(r, int | np.integer) or r < 1):
            raise BadInput(f"matrix {mat.name!r}: rank must be a positive int or "
                           f"{DENSE!r}, got {r!r}")
    return sum(mat.params(ranks[mat.name]) for mat in matrices)


def budget_from_fraction(matrices: Sequence[Matrix], fraction: float) -> int:
    """A fraction of the dense parameter count (``--budget 0.5``); above 1 is allowed here
    (every matrix may stay dense), the command line's spec is not (:func:`budget_fraction`)."""
    if not math.isfinite(fraction) or fraction <= 0:
        raise BadInput(f"budget fraction must be a positive number, got {fraction!r}")
    return math.floor(fraction * sum(mat.dense_params for mat in matrices))


def budget_fraction(spec: str) -> float | None:
    """``--budget same|FLOAT`` as the fraction it names (None: ``same``), refused unless it is
    in (0, 1]: ``--budget 2`` is likelier a typo for 0.2 than a wish for twice the dense
    model."""
    if spec == "same":
        return None
    try:
        fraction = float(spec)
    except ValueError:
        raise BadInput(f"--budget must be 'same' or a fraction of the dense model, got "
                       f"{spec!r}") from None
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise BadInput(f"--budget {spec} is not a fraction in (0, 1] of the dense model's "
                       "low-rank matrices (0.2 is a fifth; above 1 would store more than the "
                       "dense model)")
    return fraction


def budget_from_spec(spec: str, matrices: Sequence[Matrix],
                     ranks: Mapping[str, Rank] | None = None) -> int:
    """Parse ``--budget same|FLOAT``: ``same`` needs the compressor's ranks."""
    fraction = budget_fraction(spec)
    if fraction is None:
        if ranks is None:
            raise BadInput("--budget same needs the input model's ranks")
        return budget_from_ranks(matrices, ranks)
    return budget_from_fraction(matrices, fraction)


# ----------------------------------------------------------------------------- candidates

def candidate_ranks(matrix: Matrix, align: int = DEFAULT_ALIGN,
                    allow_dense: bool = True) -> list[Rank]:
    """Aligned ranks from ``align`` up to the largest useful one, then DENSE if allowed."""
    top = matrix.max_useful_rank() if allow_dense else matrix.full_rank
    ranks: list[Rank] = list(range(align, top + 1, align))
    if allow_dense:
        ranks.append(DENSE)
    return ranks


DENSE_CODE = -1


@dataclass(frozen=True)
class _Options:
    """One matrix's candidates as arrays: what the solvers actually see."""

    ranks: np.ndarray  # int64, DENSE_CODE for the dense option
    costs: np.ndarray  # int64 parameters
    errors: np.ndarray  # float64

    def rank(self, j: int) -> Rank:
        return DENSE if self.ranks[j] == DENSE_CODE else int(self.ranks[j])


def _check_custom(matrix: Matrix, ranks: Sequence[Rank], align: int) -> list[Rank]:
    checked: list[Rank] = []
    for r in ranks:
        if r == DENSE:
            checked.append(DENSE)
        elif (isinstance(r, int | np.integer) and not isinstance(r, bool)
              and 1 <= r <= matrix.full_rank and r % align == 0):
            checked.append(int(r))
        else:
            raise BadInput(f"matrix {matrix.name!r}: candidate {r!r} is not {DENSE!r} or a "
                           f"multiple of {align} in 1..{matrix.full_rank}")
    if not checked:
        raise BadInput(f"matrix {matrix.name!r}: empty candidate set")
    return list(dict.fromkeys(checked))


def build_options(matrices: Sequence[Matrix], align: int = DEFAULT_ALIGN,
                  candidates: Mapping[str, Sequence[Rank]] | None = None,
                  allow_dense: bool = True) -> list[_Options]:
    """The instance every solver receives: per matrix, candidate ranks, costs and errors."""
    if not isinstance(align, int) or align < 1:
        raise BadInput(f"alignment must be a positive int, got {align!r}")
    names = [mat.name for mat in matrices]
    if len(set(names)) != len(names):
        raise BadInput("matrix names must be unique")
    if candidates is not None and set(candidates) - set(names):
        raise BadInput(f"candidates given for unknown matrix "
                       f"{sorted(set(candidates) - set(names))[0]!r}")
    out = []
    for mat in matrices:
        if candidates is not None and mat.name in candidates:
            custom = _check_custom(mat, candidates[mat.name], align)
            ranks = np.array([DENSE_CODE if r == DENSE else r for r in custom], np.int64)
        else:
            top = mat.max_useful_rank() if allow_dense else mat.full_rank
            ranks = np.arange(align, top + 1, align, dtype=np.int64)
            if allow_dense:
                ranks = np.append(ranks, DENSE_CODE)
        if not len(ranks):
            raise BadInput(f"matrix {mat.name!r} ({mat.m} x {mat.n}) has no rank that is a "
                           f"multiple of {align} and the dense option is off")
        out.append(options_for(mat, ranks))
    return out


def options_for(mat: Matrix, ranks: np.ndarray) -> _Options:
    dense = ranks == DENSE_CODE
    costs = np.where(dense, mat.dense_params, ranks * (mat.m + mat.n)).astype(np.int64)
    errors = np.where(dense, 0.0, mat.error_curve[np.where(dense, 0, ranks)])
    return _Options(ranks, costs, errors.astype(np.float64))


def plan_from_picks(matrices: Sequence[Matrix], options: Sequence[_Options], picks: Sequence[int],
          budget: int, method: str, optimal: bool, lower_bound: float | None = None) -> RankPlan:
    choices = []
    for mat, opt, j in zip(matrices, options, picks, strict=True):
        err = float(opt.errors[j])
        choices.append(Choice(mat.name, mat.m, mat.n, opt.rank(j), int(opt.costs[j]), err,
                              mat.energy - err))
    return RankPlan(tuple(choices), int(budget), method, optimal, lower_bound)


def check_budget(options: Sequence[_Options], budget: int) -> None:
    cheapest = sum(int(o.costs.min()) for o in options)
    if budget < cheapest:
        raise BadInput(f"budget {budget} parameters is below the smallest feasible choice "
                       f"({cheapest} parameters, every matrix at its smallest candidate)")


# ----------------------------------------------------------------------------- exact solver

def realign_plan(matrices: Sequence[Matrix], budget: int, align: int = DEFAULT_ALIGN,
                 candidates: Mapping[str, Sequence[Rank]] | None = None,
                 allow_dense: bool = True, work_limit: int = WORK_LIMIT) -> RankPlan:
    """Aligned ranks with the least total error and total parameters <= budget: provably
    optimal, or, past ``work_limit`` DP cells, the best plan found with a proven gap.

    ``candidates`` replaces the default set for the matrices it names (e.g. the sizes a
    latency table says are fast); each entry is a multiple of ``align`` or DENSE.
    """
    options = build_options(matrices, align, candidates, allow_dense)
    check_budget(options, budget)
    picks, bound, optimal = solve(options, int(budget), work_limit)
    return plan_from_picks(matrices, options, picks, budget, "knapsack", optimal, bound)

