"""Worked examples and edge cases of gac_check.ranks.knapsack (the properties live in
suites/test_knapsack.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gac_check.errors import BadInput
from gac_check.ranks.knapsack import (
    DENSE,
    Matrix,
    budget_from_fraction,
    budget_from_ranks,
    budget_from_spec,
    candidate_ranks,
    realign_plan,
)
from gac_check.testing.knapsack import nearest, round_down, round_up, solve_bruteforce, solve_milp


def _pair() -> list[Matrix]:
    # a: energies 16, 9, 4, 1 -> rank 2 discards 5.  b: energies 9, 1, 1, 1 -> rank 2 discards 2.
    return [Matrix("a", 8, 8, sv=np.array([4.0, 3, 2, 1])),
            Matrix("b", 8, 8, sv=np.array([3.0, 1, 1, 1]))]


def test_worked_example_spends_the_budget_where_it_saves_most() -> None:
    # align 2, 8x8: rank 2 costs 32 (error as above); rank 4 would cost 64 = dense, so the
    # candidates are {2, dense}. Budget 96: one matrix can stay dense; keeping `a` dense saves
    # 5, keeping `b` dense saves only 2.
    mats = _pair()
    assert budget_from_ranks(mats, {"a": 3, "b": 3}) == 96
    plan = realign_plan(mats, 96, align=2)
    assert plan.ranks == {"a": DENSE, "b": 2}
    assert plan.objective == 2.0 and plan.total_params == 96 and plan.optimal
    assert plan.retained == (30 + 12) - 2
    for other in (solve_milp(mats, 96, align=2), solve_bruteforce(mats, 96, align=2)):
        assert other.ranks == plan.ranks
    assert round_down(mats, {"a": 3, "b": 3}, align=2).objective == 7.0


def test_budget_below_the_cheapest_choice_is_one_clear_line() -> None:
    with pytest.raises(BadInput) as e:
        realign_plan(_pair(), 63, align=2)
    assert "\n" not in str(e.value)
    assert "below the smallest feasible choice (64 parameters" in str(e.value)
    assert realign_plan(_pair(), 64, align=2).ranks == {"a": 2, "b": 2}  # rank 0 never


def test_candidates_stop_where_dense_is_cheaper() -> None:
    k_proj = Matrix("k", 1024, 8192, sv=np.ones(1024))
    ranks = candidate_ranks(k_proj, 8)
    assert ranks[0] == 8 and ranks[-2] == 904 and ranks[-1] == DENSE  # 912 * 9216 > 1024 * 8192
    assert 904 * 9216 < 1024 * 8192 <= 912 * 9216
    assert candidate_ranks(k_proj, 8, allow_dense=False)[-1] == 1024


def test_matrix_narrower_than_the_alignment_can_only_stay_dense() -> None:
    thin = [Matrix("thin", 4, 100, sv=np.ones(4))]
    assert candidate_ranks(thin[0], 8) == [DENSE]
    assert realign_plan(thin, 400, 8).ranks == {"thin": DENSE}
    with pytest.raises(BadInput, match="no rank that is a multiple of 8"):
        realign_plan(thin, 10_000, 8, allow_dense=False)


def test_generous_budget_keeps_everything_dense() -> None:
    plan = realign_plan(_pair(), 10**9, align=2)
    assert plan.ranks == {"a": DENSE, "b": DENSE} and plan.objective == 0.0


def test_budget_helpers() -> None:
    mats = _pair()
    assert budget_from_ranks(mats, {"a": DENSE, "b": 1}) == 64 + 16
    assert budget_from_fraction(mats, 0.5) == 64
    assert budget_from_spec("same", mats, {"a": 2, "b": 2}) == 64
    assert budget_from_spec("0.25", mats) == 32
    for bad in (lambda: budget_from_ranks(mats, {"a": 2}),
                lambda: budget_from_ranks(mats, {"a": 0, "b": 2}),
                lambda: budget_from_fraction(mats, 0.0),
                lambda: budget_from_fraction(mats, float("nan")),
                lambda: budget_from_spec("half", mats),
                lambda: budget_from_spec("same", mats)):
        with pytest.raises(BadInput):
            bad()


def test_naive_rounding_baselines() -> None:
    mats = [Matrix("w", 512, 512, sv=np.linspace(2, 1, 512))]
    assert round_down(mats, {"w": 107}).ranks == {"w": 104}
    assert round_up(mats, {"w": 107}).ranks == {"w": 112}
    assert nearest(mats, {"w": 107}).ranks == {"w": 104}
    assert nearest(mats, {"w": 108}).ranks == {"w": 112}  # ties go up
    assert round_down(mats, {"w": 5}).ranks == {"w": 8}  # never below the alignment
    assert round_up(mats, {"w": 255}).ranks == {"w": DENSE}  # 256 * 1024 = dense: go dense
    plan = round_up(mats, {"w": 107})
    assert plan.budget == 107 * 1024 and not plan.within_budget and not plan.optimal


def test_custom_candidates_are_honoured_and_checked() -> None:
    mats = _pair()
    plan = realign_plan(mats, 96, 2, candidates={"a": [2], "b": [2, DENSE]})
    assert plan.ranks == {"a": 2, "b": DENSE}
    for bad in ({"a": [3]}, {"a": [0]}, {"a": [10]}, {"a": []}, {"c": [2]}, {"a": [True]}):
        with pytest.raises(BadInput):
            realign_plan(mats, 96, 2, candidates=bad)


def test_matrix_input_is_validated() -> None:
    for kwargs in ({"sv": np.array([1.0, -1.0])}, {"sv": np.array([np.nan])},
                   {"sv": np.ones(9)}, {}, {"sv": np.ones(2), "retained": np.zeros(9)},
                   {"retained": np.ones(9)}, {"retained": np.zeros(3)},
                   {"retained": np.array([0, 2, 1, 3, 4, 5, 6, 7, 8.0])}):
        with pytest.raises(BadInput):
            Matrix("w", 8, 8, **kwargs)
    with pytest.raises(BadInput):
        Matrix("w", 0, 8, sv=np.ones(1))


def test_retained_curve_and_singular_values_give_the_same_plan() -> None:
    rng = np.random.default_rng(0)
    s = rng.uniform(0, 1, 24)
    retained = np.concatenate(([0.0], np.cumsum(np.sort(s)[::-1] ** 2)))
    a = realign_plan([Matrix("w", 24, 40, sv=s)], 8 * 64, 4)
    b = realign_plan([Matrix("w", 24, 40, retained=retained)], 8 * 64, 4)
    assert a.ranks == b.ranks and a.objective == pytest.approx(b.objective, rel=1e-12)


def test_plan_serialises() -> None:
    data = json.loads(json.dumps(realign_plan(_pair(), 96, 2).as_dict()))
    assert data["method"] == "knapsack" and data["choices"][0]["rank"] == DENSE


def test_llama_shapes_scaled_down_match_milp() -> None:
    """The 70B layer mix (q/o square, k/v thin, MLP 3.5x) at 1/64 scale, 4 layers."""
    rng = np.random.default_rng(1)
    shapes = [(128, 128), (16, 128), (16, 128), (128, 128), (448, 128), (448, 128), (128, 448)]
    mats = []
    for layer in range(4):
        for j, (m, n) in enumerate(shapes):
            k = np.arange(1, min(m, n) + 1)
            mats.append(Matrix(f"{layer}.{j}", m, n, sv=k ** -rng.uniform(0.2, 0.8)))
    budget = budget_from_fraction(mats, 0.4)
    plan = realign_plan(mats, budget, 8)
    milp = solve_milp(mats, budget, 8, time_limit=60)
    assert plan.total_params <= budget and milp.optimal
    assert plan.objective == pytest.approx(milp.objective, rel=1e-9)
    assert plan.lower_bound <= plan.objective


def test_past_the_work_limit_the_plan_says_how_far_from_optimal_it_can_be() -> None:
    """A flat spectrum (every rank ties; the Lagrangian bound is far below any integer plan):
    with no DP allowed, the incumbent comes back with optimal=False and a gap that the true
    optimum (the default solver's, proven here) lies within."""
    from gac_check.testing.knapsack import llama_instance

    mats, budget, align, _ = llama_instance(1, ("flat",), shapes={"q": (64, 64), "mlp": (224, 64)})
    exact = realign_plan(mats, budget, align)
    capped = realign_plan(mats, budget, align, work_limit=0)
    assert exact.optimal and exact.gap == 0.0 and exact.relative_gap == 0.0
    assert not capped.optimal and capped.within_budget
    assert capped.gap == pytest.approx(capped.objective - capped.lower_bound)
    assert capped.gap > 0 and capped.relative_gap == pytest.approx(capped.gap / capped.objective)
    assert capped.objective - capped.gap <= exact.objective <= capped.objective
    data = json.loads(json.dumps(capped.as_dict()))
    assert data["optimal"] is False and data["gap"] == capped.gap
    assert data["relative_gap"] == capped.relative_gap


def test_hard_families_at_full_size_stay_within_the_limit() -> None:
    """Llama-3-70B shapes, 80 layers: the flat family once took 502 s and 2.7 GB (issue 13);
    now the DP is skipped by its counted size, not by a clock, so the plan is the same on any
    machine (timings: benchmarks/bench_knapsack.py)."""
    from gac_check.testing.knapsack import llama_instance

    mats, budget, align, _ = llama_instance(80, ("flat", "coprime"))
    a, b = realign_plan(mats, budget, align), realign_plan(mats, budget, align)
    assert a.ranks == b.ranks and a.within_budget and a.aligned(align)
    assert a.optimal or 0 < a.relative_gap < 0.01


def test_the_realign_summary_prints_the_certified_gap(tmp_path) -> None:
    """What a user reads when the solver stopped at its work limit: the proven distance to the
    optimum, absolute and relative, not just "heuristic"."""
    from gac_check.ranks.factors import RealignReport
    from gac_check.report.realign import render_realign
    from gac_check.testing.knapsack import llama_instance

    mats, budget, align, _ = llama_instance(1, ("flat",), shapes={"q": (64, 64), "mlp": (224, 64)})
    for plan in (realign_plan(mats, budget, align), realign_plan(mats, budget, align,
                                                                 work_limit=0)):
        report = RealignReport(tmp_path, plan, align, {m.name: 8 for m in mats}, budget, 1.0,
                               False)
        text = render_realign(report)
        if plan.optimal:
            assert "exact knapsack (proved optimal)" in text
        else:
            assert f"at most {plan.gap:.6g} ({plan.relative_gap:.3%}) above the optimum" in text
