"""pytest plugin for benchmarks/bench_trust.py: makes every timed call really slower.

``-p benchmarks.inject_slowdown`` with ``GAC_INJECT_SLOWDOWN=0.10`` wraps each prepared
workload except the perf gate's reference kernels (whatever ``workloads.reference_for`` hands
the gate) so that a call spins after the real work for
10% of the work's own duration: the slowdown is spent inside the timed region, exactly like
slower code in one kernel, and never touches the package's code paths outside this benchmark.
"""
from __future__ import annotations

import dataclasses
import os
import time

from gac_check.bench import kernels, workloads
from gac_check.bench.workloads import Prepared

FRACTION = float(os.environ.get("GAC_INJECT_SLOWDOWN", "0.10"))
_original = kernels.run_interleaved


def _slowed(fn):
    clock = time.perf_counter

    def call():
        start = clock()
        out = fn()
        end = clock() + (clock() - start) * FRACTION
        while clock() < end:
            pass
        return out

    return call


def _slowed_work(work):
    """A slowed copy of ``work``: the caller's object is left alone, so a workload measured
    twice (the gate's second look) is slowed once each time, not 10% more per look."""
    prepare = work.prepare

    def slowed_prepare(device):
        p = prepare(device)
        return Prepared(_slowed(p.fn), p.backend, p.notes)

    return dataclasses.replace(work, prepare=slowed_prepare)


#: The reference kernels the gate asked for, by identity (an SDPA reference is an SDPA too);
#: kept alive so that no later workload can reuse one's id.
REFERENCES: dict[int, object] = {}
_reference_for = workloads.reference_for


def reference_for(work, device):
    ref = _reference_for(work, device)
    REFERENCES[id(ref)] = ref
    return ref


def run_interleaved(works, *args, **kwargs):
    return _original([w if id(w) in REFERENCES else _slowed_work(w) for w in works],
                     *args, **kwargs)


kernels.run_interleaved = run_interleaved
workloads.reference_for = reference_for
