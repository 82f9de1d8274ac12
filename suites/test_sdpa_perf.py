"""SDPA performance by head_dim: regression against the stored baseline, the backend that
actually ran, the padding rescue, and the head_dim staircase, on the device present."""
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

#: (B, S, H, dtype) per device kind. CPU cases stay small for CI, and short: under load a
#: call of ~3 ms (H=8) was preempted in most samples; at H=2 a call is under 1 ms.
SHAPE = {"cpu": (1, 256, 2, "float32"), "cuda": (4, 2048, 32, "float16")}
BACKENDS = {"cpu": ("default",), "cuda": ("default", "flash", "efficient", "cudnn")}


@pytest.mark.parametrize("d", [64, 107, 112])
@pytest.mark.parametrize("backend", ["default", "flash", "efficient", "cudnn"])
def test_no_regression_against_baseline(gac_bench, d, backend):
    if backend not in BACKENDS[gac_bench.device]:
        pytest.skip(f"SDPA backend {backend} is CUDA-only")
    b, s, h, dtype = SHAPE[gac_bench.device]
    gac_bench.regression(workloads.sdpa(b, s, h, d, dtype, backend))


def test_backend_that_ran_is_reported(gac_bench):
    b, s, h, dtype = SHAPE[gac_bench.device]
    m = gac_bench.measure(workloads.sdpa(b, s, h, 64, dtype))
    assert m.backend in ("flash", "efficient", "cudnn", "math")


@pytest.mark.gpu
def test_forced_backend_refusal_names_the_reason(gac_bench):
    """The efficient backend needs head_dim % 8 for half types; the refusal carries torch's
    own reason rather than a timing guess."""
    work = workloads.sdpa(1, 128, 4, 107, "float16", "efficient")
    with pytest.raises(workloads.Unsupported, match="efficient"):
        work.prepare("cuda")


@GENERATED
@given(d=st.integers(32, 124).map(lambda x: 2 * x + 1))  # odd: misaligned for any dtype
def test_repaired_head_dim_is_not_slower(gac_bench, d):
    b, s, h, dtype = SHAPE[gac_bench.device]
    contract = device_contract(gac_bench.device, gac_bench.session.target.key, dtype)
    to = min(repair_target(contract, Role.HEAD_DIM, d, dtype), 256)
    below = d - d % 8
    orig, rep, lower = gac_bench.interleaved(
        [workloads.sdpa(b, s, h, x, dtype) for x in (d, to, below)], COMPARE)
    dev = gac_bench.device
    margin = MARGIN[dev]
    assert_within(typical(rep, dev), typical(orig, dev), to / d, margin, f"D={to} vs original {d}")
    assert_within(typical(rep, dev), typical(lower, dev), to / below, margin,
                  f"D={to} vs aligned neighbour {below}")


def test_staircase_aligned_head_dim_beats_misaligned_neighbour(gac_bench):
    b, s, h, dtype = SHAPE[gac_bench.device]
    contract = device_contract(gac_bench.device, gac_bench.session.target.key, dtype)
    rules = staircase_rules(contract, Role.HEAD_DIM, gac_bench.device)
    if not rules:
        pytest.skip(f"the {contract.source} contract of {gac_bench.session.target.key} "
                    "expects no head_dim staircase here (measured rules are asserted "
                    "anywhere, published ones only on GPUs)")
    for rule in rules:
        aligned = 128 - 128 % rule.modulus
        slow, fast = gac_bench.interleaved(
            [workloads.sdpa(b, s, h, x, dtype) for x in (aligned - 1, aligned)], COMPARE)
        assert typical(fast, gac_bench.device) < typical(slow, gac_bench.device), (
            f"{rule.id}: D={aligned} ({fast.median_s * 1e3:.3f} ms) is not faster than "
            f"D={aligned - 1} ({slow.median_s * 1e3:.3f} ms); the contract expects "
            f"{rule.slowdown}x: contract drift")
