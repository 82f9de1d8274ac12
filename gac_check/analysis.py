"""The check stage end to end: directory -> checkpoint -> format -> sites -> findings.

Every front end (CLI, pytest plugin, report) starts from a :class:`CheckResult`, so they can
never disagree about what was checked against what.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from gac_check.checkpoint.index import Checkpoint, open_checkpoint
from gac_check.contract.dtype_choice import DtypeChoice, choose_dtype
from gac_check.contract.rules import Contract, Finding
from gac_check.contract.select import assemble
from gac_check.formats import Format, detect
from gac_check.formats.architectures import find_family
from gac_check.padding.plan import RepairPlan, plan
from gac_check.sites import DimSite

if TYPE_CHECKING:
    from gac_check.targets.spec import Target


@dataclass
class CheckResult:
    """What was checked (model, format, profile, dtype) and what was found."""

    checkpoint: Checkpoint
    format: Format
    contract: Contract
    sites: list[DimSite]
    findings: list[Finding]
    #: how the contract's dtype was chosen (config.json, weights, --dtype) and any disagreement
    dtype_choice: DtypeChoice | None = None

    @cached_property
    def family(self) -> str | None:
        """The architecture family the layers belong to (``llama``, ``opt``, ...), or None."""
        found = find_family(self.checkpoint)
        return found[0].name if found else None

    @property
    def by_site(self) -> dict[str, Finding]:
        return {f.site.name: f for f in self.findings}

    def padding_params(self, finding: Finding, target: int | None = None) -> int:
        """Parameters that zero-padding this finding's site to ``target`` adds."""
        to = finding.repair_to if target is None else target
        return (to - finding.site.value) * finding.site.params_per_unit(self.checkpoint.shapes)

    @cached_property
    def repair_plan(self) -> RepairPlan:
        """The minimal repair, planned exactly as ``--repair`` would carry it out."""
        return plan(self.sites, self.contract, "minimal", shapes=self.checkpoint.shapes,
                    config=self.checkpoint.config)

    @property
    def refusals(self) -> dict[str, str]:
        """Why each refused site cannot be zero-padded exactly, by site name; a site no
        padding makes fast on a target says so, and what would help instead."""
        out = {r.site.name: r.reason for r in self.repair_plan.refused}
        if self.contract.targets is not None:
            for site in self.sites:
                if site.name in out:
                    continue
                why = [f"{v.target.spec}: {v.cannot_pad}" for v in self.contract.targets.of(site)
                       if v.cannot_pad and v.fix_to is None]
                if why:
                    out[site.name] = "; ".join(why)
        return out

    @property
    def targets(self) -> tuple[Target, ...]:
        return self.contract.targets.targets if self.contract.targets else ()

    @property
    def repair_overhead_fraction(self) -> float:
        return self.repair_plan.overhead_fraction


def check(model_dir: Path | str | Checkpoint, gpu: str = "auto", dtype: str | None = None,
          targets: Sequence[Target | str] = ()) -> CheckResult:
    """Check a directory against ``gpu``'s contract for ``dtype`` (default: the model's own)
    and, per deployment target (``vllm,tp=4,quant=awq``), the engine's kernel choices.

    An already indexed checkpoint is checked as it is: that is how a Hub model, indexed from
    its headers by :func:`gac_check.checkpoint.remote.open_remote`, goes through the same
    stages as a directory.
    """
    ckpt = model_dir if isinstance(model_dir, Checkpoint) else open_checkpoint(model_dir)
    fmt = detect(ckpt)
    sites = fmt.sites(ckpt)
    choice = choose_dtype(ckpt, dtype)
    contract = assemble(gpu, choice.dtype, targets, sites)
    return CheckResult(ckpt, fmt, contract, sites, contract.check(sites), choice)
