"""Stage b: the perf suites against the baseline stage a wrote, JUnit out.

Two pytest runs in a child process, each from the source tree with ``GAC_BASELINES_DIR``
pointing at the output folder: first the regression cases are recorded into the device's
baseline (``--gac-update-baselines``), then every perf test runs against it, writing JUnit.
At the stage's deadline the running pytest gets SIGINT, which pytest answers by finishing the
session: the JUnit then holds the tests that ran, and the stage is "stopped at budget".
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from gac_check.evidence.budget import StageClock

ROOT = Path(__file__).resolve().parents[2]
#: the record run's share of the stage; the gated run gets the rest
RECORD_SHARE = 0.5
#: pytest's exit codes for a session that ran its tests: all passed, some failed
PYTEST_RAN = (0, 1)
#: how long pytest may take to write its reports after SIGINT before it is killed
GRACE_S = 30


def run(profile: str, record_tests: tuple[str, ...], perf_tests: tuple[str, ...], out: Path,
        junit: Path, clock: StageClock, log) -> dict:
    if not (ROOT / "suites").is_dir():
        clock.stopped = True
        return {"error": f"no suites/ beside the package ({ROOT}): run from the source tree"}
    env = {**os.environ, "GAC_BASELINES_DIR": str(out), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # --gac-gpu, not its alias --gpu: the alias is claimed in a hook that runs only for a
    # plugin installed as an entry point, and the GPU machine runs the tree uninstalled, where
    # the root conftest.py loads the plugin (found by tests/test_evidence_offline.py)
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--gac-gpu",
            profile]
    record_until = min(clock.deadline,
                       clock.started + RECORD_SHARE * clock.budget_s)
    recorded = _pytest([*base, *record_tests, "--gac-update-baselines"], env, record_until,
                       log)
    gated = _pytest([*base, *perf_tests, f"--junitxml={junit}"], env, clock.deadline, log)
    clock.stopped = recorded["interrupted"] or gated["interrupted"]
    out = {"record": recorded, "gate": gated, "junit": junit.name if junit.exists() else None,
           "counts": counts(junit)}
    broken = [f"{name} run: pytest exit {r['exit']}" for name, r in (("record", recorded),
              ("gate", gated)) if r["exit"] not in PYTEST_RAN and not r["interrupted"]]
    if broken:  # usage error, internal error, nothing collected: no evidence, say so
        out["error"] = "; ".join(broken) + " (evidence.log has pytest's words)"
    return out


def _pytest(argv: list[str], env: dict, deadline: float, log) -> dict:
    if time.monotonic() >= deadline:
        print(f"suites: not run, stopped at budget: {' '.join(argv[1:])}", file=log, flush=True)
        return {"exit": None, "interrupted": True}
    print(f"suites: {' '.join(argv[1:])}", file=log, flush=True)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    interrupted = False
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        interrupted = True
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    print(f"suites: exit {proc.returncode}{' (stopped at budget)' if interrupted else ''}",
          file=log, flush=True)
    return {"exit": proc.returncode, "interrupted": interrupted}


def counts(junit: Path) -> dict | None:
    """Tests, failures, errors and skips from the JUnit pytest wrote (our own file)."""
    if not junit.exists():
        return None
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    keys = ("tests", "failures", "errors", "skipped")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}
