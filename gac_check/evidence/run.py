"""The evidence run: the five stages in order, each on its own clock, and the files they leave.

What lands in OUT (at most eight files, each far below 16 MiB):

* ``<key>.json``: the device's baseline (``baselines/<key>.json`` once committed), stage a's
  sweeps and stage b's recorded regression cases;
* ``results.json``: provenance, each stage's budget and status, every figure of stages b-e;
* ``junit.xml``: the perf suites run against that baseline;
* ``report.html`` and its run document ``report.json``;
* ``results.md``: the same figures as the tables benchmarks/RESULTS.md takes, with provenance;
* ``evidence.log``: every stage's lines and the pytest output.

A stage that fails is recorded with its error and the next one runs: the figures a later
stage can make are worth more than a traceback.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from gac_check.bench.device import Device
from gac_check.evidence import baseline, latency, markdown, provenance, report, slowpaths, suites
from gac_check.evidence.budget import SHARES, Budget, StageClock
from gac_check.evidence.sizes import GPU, SMOKE, layers_for

SCHEMA = "gac-check-evidence/1"
LOG, RESULTS, JUNIT, HTML, MARKDOWN = ("evidence.log", "results.json", "junit.xml",
                                       "report.html", "results.md")


@dataclass(frozen=True)
class Request:
    device: Device
    out: Path
    minutes: float
    smoke: bool
    command: str
    stages: tuple[str, ...] = tuple(SHARES)


def contract_profile(device: Device) -> str:
    """The contract the forms are repaired, realigned and reported against: the GPU's own;
    on a CPU (--smoke) the generic GPU contract, so the fixes have sites to fix."""
    return "gpu" if device.kind == "cpu" else device.profile


def run(req: Request) -> dict:
    """All stages; returns the results document (also written to OUT/results.json)."""
    req.out.mkdir(parents=True, exist_ok=True)
    budget = Budget(req.minutes, req.stages)
    sizes = SMOKE if req.smoke else GPU
    doc: dict = {"schema": SCHEMA, "command": req.command, "minutes": req.minutes,
                 "smoke": req.smoke,
                 "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "device": provenance.device(req.device.kind),
                 "profile": req.device.profile, "contract": contract_profile(req.device),
                 "clocks_before": provenance.clocks() if req.device.kind == "cuda" else None,
                 "software": provenance.software(), "stages": {}}
    old_dir = os.environ.get("GAC_BASELINES_DIR")
    os.environ["GAC_BASELINES_DIR"] = str(req.out)  # the contract reads the fresh sweeps
    work = Path(tempfile.mkdtemp(prefix="gac-evidence-"))
    try:
        with open(req.out / LOG, "a", encoding="utf-8") as log:
            print(f"{doc['started_utc']} {req.command}", file=log, flush=True)
            _stages(req, budget, sizes, work, doc, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if old_dir is None:
            os.environ.pop("GAC_BASELINES_DIR", None)
        else:
            os.environ["GAC_BASELINES_DIR"] = old_dir
    doc["clocks_after"] = provenance.clocks() if req.device.kind == "cuda" else None
    doc["seconds"] = round(time.monotonic() - budget.start, 1)
    doc["files"] = sorted({p.name for p in req.out.iterdir() if p.is_file()}
                          | {RESULTS, MARKDOWN})
    (req.out / RESULTS).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (req.out / MARKDOWN).write_text(markdown.render(doc))
    return doc


def _stages(req: Request, budget: Budget, sizes, work: Path, doc: dict, log) -> None:
    dev, out = req.device, req.out
    profile = contract_profile(dev)
    jobs = {
        "baseline": lambda c: baseline.record(dev, out / f"{dev.key}.json", c, req.smoke, log),
        "suites": lambda c: suites.run(dev.profile, sizes.record_tests, sizes.perf_tests, out,
                                       out / JUNIT, c, log),
        "latency": lambda c: latency.run(sizes, layers_for(sizes, c.budget_s), dev.kind,
                                         profile, work, c, log),
        "slowpaths": lambda c: slowpaths.run(sizes, dev.kind, c, log),
        "report": lambda c: report.run(work, profile, out / HTML, c, log),
    }
    for name in budget.stages:
        job, clock = jobs[name], budget.stage(name)
        print(f"== {name}: budget {clock.budget_s:.0f} s, {clock.left():.0f} s left", file=log,
              flush=True)
        doc[name] = _guarded(job, clock, log)
        doc["stages"][name] = clock.summary()
        print(f"== {name}: {doc['stages'][name]['status']} in "
              f"{doc['stages'][name]['spent_s']} s", file=log, flush=True)


def _guarded(job, clock: StageClock, log):
    try:
        return job(clock)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one stage's failure is recorded; the next stages still run
        traceback.print_exc(file=log)
        return {"error": f"{type(exc).__name__}: {exc}"}


def summary_lines(doc: dict) -> list[str]:
    """What the command prints: each stage's status, then the claims."""
    lines = [f"{name}: {s['status']} ({s['spent_s']} of {s['budget_s']} s)"
             + (f"; error: {doc[name]['error']}" if isinstance(doc.get(name), dict)
                and doc[name].get("error") else "")
             for name, s in doc["stages"].items()]
    for c in (doc.get("latency") or {}).get("claims", []) if isinstance(
            doc.get("latency"), dict) else []:
        x = "not measured" if c["speedup"] is None else f"{c['speedup']:.2f}x"
        held = {True: "held", False: "did not hold", None: "not checked"}[c["held"]]
        lines.append(f"claim ({c['phase']}): {c['claim']}: {x}, {held}")
    return lines

