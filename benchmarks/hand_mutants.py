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
TZ, TZA = "gac_check/checkpoint/pickled/torchzip.py", "tests/test_torchzip_allowlist.py"
AL = "gac_check/checkpoint/pickled/allowlist.py"
PLAN, WRITE, SITES = "gac_check/padding/plan.py", "gac_check/padding/write.py", "gac_check/sites.py"
RS = "tests/test_repair_shards.py"
PICKLED, TZW = "gac_check/padding/pickled.py", "gac_check/checkpoint/torchzip_write.py"
RT, TW = "tests/test_roundtrip_compressors.py", "tests/test_torchzip_write.py"
KS, KB = "gac_check/ranks/knapsack.py", "tests/test_knapsack_budget.py"
FACTORS, CAL = "gac_check/ranks/factors.py", "gac_check/ranks/calibration.py"
RP = "tests/test_realign_properties.py"
RULES, SELECT = "gac_check/contract/rules.py", "gac_check/contract/select.py"
EVIDENCE, CE = "gac_check/contract/evidence.py", "tests/test_contract_edges.py"
DT, DTE = "gac_check/contract/dtype_choice.py", "tests/test_dtype_edges.py"
MEAS, MT = "gac_check/contract/measured.py", "tests/test_measured_top.py"
RR = "tests/test_rerecord.py"
ST, STE = "gac_check/checkpoint/safetensors_header.py", "tests/test_safetensors_edges.py"
ATOMIC, OUTDIR = "gac_check/checkpoint/atomic.py", "gac_check/checkpoint/outdir.py"
FM = "tests/test_file_modes.py"
TEXT, RUN = "gac_check/report/text.py", "gac_check/report/run.py"
PC, LR = "tests/test_padding_cost.py", "tests/test_layer_ranges.py"
RD = "tests/test_run_document_types.py"

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
    Mutant("torchzip", "deny-list only: unknown modules' calls become opaque values", AL,
           '    why = ("it would run code when loaded" if module.split(".")[0] in '
           "DANGEROUS_MODULES",
           '    if module.split(".")[0] not in DANGEROUS_MODULES:\n'
           '        _become(node, "opaque")\n        return\n'
           '    why = ("it would run code when loaded" if module.split(".")[0] in '
           "DANGEROUS_MODULES", (TZA,)),
    Mutant("torchzip", "anything in torch is callable", AL,
           "    handler = ALLOWED_CALLS.get((module, name))\n",
           "    handler = ALLOWED_CALLS.get((module, name))\n"
           '    if handler is None and module.split(".")[0] == "torch":\n'
           "        handler = _opaque\n", (TZA,)),
    Mutant("torchzip", "tensor subclass module checked by prefix", AL,
           'new_type.value[0].split(".")[0] != "torch"',
           'not new_type.value[0].startswith("torch")', (TZA,)),
    Mutant("torchzip", "tensor subclass type not checked", AL,
           'if new_type.kind != "global" or new_type.value[0].split(".")[0] != "torch":',
           'if new_type.kind != "global":', (TZA,)),
    Mutant("torchzip", "every tensor with Python state refused", AL,
           'if new_type.kind != "global" or new_type.value[0].split(".")[0] != "torch":',
           "if True:", (TZA,)),
    Mutant("torchzip", "reconstructor base only type-checked", AL,
           'if base.kind != "global" or base.value != OBJECT:', 'if base.kind != "global":',
           (TZA,)),
    Mutant("torchzip", "reconstructor base checked against the deny-list", AL,
           'if base.kind != "global" or base.value != OBJECT:',
           'if base.kind == "global" and base.value[0].split(".")[0] in DANGEROUS_MODULES '
           'and base.value[1] not in SAFE_BUILTIN_TYPES:', (TZA,)),
    Mutant("torchzip", "every protocol 0/1 object refused", AL,
           'if base.kind != "global" or base.value != OBJECT:', "if True:", (TZA,)),
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
           "args.strategy, args.force, args.calib", '"minimal", args.force, args.calib',
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
           'q = GPU_Q if target.kind == "cuda" else CPU_Q', "q = GPU_Q", (V,)),
    Mutant("elsewhere", "perf gate on a CPU uses the GPU's factor", "gac_check/plugin/perf.py",
           "GPU_PERF_FACTOR if target.kind == \"cuda\" else CPU_PERF_FACTOR)",
           "GPU_PERF_FACTOR)", (V,)),
    # ------------------------------------------- issue 22, "tests that bite": the thin areas
    # ------------------------------------------------------------------ dtype choice
    Mutant("dtype", "a tie in width goes to config.json", DT,
           "stricter = min((stored, declared), key=_itemsize)",
           "stricter = min((declared, stored), key=_itemsize)", (DTE,)),
    Mutant("dtype", "the looser of config and weights", DT,
           "stricter = min((stored, declared), key=_itemsize)",
           "stricter = max((stored, declared), key=_itemsize)", (DTE,)),
    Mutant("dtype", "weights' dtype by tensor count, not elements", DT,
           "counts[t.dtype] = counts.get(t.dtype, 0) + t.numel",
           "counts[t.dtype] = counts.get(t.dtype, 0) + 1", (DTE,)),
    Mutant("dtype", "integer and bool tensors counted as weights", DT,
           "    for t in ckpt.tensors.values():\n        if t.dtype.startswith(FLOAT_PREFIXES):",
           "    for t in ckpt.tensors.values():\n        if True:", (DTE,)),
    Mutant("dtype", "the weights' dtype with the fewest elements", DT,
           "return max(counts, key=counts.__getitem__) if counts else None",
           "return min(counts, key=counts.__getitem__) if counts else None", (DTE,)),
    Mutant("dtype", "a stale torch_dtype read before dtype", DT,
           'ckpt.config.get("dtype") or ckpt.config.get("torch_dtype")',
           'ckpt.config.get("torch_dtype") or ckpt.config.get("dtype")', (DTE,)),
    Mutant("dtype", "\"auto\" taken as a dtype", DT,
           'declared not in ("auto", "")', 'declared != ""', (DTE,)),
    Mutant("dtype", "--dtype hides a config/weights disagreement", DT,
           'said = "; ".join(x for x in (mixed, seen) if x)', 'said = mixed or ""', (DTE,)),
    # ------------------------------------------------- measured rules at the top of a sweep
    Mutant("measured", "64 not credited with a pair padding onto a larger power of two", MEAS,
           "return pow2 == m or (m == MODULI[-1] and pow2 >= m)", "return pow2 == m", (MT,)),
    Mutant("measured", "exactly MIN_PAIRS pairs not enough", MEAS,
           "return (self.pairs >= MIN_PAIRS and", "return (self.pairs > MIN_PAIRS and", (MT,)),
    Mutant("measured", "one pair enough", MEAS, "MIN_PAIRS = 2", "MIN_PAIRS = 1", (MT,)),
    Mutant("measured", "a family of exactly MIN_FAMILY sizes refused", MEAS,
           "if len(pts) >= MIN_FAMILY]", "if len(pts) > MIN_FAMILY]", (MT,)),
    Mutant("measured", "the weakest family makes the rule", MEAS,
           "if k not in strongest or e.rescue > strongest[k].rescue:",
           "if k not in strongest or e.rescue < strongest[k].rescue:", (MT,)),
    Mutant("measured", "the first family makes the rule", MEAS,
           "if k not in strongest or e.rescue > strongest[k].rescue:",
           "if k not in strongest:", (MT,)),
    Mutant("measured", "a family at the noise limit judges nothing", MEAS,
           "if fam.noise <= MAX_NOISE for e", "if fam.noise < MAX_NOISE for e", (MT,)),
    Mutant("measured", "sizes padding past the sweep's top not skipped", MEAS,
           "if v % m == 0 or up not in family.points or not _exactly(up, m):",
           "if v % m == 0 or not _exactly(up, m):", (MT,)),
    # ------------------------------------------- re-recording after the stack changed
    Mutant("rerecord", "the old measurement kept over the re-recorded one", BASELINES,
           "baseline.cases.update({m.case: m for m in measurements})",
           "baseline.cases = {**{m.case: m for m in measurements}, **baseline.cases}", (RR,)),
    Mutant("rerecord", "cases not re-measured dropped", BASELINES,
           "baseline.cases.update({m.case: m for m in measurements})",
           "baseline.cases = {m.case: m for m in measurements}", (RR,)),
    Mutant("rerecord", "peak figures replaced, not merged", BASELINES,
           "baseline.peak.update(peak)", "baseline.peak = dict(peak)", (RR,)),
    Mutant("rerecord", "device not checked when re-recording", BASELINES,
           "            check_fingerprint(baseline, fingerprint)\n"
           "            baseline.fingerprint = fingerprint",
           "            baseline.fingerprint = fingerprint", (RR,)),
    Mutant("rerecord", "cuDNN drift not warned", BASELINES,
           'STACK_FIELDS = ("torch", "cuda", "cudnn"', 'STACK_FIELDS = ("torch", "cuda"', (RR,)),
    # --------------------------------------- safetensors header, against safetensors' verdict
    Mutant("safetensors", "a header filling the file refused", ST,
           "if n > size - 8:", "if n >= size - 8:", (STE,)),
    Mutant("safetensors", "a header of exactly the limit refused", ST,
           "if n > MAX_HEADER_BYTES:", "if n >= MAX_HEADER_BYTES:", (STE,)),
    Mutant("safetensors", "one trailing byte tolerated", ST,
           "if data_start + end < size:", "if data_start + end < size - 1:", (STE,)),
    Mutant("safetensors", "empty tensors refused (end <= begin)", ST,
           "if e.end < e.begin:", "if e.end <= e.begin:", (STE,)),
    Mutant("safetensors", "tensors sorted by begin only", ST,
           "sorted(entries, key=lambda e: (e.begin, e.end))",
           "sorted(entries, key=lambda e: e.begin)", (STE,)),
    Mutant("safetensors", "a one-byte gap tolerated", ST,
           "if e.begin > start:", "if e.begin > start + 1:", (STE,)),
    Mutant("safetensors", "element count multiplied out before the overflow check", ST,
           "        if n > U64_MAX:\n            break\n", "", (STE,)),
    Mutant("safetensors", "overflow checked in bytes, not bits", ST,
           "    n *= SAFETENSORS_TYPES[e.dtype][1] * 8\n    if n > U64_MAX:",
           "    n *= SAFETENSORS_TYPES[e.dtype][1] * 8\n    if n // 8 > U64_MAX:", (STE,)),
    # ------------------------------------------------------- file modes of what is written
    Mutant("modes", "atomic files keep mkstemp's 0600", ATOMIC,
           "            os.fchmod(fh.fileno(), 0o666 & ~umask())\n", "", (FM,)),
    Mutant("modes", "atomic files 0644 whatever the umask", ATOMIC,
           "os.fchmod(fh.fileno(), 0o666 & ~umask())", "os.fchmod(fh.fileno(), 0o644)", (FM,)),
    Mutant("modes", "atomic files executable", ATOMIC,
           "os.fchmod(fh.fileno(), 0o666 & ~umask())",
           "os.fchmod(fh.fileno(), 0o777 & ~umask())", (FM,)),
    Mutant("modes", "the umask assumed 022", ATOMIC,
           "    os.umask(mask)\n    return mask", "    os.umask(mask)\n    return 0o022", (FM,)),
    Mutant("modes", "OUT 0755 whatever the umask", OUTDIR,
           "tmp.chmod(0o777 & ~umask())", "tmp.chmod(0o755)", (FM,)),
    Mutant("modes", "side files copied with the model directory's modes", OUTDIR,
           "shutil.copyfile(item, dst / item.name)", "shutil.copy2(item, dst / item.name)",
           (FM,)),
    Mutant("modes", "side folders keep the model directory's modes", OUTDIR,
           "            _new_folder_modes(dst / item.name)\n", "", (FM,)),
    # ------------------------------------------------- padding cost of multi-head sites
    Mutant("padding", "only axes after the padded one count (consumers cost 1)", SITES,
           "if i != ax.axis:", "if i > ax.axis:", (PC,)),
    Mutant("padding", "each tensor counted once (fused qkv: one part)", SITES,
           "for ax in self.axes:\n            shape = shapes[ax.tensor]",
           "for ax in {a.tensor: a for a in self.axes}.values():\n"
           "            shape = shapes[ax.tensor]", (PC,)),
    Mutant("padding", "the cost quoted for the optimal target", "gac_check/analysis.py",
           "to = finding.repair_to if target is None else target",
           "to = finding.optimal_to if target is None else target", (PC,)),
    Mutant("padding", "fused k/v parts given as many blocks as query heads",
           "gac_check/formats/architectures.py",
           "[heads_n * hd, (heads_n + kv_n) * hd], kv_n, hd)",
           "[heads_n * hd, (heads_n + kv_n) * hd], heads_n, hd)", (PC,)),
    Mutant("padding", "biases left out of a head's cost", "gac_check/formats/layout.py",
           "return rows + [_axis(shapes, b, 0, AxisKind.BIAS, unit) for b in self.biases]",
           "return rows", (PC,)),
    Mutant("padding", "a folded row's +params from its last layer only", TEXT,
           "row.pad += result.padding_params(f)", "row.pad = result.padding_params(f)", (PC,)),
    # ------------------------------------------------------ the terminal table's layers
    Mutant("layers", "a layer named twice listed twice", TEXT,
           "xs = sorted(set(layers))", "xs = sorted(layers)", (LR,)),
    Mutant("layers", "layers listed in the order found", TEXT,
           "xs = sorted(set(layers))", "xs = list(dict.fromkeys(layers))", (LR,)),
    Mutant("layers", "gaps not shown (one run from first to last)", TEXT,
           "if b != a + 1:", "if b is None:", (LR,)),
    Mutant("layers", "a single layer written as a range (3-3)", TEXT,
           'parts.append(f"{start}-{a}" if a != start else str(a))',
           'parts.append(f"{start}-{a}")', (LR,)),
    Mutant("layers", "sites with different values folded together", TEXT,
           "key = (pattern, f.site.value, f.repair_to, tuple(r.id for r in f.rules))",
           "key = (pattern, f.repair_to, tuple(r.id for r in f.rules))", (LR,)),
    Mutant("layers", "a wide range shifts the columns after it", TEXT,
           "wide = max([10, *(len(_ranges(row.layers)) for row in rows)])", "wide = 10",
           (LR,)),
    # ------------------------------------------------- strict types in run documents
    Mutant("rundoc", "bools accepted where numbers go", RUN,
           "if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):",
           "if not isinstance(value, kinds):", (RD,)),
    Mutant("rundoc", "required ints accept bools", RUN,
           "if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):",
           "if not isinstance(value, kind):", (RD,)),
    Mutant("rundoc", "test counts not type-checked", RUN,
           '    for key in counts:\n        _optional(counts, key, INT, path, "tests.counts.")\n',
           "", (RD,)),
    Mutant("rundoc", "site fields not type-checked", RUN,
           "        for key, kinds in SITE_FIELDS.items():\n"
           "            _optional(site, key, kinds, path, here)\n", "", (RD,)),
    Mutant("rundoc", "summary fields not type-checked", RUN,
           "    for key, kinds in SUMMARY_FIELDS.items():\n"
           '        _optional(check["summary"], key, kinds, path, f"{where}summary.")\n', "",
           (RD,)),
    Mutant("rundoc", "perf records not type-checked", RUN,
           "        for key, kinds in PERF_FIELDS.items():\n"
           '            _optional(rec, key, kinds, path, f"perf[{i}].")\n', "", (RD,)),
    Mutant("rundoc", "rule ids not type-checked", RUN,
           "            if not isinstance(rule, str):", "            if False:", (RD,)),
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
