"""Measured rules derived at the top of a sweep (issue 22, "tests that bite"): the largest
modulus is credited with pairs that pad onto a larger power of two (992 -> 1024), a family
needs MIN_FAMILY sizes and a modulus MIN_PAIRS pairs (exactly that many is enough), sizes whose
padded size lies past the sweep's top are left out, and the strongest of two families speaks.

Each test fails on one of the "measured" mutants in benchmarks/hand_mutants.py.
"""
from __future__ import annotations

import pytest

from gac_check.bench import workloads
from gac_check.bench.baselines import Baseline, Fingerprint, Measurement, Provenance
from gac_check.contract import measured

H100 = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", torch="2.13.0", cuda="12.8")
MEASURED = Provenance("measured", "2026-11-25T00:00:00Z", "test")


def meas(key: str, t: float) -> Measurement:
    return Measurement.from_samples(key, [t * (1 + 0.01 * ((i % 3) - 1)) for i in range(9)],
                                    MEASURED)


def sweep(sizes, time, axis: str = "K") -> dict[str, Measurement]:
    cases = {}
    for v in sizes:
        w = (workloads.gemm(64, v, 1024, "float16") if axis == "K"
             else workloads.gemm(64, 1024, v, "float16"))
        cases[w.key] = meas(w.key, time(v))
    return cases


def slow_unless(m: int, slow: float):
    return lambda v: 1e-3 * (1.0 if v % m == 0 else slow)


def rules_of(cases) -> list[tuple[int, str, float]]:
    rules, _ = measured.derive_rules(Baseline("h100", H100, cases), "float16")
    return [(r.modulus, r.severity, round(r.slowdown, 2)) for r in rules]


def test_64_is_credited_with_the_pair_that_pads_onto_the_top_power_of_two():
    """In 900-1024 the multiples of 32 that are not of 64 are 928 (-> 960) and 992 (-> 1024,
    a multiple of 1024): two pairs, exactly MIN_PAIRS, so 64 matters."""
    _, effects = measured.derive_rules(Baseline("h100", H100, sweep(
        range(900, 1025), slow_unless(64, 1.5))), "float16")
    sixty_four = next(e for e in effects if e.modulus == 64)
    assert sixty_four.pairs == measured.MIN_PAIRS == 2
    assert rules_of(sweep(range(900, 1025), slow_unless(64, 1.5))) == [(64, "error", 1.5)]


def test_one_pair_is_not_enough():
    """Without 1024 at the top, only 928 -> 960 is left: an anecdote, no rule."""
    assert rules_of(sweep(range(900, 1024), slow_unless(64, 1.5))) == []


def test_smaller_moduli_are_not_credited_with_the_top_power_of_two():
    """1020 -> 1024 pads onto a multiple of 1024, not an odd multiple of 8: it is no evidence
    for 8 (here only 64 matters, so crediting it would make 8 look like it matters)."""
    _, effects = measured.derive_rules(Baseline("h100", H100, sweep(
        range(900, 1025), slow_unless(64, 1.5))), "float16")
    for e in effects:
        if e.modulus < 64:
            assert e.rescue == pytest.approx(1.0, abs=0.02), e


@pytest.mark.parametrize(("sizes", "rules"), [
    (range(1009, 1025), [(4, "error", 1.5)]),  # 16 sizes: a family
    (range(1010, 1025), []),  # 15: not one, though it holds the same two pairs for 4
])
def test_a_family_needs_min_family_sizes(sizes, rules):
    """4's pairs are 1010 -> 1012 and 1018 -> 1020 in both ranges."""
    assert len(sizes) in (measured.MIN_FAMILY, measured.MIN_FAMILY - 1)
    assert rules_of(sweep(sizes, slow_unless(4, 1.5))) == rules


def test_sizes_padding_past_the_top_are_left_out():
    """1025-1031 would pad to 1032, which was not measured: they give no pair (and no
    error), so 8's figure comes from the sizes below 1024 alone."""
    inside = rules_of(sweep(range(960, 1025), slow_unless(8, 1.5)))
    past = rules_of(sweep(range(960, 1032), slow_unless(8, 1.5)))
    assert inside == past == [(8, "error", 1.5)]


def test_the_strongest_family_makes_the_rule():
    """A K sweep rescued 1.5x and an N sweep 1.2x by padding to 8: the rule quotes 1.5x and is
    an error; listed the other way round, the same."""
    k, n = sweep(range(960, 1025), slow_unless(8, 1.5)), sweep(range(960, 1025),
                                                              slow_unless(8, 1.2), "N")
    assert rules_of({**k, **n}) == rules_of({**n, **k}) == [(8, "error", 1.5)]
    k2 = sweep(range(960, 1025), slow_unless(8, 1.2))
    n2 = sweep(range(960, 1025), slow_unless(8, 1.5), "N")
    assert rules_of({**k2, **n2}) == [(8, "error", 1.5)]


def test_a_noisy_family_at_the_limit_still_judges():
    """A family whose median relative IQR is exactly MAX_NOISE judges; above it, it does not."""
    def noisy(iqr: float):
        cases = sweep(range(960, 1025), slow_unless(8, 1.5))
        return {k: Measurement(m.case, m.median_s, m.median_s * iqr, m.samples, m.provenance)
                for k, m in cases.items()}
    assert rules_of(noisy(measured.MAX_NOISE)) == [(8, "error", 1.5)]
    assert rules_of(noisy(measured.MAX_NOISE * 1.5)) == []
