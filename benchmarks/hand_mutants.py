"""Hand-written mutants: plausible bugs, each injected alone, and the tests that must catch it.

Issue 14 measured the suite by injecting realistic bugs one at a time; this script keeps those
checks repeatable. Each :class:`Mutant` replaces one exact snippet of one module (a swapped
ratio, a dropped check, an off-by-one) in a scratch copy of the working tree, runs the tests
named for it there, and counts it caught when they fail. The unmutated copy must pass the same
tests first, so a "caught" is never a test that was red anyway. A mutant whose snippet is no
longer in the file is reported "stale" (the code moved on; rewrite or drop the mutant).

    python benchmarks/hand_mutants.py                 # every mutant (a few minutes)
    python benchmarks/hand_mutants.py --only verdicts # one group
    python benchmarks/hand_mutants.py --list
    python benchmarks/hand_mutants.py --only torchzip --against tests/test_torchzip.py

The working tree is never modified: everything happens in a temporary copy (tracked and
untracked, not ignored, files; ``--head``: the committed tree), imported through PYTHONPATH
ahead of the editable install.
Exit status 1 when a mutant survives or the unmutated tests fail. Figures: benchmarks/RESULTS.md
("Mutation score").
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    group: str
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


V = "tests/test_verdicts.py"
STATS, BASELINES = "gac_check/bench/stats.py", "gac_check/bench/baselines.py"
TZ, TZA = "gac_check/checkpoint/torchzip.py", "tests/test_torchzip_allowlist.py"
PLAN, WRITE, SITES = "gac_check/repair/plan.py", "gac_check/repair/write.py", "gac_check/sites.py"
RS = "tests/test_repair_shards.py"
PICKLED, TZW = "gac_check/repair/pickled.py", "gac_check/checkpoint/torchzip_write.py"
RT, TW = "tests/test_roundtrip_compressors.py", "tests/test_torchzip_write.py"
KS, KB = "gac_check/realign/knapsack.py", "tests/test_knapsack_budget.py"
FACTORS, CAL = "gac_check/realign/factors.py", "gac_check/realign/calibration.py"
RP = "tests/test_realign_properties.py"
RULES, SELECT = "gac_check/contract/rules.py", "gac_check/contract/select.py"
EVIDENCE, CE = "gac_check/contract/evidence.py", "tests/test_contract_edges.py"

MUTANTS = [
    # ---------------------------------------------------------------- perf verdicts
    Mutant("verdicts", "ratio inverted (baseline over current)", STATS,
           "ratio = quantile(current, q) / base_t", "ratio = base_t / quantile(current, q)",
           (V,)),
    Mutant("verdicts", "improvement without significance", STATS,
           "elif ratio < 1 / factor and significant:", "elif ratio < 1 / factor:", (V,)),
    Mutant("verdicts", "improvement threshold 1 instead of 1/factor", STATS,
           "elif ratio < 1 / factor and significant:", "elif ratio < 1 and significant:", (V,)),
    Mutant("verdicts", "published median compared at the asked quantile", STATS,
           "    if not baseline:\n        q = 0.5\n", "", (V,)),
    Mutant("verdicts", "a single current sample fed to Mann-Whitney", STATS,
           "if not baseline or len(current) < 2:", "if not baseline:", (V,)),
    Mutant("verdicts", "relative ratios compared at the caller's quantile", BASELINES,
           "current.relative, factor, alpha, q=0.5)", "current.relative, factor, alpha, q=q)",
           (V,)),
    Mutant("verdicts", "relative ratios compared the wrong way round", BASELINES,
           "stats.compare(stored.relative, current.relative,",
           "stats.compare(current.relative, stored.relative,", (V,)),
    Mutant("verdicts", "published_only true for a mixed baseline", BASELINES,
           "return bool(self.cases) and all(m.provenance.kind", "return bool(self.cases) and "
           "any(m.provenance.kind", (V,)),
    Mutant("verdicts", "update keeps the old software stack", BASELINES,
           "baseline.fingerprint = fingerprint  # the stack it now reflects", "pass", (V,)),
    Mutant("verdicts", "CPU ISA not a device field", BASELINES,
           'DEVICE_FIELDS = ("kind", "device", "capability", "isa")',
           'DEVICE_FIELDS = ("kind", "device", "capability")', (V,)),
    Mutant("verdicts", "published files forgive every device field", BASELINES,
           'fields = tuple(f for f in DEVICE_FIELDS if f != "device")', "fields = ()", (V,)),
    Mutant("verdicts", "driver drift not warned", BASELINES,
           '"cudnn", "driver", "flash_attn"', '"cudnn", "flash_attn"', (V,)),
    # ---------------------------------------------------------------- torch zip safety
    Mutant("torchzip", "deny-list only: unknown modules' calls become opaque values", TZ,
           '    why = ("it would run code when loaded" if func.module.split(".")[0] in '
           "DANGEROUS_MODULES",
           '    if func.module.split(".")[0] not in DANGEROUS_MODULES:\n        return Opaque()\n'
           '    why = ("it would run code when loaded" if func.module.split(".")[0] in '
           "DANGEROUS_MODULES", (TZA,)),
    Mutant("torchzip", "anything in torch is callable", TZ,
           "    handler = ALLOWED_CALLS.get((func.module, func.name))\n",
           "    handler = ALLOWED_CALLS.get((func.module, func.name))\n"
           '    if handler is None and func.module.split(".")[0] == "torch":\n'
           "        return Opaque()\n", (TZA,)),
    Mutant("torchzip", "tensor subclass module checked by prefix", TZ,
           'new_type.module.split(".")[0] != "torch"', 'not new_type.module.startswith("torch")',
           (TZA,)),
    Mutant("torchzip", "tensor subclass type not checked", TZ,
           'if not isinstance(new_type, Global) or new_type.module.split(".")[0] != "torch":',
           "if not isinstance(new_type, Global):", (TZA,)),
    Mutant("torchzip", "every tensor with Python state refused", TZ,
           'if not isinstance(new_type, Global) or new_type.module.split(".")[0] != "torch":',
           "if True:", (TZA,)),
    Mutant("torchzip", "reconstructor base only type-checked", TZ,
           'if base != Global("builtins", "object"):', "if not isinstance(base, Global):",
           (TZA,)),
    Mutant("torchzip", "reconstructor base checked against the deny-list", TZ,
           'if base != Global("builtins", "object"):',
           'if isinstance(base, Global) and base.module.split(".")[0] in DANGEROUS_MODULES '
           'and base.name not in SAFE_BUILTIN_TYPES:', (TZA,)),
    Mutant("torchzip", "every protocol 0/1 object refused", TZ,
           'if base != Global("builtins", "object"):', "if True:", (TZA,)),
    Mutant("torchzip", "byte-order record compared with a str", TZ,
           'zf.read(record) == b"big"', 'zf.read(record) == "big"', (TZA,)),
    Mutant("torchzip", "archives without a byte-order record refused", TZ,
           'record is not None and record.file_size <= 16 and zf.read(record) == b"big"',
           'record is None or zf.read(record) != b"little"', (TZA,)),
    # ---------------------------------------------------------------------- repair
    Mutant("repair", "index keeps the input's total_size", WRITE,
           'index["metadata"] = {**meta, "total_size": total}',
           'index["metadata"] = {"total_size": total, **meta}', (RS,)),
    Mutant("repair", "safetensors index total_size from the last shard only", WRITE,
           "_write_index(index, tmp / index.name, sum(sizes.values()))",
           "_write_index(index, tmp / index.name, sizes[src.name])", (RS,)),
    Mutant("repair", "pickled shards: total_size counted from the first shard only", PICKLED,
           "for rw in self.archives:\n            for name, shape in rw.shapes.items():",
           "for rw in self.archives[:1]:\n            for name, shape in rw.shapes.items():",
           (RS,)),
    Mutant("repair", "pickle rewrite keeps the storage size of the unpadded tensor", TZW,
           "(call.offset, 0), (call.numel, math.prod(shape))]", "(call.offset, 0)]", (RT,)),
    Mutant("repair", "pickle rewrite keeps the view's storage offset", TZW,
           "(call.offset, 0), (call.numel", "(call.numel", (TW,)),
    Mutant("repair", "FRAME opcodes kept after lengths change", TZW,
           'cuts.update({pos: (end, b"") for pos, end in frames})', "pass", (TW,)),
    Mutant("repair", "nn.Linear in_features/out_features left at the old size", PICKLED,
           "for attr, axis in WEIGHT_ATTRIBUTES:", "for attr, axis in WEIGHT_ATTRIBUTES[2:]:",
           (RT,)),
    Mutant("repair", "a padded tensor sharing its storage rewritten anyway", TZW,
           "if others or len(found) != 1 or found[0].call.gets:", "if False:", (RT,)),
    Mutant("repair", "zero insertions applied in the order the sites came", PLAN,
           "for pos, count in sorted(self.inserts):", "for pos, count in self.inserts:", (RS,)),
    Mutant("repair", "per-head padding counted once, not per block", SITES,
           "total += other * ax.blocks", "total += other", (RS,)),
    # -------------------------------------------------------------------- knapsack
    Mutant("knapsack", "fraction budget rounded to nearest", KS,
           "return math.floor(fraction * sum(", "return round(fraction * sum(", (KB,)),
    Mutant("knapsack", "fraction budget rounded up", KS,
           "return math.floor(fraction * sum(", "return math.ceil(fraction * sum(", (KB,)),
    Mutant("knapsack", "nan/inf fractions let through", KS,
           "if not math.isfinite(fraction) or fraction <= 0:", "if fraction <= 0:", (KB,)),
    Mutant("knapsack", "solver capacity one unit short", KS,
           "cap = budget // unit  #", "cap = (budget - 1) // unit  #", (KB,)),
    Mutant("knapsack", "everything-fits shortcut needs slack", KS,
           "if pad.cost[rows, last].sum() <= cap:", "if pad.cost[rows, last].sum() < cap:",
           (KB,)),
    Mutant("knapsack", "a budget of exactly the cheapest choice refused", KS,
           "if budget < cheapest:", "if budget <= cheapest:", (KB,)),
    Mutant("knapsack", "within_budget strict", KS,
           "return self.total_params <= self.budget", "return self.total_params < self.budget",
           (KB,)),
    Mutant("knapsack", "DP window stops one unit short of the room", KS,
           "min(b, room)) for a, b in zip(after, before", "min(b, room - 1)) for a, b in "
           "zip(after, before", (KB,)),
    # --------------------------------------------------------------------- realign
    Mutant("realign", "calibrated factors left scaled (W diag(s))", FACTORS,
           "        Vh = Vh / s\n", "", (RP,)),
    Mutant("realign", "calibrated factors scaled twice", FACTORS,
           "        Vh = Vh / s\n", "        Vh = Vh * s\n", (RP,)),
    Mutant("realign", "ASVD alpha 1 instead of 0.5", CAL,
           "alpha: float = 0.5", "alpha: float = 1.0", (RP,)),
    Mutant("realign", "activations averaged per line, not per token", CAL,
           "counts[name] = counts.get(name, 0) + x.shape[0]",
           "counts[name] = counts.get(name, 0) + 1", (RP,)),
    Mutant("realign", "strategy ignored by the alignment", FACTORS,
           'severities = (ERROR,) if strategy == "minimal" else (ERROR, WARNING)',
           "severities = (ERROR,)", (RP,)),
    Mutant("realign", "CLI drops --strategy", "gac_check/cli/realign.py",
           "args.budget, args.strategy, args.force", 'args.budget, "minimal", args.force',
           (RP,)),
    Mutant("realign", "--budget FLOAT ignored (always same)", FACTORS,
           "spent = budget_from_spec(budget, matrices, old)",
           'spent = budget_from_spec("same", matrices, old)', (RP,)),
    # -------------------------------------------------------------------- contract
    Mutant("contract", "head_dim limit off by one (256 refused)", RULES,
           "value > self.max_value", "value >= self.max_value", (CE,)),
    Mutant("contract", "H200 not treated as Hopper", RULES,
           'hopper = profile in ("h100", "h200")', 'hopper = profile == "h100"', (CE,)),
    Mutant("contract", "a measured sweep drops the hard limits of the roles it covers", SELECT,
           "kept = [r for r in rules if r.max_value is not None or not r.roles & covered]",
           "kept = [r for r in rules if not r.roles & covered]", (CE,)),
    Mutant("contract", "H100 quotes the A100's tables", EVIDENCE,
           '"h100": "h100", "h200": "h100"}', '"h100": "a100", "h200": "h100"}', (CE,)),
    Mutant("contract", "borrowed figures lose the note saying whose they are", EVIDENCE,
           "notes = [self.note] if self.note and sweep.source == PUBLISHED else []",
           "notes = []", (CE,)),
    Mutant("contract", "published tables read as measured", EVIDENCE,
           'sweeps += sweeps_of(published.packaged(gpu), PUBLISHED, "published")',
           'sweeps += sweeps_of(published.packaged(gpu), MEASURED, "published")', (CE,)),
    # ----------------------------------------- elsewhere: the same kind of gap, other modules
    Mutant("elsewhere", "ASVD rank rounded instead of floored", "gac_check/models/compress.py",
           "return max(1, int(out_features * in_features * ratio) // (in_features + "
           "out_features))",
           "return max(1, round(out_features * in_features * ratio / (in_features + "
           "out_features)))", ("tests/test_compress.py",)),
    Mutant("elsewhere", "layer numbers sorted as text (layer 10 before 9)", SITES,
           '[(0, int(t), "") if t.isdigit() else (1, 0, t) for t in parts]',
           '[(1, 0, t) for t in parts]', ("tests/test_site_order.py",)),
    Mutant("elsewhere", "GPT-style '.h.N' layers not recognised", SITES,
           'if p in ("layers", "layer", "h", "blocks") and nxt.isdigit():',
           'if p in ("layers", "layer") and nxt.isdigit():', ("tests/test_site_order.py",)),
    Mutant("elsewhere", "measured modulus matters on one significant pair",
           "gac_check/contract/measured.py",
           "and self.significant * 3 >= self.pairs * 2)", "and self.significant >= 1)",
           ("tests/test_measured_edges.py",)),
    Mutant("elsewhere", "measured rules: every effect graded an error",
           "gac_check/contract/measured.py",
           "severity = ERROR if e.rescue >= 1 + ERROR_GAIN else WARNING", "severity = ERROR",
           ("tests/test_measured_edges.py",)),
    Mutant("elsewhere", "forced-backend SDPA families judged like the default dispatch",
           "gac_check/contract/measured.py",
           '        if kind == "sdpa" and params.get("backend", "default") != sdpa_backend:\n'
           "            continue\n", "", ("tests/test_measured_edges.py",)),
    Mutant("elsewhere", "pairs of a larger power of two credited to a modulus",
           "gac_check/contract/measured.py",
           "return pow2 == m or (m == MODULI[-1] and pow2 >= m)", "return pow2 >= m",
           ("tests/test_measured_edges.py",)),
    Mutant("elsewhere", "perf gate on a CPU uses the GPU's quantile", "gac_check/plugin/perf.py",
           'q = GPU_Q if target.device == "cuda" else CPU_Q', "q = GPU_Q", (V,)),
    Mutant("elsewhere", "perf gate on a CPU uses the GPU's factor", "gac_check/plugin/perf.py",
           "GPU_PERF_FACTOR if target.device == \"cuda\" else CPU_PERF_FACTOR)",
           "GPU_PERF_FACTOR)", (V,)),
]


def copy_tree(dst: Path, head: bool = False) -> None:
    """Tracked and untracked (not ignored) files of the working tree, as they are now; with
    ``head``, the committed tree only (what a figure quoted with a commit measured)."""
    if head:
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
        return
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def run_tests(tree: Path, tests: tuple[str, ...], timeout: int) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    try:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                             "no:cacheprovider", "-n", "0", *tests], cwd=tree, env=env,
                            capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = -1
    return rc, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="run one group")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per test run")
    ap.add_argument("--head", action="store_true",
                    help="mutate the committed tree (HEAD), not the working tree")
    ap.add_argument("--against", nargs="+", metavar="TEST",
                    help="run these tests instead of each mutant's own (what did the suite "
                         "catch before a test file existed?)")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if args.only in (None, m.group)]
    if args.against:
        chosen = [replace(m, tests=tuple(args.against)) for m in chosen]
    if args.list or not chosen:
        for m in MUTANTS:
            print(f"{m.group:10} {m.name}  [{m.path}]")
        return 0 if chosen else 2
    results: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="gac-mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree, args.head)
        for tests in sorted({m.tests for m in chosen}):
            rc, _ = run_tests(tree, tests, args.timeout)
            if rc != 0:
                print(f"unmutated tests fail (rc {rc}): {' '.join(tests)}")
                return 1
        for m in chosen:
            target = tree / m.path
            original = target.read_text()
            secs = 0.0
            if original.count(m.old) != 1:
                outcome = "stale"
            else:
                target.write_text(original.replace(m.old, m.new))
                try:
                    rc, secs = run_tests(tree, m.tests, args.timeout)
                finally:
                    target.write_text(original)
                outcome = {0: "MISSED", 1: "caught"}.get(rc, f"error (rc {rc})")
            results.setdefault(outcome.split()[0], []).append(m.name)
            print(f"{outcome:8} {secs:5.1f}s {m.group:10} {m.name}", flush=True)
    caught = len(results.get("caught", []))
    print(f"caught {caught}/{len(chosen)}; missed {len(results.get('MISSED', []))}, "
          f"stale {len(results.get('stale', []))}, errors {len(results.get('error', []))}")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
