"""Budgets at their edges: fractions of the dense size that are not whole parameter counts, and
plans that spend the budget exactly.

The suite's random budgets (suites/test_knapsack.py) rarely land on a sum of candidate costs,
so an off-by-one that excludes a plan spending exactly the budget survives it; and a budget
rounded up from ``fraction x dense`` lets a plan overspend what the user allowed. Here the
budget is drawn as the exact cost of a feasible selection, and fractions are chosen so that the
product is not an integer. Each test was run against a mutant of ranks/knapsack.py and went
red (benchmarks/hand_mutants.py, group "knapsack").
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from gac_check.testing.knapsack import instances, solve_bruteforce

CI = settings.get_profile("ci")  # registered by the repository's conftest.py


def square(name: str, n: int, sv: list[float]) -> Matrix:
    return Matrix(name, n, n, sv=np.array(sv))


# ------------------------------------------------------------------ fractional budgets
def test_a_fraction_is_rounded_down_to_whole_parameters():
    mats = [square("a", 8, [4, 3, 2, 1]), square("b", 8, [3, 1, 1, 1])]  # 128 dense
    assert budget_from_fraction(mats, 0.35) == 44  # 44.8: never 45
    assert budget_from_fraction(mats, 0.3) == 38  # 38.4
    assert budget_from_spec("0.35", mats) == 44
    assert budget_from_fraction(mats, 1.5) == 192  # the API allows more than dense
    with pytest.raises(BadInput, match="not a fraction in"):  # --budget 1.5: a likely typo
        budget_from_spec("1.5", mats)


@settings(CI, max_examples=200)
@given(fraction=st.floats(1e-3, 2.0), sizes=st.lists(st.integers(1, 60), min_size=1,
                                                       max_size=4))
def test_a_fraction_budget_never_exceeds_the_fraction(fraction, sizes):
    mats = [Matrix(f"m{i}", n, n + 1, sv=np.ones(n)) for i, n in enumerate(sizes)]
    dense = sum(m.dense_params for m in mats)
    budget = budget_from_fraction(mats, fraction)
    assert isinstance(budget, int)
    assert budget <= fraction * dense < budget + 1


def test_a_plan_under_a_fractional_budget_spends_at_most_the_fraction():
    """Two 4x4 matrices (32 dense), align 1: each is rank 1 (8) or dense (16). 0.734375 x 32 is
    23.5: rounded up, 24 would buy one dense matrix (8 + 16), which the user did not allow."""
    mats = [square("a", 4, [4, 3, 2, 1]), square("b", 4, [3, 1, 1, 1])]
    fraction = 0.734375
    plan = realign_plan(mats, budget_from_spec(str(fraction), mats), align=1)
    assert plan.total_params <= fraction * 32
    assert plan.ranks == {"a": 1, "b": 1}
    assert realign_plan(mats, 24, align=1).ranks == {"a": DENSE, "b": 1}  # what 24 buys


@pytest.mark.parametrize("spec", ["0", "-0.5", "nan", "inf", "half", "1/2", ""])
def test_budget_specs_that_are_no_positive_fraction_are_bad_input(spec):
    with pytest.raises(BadInput):
        budget_from_spec(spec, [square("a", 8, [1.0])])


# --------------------------------------------------------------- spending exactly
def test_the_best_plan_spends_the_budget_exactly():
    """Budget 96 buys a dense (64) + b at rank 2 (32): exactly 96, and strictly better than
    anything 95 buys."""
    mats = [square("a", 8, [4, 3, 2, 1]), square("b", 8, [3, 1, 1, 1])]
    plan = realign_plan(mats, 96, align=2)
    assert plan.total_params == 96 and plan.within_budget
    assert plan.ranks == {"a": DENSE, "b": 2}
    assert realign_plan(mats, 95, align=2).objective > plan.objective


def test_a_budget_of_exactly_the_cheapest_choice_is_feasible():
    mats = [square("a", 8, [4, 3, 2, 1]), square("b", 8, [3, 1, 1, 1])]
    plan = realign_plan(mats, 64, align=2)
    assert plan.ranks == {"a": 2, "b": 2} and plan.within_budget
    with pytest.raises(BadInput):
        realign_plan(mats, 63, align=2)


def test_a_budget_of_exactly_everything_at_its_best_keeps_everything():
    mats = [square("a", 8, [4, 3, 2, 1]), Matrix("b", 6, 20, sv=np.array([5.0, 2, 1, 1, 1, 1]))]
    best = {"a": DENSE, "b": DENSE}  # b: rank 4 (104 params) still discards 2 of 6 values
    plan = realign_plan(mats, budget_from_ranks(mats, best), align=2)
    assert plan.ranks == best and plan.objective == 0.0


@st.composite
def exact_budgets(draw):
    """An instance whose budget is the exact cost of one feasible selection (drawn)."""
    inst = draw(instances(max_matrices=4, max_dim=24))
    picks = {m.name: draw(st.sampled_from(candidate_ranks(m, inst.align, inst.allow_dense)))
             for m in inst.matrices}
    return inst, picks, budget_from_ranks(inst.matrices, picks)


@settings(CI, max_examples=150)
@given(case=exact_budgets())
def test_a_budget_that_a_selection_spends_exactly_admits_that_selection(case):
    inst, picks, budget = case
    plan = realign_plan(inst.matrices, budget, inst.align, allow_dense=inst.allow_dense)
    assert plan.total_params <= budget and plan.within_budget
    chosen = sum(m.error(picks[m.name]) for m in inst.matrices)
    assert plan.objective <= chosen * (1 + 1e-9) + 1e-12
    try:
        brute = solve_bruteforce(inst.matrices, budget, inst.align, allow_dense=inst.allow_dense,
                                 limit=20_000)
    except ValueError:  # too many combinations for brute force: the bound above must do
        return
    assert plan.objective == pytest.approx(brute.objective, rel=1e-9, abs=1e-12)
