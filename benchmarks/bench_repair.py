"""Speed and memory of ``gac-check --repair`` (issue 3, "Speed").

Goals: repairing a checkpoint of at least 1 GB takes at most 2x the time ``cp -r`` takes to
copy it on the same disk (measured side by side, alternating, in one run), and the repair's
peak RSS stays under 2x the largest tensor + 300 MB (streaming: never a shard, never the model).

The checkpoint is bench_check.py's TinyLlama-shaped one (1.1B parameters, ~2.2 GB bf16, 4
shards + index) with MLP width 5630, so every layer's gate/up/down (66 tensors, ~1.5 GB) goes
through the padding path (5630 -> 5632) and the rest is copied byte for byte: close to the
worst case for a repair. Each repair is a fresh ``gac-check MODEL --repair OUT`` subprocess, as
a user runs it (Python start and the torch import included in its time).

    .venv/bin/python benchmarks/bench_repair.py [--runs 3] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_check import BIG, COMMON, GAC, RSS_PROBE, tensor_shapes, write_checkpoint


def synced(run) -> tuple[float, float, object]:
    """(seconds of ``run()``, seconds including the sync that puts its output on disk, result).

    The page cache's writeback state dominates single timings on a shared VM disk, so every
    command starts from a synced disk and is also timed to durability, the same for both."""
    os.sync()
    start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    os.sync()
    return wall, time.perf_counter() - start, result


def rss_probe(cmd: list[str]) -> float:
    """Peak RSS (MiB) of ``cmd`` run from a small probe process."""
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, *cmd], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[-1]) / 1024


def bench(root: Path, runs: int) -> int:
    params, nbytes = write_checkpoint(root / "model", BIG)
    shapes = tensor_shapes(COMMON | BIG)
    largest_mb = max(2 * math.prod(s) for s in shapes.values()) / 2**20  # bf16
    print(f"checkpoint: {params / 1e9:.2f}B params, {nbytes / 1e9:.2f} GB, largest tensor "
          f"{largest_mb:.0f} MiB", flush=True)
    cp_times, repair_times, write_times, rss = [], [], [], []
    cp_synced, repair_synced = [], []
    for i in range(runs):
        copy = root / f"copy{i}"
        wall, durable, _ = synced(lambda c=copy: subprocess.run(
            ["cp", "-r", str(root / "model"), str(c)], check=True))
        cp_times.append(wall)
        cp_synced.append(durable)
        shutil.rmtree(copy)
        out = root / f"fixed{i}"
        wall, durable, peak = synced(lambda o=out: rss_probe(
            [*GAC, str(root / "model"), "--repair", str(o), "--gpu", "gpu", "--format", "json"]))
        repair_times.append(wall)
        repair_synced.append(durable)
        rss.append(peak)
        write_times.append(json.loads((out / "gac-repair.json").read_text())["seconds"])
        shutil.rmtree(out)
        print(f"run {i + 1}: cp -r {cp_times[-1]:.2f} s ({cp_synced[-1]:.2f} s to disk), "
              f"repair {wall:.2f} s ({durable:.2f} s to disk; writing {write_times[-1]:.2f} s), "
              f"peak RSS {peak:.0f} MiB", flush=True)
    cp_t, rep_t = statistics.median(cp_times), statistics.median(repair_times)
    cp_d, rep_d = statistics.median(cp_synced), statistics.median(repair_synced)
    limit_mb = 2 * largest_mb + 300
    results = {
        "bytes": nbytes, "params": params, "largest_tensor_MiB": round(largest_mb, 1),
        "cp_r_s": [round(t, 2) for t in cp_times], "repair_s": [round(t, 2) for t in
                                                                 repair_times],
        "repair_writing_s": [round(t, 2) for t in write_times],
        "cp_r_to_disk_s": [round(t, 2) for t in cp_synced],
        "repair_to_disk_s": [round(t, 2) for t in repair_synced],
        "repair_over_cp_median": round(rep_t / cp_t, 2),
        "repair_over_cp_to_disk_median": round(rep_d / cp_d, 2),
        "peak_rss_MiB": [round(r) for r in rss], "rss_limit_MiB": round(limit_mb),
    }
    print(json.dumps(results, indent=2))
    goals = {"repair <= 2x cp -r (median, to disk)": rep_d <= 2 * cp_d,
             "repair <= 2x cp -r (median, page cache)": rep_t <= 2 * cp_t,
             "peak RSS < 2x largest tensor + 300 MB": max(rss) < limit_mb,
             "checkpoint >= 1 GB": nbytes >= 1e9}
    for goal, ok in goals.items():
        print(f"{'PASS' if ok else 'FAIL'}  {goal}")
    return 0 if all(goals.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="work here and keep the checkpoint")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="gac-bench-repair-"))
    try:
        return bench(root, args.runs)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
