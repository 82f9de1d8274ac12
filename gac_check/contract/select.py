"""Which contract a check uses: measured rules where a stored sweep exists, else published ones,
and the evidence its expected slowdowns are read from.

Kept apart from :mod:`gac_check.contract.rules` so the published rules need nothing from the
measuring side, and the measured rules can build on the published ones without a circle.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gac_check.contract.evidence import evidence_for
from gac_check.contract.measured import measured_rules
from gac_check.contract.rules import Contract, cpu_rules, gpu_rules
from gac_check.profiles import resolve_profile
from gac_check.sites import DimSite

if TYPE_CHECKING:  # targets are imported only where a check names one
    from gac_check.targets.loadability import ModelKind
    from gac_check.targets.spec import Target


def assemble(gpu: str, dtype: str, targets: Sequence[Target | str] = (),
             sites: Sequence[DimSite] = (), kind: ModelKind | None = None) -> Contract:
    """Everything findings are judged against, in one place, top to bottom: the hardware
    profile ``--gpu`` names (``auto`` resolved once, here), its rules for ``dtype`` (measured
    where a sweep exists), and each deployment target's verdicts on the model's ``sites``
    (first whether its engine builds a model of this ``kind`` at all)."""
    profile = resolve_profile(gpu)
    contract = for_hardware(profile, dtype)
    if targets:
        from gac_check.targets.spec import Target, parse_target
        from gac_check.targets.verdicts import judge_all

        parsed = tuple(t if isinstance(t, Target) else parse_target(t) for t in targets)
        contract.targets = judge_all(list(sites), parsed, profile, dtype, kind)
    return contract


def for_hardware(profile: str, dtype: str) -> Contract:
    """The contract for a profile: measured where a sweep exists, else published rules.

    A measured sweep (baselines/<profile>.json; for "cpu" the present CPU's file) replaces the
    published rules of the roles it covers; hard limits (head_dim <= 256) always stay, and roles
    the sweep does not cover keep their published rules. Published rules carry the rescue the
    profile's published sweeps show (none for a dtype class no sweep was made in).
    """
    evidence = evidence_for(profile)
    rules = cpu_rules(dtype) if profile == "cpu" else gpu_rules(dtype, profile)
    rules = [evidence.rule_figure(r, dtype) for r in rules]
    measured = measured_rules(profile, dtype)
    if measured is None:
        return Contract(profile, dtype, rules, evidence=evidence)
    derived, covered = measured
    kept = [r for r in rules if r.max_value is not None or not r.roles & covered]
    return Contract(profile, dtype, kept + derived, source="measured", evidence=evidence)
