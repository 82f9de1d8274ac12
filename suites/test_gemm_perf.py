"""GEMM performance in nn.Linear's layout: regression against the stored baseline, the padding
rescue, and the alignment staircase, on the device present (``pytest suites --gpu PROFILE``)."""
from __future__ import annotations

import pytest
from _perf_common import (
    COMPARE,
    GENERATED,
    MARGIN,
    assert_within,
    device_contract,
    repair_target,
    staircase_rules,
    typical,
)
from hypothesis import given
from hypothesis import strategies as st

from gac_check.bench import workloads
from gac_check.sites import Role

pytestmark = pytest.mark.perf

#: (M, N, dtype) per device kind; K is the swept reduction size. CPU cases stay small for CI.
SHAPE = {"cpu": (64, 1024, "float32"), "cuda": (512, 4096, "float16")}
REGRESSION = {
    "aligned": lambda m, n, dt, big: workloads.gemm(m, 1024 if not big else 4096, n, dt),
    "misaligned": lambda m, n, dt, big: workloads.gemm(m, 1001 if not big else 4001, n, dt),
    "lowrank-misaligned": lambda m, n, dt, big: workloads.lowrank(m, n, 107, n, dt),
    "lowrank-aligned": lambda m, n, dt, big: workloads.lowrank(m, n, 112, n, dt),
}


@pytest.mark.parametrize("case", list(REGRESSION))
def test_no_regression_against_baseline(gac_bench, case):
    m, n, dtype = SHAPE[gac_bench.device]
    # regression() fails the test itself on a significant slowdown and skips without a baseline
    gac_bench.regression(REGRESSION[case](m, n, dtype, gac_bench.device == "cuda"))


@GENERATED
@given(rank=st.integers(32, 124).map(lambda x: 2 * x + 1))  # odd: misaligned for any dtype
def test_repaired_rank_is_not_slower(gac_bench, rank):
    """A misaligned low-rank pair padded to the contract's size costs no more than the
    original plus the padding's extra work, and runs like its aligned neighbour."""
    m, n, dtype = SHAPE[gac_bench.device]
    contract = device_contract(gac_bench.device, gac_bench.session.target.key, dtype)
    to = repair_target(contract, Role.RANK, rank, dtype)
    below = rank - rank % 8
    orig, rep, lower = gac_bench.interleaved(
        [workloads.lowrank(m, n, r, n, dtype) for r in (rank, to, below)], COMPARE)
    dev = gac_bench.device
    margin = MARGIN[dev]
    assert_within(typical(rep, dev), typical(orig, dev), to / rank, margin,
                  f"R={to} vs original {rank}")
    assert_within(typical(rep, dev), typical(lower, dev), to / below, margin,
                  f"R={to} vs aligned neighbour {below}")


def test_staircase_aligned_k_beats_misaligned_neighbour(gac_bench):
    m, n, dtype = SHAPE[gac_bench.device]
    contract = device_contract(gac_bench.device, gac_bench.session.target.key, dtype)
    rules = staircase_rules(contract, Role.RANK, gac_bench.device)
    if not rules:
        pytest.skip(f"the {contract.source} contract of {gac_bench.session.target.key} "
                    "expects no GEMM staircase here (measured rules are asserted anywhere, "
                    "published ones only on GPUs)")
    base = 4096 if gac_bench.device == "cuda" else 1024
    for rule in rules:
        aligned = base - base % rule.modulus
        slow, fast = gac_bench.interleaved(
            [workloads.gemm(m, k, n, dtype) for k in (aligned - 1, aligned)], COMPARE)
        assert typical(fast, gac_bench.device) < typical(slow, gac_bench.device), (
            f"{rule.id}: K={aligned} ({fast.median_s * 1e3:.3f} ms) is not faster than "
            f"K={aligned - 1} ({slow.median_s * 1e3:.3f} ms); the contract expects "
            f"{rule.slowdown}x: contract drift")
