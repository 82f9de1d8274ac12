"""The check stage end to end: directory -> checkpoint -> format -> sites -> findings.

Every front end (CLI, pytest plugin, report) starts from a :class:`CheckResult`, so they can
never disagree about what was checked against what.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from gac_check.checkpoint.index import Checkpoint, open_checkpoint
from gac_check.contract.dtype_choice import DtypeChoice, choose_dtype
from gac_check.contract.rules import ERROR, WARNING, Contract, Finding, fails
from gac_check.contract.select import assemble
from gac_check.formats import Format
from gac_check.formats.accounting import Accounting
from gac_check.formats.architectures import find_family
from gac_check.formats.gpt_oss import fused_family
from gac_check.formats.moe import moe_family
from gac_check.formats.reading import read_sites
from gac_check.padding.plan import RepairPlan, plan
from gac_check.sites import DimSite

if TYPE_CHECKING:  # targets are imported only where a check names one (or reads a GGUF)
    from gac_check.targets.gguf_file import GgufTypes
    from gac_check.targets.loadability import ModelKind
    from gac_check.targets.spec import Target

_LAYER = re.compile(r"(?<=\.)\d+(?=\.)")
#: an expert's index in its site's name (``...experts.3:intermediate``): folded like layers
_EXPERT = re.compile(r"(?<=\.experts\.)\d+(?=:)")


@dataclass
class FindingGroup:
    """Findings that differ only by their layer: one row of the CLI's table ("layers 0-31")."""

    pattern: str  # the site's name with its layer number as ``*``
    first: Finding
    findings: list[Finding] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    pad: int = 0  # parameters zero padding adds over the group (refused sites: none)


@dataclass(frozen=True)
class Summary:
    """What a gate reads without filtering severity strings: the verdict at ``fail_on`` (what
    the CLI's exit code says), the counts, each target's model-level verdict, and ``line``,
    the CLI's summary line."""

    verdict: str  # "pass" | "fail"
    fail_on: str
    sites: int
    misaligned: int
    errors: int
    warnings: int
    refused: int  # sites --repair leaves as they are
    repair_overhead_fraction: float
    targets: dict[str, str]  # spec -> "fast" | "fallback" | "refused"
    line: str

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


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
    #: a GGUF file's stored tensor types against its ftype's mix (None for other containers)
    gguf: GgufTypes | None = None
    #: where every tensor went (a site, auxiliary, a kind with no dimension): none unread
    accounting: Accounting | None = None

    @cached_property
    def family(self) -> str | None:
        """The architecture family the layers belong to (``llama``, ``opt``, ...), or None."""
        # an MoE layer's attention alone looks like Llama
        moe = moe_family(self.checkpoint) or fused_family(self.checkpoint)
        found = None if moe else find_family(self.checkpoint)
        return moe or (found[0].name if found else None)

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
        ckpt = self.checkpoint
        shapes = {n: s for n, s in ckpt.shapes.items() if n not in ckpt.auxiliary}
        return plan(self.sites, self.contract, "minimal", shapes=shapes, config=ckpt.config)

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

    def verdict(self, fail_on: str = ERROR) -> str:
        """``"fail"`` when a finding is at or above ``fail_on`` (``error``, ``warning``,
        ``never``), as the CLI's exit 1; else ``"pass"``."""
        return "fail" if fails(self.findings, fail_on) else "pass"

    def _blocked_rules(self) -> set[str]:
        """The rule ids that say only that a target does not load the model."""
        verdicts = self.contract.targets
        return {f"target:{spec}" for spec, load in verdicts.loads.items() if not load.loads} \
            if verdicts else set()

    def summary(self, fail_on: str = ERROR) -> Summary:
        """The counts and the CLI's line. A rule that says only that a target does not load
        the model is not the site's misalignment: the line counts the sites misaligned by
        their own rules, as the CLI's verdict does (report/deployment.py ``own_sites``)."""
        errors = sum(f.severity == ERROR for f in self.findings)
        warnings = sum(f.severity == WARNING for f in self.findings)
        verdicts = self.contract.targets
        gone = self._blocked_rules()
        own = [[r for r in f.rules if r.id not in gone] for f in self.findings]
        own = [rules for rules in own if rules]
        own_errors = sum(any(r.severity == ERROR for r in rules) for rules in own)
        head = (f"{len(own)} of {len(self.sites)} sites misaligned"
                + (" by their own rules" if gone else "")
                + f" ({own_errors} errors, {len(own) - own_errors} warnings)")
        if self.gguf is not None:  # --repair refuses a GGUF: fix the HF model
            line = head + "; pad the Hugging Face model (--repair), then convert and quantize again"
        elif own:
            line = head + (f"; zero-padding repair (--repair) adds "
                           f"{self.repair_overhead_fraction:.2%} parameters")
        else:
            line = head
        return Summary(self.verdict(fail_on), fail_on, len(self.sites), len(self.findings),
                       errors, warnings, len(self.refusals), self.repair_overhead_fraction,
                       {spec: s["verdict"] for spec, s in verdicts.summary().items()}
                       if verdicts else {}, line)

    @cached_property
    def groups(self) -> list[FindingGroup]:
        """The findings folded as the CLI's table folds them: one group per site pattern,
        value, fix, rules and target verdicts, with the layers it holds (``findings`` keeps
        one per site, as the JSON output does)."""
        refusals = self.refusals
        verdicts = self.contract.targets
        out: dict[tuple, FindingGroup] = {}
        for f in self.findings:
            site = f.site
            pattern = _LAYER.sub("*", site.name, count=1) if site.layer is not None else site.name
            pattern = _EXPERT.sub("*", pattern)  # 64 experts of one width: one row
            cells = tuple(v.short for v in verdicts.of(site)) if verdicts else ()
            key = (pattern, site.value, f.repair_to, tuple(r.id for r in f.rules), cells)
            group = out.setdefault(key, FindingGroup(pattern, f))
            group.findings.append(f)
            if site.layer is not None:
                group.layers.append(site.layer)
            if site.name not in refusals:
                group.pad += self.padding_params(f)
        return list(out.values())


def check(model_dir: Path | str | Checkpoint, gpu: str = "auto", dtype: str | None = None,
          targets: Sequence[Target | str] = ()) -> CheckResult:
    """Check a directory against ``gpu``'s contract for ``dtype`` (default: the model's own)
    and, per deployment target (``vllm,tp=4,quant=awq``), the engine's kernel choices.

    An already indexed checkpoint is checked as it is: that is how a Hub model, indexed from
    its headers by :func:`gac_check.checkpoint.hub.remote.open_remote`, goes through the same
    stages as a directory.
    """
    ckpt = model_dir if isinstance(model_dir, Checkpoint) else open_checkpoint(model_dir)
    fmt, sites, accounting = read_sites(ckpt)
    if ckpt.gguf is not None:
        return _check_gguf(ckpt, fmt, sites, gpu, dtype, targets, accounting)
    choice = choose_dtype(ckpt, dtype)
    contract = assemble(gpu, choice.dtype, _deployed(targets, ckpt), sites,
                        model_kind(ckpt, fmt, sites) if targets else None)
    return CheckResult(ckpt, fmt, contract, sites, contract.check(sites), choice,
                       accounting=accounting)


#: What a GGUF file's sites are judged in on a GPU without --dtype.
GGUF_DTYPE = DtypeChoice(
    "float16", "gguf", "llama.cpp's CUDA matmuls on GGUF types run in float16 (dequantized "
    "for cuBLAS) or int8 (MMQ); judged as float16 (pass --dtype to choose)")


def _check_gguf(ckpt: Checkpoint, fmt: Format, sites: list[DimSite], gpu: str,
                dtype: str | None, targets: Sequence[Target | str],
                accounting: Accounting) -> CheckResult:
    """A GGUF file is judged on llama.cpp at its own ftype (added when not given), and each
    of its tensors' stored types against that ftype's mix."""
    assert ckpt.gguf is not None
    from gac_check.targets.gguf_file import file_target, file_types

    judged = file_target(ckpt.gguf, tuple(targets))
    choice = DtypeChoice(dtype, "--dtype") if dtype else GGUF_DTYPE
    contract = assemble(gpu, choice.dtype, judged, sites, model_kind(ckpt, fmt, sites))
    types = file_types(ckpt.gguf, judged[0])
    return CheckResult(ckpt, fmt, contract, sites, contract.check(sites), choice, types,
                       accounting)


def _deployed(targets: Sequence[Target | str], ckpt: Checkpoint) -> list[Target]:
    """Each target as the checkpoint is served: a quantized one in its own scheme."""
    if not targets:
        return []
    from gac_check.targets.quantized import for_checkpoint
    from gac_check.targets.spec import Target, parse_target

    return [for_checkpoint(t if isinstance(t, Target) else parse_target(t), ckpt.quantization)
            for t in targets]


def model_kind(ckpt: Checkpoint, fmt: Format,
               sites: Sequence[DimSite] | None = None) -> ModelKind:
    """What a deployment target needs to know beyond the widths: the compressor's layout,
    config.json's architectures, whether the weights are a pickled whole model, and, given
    the sites, the config.json values the tensors contradict (a repair records the tensors'
    head_dim, so the model it writes is judged without them)."""
    from gac_check.formats.declared import unrecorded_head_dim
    from gac_check.targets.loadability import ModelKind

    archs = ckpt.config.get("architectures")
    archs = tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()
    conflict = unrecorded_head_dim(ckpt.config, sites) if sites is not None else None
    return ModelKind(fmt.name, archs, ckpt.pickled_model is not None, fmt.blocks(ckpt),
                     (conflict.describe(),) if conflict else (), fmt.per_layer(ckpt))
