"""The pytest plugin as another repository sees it.

A throwaway project outside this repository (its own pytest.ini, no conftest of ours) writes
tests against the plugin's fixtures, markers and hypothesis strategies, and runs
``python -m pytest --gpu cpu --model DIR`` in a subprocess: the plugin is found only through
the installed package's ``pytest11`` entry point, as in a compressor's CI.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.helpers import tiny_llama

if not any(ep.value == "gac_check.plugin.hooks" for ep in entry_points(group="pytest11")):
    pytest.skip("gac-check is not installed (pip install -e .), so its pytest11 entry point "
                "is not active", allow_module_level=True)

PROJECT_TESTS = '''
import time

import numpy as np
import pytest
from hypothesis import given

from gac_check.plugin.collect import record_perf
from gac_check.sites import DimSite, Role
from gac_check.testing.strategies import misaligned_dims


def test_session_fixtures(gac_profile, gac_contract, gac_models):
    assert gac_profile == "cpu"
    assert gac_contract("float32").profile == "cpu"
    assert [p.name for p in gac_models] == ["model"]


@given(dim=misaligned_dims(modulus=8, max_value=512))
def test_contract_repairs_every_misaligned_head_dim(gac_contract, dim):
    (finding,) = gac_contract("float32").check([DimSite("attn", Role.HEAD_DIM, dim, [])])
    assert finding.optimal_to % 8 == 0 and 0 < finding.optimal_to - dim < 8


@pytest.mark.perf
@pytest.mark.parametrize("k", [96, 100, 104, 107, 112])
def test_matmul_latency(request, k):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, k)), rng.standard_normal((k, 256))
    start = time.perf_counter()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    end = time.perf_counter()
    time.sleep(0.05)  # long enough that overlapping perf tests could not go unnoticed
    (request.config.rootpath / f"span-{k}.txt").write_text(f"{start} {time.perf_counter()}")
    record_perf(request.node, {"case": f"gemm/M=256,N=256,K={k},dtype=float64",
                               "measured_ms": float(np.median(times)) * 1e3,
                               "samples": len(times), "baseline_ms": None,
                               "verdict": "no baseline", "device": "cpu"})
'''

BUGGY_PROPERTY = '''
from hypothesis import given

from gac_check.testing.strategies import misaligned_dims


@given(dim=misaligned_dims(modulus=8, max_value=512))
def test_padding_bug(dim):
    padded = dim + (8 - dim % 8) if dim % 8 != 3 else dim + 4  # the bug: residue 3
    assert padded % 8 == 0, f"padded {dim} to {padded}"
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compressor-repo")
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_release_gate.py").write_text(PROJECT_TESTS)
    model = root / "model"
    model.mkdir()
    _tiny_model(model)
    return root


def _tiny_model(path: Path) -> None:
    tiny_llama(intermediate_size=172).save_pretrained(path)


def clean_env(root: Path) -> dict[str, str]:
    """This session's environment without what would make the inner pytest think it is ours.

    The project keeps its own (empty) baselines/, as a compressor's repository would: the
    contract is then the published one, not whatever this machine's sweep measured.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "HYPOTHESIS_", "CUDA_VISIBLE"))}
    env["HYPOTHESIS_PROFILE"] = "ci"
    env["GAC_BASELINES_DIR"] = str(root / "baselines")
    return env


def pytest_in(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=root, env=clean_env(root), capture_output=True, text=True,
                          timeout=300)


def test_external_project_passes_with_the_plugin(project):
    proc = pytest_in(project, "--gpu", "cpu", "--model", "model", "-q", "--strict-markers")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "7 passed" in proc.stdout


def test_options_and_markers_are_advertised(project):
    help_text = pytest_in(project, "--help").stdout
    for option in ("--gpu", "--model", "--gac-report", "--gac-update-baselines"):
        assert option in help_text
    markers = pytest_in(project, "--markers").stdout
    assert "@pytest.mark.gpu:" in markers and "@pytest.mark.perf:" in markers


def test_xdist_report_merges_on_the_controller(project, tmp_path):
    """-n 2: both workers' outcomes, perf records and the falsifying example reach one report;
    perf tests never overlap; the reproduce command really reproduces the failure."""
    (project / "tests" / "test_bug.py").write_text(BUGGY_PROPERTY)
    report = tmp_path / "gate.html"
    try:
        proc = pytest_in(project, "--gpu", "cpu", "--model", "model", "-n", "2",
                         "--gac-report", str(report))
    finally:
        (project / "tests" / "test_bug.py").unlink()
    assert proc.returncode == 1, proc.stdout[-3000:]
    run = json.loads(report.with_suffix(".json").read_text())
    assert run["tests"]["counts"] == {"passed": 7, "failed": 1}
    assert sorted(r["case"].split("K=")[1].split(",")[0] for r in run["perf"]) == \
        ["100", "104", "107", "112", "96"]
    (failure,) = run["equivalence"]
    assert failure["nodeid"] == "tests/test_bug.py::test_padding_bug"
    assert "dim=3" in failure["examples"][0]  # hypothesis shrinks to the smallest residue 3
    assert [c["hardware"]["profile"] for c in run["checks"]] == ["cpu"]
    html = report.read_text()
    assert "dim=3" in html and "test_padding_bug" in html and "<circle" in html

    spans = sorted(tuple(map(float, p.read_text().split())) for p in project.glob("span-*.txt"))
    assert len(spans) == 5
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, "two perf tests ran on the cpu device at once"

    (project / "tests" / "test_bug.py").write_text(BUGGY_PROPERTY)
    try:
        command = re.sub(r"(^| )python ", lambda m: f"{m[1]}{shlex.quote(sys.executable)} ",
                         failure["reproduce"], count=1)
        assert str(project) not in command  # no path of the machine that ran it
        again = subprocess.run(command, shell=True, env=clean_env(project), capture_output=True,
                               text=True, timeout=300, cwd=project)
    finally:
        (project / "tests" / "test_bug.py").unlink()
    assert again.returncode == 1 and "dim=3" in again.stdout, command
