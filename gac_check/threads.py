"""How many threads torch's CPU kernels get: what this machine can use now, not its core count.

torch starts one OpenMP thread per core it sees. On a shared runner those cores are busy, and
OpenMP's threads wait for each other at every barrier: a stalled thread stalls the rest. On a
2-core machine at load 12, one 1024x1024 SVD took 8-10x longer with torch's 2 threads than
with one (benchmarks/RESULTS.md, "Torch threads on a busy machine"). So the compressor,
``--realign`` and the repository's test suites size the pool to the CPUs this process may run
on (affinity, a cgroup CPU quota) less those other processes keep busy (the 1-minute load
average), at least one; ``OMP_NUM_THREADS``, when set, is the user's choice and wins.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

#: Where a container's CPU quota is read: cgroup v2 (``cpu.max``: QUOTA PERIOD, or ``max``),
#: then cgroup v1 (``cpu.cfs_quota_us``, -1 for none, and ``cpu.cfs_period_us``).
CGROUP = Path("/sys/fs/cgroup")


def usable_cpus(cgroup: Path = CGROUP) -> int:
    """CPUs this process may be scheduled on: its affinity mask, capped by a CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _quota(cgroup)
    return max(1, min(cpus or 1, math.ceil(quota) if quota else cpus or 1))


def _quota(cgroup: Path) -> float | None:
    """The cgroup's CPU quota in CPUs, or None where there is none or it cannot be read."""
    try:
        v2 = (cgroup / "cpu.max").read_text().split()
        if v2[0] != "max":
            return int(v2[0]) / int(v2[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def torch_threads(environ: dict[str, str] | None = None, load: float | None = None,
                  cgroup: Path = CGROUP) -> int:
    """The thread count for torch: ``OMP_NUM_THREADS`` if it is a positive integer, else the
    usable CPUs that the load average leaves idle (this process counted once), at least 1."""
    env = os.environ if environ is None else environ
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    busy = os.getloadavg()[0] if load is None else load
    idle = math.floor((os.cpu_count() or 1) - busy + 1)
    return max(1, min(usable_cpus(cgroup), idle))


def set_torch_threads() -> int:
    """Give torch :func:`torch_threads` intra-op threads (imports torch); returns the count."""
    import torch

    threads = torch_threads()
    torch.set_num_threads(threads)
    return threads
