"""Perf verdicts and the baselines they are read from, pinned on public behaviour.

What a slower or faster run must be called (absolute, published and relative comparisons), what
counts as evidence (an insignificant change is no change; a single sample is not fed to a
significance test; a published figure is a median, whatever quantile was asked for), what a
baseline mixing published and measured cases does, and which fingerprints refuse a file.

Each test was run against a hand-made mutant of the code it guards and went red; the mutants
and the tests that catch them are in benchmarks/hand_mutants.py (``python
benchmarks/hand_mutants.py --only verdicts``).
"""
from __future__ import annotations

import warnings

import pytest

from gac_check import profiles
from gac_check.bench import baselines, stats
from gac_check.bench.baselines import Baseline, Fingerprint, Measurement, Provenance
from gac_check.errors import BadInput
from tests.helpers import pytest_here

CASE = "gemm/M=64,K=1001,N=1024,dtype=float16"
OTHER = "sdpa/B=4,S=2048,H=32,D=107,dtype=float16"
REF = "gemm/M=64,K=1024,N=1024,dtype=float16"
H100 = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", torch="2.13.0", cuda="12.8")
AVX2 = ("avx2", "fma")
AVX512 = ("avx2", "fma", "avx512f")
MEASURED = Provenance("measured", "2026-11-21T00:00:00Z", "test")
PUBLISHED = Provenance("published", citation="a paper, table 3")
#: Twelve samples around 1 ms with a 2% spread: enough for the exact Mann-Whitney test.
SPREAD = [1 + 0.02 * ((i * 7) % 12 - 5.5) / 5.5 for i in range(12)]


def measured(case: str = CASE, scale: float = 1.0, samples: list[float] | None = None,
             relative: list[float] | None = None, reference: str | None = None) -> Measurement:
    times = [1e-3 * scale * s for s in (samples or SPREAD)]
    m = Measurement.from_samples(case, times, MEASURED)
    m.relative, m.reference = relative, reference
    return m


def published(case: str = CASE, median_s: float = 1e-3) -> Measurement:
    return Measurement(case, median_s, None, [], PUBLISHED)


# ------------------------------------------------------------------------------ direction
@pytest.mark.parametrize("stored", ["measured", "published"])
def test_a_slower_run_is_a_regression_and_a_faster_one_never(stored):
    base = Baseline("h100", H100, {CASE: measured() if stored == "measured" else published()})
    slow = base.compare(measured(scale=1.5))
    assert slow.status == stats.REGRESSED and slow.regressed
    assert slow.ratio == pytest.approx(1.5, rel=0.02)  # current over baseline: > 1 is slower
    fast = base.compare(measured(scale=0.5))
    assert fast.status == stats.IMPROVED and not fast.regressed
    assert fast.ratio == pytest.approx(0.5, rel=0.02)


def test_relative_ratios_keep_the_same_direction():
    ratios = [1.3 * s for s in SPREAD]
    base = Baseline("h100", H100, {CASE: measured(relative=ratios, reference=REF)})
    slower = measured(relative=[1.5 * r for r in ratios], reference=REF)
    faster = measured(relative=[r / 1.5 for r in ratios], reference=REF)
    assert base.compare(slower).status == stats.REGRESSED
    assert base.compare(faster).status == stats.IMPROVED
    assert base.compare(slower).ratio == pytest.approx(1.5, rel=0.02)


def test_the_verdict_describes_the_direction():
    base = Baseline("h100", H100, {CASE: measured()})
    text = base.compare(measured(scale=1.5)).describe()
    assert text.startswith("regressed: 1.5") and "x the baseline's time" in text


# ----------------------------------------------------------------------- what is evidence
def test_an_insignificant_speed_up_is_unchanged_not_improved():
    """Half the median time, but two samples a side overlap: no evidence of a change."""
    v = stats.compare([1.0, 3.0], [0.5, 1.5])
    assert v.ratio == pytest.approx(0.5) and v.p_value is not None and v.p_value >= 0.05
    assert v.status == stats.UNCHANGED
    base = Baseline("h100", H100, {CASE: measured(samples=[1.0, 3.0])})
    assert base.compare(measured(samples=[0.5, 1.5])).status == stats.UNCHANGED


def test_an_insignificant_relative_speed_up_is_unchanged():
    base = Baseline("h100", H100, {CASE: measured(relative=[1.0, 3.0], reference=REF)})
    v = base.compare(measured(relative=[0.5, 1.5], reference=REF))
    assert v.ratio == pytest.approx(0.5) and v.status == stats.UNCHANGED


def test_a_significant_change_inside_the_factor_is_unchanged_both_ways():
    base = [1 + 0.001 * i for i in range(20)]
    for scale in (1.05, 1 / 1.05):
        v = stats.compare(base, [x * scale for x in base], factor=1.10)
        assert v.p_value < 0.05 and v.status == stats.UNCHANGED


@pytest.mark.parametrize("q", [0.0, 0.1, 0.9, 1.0])
def test_a_published_median_is_compared_with_the_current_median_whatever_q(q):
    """The minimum of [0.5, 1.5, 1.6] would read as 2x faster; the median is 1.5x slower."""
    current = [0.5, 1.5, 1.6]
    v = stats.compare([], current, baseline_median=1.0, q=q)
    assert v.ratio == pytest.approx(1.5) and v.status == stats.REGRESSED
    base = Baseline("h100", H100, {CASE: published(median_s=1e-3)})
    v = base.compare(measured(samples=current), q=q)
    assert v.ratio == pytest.approx(1.5) and v.status == stats.REGRESSED


def test_relative_ratios_are_compared_at_the_median_whatever_q():
    stored = [1.0] * 6 + [2.0] * 6
    current = [1.0] * 2 + [2.0] * 10
    base = Baseline("h100", H100, {CASE: measured(relative=stored, reference=REF)})
    v = base.compare(measured(relative=current, reference=REF), q=0.0)
    assert v.ratio == pytest.approx(2.0 / 1.5)


def test_a_single_current_sample_is_decided_on_the_factor_alone():
    """One sample against twenty can never reach p < 0.05 (at best 2/21): feeding it to the
    test would call every single-sample regression unchanged."""
    base = [1 + 0.001 * i for i in range(20)]
    v = stats.compare(base, [1.5])
    assert v.p_value is None and v.status == stats.REGRESSED
    assert stats.compare(base, [0.5]).status == stats.IMPROVED
    stored = Baseline("h100", H100, {CASE: measured(samples=base)})
    assert stored.compare(measured(samples=[1.5])).status == stats.REGRESSED


def test_a_factor_below_one_is_refused():
    with pytest.raises(ValueError):
        stats.compare([1.0], [1.0], factor=0.9)


# ------------------------------------------------------------------ a mixed baseline
def mixed() -> Baseline:
    return Baseline("h100", H100, {CASE: published(), OTHER: measured(OTHER)})


def test_a_mixed_baseline_compares_each_case_by_its_own_kind():
    base = mixed()
    assert not base.published_only
    pub = base.compare(measured(scale=1.5))
    assert pub.status == stats.REGRESSED and pub.p_value is None
    assert "published figure" in pub.reason
    own = base.compare(measured(OTHER, scale=1.5))
    assert own.status == stats.REGRESSED and own.p_value is not None
    assert "published" not in own.reason


def test_a_mixed_baseline_under_relative_gating():
    """Relative ratios: a published case is still judged on absolute time; a measured case
    without ratios is no baseline (never an absolute comparison of a ratio)."""
    base = mixed()
    pub = base.compare(measured(scale=1.5, relative=[1.3] * 12, reference=REF))
    assert pub.status == stats.REGRESSED and "published figure" in pub.reason
    own = base.compare(measured(OTHER, relative=[1.3] * 12, reference=REF))
    assert own.status == stats.NO_BASELINE


def test_a_mixed_baseline_names_its_exact_device():
    """Only an all-published file tolerates another SKU string of the same GPU; one measured
    case makes the file this exact device's."""
    sxm = Fingerprint("cuda", "NVIDIA H100 SXM5", "9.0", torch="2.13.0", cuda="12.8")
    with pytest.raises(BadInput, match="different device"):
        baselines.check_fingerprint(mixed(), sxm)
    only_published = Baseline("h100", H100, {CASE: published()})
    assert baselines.check_fingerprint(only_published, sxm) == []


def test_a_mixed_baseline_survives_the_file(tmp_path):
    path = tmp_path / "h100.json"
    baselines.save(mixed(), path)
    back = baselines.load(path)
    assert back.cases[CASE].provenance.kind == "published" and back.cases[CASE].iqr_s is None
    assert back.cases[OTHER].samples == mixed().cases[OTHER].samples
    assert back.compare(measured(scale=1.5)).p_value is None


# ------------------------------------------------------------------------ fingerprints
def test_update_records_the_new_software_stack(tmp_path):
    path = tmp_path / "h100.json"
    baselines.update(path, "h100", H100, [measured()])
    newer = Fingerprint("cuda", H100.device, "9.0", torch="2.14.0", cuda="12.9",
                        driver="580.1")
    with pytest.warns(baselines.BaselineDriftWarning):
        baselines.update(path, "h100", newer, [measured(OTHER)])
    back = baselines.load(path)
    assert back.fingerprint == newer
    assert set(back.cases) == {CASE, OTHER}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file now matches the stack: no drift warned
        assert baselines.check_fingerprint(back, newer) == []


def test_a_cpu_baseline_from_another_isa_is_refused(tmp_path):
    cpu = Fingerprint("cpu", "AMD EPYC 9654", isa=AVX512, torch="2.13.0", threads=1)
    other_isa = Fingerprint("cpu", "AMD EPYC 9654", isa=AVX2, torch="2.13.0", threads=1)
    base = Baseline("cpu-amd-avx512", cpu, {CASE: measured()})
    with pytest.raises(BadInput, match="different device") as info:
        baselines.check_fingerprint(base, other_isa)
    assert "isa" in str(info.value)
    path = tmp_path / "cpu.json"
    baselines.update(path, "cpu-amd-avx512", cpu, [measured()])
    with pytest.raises(BadInput, match="different device"):
        baselines.update(path, "cpu-amd-avx512", other_isa, [measured(OTHER)])
    assert set(baselines.load(path).cases) == {CASE}


def test_a_published_cpu_file_still_refuses_another_isa():
    """Published files forgive the device's name, never its instruction set."""
    cpu = Fingerprint("cpu", "Intel Xeon", isa=AVX512)
    base = Baseline("cpu", cpu, {CASE: published()})
    with pytest.raises(BadInput, match="isa"):
        baselines.check_fingerprint(base, Fingerprint("cpu", "Intel Xeon", isa=AVX2))


@pytest.mark.parametrize("field", ["kind", "capability"])
def test_other_device_fields_are_refused(field):
    other = Fingerprint(**{**H100.__dict__, field: "cpu" if field == "kind" else "8.0"})
    with pytest.raises(BadInput, match=field):
        baselines.check_fingerprint(Baseline("h100", H100, {CASE: published()}), other)


@pytest.mark.parametrize("field", ["torch", "cuda", "cudnn", "driver", "flash_attn", "threads"])
def test_stack_fields_only_warn(field):
    other = Fingerprint(**{**H100.__dict__, field: 7 if field == "threads" else "x"})
    with pytest.warns(baselines.BaselineDriftWarning, match=field):
        assert baselines.check_fingerprint(Baseline("h100", H100, {}), other)


# ------------------------------------------------------------- through the pytest plugin
PERF_TEST = '''
import pytest
from gac_check.bench import workloads


@pytest.mark.perf
def test_gemm(gac_bench):
    gac_bench.regression(workloads.gemm(8, 16, 8, "float32"))
'''


def test_the_perf_gate_refuses_a_cpu_baseline_of_another_isa(pytester):
    """A project's perf test on this CPU, with a stored file for this CPU's profile key but
    another instruction set: the test skips naming the ISA, it never compares."""
    here = baselines.present_fingerprint("cpu")
    other = ("avx2",) if "avx512f" in here.isa else (*here.isa, "avx512f")
    stored = Fingerprint(**{**here.__dict__, "isa": other})
    store = pytester.path / "baselines"
    key = profiles.cpu_profile_key()
    baselines.save(Baseline(key, stored, {CASE: measured()}), baselines.path_for(key, store))
    pytester.makepyfile(test_perf=PERF_TEST)
    res = pytest_here(pytester, "-q", "-rs", "--gac-gpu", "cpu", "test_perf.py",
                      env={"GAC_BASELINES_DIR": str(store)})
    out = res.stdout.str()
    assert res.ret == 0, out[-3000:] + res.stderr.str()[-2000:]
    assert "1 skipped" in out
    assert "different device" in out and "isa" in out, out[-2000:]


DEFAULTS_TEST = '''
from gac_check.profiles import CPU_PERF_FACTOR


def test_defaults(gac_bench, request):
    given = request.config.getoption("--gac-perf-factor")
    assert gac_bench.session.factor == (given or CPU_PERF_FACTOR)
    assert gac_bench.session.q == 0.0  # the minimum: interference on a CPU only adds time
'''


@pytest.mark.parametrize("factor", [None, "1.3"])
def test_on_a_cpu_the_gate_uses_the_cpus_factor_and_quantile(pytester, factor):
    pytester.makepyfile(test_defaults=DEFAULTS_TEST)
    extra = ["--gac-perf-factor", factor] if factor else []
    res = pytest_here(pytester, "-q", "--gac-gpu", "cpu", *extra, "test_defaults.py",
                      env={"GAC_BASELINES_DIR": str(pytester.path / "baselines")})
    assert res.ret == 0 and "1 passed" in res.stdout.str(), res.stdout.str()[-3000:]
