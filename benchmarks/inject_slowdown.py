"""pytest plugin for benchmarks/bench_trust.py: makes every timed call really slower.

``-p benchmarks.inject_slowdown`` with ``GAC_INJECT_SLOWDOWN=0.10`` wraps each prepared
workload except the perf gate's reference kernel so that a call spins after the real work for
10% of the work's own duration: the slowdown is spent inside the timed region, exactly like
slower code in one kernel, and never touches the package's code paths outside this benchmark.
"""
from __future__ import annotations

import os
import time

from gac_check.bench import run as bench_run
from gac_check.bench.workloads import Prepared, reference_workload

FRACTION = float(os.environ.get("GAC_INJECT_SLOWDOWN", "0.10"))
_original = bench_run.run_interleaved


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
    prepare = work.prepare

    def slowed_prepare(device):
        p = prepare(device)
        return Prepared(_slowed(p.fn), p.backend, p.notes)

    work.prepare = slowed_prepare
    return work


REFERENCES = {reference_workload(d).key for d in ("cpu", "cuda")}


def run_interleaved(works, *args, **kwargs):
    return _original([w if w.key in REFERENCES else _slowed_work(w) for w in works],
                     *args, **kwargs)


bench_run.run_interleaved = run_interleaved
