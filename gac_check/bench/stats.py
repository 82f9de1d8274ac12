"""Robust statistics and the regression test, as pure functions.

Timing samples are skewed (a pause, an interrupt or a clock boost moves single samples far), so
everything here is rank- or quantile-based: the median and the inter-quartile range describe a
measurement, and the Mann-Whitney U test decides whether two sample sets differ. The comparison
mirrors airspeed velocity (asv): a change counts only when it is larger than a relative factor
AND the samples say it is not noise. Either test alone fails in practice: a factor alone flags
noise on a busy machine, a significance test alone flags a 0.3% clock drift as "significant".
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

REGRESSED, IMPROVED, UNCHANGED, NO_BASELINE = "regressed", "improved", "unchanged", "no baseline"
#: ``--gac-update-baselines``: the case was measured and stored, not judged.
RECORDED = "recorded"
#: Exact U distribution up to this many samples per side (the DP table is n1*n2*(n1*n2/2)).
EXACT_MAX_N = 12


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (Hyndman & Fan type 7, numpy's default)."""
    if not xs:
        raise ValueError("quantile of no samples")
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)


def iqr(xs: Sequence[float]) -> float:
    return quantile(xs, 0.75) - quantile(xs, 0.25)


def midranks(values: Sequence[float]) -> list[float]:
    """1-based ranks with ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


@cache
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """Number of arrangements giving each U = 0..n1*n2 with no ties.

    Mann & Whitney (1947), eq. (2): the largest observation comes from either sample, so
    f(u; n1, n2) = f(u - n2; n1 - 1, n2) + f(u; n1, n2 - 1).
    """
    if n1 == 0 or n2 == 0:
        return (1,)
    a, b = _u_counts(n1 - 1, n2), _u_counts(n1, n2 - 1)
    return tuple((a[u - n2] if 0 <= u - n2 < len(a) else 0) + (b[u] if u < len(b) else 0)
                 for u in range(n1 * n2 + 1))


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U statistic of the first sample
    p_value: float  # two-sided
    method: str  # "exact" or "normal"


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test.

    Exact null distribution (Mann & Whitney 1947) when both samples are small and untied;
    otherwise the normal approximation with the tie-corrected variance
    sigma^2 = n1 n2 / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1))) (Lehmann, Nonparametrics,
    1975, eq. 1.46) and a continuity correction of 0.5, the same choice as
    scipy.stats.mannwhitneyu(method="asymptotic", use_continuity=True).
    """
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney needs samples on both sides")
    pooled = [*a, *b]
    ranks = midranks(pooled)
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    tied = len(set(pooled)) < len(pooled)
    if not tied and max(n1, n2) <= EXACT_MAX_N:
        counts = _u_counts(n1, n2)
        total = sum(counts)
        k = round(u1)
        lower = sum(counts[: k + 1]) / total
        upper = sum(counts[k:]) / total
        return MannWhitney(u1, min(1.0, 2 * min(lower, upper)), "exact")
    n = n1 + n2
    ties = _tie_term(pooled)
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:  # every sample equal: no evidence of a difference
        return MannWhitney(u1, 1.0, "normal")
    z = max(abs(u1 - n1 * n2 / 2) - 0.5, 0.0) / math.sqrt(var)
    return MannWhitney(u1, min(1.0, math.erfc(z / math.sqrt(2))), "normal")


def _tie_term(values: Sequence[float]) -> float:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return float(sum(t ** 3 - t for t in counts.values()))


#: A CPU trial counts only when both kernels' minima are within this factor of their minima
#: over the whole look (see :func:`trial_ratios`).
CLEAN_TRIAL = 1.25


def trial_ratios(case: Sequence[Sequence[float]], reference: Sequence[Sequence[float]],
                 q: float, clean: float | None = None) -> list[float]:
    """Per trial, the case's ``q`` quantile over the reference's.

    With ``clean`` (a factor; CPU minima): keep only the trials in which *both* kernels got a
    clean sample, i.e. their trial minimum is within ``clean`` x their minimum over all trials.
    On a CPU shared with more runnable processes than cores, a sample is either clean or
    preempted (a scheduler slice, several ms, lands inside it); a trial in which one kernel
    never ran clean gives a ratio 0.3x or 3x off. When both kernels slow alike (a lower clock),
    every trial stays; when fewer than a quarter of the trials (at least 3) are clean, all are
    kept (nothing to choose from; the verdict's test sees their spread).
    """
    if len(case) != len(reference):
        raise ValueError("case and reference need the same trials")
    pairs = [(quantile(c, q), quantile(r, q)) for c, r in zip(case, reference, strict=True)]
    if clean is not None and pairs:
        lo_c, lo_r = min(c for c, _ in pairs), min(r for _, r in pairs)
        kept = [(c, r) for c, r in pairs if c <= clean * lo_c and r <= clean * lo_r]
        if len(kept) >= max(3, len(pairs) // 4):
            pairs = kept
    return [c / r for c, r in pairs]


@dataclass(frozen=True)
class Verdict:
    """How a measurement compares with its baseline (times: ratio > 1 means slower now)."""

    status: str
    ratio: float | None = None
    p_value: float | None = None
    factor: float = 1.10
    reason: str = ""

    @property
    def regressed(self) -> bool:
        return self.status == REGRESSED

    def describe(self) -> str:
        if self.ratio is None:
            return f"{self.status}: {self.reason}"
        p = "n/a" if self.p_value is None else f"{self.p_value:.2g}"
        note = f"; {self.reason}" if self.reason else ""
        what = "relative time" if "relative to" in self.reason else "time"
        return (f"{self.status}: {self.ratio:.3f}x the baseline's {what} "
                f"(threshold {self.factor:.2f}x, p={p}){note}")


def compare(baseline: Sequence[float], current: Sequence[float], factor: float = 1.10,
            alpha: float = 0.05, baseline_median: float | None = None,
            q: float = 0.5) -> Verdict:
    """asv-style verdict on two sets of times.

    The ratio compares the ``q`` quantile of both sides: the median (asv's choice) by default;
    on a shared CPU, where interference only ever adds time, a low quantile (q=0, the minimum,
    as timeit recommends) tracks the code's own cost and not the neighbours'.
    ``baseline`` may be empty when only a median is stored (published figures): then the median
    and the factor alone decide, and the verdict says the significance test was impossible.
    """
    if factor < 1.0:
        raise ValueError("factor is a slowdown ratio >= 1")
    if not current:
        raise ValueError("no current samples")
    if not baseline:
        q = 0.5
    base_t = quantile(baseline, q) if baseline else baseline_median
    if base_t is None or base_t <= 0:
        return Verdict(NO_BASELINE, factor=factor, reason="the baseline has no usable time")
    ratio = quantile(current, q) / base_t
    if not baseline or len(current) < 2:
        p, note = None, "no baseline samples: decided on the factor alone"
    else:
        p, note = mann_whitney_u(baseline, current).p_value, ""
    significant = p is None or p < alpha
    if ratio > factor and significant:
        status = REGRESSED
    elif ratio < 1 / factor and significant:
        status = IMPROVED
    else:
        status = UNCHANGED
    return Verdict(status, ratio, p, factor, note)


def confirm(first: Verdict, second: Verdict, pooled: Verdict) -> Verdict:
    """The verdict after a second look at a case whose first look said "regressed".

    The second look is a fresh measurement (re-prepared, minutes of other processes later in
    the worst case, seconds usually). A neighbour's burst that inflated the first look rarely
    inflates an independent second one, while a real slowdown shows in both. So the case is
    regressed only when the second look is regressed on its own too; the verdict then carries
    the ``pooled`` comparison (both looks against the baseline: the median of the union lies
    between the two looks' medians, so it is above the factor as well). Otherwise the second
    look's verdict stands, saying the first was not confirmed.
    """
    if not first.regressed:
        raise ValueError("a second look only follows a regressed first look")
    looks = f"first look {first.ratio:.3f}x, second look {second.ratio:.3f}x"
    if second.regressed:
        return Verdict(REGRESSED, pooled.ratio, pooled.p_value, pooled.factor,
                       "; ".join(filter(None, [pooled.reason,
                                               f"confirmed by a second look ({looks}; "
                                               "ratio and p of both looks pooled)"])))
    return Verdict(second.status, second.ratio, second.p_value, second.factor,
                   "; ".join(filter(None, [second.reason,
                                           f"not confirmed by a second look ({looks}); "
                                           "the second look's verdict stands"])))
