"""torch's thread count (gac_check.threads): the usable CPUs a load leaves idle, a quota's cap,
and OMP_NUM_THREADS obeyed; read from real files laid out as cgroup v1 and v2 write them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gac_check.threads import torch_threads, usable_cpus

CPUS = os.cpu_count() or 1
AFFINITY = len(os.sched_getaffinity(0))


def cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(("files", "cpus"), [
    ({}, AFFINITY),                                                # no cgroup files
    ({"cpu.max": "max 100000\n"}, AFFINITY),                       # v2, no quota
    ({"cpu.max": "50000 100000\n"}, 1),                            # v2, half a CPU: 1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, AFFINITY),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    ({"cpu.max": "garbage\n"}, AFFINITY),                          # unreadable: no cap
], ids=["none", "v2-max", "v2-half", "v1-none", "v1-one", "v2-junk"])
def test_usable_cpus_are_the_affinity_capped_by_a_quota(tmp_path, files, cpus) -> None:
    assert usable_cpus(cgroup(tmp_path, files)) == cpus


def test_a_quota_above_the_affinity_does_not_raise_it(tmp_path) -> None:
    root = cgroup(tmp_path, {"cpu.max": f"{(AFFINITY + 4) * 100000} 100000\n"})
    assert usable_cpus(root) == AFFINITY


def test_a_busy_machine_gets_one_thread_a_quiet_one_every_usable_cpu(tmp_path) -> None:
    env: dict[str, str] = {}
    assert torch_threads(env, load=CPUS + 6, cgroup=tmp_path) == 1
    assert torch_threads(env, load=0.0, cgroup=tmp_path) == AFFINITY
    if AFFINITY >= 2:  # one CPU's worth of other work leaves the rest
        assert torch_threads(env, load=2.0, cgroup=tmp_path) == min(AFFINITY, CPUS - 1)


def test_a_quota_caps_the_threads_of_a_quiet_machine(tmp_path) -> None:
    root = cgroup(tmp_path, {"cpu.max": "100000 100000\n"})
    assert torch_threads({}, load=0.0, cgroup=root) == 1


@pytest.mark.parametrize(("omp", "threads"), [("3", 3), (" 1 ", 1), ("0", None), ("x", None),
                                              ("", None)])
def test_omp_num_threads_wins_when_it_is_a_positive_integer(tmp_path, omp, threads) -> None:
    got = torch_threads({"OMP_NUM_THREADS": omp}, load=CPUS + 6, cgroup=tmp_path)
    assert got == (threads or 1)


def test_set_torch_threads_sets_torch_in_a_fresh_interpreter() -> None:
    code = ("import torch; from gac_check.threads import set_torch_threads; "
            "torch.set_num_threads(7); "
            "n = set_torch_threads(); print(n, torch.get_num_threads())")
    for omp in ("3", None):
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        if omp:
            env["OMP_NUM_THREADS"] = omp
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True, timeout=120).stdout.split()
        assert out[0] == out[1] and (omp is None or out[0] == omp), out
