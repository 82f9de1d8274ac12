"""What each ``--target`` makes of the whole model, said once, and the sites seen without it.

A target that does not build the model at all (vLLM and a low-rank checkpoint's factor pairs)
refuses every site with the same reason: the check document records that on each site (a
``target:SPEC`` rule, a ``refusal`` naming the remedy), which is right for a gate but, drawn
site by site, makes an aligned width look misaligned and repeats one sentence per row. The
report reads the model-level outcome from ``summary.targets[SPEC].load`` instead, leads the
verdict with it, and draws each site by its own rules: the hardware's and those of the targets
that do load the model.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass


@dataclass
class Outcome:
    """One target's verdict on the whole model: does it load, and if not what would serve it."""

    spec: str
    loads: bool
    why: str | None
    remedy: str | None


def outcomes(check: dict) -> list[Outcome]:
    """Each target's model-level outcome, in the order the targets were given."""
    out = []
    for spec, t in (check["summary"].get("targets") or {}).items():
        load = t.get("load") or {}
        out.append(Outcome(spec, load.get("loads", True), load.get("why"), load.get("remedy")))
    return out


def blocked(check: dict) -> dict[str, Outcome]:
    """The targets that do not load the model, by spec."""
    return {o.spec: o for o in outcomes(check) if not o.loads}


def own_sites(check: dict) -> list[dict]:
    """The check's sites as their own rules judge them: a rule or a refusal that only says
    that a blocked target does not load the model is dropped (the verdict says it once), and
    a site left with no rule is aligned."""
    gone = blocked(check)
    if not gone:
        return check["sites"]
    severity = {r["id"]: r.get("severity") for r in check.get("rules") or []}
    out = []
    for site in check["sites"]:
        s = copy.copy(site)
        s["rules"] = [r for r in site.get("rules") or []
                      if r.removeprefix("target:") not in gone]
        s["refusal"] = _without_remedies(site.get("refusal"), gone.values())
        if not site.get("aligned") and not s["rules"]:
            s.update(aligned=True, severity=None, repair_to=None, optimal_to=None,
                     slowdown=None, expected_slowdown=None, padding_params=0, refusal=None)
        elif s["rules"] != site.get("rules") and all(r in severity for r in s["rules"]):
            # only the hardware's rules are left: theirs is the site's severity
            s["severity"] = "error" if any(severity[r] == "error" for r in s["rules"]) \
                else "warning"
        out.append(s)
    return out


def _without_remedies(refusal: str | None, gone) -> str | None:
    """``refusal`` less each blocked target's ``SPEC: to serve it: REMEDY`` part."""
    if not refusal:
        return refusal
    for o in gone:
        refusal = refusal.replace(f"{o.spec}: to serve it: {o.remedy}", "")
    parts = [p.strip() for p in refusal.split("; ") if p.strip()]
    return "; ".join(parts) or None


def target_lines(sites: list[dict], targets: dict[str, dict]) -> list[str]:
    """One line per --target that loads the model: its worst verdict over the sites, the
    counts, and the first reason for that verdict (what the engine says when it refuses)."""
    lines = []
    for spec, t in targets.items():
        worst = t["verdict"]
        why = next((c.get("why") or c.get("cannot_pad") for s in sites
                    for c in s.get("targets") or [] if c["target"] == spec
                    and c["verdict"] == worst and (c.get("why") or c.get("cannot_pad"))), None)
        what = {"refused": "the engine refuses to load the model",
                "fallback": "some layers run a slower kernel",
                "fast": "every layer runs a fast kernel"}.get(worst, worst)
        counts = f"{t.get('fast', 0)} fast, {t.get('fallback', 0)} fallback, " \
                 f"{t.get('refused', 0)} refused sites"
        lines.append(f"{spec}: {worst.upper()}: {what} ({counts})" + (f": {why}" if why else ""))
    return lines


def verdict_lines(check: dict, sites: list[dict]) -> list[str]:
    """The verdict's per-target lines, model level first: each target that does not load the
    model and what would serve it, then each one that does, by its worst site. ``sites`` are
    :func:`own_sites` (read once by the caller)."""
    gone = blocked(check)
    targets = check["summary"].get("targets") or {}
    shared: dict[tuple, list[str]] = {}  # several targets refused for one reason: one line
    for o in gone.values():
        shared.setdefault((o.why, o.remedy), []).append(o.spec)
    return [outcome_line(Outcome(" and ".join(specs), False, why, remedy))
            for (why, remedy), specs in shared.items()] + target_lines(
        sites, {k: t for k, t in targets.items() if k not in gone})


def sites_line(check: dict, misaligned: int) -> str:
    """The verdict's count of the sites misaligned by their own rules (``misaligned``, from
    :func:`own_sites`), and what padding them costs, where any is."""
    gone = blocked(check)
    loading = [k for k in check["summary"].get("targets") or {} if k not in gone]
    line = f"sites: {misaligned} of {check['summary']['sites']} misaligned"
    if gone:
        line += " by their own rules (the hardware's" + (
            " and the loading targets'" if loading else "") + ")"
    if misaligned:
        line += (f"; zero-padding repair adds "
                 f"{check['summary']['repair_overhead_fraction'] * 100:.2f}% parameters")
    return line


def outcome_line(o: Outcome) -> str:
    """The verdict's first line for a target that does not load the model: why, and the one
    action that would make it servable."""
    return f"{o.spec}: DOES NOT LOAD the model: {o.why}. To serve it: {o.remedy}."
