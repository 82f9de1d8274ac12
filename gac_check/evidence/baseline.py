"""Stage a: the device's baseline, the sweeps ``gac-check baseline record`` measures.

The same plan (:func:`gac_check.bench.sweep.record_plan`) and the same file format, written
to ``OUT/<key>.json`` (the name it takes in ``baselines/``), with the groups the contract
reads first: the perf gate's reference kernel, the GEMM sweeps at the published shape, SDPA's
default dispatch, the GEMMs at low-rank sizes, then the forced SDPA backends. No chunk of
cases starts after the stage's deadline; what was measured is saved group by group.
"""
from __future__ import annotations

from pathlib import Path

from gac_check.bench import baselines, sweep
from gac_check.bench.device import Device
from gac_check.bench.peak import peak
from gac_check.evidence.budget import StageClock

#: The contract's inputs first, the forced backends (read by people, not rules) last.
ORDER = ("reference", "gemm-published-shape", "sdpa-default", "gemm", "gemm-rank-sizes",
         "sdpa-backends")
COMMAND = "gac-check evidence"


def plan(device: Device, smoke: bool) -> sweep.RecordPlan:
    full = sweep.record_plan(device.kind, "float32")
    groups = sorted(full.groups, key=lambda g: ORDER.index(g.name) if g.name in ORDER
                    else len(ORDER))
    ordered = sweep.RecordPlan(full.device, groups)
    return ordered.smoke() if smoke else ordered


def record(device: Device, out: Path, clock: StageClock, smoke: bool, log) -> dict:
    """Measure the plan into ``out`` until the clock runs out; what was measured, per group."""
    todo = plan(device, smoke)
    fingerprint = baselines.present_fingerprint(device.kind)
    figures = peak(device.kind, "float32").as_dict()
    groups = {}
    for group in todo.groups:
        if clock.expired():
            groups[group.name] = {"planned": len(group.works), "measured": 0}
            continue
        found = sweep.run_group(group, device.kind, COMMAND, log=log, deadline=clock.deadline)
        if found:
            baselines.update(out, device.key, fingerprint, found, figures)
        groups[group.name] = {"planned": len(group.works), "measured": len(found)}
        print(f"baseline: {group.name}: {len(found)} of {len(group.works)} cases", file=log,
              flush=True)
    clock.stopped = clock.stopped or clock.left() <= 0
    return {"file": out.name, "key": device.key, "peak": figures, "groups": groups,
            "estimate_s": round(todo.estimate_s(), 1)}
