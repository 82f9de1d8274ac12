"""CPU a usage error and ``--help`` cost (issue 41, goal: under 0.5 s of CPU each).

A typo in a CI step should be refused at once, not after the seconds of CPU importing torch
costs on a busy runner. Each command runs as a fresh ``python -m gac_check.cli`` process, as a
user runs it; its user + system CPU is read from ``getrusage(RUSAGE_CHILDREN)`` and the median
of ``--runs`` is printed beside the goal. The model is a real low-rank checkpoint written by
the reference compressor into a temporary directory (removed afterwards).

    .venv/bin/python benchmarks/bench_usage_errors.py [--runs 5]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL_S = 0.5
COMMANDS = {
    "--help": ["--help"],
    "realign --budget 2": ["asvd", "--realign", "out", "--budget", "2"],
    "realign --calib without --base": ["asvd", "--realign", "out", "--calib", "c.txt"],
    "--dtype float17": ["asvd", "--dtype", "float17"],
    "--repair and --realign": ["asvd", "--repair", "a", "--realign", "b"],
}


def cpu_seconds(argv: list[str], cwd: Path) -> tuple[float, int]:
    """User + system CPU of one ``gac-check ARGV`` process, and its exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "gac_check.cli", *argv], cwd=cwd,
                          capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from gac_check.models.compress import compress_dir
    from gac_check.testing.models import tiny_llama

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny_llama().save_pretrained(root / "dense")
        compress_dir(root / "dense", root / "asvd", 0.7)
        print(f"{'command':34} {'exit':>4} {'CPU s (median, min-max)':>26}  goal < {GOAL_S} s")
        for name, argv in COMMANDS.items():
            runs = [cpu_seconds(argv, root) for _ in range(args.runs)]
            cpu = [c for c, _ in runs]
            verdict = "met" if statistics.median(cpu) < GOAL_S else "NOT MET"
            print(f"{name:34} {runs[0][1]:>4} {statistics.median(cpu):>10.3f} "
                  f"({min(cpu):.3f}-{max(cpu):.3f})  {verdict}")


if __name__ == "__main__":
    main()
