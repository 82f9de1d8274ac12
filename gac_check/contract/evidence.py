"""Which data an expected slowdown may be read from, and whether it covers a site's shape.

The data are sweeps: times of one kernel over a contiguous range of one size (SDPA over
head_dim, a GEMM over K or N) at fixed other sizes, on one machine, in one dtype. Two kinds:

* measured: ``baselines/<profile>.json`` recorded on that hardware
  (``gac-check baseline record``), which wins where it covers the shape;
* published: the paper's A100 and H100 tables, packaged with gac-check
  (:mod:`gac_check.bench.published`). The generic ``gpu`` profile quotes the A100's; the H200
  inherits the H100's (:data:`INHERITED`).

A figure applies where the workload is comparable: the same kernel (a head_dim reads the SDPA
sweep, a GEMM size the K and N sweeps), the same dtype class (fp16 data speaks for bf16, not for
fp32, which runs TF32 kernels with another alignment), and a size inside the range the sweep
covers. Then the figure is the sweep's own ratio t(size) / t(fix), read at the site's size and
its repair target. Inside the range but with the size or its target not sampled (the H100 SDPA
table has only even head_dims above 160) the figure is an *estimate*: the median ratio of the
sampled sizes with the same largest power-of-two divisor, each against its own fix, and it is
labelled so. Outside the range (a rank of 153 against a K 4000-4100 sweep) there is no figure:
"not measured at this shape", and ``gac-check --bench`` on the GPU measures it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from gac_check.bench import baselines, published, stats
from gac_check.bench.cases import parse_case_key
from gac_check.bench.device import contract_key
from gac_check.contract import measured
from gac_check.contract.rules import GEMM_ROLES, Contract, Finding, Rule
from gac_check.contract.slowdown import BENCH, ESTIMATE, MEASURED, PUBLISHED, Slowdown
from gac_check.sites import Role

if TYPE_CHECKING:  # --bench only
    from gac_check.bench.model_bench import BenchReport

#: Whose published sweeps a profile quotes.
PUBLISHED_FOR = {"a100": "a100", "gpu": "a100", "h100": "h100", "h200": "h100"}
#: Why a profile quotes another GPU's figures.
INHERITED = {
    "gpu": "the generic GPU contract quotes the A100's published figures; name the GPU "
           "(--gpu h100) for its own",
    "h200": "the H200 inherits the H100's figures: the same GH100 compute die (sm_90: the same "
            "SMs, Tensor Cores and cuBLAS/FlashAttention kernels, hence the same alignment "
            "rules and kernel choices); only its memory differs (141 GB HBM3e at 4.8 TB/s vs "
            "80 GB HBM3 at 3.35 TB/s), so memory-bound shapes may gain less from padding",
}
#: The sizes of a role's GEMMs that the role sets: a rank (intermediate, latent, hidden) is K of
#: one GEMM and N of another; the vocabulary is N of the LM head only.
GEMM_AXES = {Role.VOCAB: ("N",)}
AXIS_NAMES = {"D": "head_dim", "K": "K", "N": "N"}
BENCH_HINT = "gac-check --bench on that hardware times the model's own shapes"
#: Sizes further apart than this split a sweep (the H100 SDPA table steps by 2 above 160).
MAX_GAP = 8
#: An estimate needs at least this many sampled sizes of the class.
MIN_ESTIMATE_PAIRS = 2


def dtype_class(dtype: str) -> str:
    """Dtypes whose kernels share an alignment (16 bytes = 8 elements for both halves)."""
    if dtype in ("float16", "bfloat16"):
        return "16-bit float"
    if dtype in ("float32", "tfloat32"):
        return "32-bit float"
    if dtype.startswith("float8"):
        return "8-bit float"
    return dtype


@dataclass(frozen=True)
class Sweep:
    """One kernel timed over a contiguous range of one size, with where it comes from."""

    kind: str  # "sdpa" | "gemm"
    axis: str  # "D" | "K" | "N"
    dtype: str
    fixed: str  # the other sizes, e.g. "B=4 S=2048 H=32"
    times: dict[int, float]
    source: str  # PUBLISHED | MEASURED
    hardware: str
    citation: str

    @property
    def lo(self) -> int:
        return min(self.times)

    @property
    def hi(self) -> int:
        return max(self.times)

    def covers(self, value: int) -> bool:
        return self.lo <= value <= self.hi

    @property
    def coverage(self) -> str:
        return (f"{self.kind.upper()} {AXIS_NAMES[self.axis]} {self.lo}-{self.hi} at "
                f"{self.fixed}")

    def point(self, value: int) -> str:
        return f"{AXIS_NAMES[self.axis]}={value}"


def sweeps_of(baseline: baselines.Baseline, source: str, where: str) -> list[Sweep]:
    """Every sweep in a baseline (default SDPA dispatch: what a model runs): each family's runs
    of sizes, so a lone case that shares the fixed sizes (the reference GEMM K=4096 beside a
    K 96-320 sweep) does not stretch a sweep's range over sizes it never timed."""
    out = []
    dtypes = sorted({p.get("dtype", "") for p in _params(baseline)} - {""})
    for dtype in dtypes:
        for fam in measured.families(baseline, dtype, measured_only=source == MEASURED):
            first = next(iter(fam.points.values())).provenance
            if source == PUBLISHED:
                citation = first.citation or where
            else:
                citation = f"{where}: {first.command or '?'} ({first.date or 'undated'})"
            fixed = " ".join(f"{k}={v}" for k, v in fam.fixed if k not in ("dtype", "backend"))
            if fam.kind == "sdpa":
                fixed += f" ({dict(fam.fixed).get('backend', 'default')} backend)"
            for run in _runs(sorted(fam.points)):
                out.append(Sweep(fam.kind, fam.axis, dtype, fixed,
                                 {v: fam.points[v].median_s for v in run}, source,
                                 baseline.fingerprint.device, citation))
    return out


def _runs(sizes: list[int]) -> list[list[int]]:
    """Sizes split where two neighbours are more than MAX_GAP apart; runs of at least
    measured.MIN_FAMILY sizes."""
    runs: list[list[int]] = []
    for v in sizes:
        if runs and v - runs[-1][-1] <= MAX_GAP:
            runs[-1].append(v)
        else:
            runs.append([v])
    return [r for r in runs if len(r) >= measured.MIN_FAMILY]


def _params(baseline: baselines.Baseline) -> list[dict[str, str]]:
    return [parse_case_key(k)[1] for k in baseline.cases]


@dataclass(frozen=True)
class Evidence:
    """The sweeps a profile's figures may come from, best first (measured before published)."""

    profile: str
    sweeps: tuple[Sweep, ...] = field(default_factory=tuple)
    note: str = ""  # why this profile quotes another GPU's figures, if it does

    def figure(self, role: Role, value: int, to: int, dtype: str,
               target_of: Callable[[int], int]) -> Slowdown:
        """The expected slowdown of ``value`` against ``to`` (its repair), with provenance.

        ``target_of`` is the same repair for any other size of the role (for estimates)."""
        kind = "sdpa" if role == Role.HEAD_DIM else "gemm" if role in GEMM_ROLES else None
        if kind is None:
            return Slowdown.not_measured(f"no kernel is timed for role {role.value}")
        if to == value:
            return Slowdown.not_measured(f"no aligned size to compare {value} with")
        axes = ("D",) if kind == "sdpa" else GEMM_AXES.get(role, ("K", "N"))
        usable = [s for s in self.sweeps if s.kind == kind and s.axis in axes
                  and dtype_class(s.dtype) == dtype_class(dtype)]
        if not usable:
            return self._no_data(kind, dtype)
        groups = [[s for s in usable if s.source == src and (s.dtype == dtype) == exact]
                  for src in (MEASURED, PUBLISHED) for exact in (True, False)]
        for group in groups:
            found = self._direct(group, value, to, dtype)
            if found:
                return found
        for group in groups:
            found = self._estimate(group, value, to, dtype, target_of)
            if found:
                return found
        by_origin: dict[str, list[str]] = {}
        for s in usable:
            by_origin.setdefault(f"{s.source} {s.hardware} {s.dtype}", []).append(s.coverage)
        ranges = "; ".join(f"{origin}: {' and '.join(cov)}" for origin, cov in by_origin.items())
        first = usable[0]
        return Slowdown.not_measured(
            f"outside the sizes the data cover ({ranges}); {BENCH_HINT}", first.hardware,
            first.dtype, " and ".join(s.coverage for s in usable), first.citation)

    def _no_data(self, kind: str, dtype: str) -> Slowdown:
        have = sorted({f"{s.dtype} ({s.source})" for s in self.sweeps if s.kind == kind})
        why = (f"no {kind.upper()} sweep in {dtype} or its class ({dtype_class(dtype)}) for "
               f"the {self.profile} profile")
        there = f"; there are {', '.join(have)}" if have else ""
        if self.profile not in PUBLISHED_FOR and self.profile != "cpu":
            there += "; nothing is published for this GPU and no other GPU's figure is borrowed"
        return Slowdown.not_measured(f"{why}{there}; {BENCH_HINT}")

    def _note(self, sweep: Sweep, dtype: str) -> str:
        notes = [self.note] if self.note and sweep.source == PUBLISHED else []
        if sweep.dtype != dtype:
            notes.append(f"measured in {sweep.dtype}, applied to {dtype} (same "
                         f"{dtype_class(dtype)} kernels and alignment)")
        return "; ".join(notes)

    def _direct(self, group: list[Sweep], value: int, to: int, dtype: str) -> Slowdown | None:
        by_axis: dict[str, Sweep] = {}
        for s in group:
            if s.axis not in by_axis and value in s.times and to in s.times:
                by_axis[s.axis] = s
        if not by_axis:
            return None
        used = list(by_axis.values())
        ratio = sum(s.times[value] for s in used) / sum(s.times[to] for s in used)
        shape = "; ".join(f"{s.kind.upper()} {s.fixed}: {s.point(value)} "
                          f"{s.times[value] * 1e3:.3f} ms vs {s.point(to)} "
                          f"{s.times[to] * 1e3:.3f} ms" for s in used)
        if len(used) > 1:
            shape += " (summed: the size is K of one GEMM and N of another)"
        first = used[0]
        return Slowdown(round(ratio, 3), first.source, first.hardware, first.dtype, shape,
                        "; ".join(s.coverage for s in used), first.citation,
                        self._note(first, dtype))

    def _estimate(self, group: list[Sweep], value: int, to: int, dtype: str,
                  target_of: Callable[[int], int]) -> Slowdown | None:
        covering = [s for s in group if s.covers(value)]
        pow2 = value & -value
        ratios = []
        for s in covering:
            for u in s.times:
                fix = target_of(u)
                if u & -u == pow2 and fix != u and fix in s.times:
                    ratios.append(s.times[u] / s.times[fix])
        if len(ratios) < MIN_ESTIMATE_PAIRS:
            return None
        first = covering[0]
        model = (f"model: the sweep did not time both {value} and {to}; median of "
                 f"t(size)/t(its fix) over the {len(ratios)} timed sizes in "
                 f"{first.lo}-{first.hi} whose largest power-of-two divisor is {pow2}, as "
                 f"{value}'s is")
        note = "; ".join(p for p in (model, self._note(first, dtype)) if p)
        return Slowdown(round(stats.median(ratios), 3), ESTIMATE, first.hardware, first.dtype,
                        f"{first.kind.upper()} {first.fixed}: {first.point(value)} class",
                        "; ".join(s.coverage for s in covering), first.citation, note)

    def rule_figure(self, rule: Rule, dtype: str) -> Rule:
        """A published rule with the padding rescue its modulus buys at the sweeps' own shapes
        (``Rule.slowdown``, what the perf suites expect to see), where a sweep of the dtype's
        class shows it."""
        if rule.allowed or rule.max_value is not None or rule.modulus <= 1:
            return rule
        gpu = PUBLISHED_FOR.get(self.profile)
        kind = "sdpa" if Role.HEAD_DIM in rule.roles else "gemm"
        best = _published_effect(gpu, dtype, kind, rule.modulus) if gpu else None
        if best is None:
            return rule
        return replace(rule, slowdown=round(best.rescue, 3), slowdown_by_pow2=best.by_pow2)


@cache
def _published_effect(gpu: str, dtype: str, kind: str,
                      modulus: int) -> measured.ModulusEffect | None:
    """The strongest rescue ``modulus`` shows in a GPU's published sweeps of ``kind``."""
    base = published.packaged(gpu)
    best = None
    for fam in measured.families(base, _sweep_dtype(base, dtype), measured_only=False):
        if fam.kind != kind:
            continue
        for e in measured.effects(fam):
            if e.modulus == modulus and (best is None or e.rescue > best.rescue):
                best = e
    return best


def _sweep_dtype(base: baselines.Baseline, dtype: str) -> str:
    """The dtype of ``base``'s sweeps that speaks for ``dtype`` (itself, else one of its class;
    none: a dtype no sweep is in, so no family matches)."""
    have = {p.get("dtype") for p in _params(base)}
    if dtype in have:
        return dtype
    return next((d for d in sorted(have) if d and dtype_class(d) == dtype_class(dtype)), dtype)


def evidence_for(profile: str) -> Evidence:
    """The sweeps for a profile: its measured baseline (if recorded), then published data."""
    path = baselines.path_for(contract_key(profile))
    stamp = path.stat().st_mtime_ns if path.exists() else None
    return _evidence(profile, path, stamp)


@cache
def _evidence(profile: str, path: Path, stamp: int | None) -> Evidence:
    del stamp  # part of the cache key only: a rewritten file is read again
    sweeps: list[Sweep] = []
    if path.exists():
        sweeps += sweeps_of(baselines.load(path), MEASURED, str(path))
    gpu = PUBLISHED_FOR.get(profile)
    if gpu:
        sweeps += sweeps_of(published.packaged(gpu), PUBLISHED, "published")
    return Evidence(profile, tuple(sweeps), INHERITED.get(profile, ""))


# ------------------------------------------------------------------------------- --bench
def bench_speaks_for(report: BenchReport, contract: Contract) -> str | None:
    """Why ``--bench`` timings cannot stand for this contract's hardware and dtype, or None
    when they can (then they take precedence over every other figure)."""
    if contract.profile == "cpu":
        same = report.profile == "cpu"
    elif contract.profile == "gpu":  # the generic GPU contract: any GPU is closer than none
        same = report.profile != "cpu"
    else:
        same = report.profile == contract.profile
    if not same:
        return (f"timed on {report.hardware or report.device}, not on {contract.profile} "
                "hardware: shown here only, the expected slowdowns above stand")
    if dtype_class(report.dtype) != dtype_class(contract.dtype):
        return (f"timed in {report.dtype}, not in {contract.dtype}'s class: shown here only, "
                "the expected slowdowns above stand")
    return None


def adopt_bench(findings: list[Finding], report: BenchReport, contract: Contract) -> str:
    """Give every timed site its ``--bench`` figure where the bench speaks for the contract;
    returns (and stores in ``report.precedence``) the line that says whether it did."""
    report.precedence = bench_speaks_for(report, contract) or _adopt(findings, report)
    return report.precedence


def _adopt(findings: list[Finding], report: BenchReport) -> str:
    by_name = {s.name: s for s in report.sites if s.speedup is not None}
    adopted = 0
    for f in findings:
        s = by_name.get(f.site.name)
        if s is None or s.repaired != f.fix_to:
            continue
        f.bench = Slowdown(round(s.speedup, 3), BENCH, report.hardware or report.device,
                           report.dtype, f"{s.kernels}: {s.value} vs {s.repaired}",
                           "this model's own shapes", "gac-check --bench (this run)",
                           f"timed on the device present at {report.tokens} tokens; "
                           "takes precedence over published and stored figures")
        adopted += 1
    return (f"these timings are the expected slowdowns above for {adopted} site(s) "
            "(source: bench)")
