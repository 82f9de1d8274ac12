"""Baseline files beyond the happy round trip: what mutmut on gac_check/bench/baselines.py showed
no test pinned (benchmarks/mutation.py; score in benchmarks/RESULTS.md).

A CPU fingerprint's ISA survives the file; hand-written or published files may omit samples,
IQR and peak; a zero median is refused; a chain of migrations runs every step once; an
unreadable file is named; ``update`` creates nested directories and records the profile, the
peak and the path; the directory lookup prefers ``$GAC_BASELINES_DIR``, then the project's own
``./baselines``; an absolute comparison of measured cases uses the quantile asked for.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gac_check.bench import baselines, stats
from gac_check.bench.baselines import Baseline, Fingerprint, Measurement, Provenance
from gac_check.errors import BadInput

CPU = Fingerprint("cpu", "AMD EPYC 9654", isa=("avx2", "fma", "avx512f"), torch="2.13.0",
                  threads=1)
CASE = "gemm/M=64,K=1001,N=1024,dtype=float32"
MEASURED = Provenance("measured", "2026-11-21T00:00:00Z", "test")


def measured(samples: list[float]) -> Measurement:
    return Measurement.from_samples(CASE, samples, MEASURED)


def minimal_doc(**case: object) -> dict:
    """A file as a person or a paper's table would write it: only what is required."""
    return {"schema": baselines.SCHEMA, "version": baselines.VERSION, "profile": "a100",
            "fingerprint": {"kind": "cuda", "device": "NVIDIA A100"},
            "cases": {CASE: {"median_s": 1e-3, "provenance": {"kind": "published"}, **case}}}


def test_a_cpu_fingerprint_keeps_its_isa_through_the_file(tmp_path):
    path = tmp_path / "cpu.json"
    baselines.save(Baseline("cpu-amd-avx512", CPU, {CASE: measured([1.0, 1.1])}), path)
    assert json.loads(path.read_text())["fingerprint"]["isa"] == list(CPU.isa)
    back = baselines.load(path)
    assert back.fingerprint == CPU and back.fingerprint.isa == CPU.isa
    assert baselines.check_fingerprint(back, CPU) == []


def test_a_minimal_published_file_loads(tmp_path):
    path = tmp_path / "a100.json"
    path.write_text(json.dumps(minimal_doc()))
    base = baselines.load(path)
    m = base.get(CASE)
    assert (m.samples, m.iqr_s, base.peak, base.path) == ([], None, {}, path)
    v = base.compare(measured([2e-3, 2e-3]))
    assert v.status == stats.REGRESSED and "published figure" in v.reason


@pytest.mark.parametrize("median", [0, -1e-3])
def test_a_median_that_is_not_positive_is_refused(tmp_path, median):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(minimal_doc(median_s=median)))
    with pytest.raises(BadInput, match="median_s must be positive"):
        baselines.load(path)


def test_a_missing_case_names_the_file_it_was_looked_up_in(tmp_path):
    path = tmp_path / "a100.json"
    path.write_text(json.dumps(minimal_doc()))
    v = baselines.load(path).compare(Measurement.from_samples("gemm/M=1,K=1,N=1,dtype=float32",
                                                              [1.0], MEASURED))
    assert v.status == stats.NO_BASELINE and str(path) in v.reason


def test_a_chain_of_migrations_runs_each_step_once_in_order(tmp_path, monkeypatch):
    seen: list[int] = []

    def step(doc: dict) -> dict:
        seen.append(doc["version"])
        return {**doc, "profile": doc["profile"] + "+"}

    doc = minimal_doc()
    doc["version"] = 1
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(baselines, "VERSION", 4)
    for v in (1, 2, 3):
        monkeypatch.setitem(baselines.MIGRATIONS, v, step)
    assert baselines.load(path).profile == "a100+++"
    assert seen == [1, 2, 3]


def test_an_unreadable_file_is_bad_input_naming_it(tmp_path):
    for path in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(BadInput, match="cannot read baseline") as info:
            baselines.load(path)
        assert info.value.path == path


def test_update_creates_the_file_with_its_profile_peak_and_path(tmp_path):
    path = tmp_path / "new" / "nested" / "cpu.json"
    made = baselines.update(path, "cpu-amd-avx512", CPU, [measured([1.0, 1.1])],
                            peak={"tflops": 2.5})
    assert made.path == path
    back = baselines.load(path)
    assert (back.profile, back.peak, list(back.cases)) == ("cpu-amd-avx512", {"tflops": 2.5},
                                                           [CASE])
    baselines.update(path, "cpu-amd-avx512", CPU, [], peak={"gflops": 9.0})
    assert baselines.load(path).peak == {"tflops": 2.5, "gflops": 9.0}


def test_save_creates_missing_parent_directories(tmp_path):
    path = tmp_path / "a" / "b" / "c.json"
    baselines.save(Baseline("cpu", CPU, {CASE: measured([1.0])}), path)
    assert baselines.load(path).cases[CASE].samples == [1.0]


def test_the_baselines_directory_lookup_order(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "baselines").mkdir(parents=True)
    monkeypatch.chdir(project)
    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path / "env"))
    assert baselines.default_dir() == tmp_path / "env"
    monkeypatch.delenv("GAC_BASELINES_DIR")
    assert baselines.default_dir() == project / "baselines"  # the project's own first
    assert baselines.path_for("h100") == project / "baselines" / "h100.json"
    monkeypatch.chdir(tmp_path)  # no ./baselines here: gac-check's own, from this checkout
    checkout = Path(baselines.__file__).resolve().parents[2] / "baselines"
    assert baselines.default_dir() == checkout and (checkout / "a100.json").is_file()


def test_measured_cases_are_compared_at_the_quantile_asked_for():
    """A busy machine interrupted most baseline samples: the minimum (q=0) still tracks the
    code's own cost."""
    base = Baseline("cpu", CPU, {CASE: measured([1.0] * 5 + [5.0] * 15)})
    current = measured([1.02] * 15 + [5.0] * 5)
    assert base.compare(current, q=0.0).ratio == pytest.approx(1.02)
    assert base.compare(current).ratio == pytest.approx(1.02 / 5.0)


def test_a_published_verdict_describes_itself():
    base = Baseline("a100", CPU, {CASE: Measurement(CASE, 1e-3, None, [],
                                                    Provenance("published", citation="x"))})
    text = base.compare(measured([2e-3]), factor=1.2).describe()
    assert text.startswith("regressed: 2.000x") and "threshold 1.20x" in text
    assert "published figure" in text


def test_from_samples_derives_throughput_and_the_share_of_the_peak():
    m = Measurement.from_samples(CASE, [2e-3, 2e-3, 4e-3], MEASURED, flops=4e9,
                                 peak_tflops=8.0, backend="math")
    assert m.median_s == 2e-3 and m.tflops == pytest.approx(2.0)
    assert m.peak_fraction == pytest.approx(0.25) and m.backend == "math"
    bare = Measurement.from_samples(CASE, [1e-3], MEASURED, flops=4e9)
    assert bare.tflops == pytest.approx(4.0) and bare.peak_fraction is None


def test_a_missing_case_without_a_file_names_the_profile():
    v = Baseline("cpu-amd-avx512", CPU, {}).compare(measured([1.0]), factor=1.3)
    assert v.status == stats.NO_BASELINE and "cpu-amd-avx512" in v.reason and v.factor == 1.3


def test_ratios_against_another_reference_kernel_are_no_baseline():
    stored = measured([1.0, 1.0])
    stored.relative, stored.reference = [1.3, 1.3], "gemm/M=64,K=768,N=1024,dtype=float32"
    current = measured([1.0, 1.0])
    current.relative, current.reference = [1.3, 1.3], "gemm/M=64,K=512,N=1024,dtype=float32"
    v = Baseline("cpu", CPU, {CASE: stored}).compare(current, factor=1.3)
    assert v.status == stats.NO_BASELINE and v.factor == 1.3


@pytest.mark.parametrize("relative", [False, True])
def test_alpha_is_the_callers(relative):
    """Three samples a side, fully separated: p = 0.1, significant at 0.2 but not at 0.05."""
    stored, current = measured([1.0, 1.01, 1.02]), measured([1.5, 1.51, 1.52])
    if relative:
        stored.relative, stored.reference = [1.0, 1.01, 1.02], "ref"
        current.relative, current.reference = [1.5, 1.51, 1.52], "ref"
    base = Baseline("cpu", CPU, {CASE: stored})
    assert base.compare(current).status == stats.UNCHANGED
    loose = base.compare(current, alpha=0.2)
    assert loose.status == stats.REGRESSED and loose.p_value == pytest.approx(0.1)


def test_the_present_cpu_fingerprint():
    """What a CPU baseline is keyed and refused by: this CPU, its ISA, torch without the local
    build suffix ("2.13.0+cpu" is the same stack as "2.13.0"), one thread unless told."""
    import torch

    from gac_check import profiles

    fp = baselines.present_fingerprint("cpu")
    assert (fp.kind, fp.device, fp.isa) == ("cpu", profiles.cpu_name(), profiles.cpu_isa())
    assert fp.torch == torch.__version__.split("+")[0] and "+" not in fp.torch
    assert fp.threads == 1 and baselines.present_fingerprint("cpu", threads=4).threads == 4
    assert fp.capability is None and fp.cuda is None


def test_a_relative_verdict_keeps_the_callers_factor():
    stored, current = measured([1.0, 1.0]), measured([1.0, 1.0])
    stored.relative, stored.reference = [1.3] * 6, "ref"
    current.relative, current.reference = [1.3] * 6, "ref"
    v = Baseline("cpu", CPU, {CASE: stored}).compare(current, factor=1.07)
    assert v.status == stats.UNCHANGED and v.factor == 1.07 and "relative to ref" in v.reason
