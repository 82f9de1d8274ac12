"""Mutation score of small, pure modules with mutmut: an occasional job, never part of make test.

mutmut rewrites every operator, constant and comparison of a module one at a time and runs the
tests that reach it; a mutant no test notices ("survived") is a bug today's tests would let
through, or an equivalent rewrite (the survivors are listed so a person can tell which).
benchmarks/hand_mutants.py is the complement: a few plausible bugs chosen by hand, across the
whole package, each tied to the tests that must catch it.

    .venv/bin/pip install mutmut                        # or: pip install -e ".[dev]"
    python benchmarks/mutation.py                       # every target (~10 min on 2 cores)
    python benchmarks/mutation.py --only stats --survivors

Everything happens in a scratch copy of the working tree (tracked and untracked, not ignored,
files; ``--head``: the committed tree) with mutmut's configuration written into the copy's
setup.cfg, so the repository's own configuration and files are never touched. Figures:
benchmarks/RESULTS.md ("Mutation score").
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hand_mutants import copy_tree

#: name -> (modules to mutate, the tests that pin them)
TARGETS = {
    "stats": (["gac_check/bench/stats.py"],
              ["tests/test_stats.py", "tests/test_stats_edges.py", "tests/test_verdicts.py"]),
    "baselines": (["gac_check/bench/baselines.py"],
                  ["tests/test_baselines.py", "tests/test_baseline_files.py",
                   "tests/test_verdicts.py", "tests/test_perf_gate.py"]),
    "dtype_choice": (["gac_check/contract/dtype_choice.py"], ["tests/test_dtype_edges.py"]),
    "safetensors_header": (["gac_check/checkpoint/safetensors_header.py"],
                           ["tests/test_safetensors_edges.py"]),
}


def mutmut() -> str:
    exe = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or shutil.which("mutmut")
    if exe is None:
        sys.exit("mutmut is not installed: pip install mutmut (it is in the dev extra)")
    return exe


def config(modules: list[str], tests: list[str]) -> str:
    lines = ["[mutmut]", "source_paths=gac_check", "only_mutate=" + modules[0]]
    lines += [f"  {m}" for m in modules[1:]]
    lines += ["pytest_add_cli_args=-p no:cacheprovider -n 0 -q",
              "pytest_add_cli_args_test_selection=" + tests[0]]
    lines += [f"  {t}" for t in tests[1:]]
    lines += ["also_copy=conftest.py", "  baselines/", "  suites/"]
    return "\n".join(lines) + "\n"


def run(name: str, children: int, survivors: bool, head: bool) -> dict:
    modules, tests = TARGETS[name]
    exe = mutmut()
    with tempfile.TemporaryDirectory(prefix=f"gac-mutmut-{name}-") as tmp:
        tree = Path(tmp)
        copy_tree(tree, head)
        (tree / "setup.cfg").write_text(config(modules, tests))
        t0 = time.perf_counter()
        subprocess.run([exe, "run", "--max-children", str(children)], cwd=tree,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        seconds = time.perf_counter() - t0
        subprocess.run([exe, "export-cicd-stats"], cwd=tree, capture_output=True, check=True)
        counts = json.loads((tree / "mutants" / "mutmut-cicd-stats.json").read_text())
        listed = subprocess.run([exe, "results"], cwd=tree, capture_output=True,
                                text=True).stdout
        left = [ln.strip().split(":")[0] for ln in listed.splitlines()
                if ln.strip().endswith("survived")]
        if survivors:
            for key in left:
                diff = subprocess.run([exe, "show", key], cwd=tree, capture_output=True,
                                      text=True).stdout
                changed = [ln for ln in diff.splitlines()
                           if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
                print(f"  survived {key}: " + " / ".join(c.strip() for c in changed))
    caught = counts["killed"] + counts["timeout"]
    return {"target": name, "modules": modules, "tests": tests, **counts,
            "score": caught / counts["total"] if counts["total"] else 0.0,
            "survivors": left, "seconds": round(seconds)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=sorted(TARGETS))
    ap.add_argument("--children", type=int, default=2, help="mutants run at once")
    ap.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    ap.add_argument("--head", action="store_true",
                    help="mutate the committed tree (HEAD), not the working tree")
    args = ap.parse_args()
    for name in [args.only] if args.only else list(TARGETS):
        r = run(name, args.children, args.survivors, args.head)
        print(f"{name}: {r['killed']} killed + {r['timeout']} timed out of {r['total']} "
              f"mutants = {r['score']:.1%}; {r['survived']} survived "
              f"({', '.join(r['modules'])}; {r['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
