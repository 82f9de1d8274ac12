"""Edges of gac_check.bench.stats that mutation testing (mutmut) showed no test pinned: the IQR,
the exact/normal switch at EXACT_MAX_N, p-values never above 1, small tied samples, one empty
side, a factor of exactly 1, a zero published median, and ratios exactly at the threshold.

benchmarks/mutation.py runs mutmut on this module; its score is in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given
from hypothesis import strategies as st

from gac_check.bench import stats


@given(xs=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30))
def test_iqr_is_the_spread_between_the_quartiles(xs):
    want = float(np.quantile(xs, 0.75) - np.quantile(xs, 0.25))
    assert stats.iqr(xs) == pytest.approx(want, rel=1e-9, abs=1e-6)
    assert stats.iqr(xs) >= 0


def test_empty_samples_are_refused():
    with pytest.raises(ValueError, match="no samples"):
        stats.quantile([], 0.5)
    for a, b in (([], [1.0]), ([1.0], []), ([], [])):
        with pytest.raises(ValueError, match="both sides"):
            stats.mann_whitney_u(a, b)
    with pytest.raises(ValueError, match="no current samples"):
        stats.compare([1.0], [])


def test_the_exact_test_runs_up_to_exact_max_n_per_side():
    n = stats.EXACT_MAX_N
    a = [float(i) for i in range(n)]
    b = [i + 0.5 for i in range(n)]
    assert stats.mann_whitney_u(a, b).method == "exact"
    assert stats.mann_whitney_u([*a, 100.0], b).method == "normal"
    ref = scipy.stats.mannwhitneyu(a, b, alternative="two-sided", method="exact")
    assert stats.mann_whitney_u(a, b).p_value == pytest.approx(float(ref.pvalue), rel=1e-9)


@pytest.mark.parametrize(("a", "b"), [
    ([1.0, 4.0], [2.0, 3.0]),  # exact, U at the centre of its distribution
    ([1.0, 2.0, 5.0, 6.0], [3.0, 4.0]),
    ([1.0, 2.0], [1.0, 2.0]),  # tied: normal approximation
])
def test_a_p_value_is_never_above_one(a, b):
    p = stats.mann_whitney_u(a, b).p_value
    assert p == 1.0


@pytest.mark.parametrize(("a", "b"), [
    ([1.0, 1.0], [2.0]), ([1.0, 1.0, 2.0], [2.0, 3.0]), ([0.5, 0.5], [0.5, 1.0, 1.0]),
])
def test_small_tied_samples_match_scipy(a, b):
    """The variance of a tiny tied sample is below 1: still a real test, not 'no evidence'."""
    ref = scipy.stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic",
                                   use_continuity=True)
    ours = stats.mann_whitney_u(a, b)
    assert ours.method == "normal"
    assert ours.p_value == pytest.approx(float(ref.pvalue), rel=1e-9)


def test_a_factor_of_exactly_one_is_allowed():
    assert stats.compare([1.0, 1.0], [1.0, 1.0], factor=1.0).status == stats.UNCHANGED


def test_a_zero_published_median_is_no_baseline_not_a_division_by_zero():
    v = stats.compare([], [1.0, 1.1], baseline_median=0.0, factor=1.2)
    assert v.status == stats.NO_BASELINE and v.ratio is None and v.factor == 1.2
    assert v.describe() == "no baseline: the baseline has no usable time"


@pytest.mark.parametrize(("current", "status"), [
    (1.25, stats.UNCHANGED), (1.2500001, stats.REGRESSED),
    (0.8, stats.UNCHANGED), (0.7999999, stats.IMPROVED),
])
def test_a_ratio_exactly_at_the_threshold_is_unchanged(current, status):
    """Strictly beyond the factor, both ways: exactly 1.25x (or 1/1.25) is not a change."""
    v = stats.compare([], [current], baseline_median=1.0, factor=1.25)
    assert v.status == status and math.isclose(v.ratio, current)


def test_describe_without_a_p_value_says_so():
    v = stats.compare([], [2.0], baseline_median=1.0)
    assert v.p_value is None
    assert "p=n/a" in v.describe() and "threshold 1.10x" in v.describe()
    sig = stats.compare([1.0 + 0.01 * i for i in range(12)], [2.0 + 0.01 * i for i in range(12)])
    assert f"p={sig.p_value:.2g}" in sig.describe()
    assert sig.describe().endswith(")")  # no reason: nothing appended


def test_all_equal_samples_are_no_evidence_of_a_difference():
    mw = stats.mann_whitney_u([1.0, 1.0, 1.0], [1.0, 1.0])
    assert (mw.p_value, mw.method) == (1.0, "normal")
