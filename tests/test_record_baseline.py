"""The baseline recording command (``gac-check baseline record``, here by its older spelling
``python -m gac_check.bench.sweep --profile``), on the CPU.

The GPU plan cannot be run here; what can be checked without a GPU is checked: that it records
every case the issue lists (SDPA staircase per backend, GEMM K/N sweeps holding the
padding-rescue pairs, the perf gate's reference kernel), that its published-shape cases have
the keys of the published baseline (so a recording replaces those figures), that it fits the
10-minute slot on its stated assumptions, and that the same code path, run on the CPU, writes a
baseline the contract then reads its figures from. The device-specific lines left unrun are the
CUDA clock (tests/test_timing_path.py checks its API) and the device probe.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gac_check.bench import baselines, published, timing, workloads
from gac_check.bench.cases import parse_case_key
from gac_check.bench.sweep import MAX_SECONDS, Group, RecordPlan, record, record_plan
from gac_check.bench.workloads import reference_workload
from gac_check.contract.evidence import evidence_for
from gac_check.contract.measured import MODULI
from gac_check.profiles import cpu_name, cpu_profile_key
from gac_check.sites import Role

FAST = timing.TimingConfig(samples=3, trials=2, warmup_s=0.0, min_warmup_calls=1)


def keys(plan: RecordPlan, group: str) -> set[str]:
    (g,) = [g for g in plan.groups if g.name == group]
    return {w.key for w in g.works}


def sizes(case_keys: set[str], axis: str, **fixed: str) -> set[int]:
    out = set()
    for key in case_keys:
        _, params = parse_case_key(key)
        if all(params.get(k) == v for k, v in fixed.items()):
            out.add(int(params[axis]))
    return out


def has_rescue_pairs(values: set[int]) -> bool:
    """For every modulus, a size half-way off it and its padded size (an odd multiple)."""
    for m in MODULI:
        pairs = [v for v in values if v % m == m // 2 and (v + m // 2) in values
                 and ((v + m // 2) // m) % 2 == 1]
        if not pairs:
            return False
    return True


def test_gpu_plan_records_every_group_the_gate_and_contract_need():
    plan = record_plan("cuda")
    assert [g.name for g in plan.groups] == ["reference", "sdpa-default",
                                             "gemm-published-shape", "gemm-rank-sizes",
                                             "sdpa-backends"]
    sdpa = keys(plan, "sdpa-default")
    for dt in ("float16", "bfloat16"):
        d = sizes(sdpa, "D", dtype=dt, backend="default", B="4", S="2048", H="32")
        assert d == set(range(32, 257)) and has_rescue_pairs(d)
    forced = keys(plan, "sdpa-backends")
    for be in ("flash", "efficient", "cudnn"):
        assert sizes(forced, "D", backend=be) == set(range(32, 257))
    assert sizes(forced, "D", backend="math")
    gemm = keys(plan, "gemm-published-shape")
    for dt in ("float16", "bfloat16"):
        assert sizes(gemm, "K", dtype=dt, M="512", N="4096") == set(range(4000, 4101))
        assert sizes(gemm, "N", dtype=dt, M="512", K="4096") == set(range(4000, 4101))
    rank = keys(plan, "gemm-rank-sizes")
    k = sizes(rank, "K", dtype="float16", M="4096", N="4096")
    n = sizes(rank, "N", dtype="float16", M="4096", K="4096")
    assert {153, 245} <= k & n and has_rescue_pairs(k) and has_rescue_pairs(n)
    # the perf gate's reference kernel (gac_check.plugin.perf) is recorded too
    assert keys(plan, "reference") == {reference_workload("cuda").key}


def test_gpu_plan_replaces_every_published_case():
    """Measured cases take the published cases' keys, so the file's figures become measured."""
    plan = {w.key for g in record_plan("cuda").groups for w in g.works}
    for gpu in ("a100", "h100"):
        assert set(published.packaged(gpu).cases) <= plan


def test_gpu_plan_fits_the_ten_minute_slot():
    plan = record_plan("cuda")
    assert MAX_SECONDS < 600
    assert plan.estimate_s() < MAX_SECONDS
    assert plan.smoke().cases == 3 * len(plan.groups) - 2  # the reference group has one


def test_cpu_plan_keeps_one_dtype_per_process():
    for dtype in ("float32", "bfloat16"):
        plan = record_plan("cpu", dtype)
        dtypes = {w.params["dtype"] for g in plan.groups for w in g.works}
        assert dtypes == {dtype}
    assert keys(record_plan("cpu"), "reference") == {reference_workload("cpu").key}


def run_sweep(*args: str, env_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GAC_BASELINES_DIR": str(env_dir)}
    return subprocess.run([sys.executable, "-m", "gac_check.bench.sweep", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_recording_command_end_to_end_on_cpu(tmp_path):
    proc = run_sweep("--profile", "cpu", "--smoke", env_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / f"{cpu_profile_key()}.json"  # baselines/<key>.json by default
    base = baselines.load(path)
    assert base.fingerprint.kind == "cpu" and base.fingerprint.device == cpu_name()
    assert base.peak["tflops"] > 0 and base.peak["copy_gbs"] > 0
    assert len(base.cases) == record_plan("cpu").smoke().cases
    for m in base.cases.values():
        assert m.provenance.kind == "measured" and "--smoke" in m.provenance.command
        assert m.provenance.date and len(m.samples) == 3 and m.median_s > 0
    assert reference_workload("cpu").key in base.cases
    again = run_sweep("--profile", "cpu", "--smoke", env_dir=tmp_path)
    assert again.returncode == 0 and len(baselines.load(path).cases) == len(base.cases)


def test_dry_run_shows_the_gpu_plan_without_a_gpu(tmp_path):
    proc = run_sweep("--profile", "h100", "--dry-run", env_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "sdpa-backends:" in proc.stdout and "on cuda" in proc.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is present")
def test_absent_gpu_is_one_line_and_exit_2(tmp_path):
    proc = run_sweep("--profile", "h100", env_dir=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "asks for an H100" in proc.stderr


def test_time_budget_stops_before_a_group_and_says_so(tmp_path):
    proc = run_sweep("--profile", "cpu", "--smoke", "--max-seconds", "0", env_dir=tmp_path)
    assert proc.returncode == 1
    assert "not recorded: reference, sdpa-default, gemm" in proc.stderr


def test_recorded_sweep_becomes_the_contracts_measured_evidence(tmp_path, monkeypatch):
    """What the command records is what expected slowdowns are read from next."""
    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path))
    plan = RecordPlan("cpu", [Group("sdpa", [workloads.sdpa(1, 64, 2, d, "float32")
                                             for d in range(56, 76)], FAST)])
    out = tmp_path / f"{cpu_profile_key()}.json"
    assert record(plan, "cpu", cpu_profile_key(), out, "test-record", "float32") == []
    stored = baselines.load(out)
    ev = evidence_for("cpu")
    fig = ev.figure(Role.HEAD_DIM, 63, 64, "float32", lambda u: -(-u // 8) * 8)
    t = {d: stored.cases[workloads.sdpa(1, 64, 2, d, "float32").key].median_s
         for d in (63, 64)}
    assert fig.source == "measured" and fig.hardware == cpu_name()
    assert fig.value == pytest.approx(t[63] / t[64], abs=1e-3)
    assert "test-record" in fig.citation and "56-75" in fig.coverage
    outside = ev.figure(Role.HEAD_DIM, 99, 104, "float32", lambda u: -(-u // 8) * 8)
    assert outside.value is None and "56-75" in outside.note
    assert json.loads(out.read_text())["cases"]  # a plain, readable baseline file
