"""How far the perf gate can be trusted, measured on the device present.

    python benchmarks/bench_trust.py --runs 20 --load 2   # CPU, both cores busy beside it
    python benchmarks/bench_trust.py --runs 20 --gpu h100 # on an H100

1. False regressions: the regression tests of suites/test_gemm_perf.py and test_sdpa_perf.py
   run ``--runs`` times on an unchanged stack against the stored baseline; every failure is a
   false alarm (goal: 0).
2. Detection: the same runs with a real 10% slowdown injected into every timed kernel but the
   gate's reference kernel (benchmarks/inject_slowdown.py); every case not failing is a miss
   (goal: >= 90% detected).

``--load N`` starts N busy-loop processes for the whole measurement (a shared CI runner);
``--factor`` is the gate's ``--gac-perf-factor``.

Each run is a fresh pytest process (as in CI). Besides the suite's own verdicts at its default
factor, the per-case ratios and p-values from the JUnit XML give the rates at other factors
(those rates use the final verdict's ratio and p, i.e. after the gate's second look where it
took one; the suite's verdicts are the figures that count). Every failure is printed with its
message, and each run with the load average.
"""
from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = ["suites/test_gemm_perf.py", "suites/test_sdpa_perf.py"]
FACTORS = (1.03, 1.04, 1.05, 1.06, 1.07, 1.08, 1.10, 1.20)
ALPHA = 0.05


def one_run(gpu: str, inject: float | None, xml: Path, factor: float | None) -> list[dict]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES,
           "--gpu", gpu, "-k", "regression", f"--junitxml={xml}", "-o",
           "junit_logging=no"]
    if factor is not None:
        cmd += ["--gac-perf-factor", str(factor)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if inject is not None:
        cmd += ["-p", "benchmarks.inject_slowdown"]
        env["GAC_INJECT_SLOWDOWN"] = str(inject)
    subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, check=False)
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        if case.find("failure") is not None:
            print(f"  {'slowed' if inject else 'unchanged'}: {case.get('name')}: "
                  f"{case.find('failure').get('message', '')[:400]}", flush=True)
        if case.find("skipped") is not None:
            continue
        failed = case.find("failure") is not None or case.find("error") is not None
        rec = next((ast.literal_eval(p.get("value")) for p in case.iter("property")
                    if p.get("name") == "gac_perf"), None)
        out.append({"test": case.get("name"), "failed": failed, "record": rec})
        if inject and not failed and rec:
            print(f"  missed: {case.get('name')}: {rec.get('ratio') or 0:.3f}x, "
                  f"p={rec.get('p_value')}: {rec.get('reason', '')[:200]}", flush=True)
    return out


def rates(results: list[dict]) -> dict[float, int]:
    """Cases each factor would flag (ratio above it and significant)."""
    flagged = {}
    for f in FACTORS:
        flagged[f] = sum(1 for r in results if r["record"] and r["record"].get("ratio")
                         and r["record"]["ratio"] > f
                         and (r["record"].get("p_value") is None
                              or r["record"]["p_value"] < ALPHA))
    return flagged


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--gpu", default="cpu")
    p.add_argument("--slowdown", type=float, default=0.10)
    p.add_argument("--slow-runs", type=int, default=None,
                   help="runs with the slowdown injected (default: --runs)")
    p.add_argument("--factor", type=float, default=None, help="--gac-perf-factor for the runs")
    p.add_argument("--load", type=int, default=0, help="busy-loop processes to run beside")
    args = p.parse_args()
    load = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.load)]
    try:
        clean, slow = measure(args)
    finally:
        for proc in load:
            proc.kill()
    report(args, clean, slow)
    return 0


def measure(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        clean, slow = [], []
        slow_runs = args.runs if args.slow_runs is None else args.slow_runs
        for i in range(max(args.runs, slow_runs)):
            if i < args.runs:
                clean += one_run(args.gpu, None, Path(tmp) / f"clean{i}.xml", args.factor)
            if i < slow_runs:
                slow += one_run(args.gpu, args.slowdown, Path(tmp) / f"slow{i}.xml",
                                args.factor)
            print(f"{time.strftime('%H:%M:%S')} run {i + 1}: load {_loadavg()}; false alarms "
                  f"so far {sum(r['failed'] for r in clean)}/{len(clean)}, detected "
                  f"{sum(r['failed'] for r in slow)}/{len(slow)}", flush=True)
    return clean, slow


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def report(args: argparse.Namespace, clean: list[dict], slow: list[dict]) -> None:
    fa, det = sum(r["failed"] for r in clean), sum(r["failed"] for r in slow)
    print(f"\nload at the end {_loadavg()}")
    print(f"suite verdicts (its default factor): false regressions {fa}/{len(clean)} "
          f"(goal 0); {args.slowdown:.0%} slowdown detected {det}/{len(slow)} "
          f"({det / max(len(slow), 1):.0%}, goal >= 90%)")
    fr, dr = rates(clean), rates(slow)
    print("factor | false regressions | detections of the injected slowdown")
    for f in FACTORS:
        print(f"{f:.2f}   | {fr[f]}/{len(clean)} | {dr[f]}/{len(slow)} "
              f"({dr[f] / max(len(slow), 1):.0%})")
    for name, results in (("unchanged-stack", clean), ("slowed", slow)):
        by_case: dict[str, list[float]] = {}
        for r in results:
            if r["record"] and r["record"].get("ratio"):
                by_case.setdefault(r["test"], []).append(r["record"]["ratio"])
        ratios = sorted(x for xs in by_case.values() for x in xs)
        if ratios:
            print(f"{name} ratios: min {ratios[0]:.3f} median {ratios[len(ratios) // 2]:.3f} "
                  f"max {ratios[-1]:.3f}")
        for test, xs in sorted(by_case.items()):
            xs.sort()
            print(f"  {test}: min {xs[0]:.3f} median {xs[len(xs) // 2]:.3f} max {xs[-1]:.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
