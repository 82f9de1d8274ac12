"""baselines: schema, fingerprints, atomic and concurrent writes; the measured contract.

Checked by hand that these can fail: without the fcntl lock in ``update`` the concurrent test
loses cases (each worker's read-merge-write overwrites the others'); without the fingerprint
check a baseline from another GPU loads silently; without the noise gate the noisy family
yields rules.
"""
from __future__ import annotations

import json
import multiprocessing
import warnings
from pathlib import Path

import pytest

from gac_check import profiles
from gac_check.bench import baselines, workloads
from gac_check.bench.baselines import Baseline, Fingerprint, Measurement, Provenance
from gac_check.contract import measured as measured_contract
from gac_check.contract.select import for_hardware
from gac_check.errors import BadInput
from gac_check.sites import DimSite, Role

ROOT = Path(__file__).resolve().parent.parent
H100 = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", torch="2.13.0", cuda="12.8")
MEASURED = Provenance("measured", "2026-11-21T00:00:00Z", "test")


def meas(key: str, t: float, n: int = 9, spread: float = 0.01) -> Measurement:
    samples = [t * (1 + spread * ((i % 3) - 1)) for i in range(n)]
    return Measurement.from_samples(key, samples, MEASURED)


def test_roundtrip(tmp_path):
    b = Baseline("h100", H100, {m.case: m for m in [meas("gemm/M=1,K=2,N=3,dtype=float16",
                                                         1e-3)]}, {"tflops": 700.0})
    baselines.save(b, tmp_path / "h100.json")
    back = baselines.load(tmp_path / "h100.json")
    assert back.fingerprint == H100 and back.peak == {"tflops": 700.0}
    assert back.cases == b.cases


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ('{"schema": "something-else"}', "not a gac-check baseline"),
    ('{"schema": "gac-check-baseline", "version": 99}', "newer"),
    ('{"schema": "gac-check-baseline", "version": 0}', "no valid schema version"),
    ('{"schema": "gac-check-baseline", "version": 1, "profile": "x"}', "schema version 2"),
    ('{"schema": "gac-check-baseline", "version": 1, "profile": "x", "fingerprint": '
     '{"kind": "cpu", "device": "x"}, "cases": {"a/b=1": {"median_s": -1, "samples": [], '
     '"provenance": {"kind": "measured"}}}}', "median_s must be positive"),
])
def test_bad_files_name_the_file(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(BadInput, match=match) as info:
        baselines.load(path)
    assert str(path) in str(info.value)


def test_migrations_run_in_order(tmp_path, monkeypatch):
    b = Baseline("h100", H100, {"k/a=1": meas("k/a=1", 1.0)})
    doc = baselines.to_document(b)
    old = baselines.VERSION
    monkeypatch.setattr(baselines, "VERSION", old + 1)
    monkeypatch.setitem(baselines.MIGRATIONS, old, lambda d: {**d, "profile": d["profile"] + "!"})
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    assert baselines.load(path).profile == "h100!"
    monkeypatch.delitem(baselines.MIGRATIONS, old)
    with pytest.raises(BadInput, match=f"no migration from baseline schema version {old}"):
        baselines.load(path)


def test_other_device_is_refused_and_stack_drift_warned(tmp_path):
    b = Baseline("h100", H100, {}, path=tmp_path / "h100.json")
    h200 = Fingerprint("cuda", "NVIDIA H200", "9.0", torch="2.13.0", cuda="12.8")
    with pytest.raises(BadInput, match="different device") as info:
        baselines.check_fingerprint(b, h200)
    assert "h100.json" in str(info.value)
    newer = Fingerprint("cuda", H100.device, "9.0", torch="2.14.0", cuda="12.8")
    with pytest.warns(baselines.BaselineDriftWarning, match="torch"):
        assert baselines.check_fingerprint(b, newer) == ["torch: '2.13.0' vs '2.14.0'"]


def test_published_a100_baseline_loads_and_tolerates_the_sku_name():
    a100 = baselines.load(ROOT / "baselines" / "a100.json")
    assert a100.published_only
    sxm = Fingerprint("cuda", "NVIDIA A100-SXM4-80GB", "8.0", torch="2.9.1", cuda="12.8")
    assert baselines.check_fingerprint(a100, sxm) == []
    with pytest.raises(BadInput):
        baselines.check_fingerprint(a100, Fingerprint("cuda", "NVIDIA A100", "9.0"))
    case = workloads.sdpa(4, 2048, 32, 107, "float16").key
    assert a100.get(case).median_s == pytest.approx(2.147e-3)
    assert a100.get(case).provenance.citation


def test_missing_case_is_no_baseline_never_a_pass():
    b = Baseline("h100", H100, {})
    v = b.compare(meas("gemm/M=1,K=2,N=3,dtype=float16", 1.0))
    assert v.status == "no baseline" and "gemm/M=1" in v.reason


def test_save_is_atomic(tmp_path):
    path = tmp_path / "b.json"
    good = Baseline("h100", H100, {"k/a=1": meas("k/a=1", 1.0)})
    baselines.save(good, path)
    before = path.read_bytes()
    broken = Baseline("h100", H100, {"k/a=2": meas("k/a=2", 1.0)})
    broken.peak = {"tflops": object()}  # not JSON: fails half way through the dump
    with pytest.raises(TypeError):
        baselines.save(broken, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


def _worker(args):
    path, i = args
    cases = [meas(f"gemm/M={i},K={j},N=8,dtype=float16", 1e-3) for j in range(20)]
    for c in cases:  # many small read-merge-writes maximise the chance of a lost update
        baselines.update(Path(path), "h100", H100, [c])


def test_concurrent_updates_merge(tmp_path):
    path = tmp_path / "h100.json"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_worker, [(str(path), i) for i in range(4)])
    assert len(baselines.load(path).cases) == 80


def test_update_refuses_another_devices_file(tmp_path):
    path = tmp_path / "h100.json"
    baselines.update(path, "h100", H100, [meas("k/a=1", 1.0)])
    with pytest.raises(BadInput, match="different device"):
        baselines.update(path, "h100", Fingerprint("cuda", "other", "9.0"), [])


def test_cpu_profile_key_scheme():
    key = profiles.cpu_profile_key()
    assert key.startswith("cpu-") and key.count("-") == 2


# ------------------------------------------------------------------- measured contract
def staircase(step: dict[int, float], noise: float = 0.01) -> Baseline:
    """A synthetic GEMM K sweep: t = K * (slowdown of K's largest power-of-two class)."""
    cases = {}
    for k in range(960, 1090):
        pow2 = k & -k
        t = k * 1e-6 * step.get(min(pow2, 64), 1.0)
        m = meas(workloads.gemm(64, k, 1024, "float16").key, t, spread=noise)
        cases[m.case] = m
    return Baseline("h100", H100, cases)


def test_derive_finds_exactly_the_modulus_that_matters():
    base = staircase({1: 1.5, 2: 1.5, 4: 1.5})  # below 8 slow, 8 and above fast
    rules, effects = measured_contract.derive_rules(base, "float16")
    assert [r.modulus for r in rules] == [8]
    (rule,) = rules
    assert rule.source == "measured" and rule.severity == "error"
    assert rule.slowdown == pytest.approx(1.5, rel=0.02)
    assert dict(rule.slowdown_by_pow2)[1] == pytest.approx(1.5, rel=0.02)
    assert {e.modulus for e in effects} == {2, 4, 8, 16, 32, 64}


def test_noisy_sweep_judges_nothing():
    base = staircase({1: 1.5, 2: 1.5, 4: 1.5}, noise=0.5)
    assert measured_contract.derive_rules(base, "float16") == ([], [])


def test_drift_reports_dropped_rules_and_new_cliffs():
    old, _ = measured_contract.derive_rules(staircase({1: 1.5, 2: 1.5, 4: 1.5}), "float16")
    new, seen = measured_contract.derive_rules(staircase({1: 1.3, 2: 1.0, 4: 1.0}), "float16")
    d = measured_contract.drift(old, new, measured_contract.roles_covered(seen))
    assert len(d.no_longer_needed) == 1 and "mod8" in d.no_longer_needed[0]
    assert len(d.new_cliffs) == 1 and "% 2" in d.new_cliffs[0]


def test_published_a100_sweep_yields_the_known_cliffs():
    a100 = baselines.load(ROOT / "baselines" / "a100.json")
    rules, _ = measured_contract.derive_rules(a100, "float16", measured_only=False)
    by = {(("sdpa" if Role.HEAD_DIM in r.roles else "gemm"), r.modulus): r for r in rules}
    assert by[("sdpa", 8)].slowdown == pytest.approx(1.36, abs=0.03)
    assert by[("gemm", 2)].severity == by[("gemm", 8)].severity == "error"
    assert ("sdpa", 2) not in by and ("gemm", 4) not in by


def test_for_hardware_uses_a_measured_sweep_and_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path))
    published = for_hardware("h100", "float16")
    assert published.source == "published"
    baselines.save(staircase({1: 1.5, 2: 1.5, 4: 1.5}), tmp_path / "h100.json")
    c = for_hardware("h100", "float16")
    assert c.source == "measured"
    rank = DimSite("r", Role.RANK, 1001, [])
    assert [r.id for r in c.violations(rank)] == ["measured-gemm-mod8"]
    assert c.target(rank) == 1008
    # roles the sweep does not cover keep their published rules; hard limits stay
    head = DimSite("h", Role.HEAD_DIM, 300, [])
    assert {r.id for r in c.violations(head)} == {r.id for r in published.violations(head)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert for_hardware("h100", "bfloat16").source == "published"  # no bf16 sweep


def test_a_cpu_baseline_from_another_cpu_model_says_why_and_what_to_do(tmp_path):
    """A CPU baseline committed from a laptop meets the next hosted runner: same file name
    (vendor and ISA), another CPU model. The refusal says timings do not travel, and what to
    do instead (issue 41)."""
    laptop = Fingerprint("cpu", "AMD Ryzen 7 5800U", isa=("avx2", "fma"), torch="2.13.0")
    runner = Fingerprint("cpu", "AMD EPYC 7763 64-Core Processor", isa=("avx2", "fma"),
                         torch="2.13.0")
    path = tmp_path / "cpu-amd-avx2.json"
    baselines.update(path, "cpu-amd-avx2", laptop, [meas("k/a=1", 1.0)])
    with pytest.raises(BadInput, match="different device") as info:
        baselines.check_fingerprint(baselines.load(path), runner)
    said = str(info.value)
    assert "not portable across CPU models" in said and "-m 'not perf'" in said
    with pytest.raises(BadInput) as gpu:
        baselines.check_fingerprint(baselines.load(path), Fingerprint("cuda", "H100", "9.0"))
    assert "CPU models" not in str(gpu.value)
