"""Time to proven optimality on a Llama-3-70B-scale rank re-selection: our solver vs HiGHS.

80 layers x 7 matrices (q, o 8192x8192; k, v 1024x8192; gate, up 28672x8192; down
8192x28672), candidates every ``align`` ranks up to the largest useful rank plus dense, synthetic
power-law spectra (exponent and scale drawn per matrix, log-normal noise) and a budget equal to
the parameters of unaligned "compressor" ranks (``--budget same``).

    .venv/bin/python benchmarks/bench_knapsack.py [--seeds 0 1 2] [--milp-time-limit 600]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gac_check.realign.knapsack import Matrix, budget_from_ranks, build_options, realign_plan
from gac_check.testing.knapsack import round_down, solve_milp

SHAPES = {"q_proj": (8192, 8192), "k_proj": (1024, 8192), "v_proj": (1024, 8192),
          "o_proj": (8192, 8192), "gate_proj": (28672, 8192), "up_proj": (28672, 8192),
          "down_proj": (8192, 28672)}


def llama70b_instance(seed: int, layers: int = 80) -> tuple[list[Matrix], dict[str, int]]:
    """Matrices with decaying spectra, and misaligned ranks keeping 20-50% of each matrix."""
    rng = np.random.default_rng(seed)
    matrices, ranks = [], {}
    for layer in range(layers):
        for proj, (m, n) in SHAPES.items():
            p = min(m, n)
            k = np.arange(1, p + 1)
            alpha = rng.uniform(0.3, 1.2)
            sv = rng.uniform(0.5, 2.0) * k ** (-alpha / 2) * np.exp(rng.normal(0, 0.05, p))
            name = f"layers.{layer}.{proj}"
            matrices.append(Matrix(name, m, n, sv=sv))
            useful = matrices[-1].max_useful_rank()
            ranks[name] = int(rng.uniform(0.2, 0.5) * useful) | 1  # odd: never aligned
    return matrices, ranks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--align", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of our solver per seed")
    ap.add_argument("--milp-time-limit", type=float, default=600.0)
    args = ap.parse_args()
    print(f"{'seed':>4} {'matrices':>8} {'candidates':>10} {'ours s (median)':>15} "
          f"{'HiGHS s':>9} {'speed-up':>8} {'rel. diff':>9} {'gap to LB':>9} "
          f"{'error saved vs round-down':>26}")
    for seed in args.seeds:
        matrices, ranks = llama70b_instance(seed)
        budget = budget_from_ranks(matrices, ranks)
        n_cand = sum(len(o.costs) for o in build_options(matrices, args.align))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ours = realign_plan(matrices, budget, args.align)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ref = solve_milp(matrices, budget, args.align, time_limit=args.milp_time_limit)
        t_milp = time.perf_counter() - t0
        assert ours.within_budget and ours.aligned(args.align)
        rel = (ours.objective - ref.objective) / ref.objective
        gap = (ours.objective - ours.lower_bound) / ours.objective
        naive = round_down(matrices, ranks, args.align).objective
        t_ours = statistics.median(times)
        status = "" if ref.optimal else " (HiGHS hit its time limit)"
        print(f"{seed:>4} {len(matrices):>8} {n_cand:>10} {t_ours:>15.3f} {t_milp:>9.2f} "
              f"{t_milp / t_ours:>7.0f}x {rel:>9.1e} {gap:>9.1e} "
              f"{(naive - ours.objective) / naive:>25.2%}{status}")


if __name__ == "__main__":
    main()
