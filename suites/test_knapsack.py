"""Properties of the exact rank re-selection (GAC knapsack), on generated instances.

The oracles are independent of the solver's own arithmetic: a plain DP over the whole budget
with its own candidate list (every aligned rank up to full rank, plus dense) and errors taken
from numpy's SVD; explicit truncated reconstructions for the errors a plan reports; scipy's
MILP (HiGHS) on the same instance. Each of these bugs turns the suite red (checked by hand;
benchmarks/RESULTS.md, "Knapsack mutants"): an off-by-one in the budget comparison, a candidate
list without its last multiple, no dense option, singular values used unsquared.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gac_check.errors import BadInput
from gac_check.ranks.knapsack import (
    DENSE,
    WORK_LIMIT,
    budget_from_ranks,
    build_options,
    realign_plan,
)
from gac_check.testing.knapsack import (
    Instance,
    family_instances,
    instances,
    nearest,
    round_down,
    round_up,
    solve_bruteforce,
    solve_milp,
)

CI = settings.get_profile("ci")  # registered by the repository's conftest.py
REL = 1e-9


def _close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= REL * max(abs(b), 1e-12 * scale, 1e-300)


def _energy(inst: Instance) -> float:
    return sum(float(np.sum(w * w)) for w in inst.weights.values())


def reference_optimum(inst: Instance) -> float:
    """Plain DP over the budget in gcd units, from first principles (no solver code)."""
    classes = []
    for name, w in inst.weights.items():
        m, n = w.shape
        s = np.linalg.svd(w, compute_uv=False)
        opts = [(r * (m + n), float(np.sum(s[r:] ** 2)))
                for r in range(inst.align, min(m, n) + 1, inst.align)]
        if inst.allow_dense:
            opts.append((m * n, 0.0))
        classes.append((name, opts))
    unit = math.gcd(*(c for _, opts in classes for c, _ in opts))
    cap = inst.budget // unit
    best = np.zeros(cap + 1)  # best[c]: least error of the classes so far within c units
    for _, opts in classes:
        nxt = np.full(cap + 1, np.inf)
        for cost, err in opts:
            w = cost // unit
            if w <= cap:
                nxt[w:] = np.minimum(nxt[w:], best[: cap + 1 - w] + err)
        best = nxt
    return float(best[cap])


def truncation_error(w: np.ndarray, rank: int | str) -> float:
    """||W - W_r||_F^2 of the best rank-r approximation, reconstructed explicitly."""
    if rank == DENSE:
        return 0.0
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    approx = (u[:, :rank] * s[:rank]) @ vt[:rank]
    return float(np.sum((w - approx) ** 2))


@settings(CI, max_examples=60)
@given(instances(max_matrices=10, max_dim=40))
def test_plan_is_within_budget_aligned_and_reports_real_errors(inst: Instance) -> None:
    plan = realign_plan(inst.matrices, inst.budget, inst.align, allow_dense=inst.allow_dense)
    assert plan.total_params <= inst.budget
    assert plan.total_params == budget_from_ranks(inst.matrices, plan.ranks)
    assert plan.aligned(inst.align) and plan.optimal
    for c in plan.choices:
        assert c.dense or inst.align <= c.rank <= min(c.m, c.n)
        assert inst.allow_dense or not c.dense
        w = inst.weights[c.name]
        assert abs(c.error - truncation_error(w, c.rank)) <= REL * float(np.sum(w * w)) + 1e-12
    assert plan.lower_bound <= plan.objective * (1 + REL) + 1e-12


@settings(CI, max_examples=60)
@given(instances(max_matrices=4, max_dim=20))
def test_equals_brute_force_and_first_principles_on_tiny_instances(inst: Instance) -> None:
    plan = realign_plan(inst.matrices, inst.budget, inst.align, allow_dense=inst.allow_dense)
    brute = solve_bruteforce(inst.matrices, inst.budget, inst.align,
                             allow_dense=inst.allow_dense)
    assert _close(plan.objective, brute.objective, _energy(inst))
    assert _close(plan.objective, reference_optimum(inst), _energy(inst))


@settings(CI, max_examples=40)
@given(instances(max_matrices=24, max_dim=64, aligns=(4, 8), max_shapes=2))
def test_equals_first_principles_when_many_matrices_share_a_shape(inst: Instance) -> None:
    """Many same-shape matrices: the path where the solver merges equal-step bands."""
    plan = realign_plan(inst.matrices, inst.budget, inst.align, allow_dense=inst.allow_dense)
    assert plan.total_params <= inst.budget
    assert _close(plan.objective, reference_optimum(inst), _energy(inst))


@settings(CI, max_examples=30)
@given(instances(max_matrices=6, max_dim=48, aligns=(2, 4, 8),
                 kinds=("random", "power", "steep")))
def test_equals_milp(inst: Instance) -> None:
    """HiGHS on the same 0/1 model. Distinct spectra only: exact ties make its branch and bound
    crawl, and the first-principles DP covers ties."""
    plan = realign_plan(inst.matrices, inst.budget, inst.align, allow_dense=inst.allow_dense)
    milp = solve_milp(inst.matrices, inst.budget, inst.align, allow_dense=inst.allow_dense,
                      time_limit=30)
    assert milp.total_params <= inst.budget
    assert plan.objective <= milp.objective * (1 + REL) + 1e-12 * _energy(inst)
    if milp.optimal:
        assert _close(plan.objective, milp.objective, _energy(inst))


@settings(CI, max_examples=60)
@given(instances(max_matrices=10, max_dim=48))
def test_never_worse_than_naive_rounding_that_fits(inst: Instance) -> None:
    budget = budget_from_ranks(inst.matrices, inst.ranks)
    try:
        plan = realign_plan(inst.matrices, budget, inst.align)
    except BadInput:  # a budget below the cheapest aligned choice: nothing to compare
        return
    for naive in (round_down, round_up, nearest):
        rounded = naive(inst.matrices, inst.ranks, inst.align)
        assert rounded.budget == budget
        if rounded.within_budget:
            assert plan.objective <= rounded.objective * (1 + REL) + 1e-12 * _energy(inst)


@settings(CI, max_examples=40)
@given(instances(max_matrices=8, max_dim=40), st.integers(0, 10_000))
def test_more_budget_never_hurts(inst: Instance, extra: int) -> None:
    tight = realign_plan(inst.matrices, inst.budget, inst.align, allow_dense=inst.allow_dense)
    loose = realign_plan(inst.matrices, inst.budget + extra, inst.align,
                         allow_dense=inst.allow_dense)
    assert loose.objective <= tight.objective * (1 + REL) + 1e-12 * _energy(inst)


def _check_against(plan, best: float, scale: float, align: int, budget: int) -> None:
    """A plan is feasible and aligned; its bound and gap are true; if optimal, it is best."""
    tol = REL * max(abs(best), 1e-12 * scale, 1e-300)
    assert plan.total_params <= budget and plan.aligned(align)
    assert plan.objective >= best - tol
    assert plan.lower_bound <= best + tol
    assert plan.objective - plan.gap <= best + tol
    if plan.optimal:
        assert plan.gap == 0.0 and _close(plan.objective, best, scale)


@settings(CI, max_examples=40)
@given(family_instances())
def test_hard_families_are_optimal_or_certified(inst: Instance) -> None:
    """Flat, near-equal, coprime-cost and alignment-2 instances (issue 13), and their mixes,
    against the first-principles DP and, where few enough, brute force: the default solver and
    one forced past its work limit (``work_limit=0``: no DP at all, the incumbent and its
    certified gap) are both right about what they claim."""
    best = reference_optimum(inst)
    options = build_options(inst.matrices, inst.align)
    if math.prod(len(o.costs) for o in options) <= 50_000:
        brute = solve_bruteforce(inst.matrices, inst.budget, inst.align)
        assert _close(brute.objective, best, _energy(inst))
    for limit in (WORK_LIMIT, 0):
        plan = realign_plan(inst.matrices, inst.budget, inst.align, work_limit=limit)
        _check_against(plan, best, _energy(inst), inst.align, inst.budget)


@settings(CI, max_examples=15)
@given(family_instances(max_layers=1))
def test_hard_families_agree_with_milp(inst: Instance) -> None:
    """HiGHS on the same families; where it proves its optimum, ours is no worse and, when
    ours claims optimality, equal."""
    milp = solve_milp(inst.matrices, inst.budget, inst.align, time_limit=20)
    assert milp.total_params <= inst.budget
    if milp.optimal:
        plan = realign_plan(inst.matrices, inst.budget, inst.align)
        _check_against(plan, milp.objective, _energy(inst), inst.align, inst.budget)
