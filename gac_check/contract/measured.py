"""The measured Shape Contract: which moduli matter on a machine, derived from its stored sweep.

A sweep family is a set of cases that differ in one size only (SDPA's D, GEMM's K or N). For a
modulus m in 2, 4, 8, 16, 32, 64 the evidence is the padding-rescue pairs: every size v that is
a multiple of m/2 but not of m, against ceil_m(v), the size padding would give it (only pairs
whose padded size is an odd multiple of m, so 8's effect is not credited to 4). The ratio
t(v) / t(ceil_m(v)) is what padding to m buys (it includes the padded size's extra work, so it is
the honest number). m *matters* when the median ratio is at least 1 + ``MIN_GAIN`` and, where
samples are stored, most pairs differ significantly (Mann-Whitney). A rule's ``slowdown_by_pow2``
gives the rescue ratio for every lower power-of-two class, so an odd size quotes its own figure.

    gac-check baseline contract baselines/cpu-amd-avx2.json --dtype float32
"""
from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gac_check.bench import baselines, stats
from gac_check.bench.cases import parse_case_key
from gac_check.bench.device import contract_key
from gac_check.contract.rules import ERROR, GEMM_ROLES, WARNING, Rule
from gac_check.sites import Role

MODULI = (2, 4, 8, 16, 32, 64)
MIN_GAIN = 0.05  # a modulus below a 5% rescue is noise-level and not worth a rule
ERROR_GAIN = 0.25  # a 1.25x rescue or more is an error, as the published rules grade it
ALPHA = 0.05
#: swept parameter per kind, and the roles a family of that kind speaks for
SWEPT = {"sdpa": ("D",), "gemm": ("K", "N")}
ROLES = {"sdpa": frozenset({Role.HEAD_DIM}), "gemm": GEMM_ROLES}
MIN_FAMILY = 16
MIN_PAIRS = 2  # one pair is an anecdote
#: A family whose cases' median relative IQR exceeds this was measured on a busy machine: it
#: cannot show that a modulus does NOT matter, so it judges nothing (published rules stay).
MAX_NOISE = 0.10


@dataclass(frozen=True)
class Family:
    """Cases of one kind differing only in ``axis``: size -> measurement."""

    kind: str
    axis: str
    fixed: tuple[tuple[str, str], ...]
    points: dict[int, baselines.Measurement]

    @property
    def noise(self) -> float:
        """Median relative IQR of the family's cases (0 for published medians)."""
        return stats.median([(m.iqr_s or 0.0) / m.median_s for m in self.points.values()])

    @property
    def label(self) -> str:
        return f"{self.kind} {self.axis}-sweep ({','.join(f'{k}={v}' for k, v in self.fixed)})"


@dataclass(frozen=True)
class ModulusEffect:
    kind: str
    modulus: int
    rescue: float  # median t(v)/t(ceil_m(v)) over the marginal class
    by_pow2: tuple[tuple[int, float], ...]
    pairs: int
    significant: int  # pairs whose samples differ at ALPHA (or pairs, without samples)
    family: str

    @property
    def matters(self) -> bool:
        return (self.pairs >= MIN_PAIRS and self.rescue >= 1 + MIN_GAIN
                and self.significant * 3 >= self.pairs * 2)


def families(baseline: baselines.Baseline, dtype: str, measured_only: bool = True,
             sdpa_backend: str = "default") -> list[Family]:
    """Group the baseline's cases into sweeps. SDPA families use the default dispatch: that is
    what a model runs; forced-backend families are for reading, not for the contract."""
    groups: dict[tuple, dict[int, baselines.Measurement]] = defaultdict(dict)
    for key, m in baseline.cases.items():
        if measured_only and m.provenance.kind != "measured":
            continue
        kind, params = parse_case_key(key)
        if kind not in SWEPT or params.get("dtype") != dtype:
            continue
        if kind == "sdpa" and params.get("backend", "default") != sdpa_backend:
            continue
        for axis in SWEPT[kind]:
            fixed = tuple((k, v) for k, v in params.items() if k != axis)
            groups[(kind, axis, fixed)][int(params[axis])] = m
    return [Family(kind, axis, fixed, pts) for (kind, axis, fixed), pts in groups.items()
            if len(pts) >= MIN_FAMILY]


def effects(family: Family) -> list[ModulusEffect]:
    out = []
    for m in MODULI:
        by_class: dict[int, list[float]] = defaultdict(list)
        pairs = significant = 0
        for v, meas in family.points.items():
            up = -(-v // m) * m
            if v % m == 0 or up not in family.points or not _exactly(up, m):
                continue
            padded = family.points[up]
            ratio = meas.median_s / padded.median_s
            by_class[v & -v].append(ratio)
            if v % (m // 2) == 0:
                pairs += 1
                significant += _significant(meas, padded)
        marginal = by_class.get(m // 2)
        if not marginal:
            continue
        out.append(ModulusEffect(family.kind, m, stats.median(marginal),
                                 tuple((p, round(stats.median(r), 3))
                                       for p, r in sorted(by_class.items())),
                                 pairs, significant, family.label))
    return out


def _exactly(size: int, m: int) -> bool:
    """Is ``size`` a multiple of m and not of 2m (of at least m for the largest modulus)?

    Without this, half of the pairs for m = 4 would land on multiples of 8 and credit 4 with
    8's effect."""
    pow2 = size & -size
    return pow2 == m or (m == MODULI[-1] and pow2 >= m)


def _significant(a: baselines.Measurement, b: baselines.Measurement) -> int:
    if len(a.samples) < 2 or len(b.samples) < 2:
        return 1  # published medians only: the size of the effect has to speak for itself
    return int(stats.mann_whitney_u(a.samples, b.samples).p_value < ALPHA)


def derive_rules(baseline: baselines.Baseline, dtype: str,
                 measured_only: bool = True) -> tuple[list[Rule], list[ModulusEffect]]:
    """Rules (source "measured") for every modulus that matters, and every effect seen."""
    all_effects = [e for fam in families(baseline, dtype, measured_only)
                   if fam.noise <= MAX_NOISE for e in effects(fam)]
    strongest: dict[tuple[str, int], ModulusEffect] = {}
    for e in all_effects:
        k = (e.kind, e.modulus)
        if k not in strongest or e.rescue > strongest[k].rescue:
            strongest[k] = e
    source = "measured" if measured_only else "published-sweep"
    rules = [_rule(e, baseline, dtype, source) for e in strongest.values() if e.matters]
    return sorted(rules, key=lambda r: r.id), all_effects


def _rule(e: ModulusEffect, baseline: baselines.Baseline, dtype: str, source: str) -> Rule:
    name = "sdpa-head-dim" if e.kind == "sdpa" else "gemm"
    severity = ERROR if e.rescue >= 1 + ERROR_GAIN else WARNING
    why = (f"measured on {baseline.fingerprint.device} ({dtype}): sizes that are multiples "
           f"of {e.modulus // 2} but not {e.modulus} ran {e.rescue:.2f}x the time of the "
           f"padded size ({e.pairs} pairs, {e.family})")
    return Rule(f"{source}-{name}-mod{e.modulus}", ROLES[e.kind], severity, why,
                modulus=e.modulus, slowdown=round(e.rescue, 3), slowdown_by_pow2=e.by_pow2,
                source=source)


def roles_covered(rules_effects: list[ModulusEffect]) -> frozenset[Role]:
    return frozenset(r for e in rules_effects for r in ROLES[e.kind])


def measured_rules(profile: str, dtype: str) -> tuple[list[Rule], frozenset[Role]] | None:
    """The measured rules for a profile and the roles its sweeps cover, or None without a
    measured sweep (the caller then uses the published rules)."""
    path = baselines.path_for(contract_key(profile))
    if not path.exists():
        return None
    return _cached_rules(path, path.stat().st_mtime_ns, dtype)


@cache
def _cached_rules(path: Path, mtime: int, dtype: str):
    del mtime  # part of the cache key only: a rewritten file is read again
    rules, seen = derive_rules(baselines.load(path), dtype)
    return (rules, roles_covered(seen)) if seen else None


# -------------------------------------------------------------------------------- drift
@dataclass(frozen=True)
class Drift:
    no_longer_needed: list[str]
    new_cliffs: list[str]

    @property
    def clean(self) -> bool:
        return not (self.no_longer_needed or self.new_cliffs)

    def lines(self) -> list[str]:
        return ([f"no longer needed: {s}" for s in self.no_longer_needed]
                + [f"new cliff: {s}" for s in self.new_cliffs]) or ["no contract drift"]


def _modulus_rules(rules: list[Rule], roles: frozenset[Role]) -> dict[tuple, Rule]:
    out = {}
    for r in rules:
        if r.allowed or r.max_value is not None or r.modulus <= 1 or not r.roles & roles:
            continue
        kind = "sdpa" if Role.HEAD_DIM in r.roles else "gemm"
        out[(kind, r.modulus)] = r
    return out


def drift(expected: list[Rule], current: list[Rule], covered: frozenset[Role]) -> Drift:
    """Compare the rules a contract states with what the current stack measures.

    Only roles the current sweep covers are judged: no SDPA sweep says nothing about SDPA.
    """
    old, new = _modulus_rules(expected, covered), _modulus_rules(current, covered)
    gone = [f"{old[k].id} ({k[0]} % {k[1]}): the current stack shows no measurable gain"
            for k in sorted(old) if k not in new]
    added = [f"{new[k].id}: {k[0]} % {k[1]} now costs {new[k].slowdown:.2f}x"
             for k in sorted(new) if k not in old]
    return Drift(gone, added)


if __name__ == "__main__":  # the old spelling of `gac-check baseline contract`: runs that command
    import runpy  # the CLI is run as a program, not imported: it sits above this module

    sys.argv[1:1] = ["baseline", "contract"]
    runpy.run_module("gac_check.cli", run_name="__main__")
