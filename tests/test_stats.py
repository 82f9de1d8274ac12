"""stats: quantiles, the Mann-Whitney U test (against scipy), and the asv-style verdict.

Checked by hand that these can fail: dropping the tie term from the variance makes
test_mann_whitney_matches_scipy fail on tied samples; swapping the two exact tails makes the
exact-method comparison fail; using the median instead of ``q`` fails test_compare_quantile.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given
from hypothesis import strategies as st

from gac_check.bench import stats

samples = st.lists(st.integers(1, 40).map(lambda x: x / 8), min_size=1, max_size=25)


@given(xs=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30),
       q=st.floats(0, 1))
def test_quantile_matches_numpy(xs, q):
    assert stats.quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)), rel=1e-9,
                                                  abs=1e-6)


@given(a=samples, b=samples)
def test_mann_whitney_matches_scipy(a, b):
    ours = stats.mann_whitney_u(a, b)
    method = "exact" if ours.method == "exact" else "asymptotic"
    ref = scipy.stats.mannwhitneyu(a, b, alternative="two-sided", method=method,
                                   use_continuity=True)
    assert ours.u == pytest.approx(float(ref.statistic))
    if math.isnan(ref.pvalue):  # scipy: all values equal
        assert ours.p_value == 1.0
    else:
        assert ours.p_value == pytest.approx(float(ref.pvalue), rel=1e-7, abs=1e-12)


def test_exact_distribution_counts_every_arrangement():
    for n1, n2 in [(1, 1), (3, 4), (6, 6)]:
        assert sum(stats._u_counts(n1, n2)) == math.comb(n1 + n2, n1)


def test_small_untied_samples_use_the_exact_test():
    assert stats.mann_whitney_u([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]).method == "exact"
    assert stats.mann_whitney_u([1.0, 2.0, 2.0], [4.0, 5.0, 6.0]).method == "normal"


def test_compare_flags_a_large_significant_slowdown_only():
    base = [1.0 + 0.01 * i for i in range(20)]
    assert stats.compare(base, [x * 1.5 for x in base]).status == stats.REGRESSED
    assert stats.compare(base, [x / 1.5 for x in base]).status == stats.IMPROVED
    # 5% slower and significant, but under the 10% factor: unchanged
    v = stats.compare(base, [x * 1.05 for x in base], factor=1.10)
    assert v.status == stats.UNCHANGED
    # 50% slower in the median but not significant (two samples each side)
    v = stats.compare([1.0, 3.0], [1.5, 4.0], factor=1.10)
    assert v.ratio > 1.1 and v.status == stats.UNCHANGED


def test_compare_quantile():
    base = [1.0] * 5 + [5.0] * 15  # a busy machine: most samples interrupted
    cur = [1.02] * 15 + [5.0] * 5
    assert stats.compare(base, cur, q=0.0).ratio == pytest.approx(1.02)
    assert stats.compare(base, cur).ratio == pytest.approx(1.02 / 5.0)


def test_compare_without_baseline_samples_uses_the_published_median():
    v = stats.compare([], [2.0, 2.1, 2.2], baseline_median=1.0, q=0.0)
    assert v.status == stats.REGRESSED and v.p_value is None
    assert "factor alone" in v.reason
    assert stats.compare([], [1.0], baseline_median=None).status == stats.NO_BASELINE


def test_confirm_needs_both_looks_regressed():
    first = stats.Verdict(stats.REGRESSED, 1.07, 1e-3, 1.06)
    pooled = stats.Verdict(stats.REGRESSED, 1.075, 1e-6, 1.06)
    confirmed = stats.confirm(first, stats.Verdict(stats.REGRESSED, 1.08, 1e-3, 1.06), pooled)
    assert confirmed.regressed and confirmed.ratio == 1.075 and confirmed.p_value == 1e-6
    assert "confirmed by a second look (first look 1.070x, second look 1.080x" in confirmed.reason
    second = stats.Verdict(stats.UNCHANGED, 1.01, 0.4, 1.06)
    refuted = stats.confirm(first, second, pooled)
    assert refuted.status == stats.UNCHANGED and refuted.ratio == 1.01
    assert "not confirmed" in refuted.reason
    with pytest.raises(ValueError):
        stats.confirm(second, first, pooled)
