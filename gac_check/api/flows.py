"""The three flows every front end runs: check; repair (check, plan, write, re-check OUT);
realign (check, re-select ranks, write, re-check OUT).

The CLI, the pytest plugin's fixtures and :mod:`gac_check.testing` call these functions and
only render what they return, so a flow does its work, every check included, exactly once:
OUT is re-checked in its temporary directory before it appears, and that one re-check is the
``remaining`` of the ``gac-*.json`` record, the printed summary, ``--report`` and ``--junit``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from gac_check import analysis
from gac_check.analysis import CheckResult
from gac_check.api.sources import checkpoint_of, is_remote_checkpoint, local_dir
from gac_check.checkpoint.index import Checkpoint
from gac_check.contract.dtype_choice import dtype_name
from gac_check.contract.rules import Finding
from gac_check.errors import BadInput
from gac_check.padding.plan import STRATEGIES
from gac_check.profiles import profile_name
from gac_check.sites import Role

if TYPE_CHECKING:  # a check imports neither writer, nor targets unless it names one
    from gac_check.targets.spec import Target

    Targets = str | Target | Sequence[str | Target]
    from gac_check.padding.write import RepairReport
    from gac_check.ranks.factors import RealignReport

Report = TypeVar("Report")


def check(model: object, gpu: str = "auto", dtype: str | None = None, target: Targets = (),
          *, config: object = None) -> CheckResult:
    """Check ``model`` against ``gpu``'s contract for ``dtype`` (default: the model's own)
    and, per deployment target (``"vllm,tp=4,quant=awq"``, one or a list), the engine's kernels.

    ``model`` is a model directory, a Hub model (``hf://ORG/NAME[@REVISION]``, headers only),
    a ``torch.nn.Module`` (its ``.config``, or ``config=``), a state dict with ``config=`` (a
    dict or a transformers config), or an already indexed checkpoint. ``gpu`` and ``dtype`` are
    taken in any case and in the usual short spellings (``"H100"``, ``"fp16"``,
    ``torch.float16``) and checked against their canonical names; an unknown one is BadInput.
    """
    gpu, dtype = _names(gpu, dtype)
    ckpt = checkpoint_of(model, config)
    targets = (target,) if isinstance(target, str) or not isinstance(target, Sequence) \
        else tuple(target)
    try:
        return analysis.check(ckpt, gpu, dtype, targets)
    except BadInput as exc:
        if not is_remote_checkpoint(ckpt):
            raise
        from gac_check.checkpoint.hub.remote import renamed

        raise renamed(exc, ckpt) from None


def _names(gpu: str, dtype: object) -> tuple[str, str | None]:
    """``gpu`` and ``dtype`` as the CLI spells them, or BadInput before any work."""
    return profile_name(gpu), None if dtype is None else dtype_name(dtype)


@dataclass
class FixResult(Generic[Report]):
    """What a fix did: the input's check it was planned from, what it wrote (``report``:
    a :class:`RepairReport` or :class:`RealignReport`, what the CLI prints), and the re-check
    of OUT, made once before OUT appeared."""

    before: CheckResult
    report: Report
    after: CheckResult

    @property
    def remaining(self) -> list[Finding]:
        """What OUT still violates (refused sites stay misaligned): what a gate judges."""
        return self.after.findings


def repair(model_dir: Path | str, out: Path | str, gpu: str = "auto",
           strategy: str = "minimal", dtype: str | None = None, force: bool = False,
           target: Targets = (), *, uniform: bool = False,
           progress: bool = True) -> FixResult[RepairReport]:
    """Check ``model_dir`` against ``gpu``'s contract and write its exact zero-padded repair
    to ``out``, then re-check ``out``.

    Refuses exactly what the checker refuses (BadInput before anything is written), and an
    existing ``out`` unless ``force``. With ``target``, each site is padded to the smallest
    size that is also fast on every target, where zero padding is exact, and a repair that a
    target would still refuse is refused before anything is written; ``uniform`` pads every
    layer's MLP, and every routed expert of every layer, to the widest, so a target that
    reads one width (a fused-MoE layer: one for all its experts) loads OUT.
    """
    from gac_check.api.repair_targets import plan_for_targets, uniform_note
    from gac_check.padding.support import gguf_instead, unsupported
    from gac_check.padding.write import apply

    if strategy not in STRATEGIES:
        raise BadInput(f"--strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    gpu, dtype = _names(gpu, dtype)
    before = check(local_dir(model_dir, "--repair"), gpu, dtype, target)
    ckpt = before.checkpoint
    if ckpt.quantization is not None:
        raise BadInput(ckpt.quantization.refuse_padding("--repair"), ckpt.path)
    why = (gguf_instead(before.gguf.ftype) if before.gguf is not None
           else _ssm_refusal(before, STRATEGIES[strategy])
           or _with_inexact(before, unsupported(before.format.name, before.family,
                                                ckpt.config.get("model_type"))))
    if why:
        raise BadInput(why, ckpt.path)
    from gac_check.checkpoint.outdir import check_output_dir  # a fix only

    check_output_dir(Path(out), force, ckpt.path)
    targeted = plan_for_targets(before, strategy, uniform)
    choice = before.dtype_choice
    notes = [choice.note] if choice and choice.note else []
    if targeted.widths:
        notes.append(uniform_note(before, targeted.widths))
    recheck = Recheck(gpu, before)
    report = apply(targeted.plan, ckpt, out, force=force, recheck=recheck,
                   extra_notes=notes, show_progress=progress)
    return FixResult(before, report, recheck.moved_to(report.out))


def _with_inexact(before: CheckResult, why: str | None) -> str | None:
    """An unproven family's refusal, and what its misaligned widths could not be anyway:
    the first one zero padding cannot make exact (BitNet's ``ffn_sub_norm`` over its MLP
    width), so a user knows a proof would not bring the repair either."""
    refused = before.repair_plan.refused if why else []
    if not refused:
        return why
    first = refused[0]
    return f"{why}; and {first.site.name} = {first.site.value} could not be padded exactly " \
           f"anyway: {first.reason}"


def _ssm_refusal(before: CheckResult, severities: tuple[str, ...]) -> str | None:
    """Repairing an SSM mixer's widths is out of scope: the first one the strategy would pad,
    named. A minimal repair pads errors only, so an SSM width with a warning alone (Zamba2's
    fused in_proj at 392) is left as every other warning is, and the MLP beside it repaired."""
    ssm = (Role.SSM, Role.SSM_CONV, Role.SSM_STATE)
    site = next((f.site for f in before.findings
                 if f.site.role in ssm and f.severity in severities), None)
    return f"--repair: {site.name} = {site.value} is {site.inexact}" if site else None


def realign(model_dir: Path | str, out: Path | str, base: Path | str | None = None,
            gpu: str = "auto", dtype: str | None = None, budget: str = "same",
            strategy: str = "minimal", force: bool = False, calib: Path | str | None = None,
            target: Targets = (), *, progress: bool = True) -> FixResult[RealignReport]:
    """Re-select aligned ranks of an ASVD-layout, SVD-LLM or PaLU model under the same
    parameter budget (or ``budget``, a fraction of the dense matrices), write it to ``out`` in
    its own layout and re-check ``out``. SVD-LLM's ranks are re-truncated from its whitened
    factors (:mod:`gac_check.ranks.whitened`), PaLU's group latents from each group's own
    factors in the basis PaLU built them in (:mod:`gac_check.ranks.grouped`), so neither
    takes a ``base``.

    ``base`` is the dense original, so any aligned rank can be chosen; without it ranks only
    go down within the existing factors. With ``target``, a rank is chosen only where every
    target runs it fast (else the matrix is stored dense). Other formats are refused with what
    to run instead, and everything the headers can refuse is refused before any SVD.
    """
    from gac_check.api.refusals import require_feasible, require_loadable, require_realignable
    from gac_check.ranks.candidates import rank_menus

    gpu, dtype = _names(gpu, dtype)
    realign_usage(budget, base, calib)
    model_dir = local_dir(model_dir, "--realign")
    base_dir = Path(base) if base is not None else None
    from gac_check.checkpoint.outdir import check_output_dir

    check_output_dir(Path(out), force, model_dir, *([base_dir] if base_dir else []))
    before = check(model_dir, gpu, dtype, target)
    if before.checkpoint.quantization is not None:
        raise BadInput(before.checkpoint.quantization.refuse_padding("--realign"),
                       before.checkpoint.path)
    require_realignable(before)
    require_loadable(before)
    from gac_check.ranks.factors import rank_alignment  # torch: only once a realign is due
    from gac_check.ranks.factors import realign as write_realigned

    align = rank_alignment(before.contract, strategy)
    whitened = before.format.name == "svd-llm"
    grouped = before.format.name == "palu"
    if grouped:
        from gac_check.ranks.grouped import group_menus, realign_palu
        from gac_check.ranks.grouped import require_rewritable as require_palu

        require_palu(before.checkpoint, before.family, before.sites, base_dir,
                     Path(calib) if calib is not None else None)
        menus = group_menus(before.sites, before.checkpoint.shapes, before.contract, align)
    else:
        menus = rank_menus(before.sites, before.checkpoint.shapes, before.contract, align,
                           base_dir is not None and not whitened, pad_up=whitened)
    if whitened:
        from gac_check.ranks.whitened import factor_menus, realign_svdllm, require_rewritable

        require_rewritable(before.checkpoint, before.family, base_dir,
                           Path(calib) if calib is not None else None)
        menus = factor_menus(menus)
    require_feasible(before, budget, menus)
    recheck = Recheck(gpu, before)
    if grouped:
        report = realign_palu(before.checkpoint, menus, Path(out), align, budget, force,
                              recheck=recheck, base_dir=base_dir,
                              calib=Path(calib) if calib is not None else None,
                              progress=progress)
    elif whitened:
        report = realign_svdllm(before.checkpoint, menus, Path(out), align, budget, force,
                                recheck=recheck, base_dir=base_dir,
                              calib=Path(calib) if calib is not None else None,
                              progress=progress)
    else:
        report = write_realigned(before.checkpoint, menus, Path(out), align, base_dir, budget,
                                 force, Path(calib) if calib is not None else None, progress,
                                 recheck=recheck)
    if before.dtype_choice and before.dtype_choice.note:
        report.notes.insert(0, before.dtype_choice.note)
    return FixResult(before, report, recheck.moved_to(report.out))


def realign_usage(budget: str, base: Path | str | None, calib: Path | str | None) -> None:
    """Refuse what the options alone make impossible, before torch is imported (seconds of
    CPU that a typo should not cost): a ``budget`` that is no fraction, ``calib`` without
    ``base``."""
    from gac_check.ranks.knapsack import budget_fraction

    budget_fraction(budget)
    if calib is not None and base is None:
        raise BadInput("--calib needs --base: activations come from the dense model")


class Recheck:
    """The re-check of a fix's output, run by the writer in OUT's temporary directory (so
    OUT's provenance record holds what remains) against the input's profile, dtype and
    targets; kept, so nothing has to check OUT again."""

    def __init__(self, gpu: str, before: CheckResult) -> None:
        self.gpu, self.dtype, self.targets = gpu, before.contract.dtype, before.targets
        self.result: CheckResult | None = None

    def __call__(self, tmp: Path) -> list[Finding]:
        self.result = analysis.check(tmp, self.gpu, self.dtype, self.targets)
        return self.result.findings

    def moved_to(self, out: Path) -> CheckResult:
        """The re-check, its checkpoint renamed to where the temporary directory went."""
        result = self.result
        assert result is not None, "the writer calls its recheck before OUT appears"
        return dataclasses.replace(result, checkpoint=_moved(result.checkpoint,
                                                             Path(out).resolve()))


def _moved(ckpt: Checkpoint, to: Path) -> Checkpoint:
    """``ckpt`` with its directory and every file in it renamed to ``to``."""
    def move(path: Path) -> Path:
        return to / path.relative_to(ckpt.path)

    tensors = {n: dataclasses.replace(t, file=move(t.file)) for n, t in ckpt.tensors.items()}
    return dataclasses.replace(ckpt, path=to, tensors=tensors,
                               files=[move(f) for f in ckpt.files])
