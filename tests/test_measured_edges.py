"""The measured contract's judgement, at the edges tests/test_baselines.py leaves open: how a
measured rule is graded, how many pairs must be significant, which SDPA families speak for a
model, and which pairs a modulus is credited with.

Found by benchmarks/hand_mutants.py (group "elsewhere"): each of these mutants passed every
test before this file, and each test here fails on its mutant.
"""
from __future__ import annotations

import pytest

from gac_check.bench import workloads
from gac_check.bench.baselines import Baseline, Fingerprint, Measurement, Provenance
from gac_check.contract import measured
from gac_check.sites import Role

H100 = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", torch="2.13.0", cuda="12.8")
MEASURED = Provenance("measured", "2026-11-21T00:00:00Z", "test")
SIZES = range(960, 1090)


def meas(key: str, t: float, n: int = 9) -> Measurement:
    samples = [t * (1 + 0.01 * ((i % 3) - 1)) for i in range(n)] if n > 2 else [t] * n
    return Measurement.from_samples(key, samples, MEASURED)


def below_eight(k: int, slow: float) -> float:
    """Sizes that are not multiples of 8 run ``slow`` times longer; 8 and above are fast."""
    return k * 1e-6 * (slow if k % 8 else 1.0)


def gemm_sweep(slow: float, samples=lambda k: 9) -> Baseline:
    cases = {}
    for k in SIZES:
        m = meas(workloads.gemm(64, k, 1024, "float16").key, below_eight(k, slow), samples(k))
        cases[m.case] = m
    return Baseline("h100", H100, cases)


@pytest.mark.parametrize(("slow", "severity"), [(1.5, "error"), (1.3, "error"),
                                                (1.15, "warning"), (1.08, "warning")])
def test_a_measured_rule_is_graded_by_the_rescue_it_measured(slow, severity):
    rules, _ = measured.derive_rules(gemm_sweep(slow), "float16")
    assert [(r.modulus, r.severity) for r in rules] == [(8, severity)]
    assert rules[0].slowdown == pytest.approx(slow, rel=0.02)


def test_a_modulus_needs_most_of_its_pairs_significant():
    """Only one pair in six has samples that can show a difference (nine samples a side); the
    rest hold two equal samples each, which no rank test can tell apart: no rule."""
    def samples(k: int) -> int:
        return 9 if k % 48 in (4, 8) else 2

    rules, effects = measured.derive_rules(gemm_sweep(1.5, samples), "float16")
    assert rules == []
    eight = next(e for e in effects if e.modulus == 8 and e.pairs)
    assert 0 < eight.significant * 3 < eight.pairs * 2 and eight.rescue >= 1.4


def test_forced_backend_sdpa_sweeps_do_not_make_the_contract():
    """A model runs SDPA's default dispatch: a staircase seen only with a forced backend says
    nothing about it."""
    cases = {}
    for d in range(96, 168):
        for backend, slow in (("default", 1.0), ("flash", 1.5)):
            w = workloads.sdpa(4, 2048, 32, d, "float16", backend=backend)
            cases[w.key] = meas(w.key, below_eight(d, slow))
    rules, effects = measured.derive_rules(Baseline("h100", H100, cases), "float16")
    assert rules == []
    assert {dict(f.fixed)["backend"] for f in measured.families(
        Baseline("h100", H100, cases), "float16")} == {"default"}
    assert measured.roles_covered(effects) == {Role.HEAD_DIM}


def test_a_modulus_is_credited_only_with_its_own_pairs():
    """Only 8 matters here. 4's evidence is pairs whose padded size is an odd multiple of 4
    (both slow: ratio 1); pairs that pad onto a multiple of 8 are 8's effect, not 4's."""
    _, effects = measured.derive_rules(gemm_sweep(1.5), "float16")
    four = [e for e in effects if e.modulus == 4]
    assert four and all(e.rescue == pytest.approx(1.0, abs=0.01) for e in four)
    assert all(r == pytest.approx(1.0, abs=0.01) for e in four for _, r in e.by_pow2)
