"""What the perf suites share: the device's contract, repair targets, timing margins.

Kept beside the suites (not in the plugin) because these are the suites' own choices.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings

from gac_check.bench.timing import TimingConfig
from gac_check.contract.rules import Contract, elements_per_16_bytes
from gac_check.contract.select import for_hardware
from gac_check.sites import DimSite, Role

#: Slack for "the repaired size is not slower than the original / is within reach of the aligned
#: neighbour", after allowing for the padded size's extra work. CPUs on shared CI are noisier.
MARGIN = {"cpu": 0.25, "cuda": 0.10}
#: A staircase step is asserted only where the contract expects at least this slowdown.
MIN_STEP = 1.10
COMPARE = TimingConfig(samples=9, trials=4, warmup_s=0.02)
#: Generated sizes: few (each example is timed), and the gac_bench fixture is stateless across
#: examples, so sharing it is safe.
GENERATED = settings(max_examples=3, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


def device_contract(device: str, key: str, dtype: str) -> Contract:
    """The contract of the device being measured (not of the ``--gpu`` served profile)."""
    return for_hardware("cpu" if device == "cpu" else key, dtype)


def site(role: Role, value: int) -> DimSite:
    return DimSite(f"generated.{role.value}", role, value, [])


def repair_target(contract: Contract, role: Role, value: int, dtype: str) -> int:
    """The contract's repair; where this device's contract has no rule for the role, the
    16-byte alignment a GPU-bound repair would write (padding must not hurt here either)."""
    target = contract.target(site(role, value), ("error", "warning"))
    if target == value and value % elements_per_16_bytes(dtype):
        align = elements_per_16_bytes(dtype)
        target = -(-value // align) * align
    return target


def typical(m, device: str) -> float:
    """The time a comparison uses: the median on a GPU, the minimum on a CPU (interference on
    a shared CPU only adds time; see gac_check/bench/pytest_perf.py)."""
    return m.median_s if device == "cuda" else min(m.samples)


def assert_within(t_slow: float, t_ref: float, work_ratio: float, margin: float, what: str):
    """t_slow must not exceed t_ref scaled by the extra work and the margin."""
    bound = t_ref * work_ratio * (1 + margin)
    assert t_slow <= bound, (f"{what}: {t_slow * 1e3:.3f} ms > {bound * 1e3:.3f} ms "
                             f"(reference {t_ref * 1e3:.3f} ms x work {work_ratio:.3f} x "
                             f"margin {1 + margin:.2f})")


def staircase_rules(contract: Contract, role: Role, device: str):
    """Rules whose slowdown this device is expected to show: measured ones anywhere, published
    ones only on a GPU (published CPU figures come from other machines)."""
    return [r for r in contract.rules if role in r.roles and r.modulus > 1 and not r.allowed
            and (r.slowdown or 0) >= MIN_STEP
            and (r.source == "measured" or device == "cuda")]
