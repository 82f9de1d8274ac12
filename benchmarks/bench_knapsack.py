"""Rank re-selection at Llama-3-70B scale: our solver on the benchmark instance and on the
pathological families (issue 13), against HiGHS and against the GAC paper's own DP.

80 layers x 7 matrices (q, o 8192x8192; k, v 1024x8192; gate, up 28672x8192; down
8192x28672), candidates every ``align`` ranks up to the largest useful rank plus dense, budget
equal to the parameters of odd "compressor" ranks keeping 20-50% of each matrix
(``--budget same``); instances from :func:`gac_check.testing.knapsack.llama_instance`:

- ``power``: power-law spectra (exponent and scale per matrix, log-normal noise), compared with
  HiGHS (``mip_rel_gap=0``) for time and objective;
- the families (goal: every one under 2 s and 500 MB, proven optimal or with a certified gap):
  ``flat`` (all singular values 1), ``near_equal`` (1 + 1e-9 noise), ``coprime`` (rows and
  columns shortened by 0-63 per matrix: tiny cost unit), ``align2``, and their mixes. Each runs
  in a fresh process so its peak RSS is its own (getrusage of the child, building included).
- ``--gac-repo DIR``: a checkout of the GAC research repository; its
  ``scripts/asvd_gac_experiment.py::strategy_gac_dp`` runs on the same instance (its module
  constants set to these shapes and layers; its per-matrix weight ``fisher`` = the squared
  singular value at the compressor's rank, the marginal value of a rank there), and its ranks are
  scored with our objective. Nothing of it is copied here.

    .venv/bin/python benchmarks/bench_knapsack.py [--seeds 0] [--milp-time-limit 600]
        [--families ...] [--gac-repo DIR] [--gac-layers 80]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gac_check.ranks.knapsack import build_options, realign_plan
from gac_check.testing.knapsack import LLAMA70B_SHAPES, llama_instance, round_down, solve_milp

FAMILY_SETS = ("flat", "near_equal", "coprime", "align2", "flat+coprime", "flat+align2",
               "near_equal+coprime", "near_equal+align2", "coprime+align2",
               "flat+coprime+align2", "near_equal+coprime+align2")


def one(families: str, seed: int, repeats: int) -> dict:
    """Solve one instance family in this process: times (build, solve) and peak RSS."""
    names = tuple(f for f in families.split("+") if f != "power")
    t0 = time.perf_counter()
    matrices, budget, align, _ = llama_instance(80, names, seed)
    built = time.perf_counter() - t0
    times, plan = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = realign_plan(matrices, budget, align)
        times.append(time.perf_counter() - t0)
    assert plan is not None and plan.within_budget and plan.aligned(align)
    return {"family": families, "seed": seed, "matrices": len(matrices), "align": align,
            "candidates": sum(len(o.costs) for o in build_options(matrices, align)),
            "build_s": round(built, 3), "solve_s": round(statistics.median(times), 3),
            "optimal": plan.optimal, "relative_gap": plan.relative_gap,
            "objective": plan.objective, "lower_bound": plan.lower_bound,
            "peak_rss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def families(seeds: list[int], sets: list[str], repeats: int) -> None:
    print(f"{'family':>26} {'seed':>4} {'cand.':>8} {'solve s':>8} {'+build s':>8} "
          f"{'peak MiB':>8} {'result':>26}")
    for fam in sets:
        for seed in seeds:
            out = subprocess.run([sys.executable, __file__, "--one", fam, "--seeds", str(seed),
                                  "--repeats", str(repeats)], capture_output=True, text=True,
                                 check=True).stdout
            r = json.loads(out.splitlines()[-1])
            result = ("proven optimal" if r["optimal"]
                      else f"certified gap {r['relative_gap']:.2e}")
            ok = r["solve_s"] + r["build_s"] < 2 and r["peak_rss_MiB"] < 500
            print(f"{fam:>26} {seed:>4} {r['candidates']:>8} {r['solve_s']:>8.3f} "
                  f"{r['build_s']:>8.3f} {r['peak_rss_MiB']:>8} {result:>26} "
                  f"{'PASS' if ok else 'FAIL'}", flush=True)


def versus_milp(seeds: list[int], repeats: int, limit: float) -> None:
    print(f"{'seed':>4} {'matrices':>8} {'candidates':>10} {'ours s (median)':>15} "
          f"{'HiGHS s':>9} {'speed-up':>8} {'rel. diff':>9} {'gap to LB':>9} "
          f"{'error saved vs round-down':>26}")
    for seed in seeds:
        matrices, budget, align, ranks = llama_instance(80, (), seed)
        n_cand = sum(len(o.costs) for o in build_options(matrices, align))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ours = realign_plan(matrices, budget, align)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ref = solve_milp(matrices, budget, align, time_limit=limit)
        t_milp = time.perf_counter() - t0
        assert ours.within_budget and ours.aligned(align)
        rel = (ours.objective - ref.objective) / ref.objective
        gap = (ours.objective - ours.lower_bound) / ours.objective
        naive = round_down(matrices, ranks, align).objective
        t_ours = statistics.median(times)
        status = "" if ref.optimal else " (HiGHS hit its time limit)"
        print(f"{seed:>4} {len(matrices):>8} {n_cand:>10} {t_ours:>15.3f} {t_milp:>9.2f} "
              f"{t_milp / t_ours:>7.0f}x {rel:>9.1e} {gap:>9.1e} "
              f"{(naive - ours.objective) / naive:>25.2%}{status}", flush=True)


def versus_gac(repo: Path, layers: int, seed: int) -> None:
    """The GAC repository's strategy_gac_dp on the same instance, scored by our objective."""
    path = repo / "scripts" / "asvd_gac_experiment.py"
    spec = importlib.util.spec_from_file_location("gac_experiment", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    gac = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gac)
    gac.NUM_LAYERS, gac.PROJ_SHAPES, gac.ALL_PROJS = layers, dict(LLAMA70B_SHAPES), list(
        LLAMA70B_SHAPES)
    matrices, budget, align, ranks = llama_instance(layers, (), seed)
    by_name = {m.name: m for m in matrices}
    base, fisher = {}, {}
    for name, r in ranks.items():
        _, layer, proj = name.split(".")
        mat = by_name[name]
        base[(int(layer), proj)] = r
        fisher[(int(layer), proj)] = float(mat.error(r - 1) - mat.error(r))  # s_r^2
    t0 = time.perf_counter()
    theirs = gac.strategy_gac_dp(base, fisher, budget, align=align)
    t_gac = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = realign_plan(matrices, budget, align)
    t_ours = time.perf_counter() - t0
    params = sum(mat.params(theirs[(int(n.split(".")[1]), n.split(".")[2])])
                 for n, mat in by_name.items())
    objective = sum(mat.error(theirs[(int(n.split(".")[1]), n.split(".")[2])])
                    for n, mat in by_name.items())
    print(f"GAC strategy_gac_dp, {layers} layers x 7: {t_gac:.1f} s, objective {objective:.6g}, "
          f"{params:,} of {budget:,} parameters; ours: {t_ours:.3f} s, objective "
          f"{ours.objective:.6g} ({'proven optimal' if ours.optimal else 'certified gap'}); "
          f"theirs / ours = {objective / ours.objective:.2f}x the error", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--repeats", type=int, default=3, help="timed solves per instance")
    ap.add_argument("--milp-time-limit", type=float, default=600.0)
    ap.add_argument("--no-milp", action="store_true", help="skip the HiGHS comparison")
    ap.add_argument("--families", nargs="*", default=list(FAMILY_SETS),
                    help="family sets to time (f1+f2 mixes), or none")
    ap.add_argument("--gac-repo", type=Path, help="a checkout of the GAC research repository")
    ap.add_argument("--gac-layers", type=int, default=80)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.seeds[0], args.repeats)))
        return
    if not args.no_milp:
        versus_milp(args.seeds, args.repeats, args.milp_time_limit)
    if args.families:
        families(args.seeds, ["power", *args.families], args.repeats)
    if args.gac_repo:
        versus_gac(args.gac_repo, args.gac_layers, args.seeds[0])


if __name__ == "__main__":
    main()
