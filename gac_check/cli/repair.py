"""``gac-check MODEL_DIR --repair OUT``: check, plan, write, then re-check OUT."""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from gac_check.analysis import CheckResult, check
from gac_check.checkpoint.outdir import check_output_dir
from gac_check.cli.exits import exit_code
from gac_check.cli.fixing import plan_fix_outputs, write_fix_outputs
from gac_check.errors import BadInput
from gac_check.repair.plan import STRATEGIES, plan
from gac_check.repair.support import unsupported
from gac_check.repair.write import RepairReport, apply
from gac_check.report.repair import render_repair
from gac_check.targets.spec import Target


def run_repair(args: argparse.Namespace) -> int:
    """Repair, then gate on what the re-check of OUT still finds (refused sites remain);
    ``--report``/``--junit`` describe that re-check, with what each site was before."""
    outputs = plan_fix_outputs(args, args.repair)
    before, report = repair_checked(args.model_dir, args.repair, args.gpu, args.strategy,
                                    args.dtype, args.force, args.targets,
                                    show_progress=args.output != "json")
    print(json.dumps(report.to_json(), indent=2) if args.output == "json"
          else render_repair(report))
    write_fix_outputs(outputs, "repair", before, report.out, args.gpu,
                      before.contract.dtype, args.fail_on, args.targets)
    return exit_code(report.remaining, args.fail_on)


def repair_dir(model_dir: Path | str, out: Path | str, gpu: str = "auto",
               strategy: str = "minimal", dtype: str | None = None,
               force: bool = False, targets: Sequence[Target | str] = ()) -> RepairReport:
    """Check ``model_dir`` against ``gpu``'s contract and write its exact repair to ``out``.

    Refuses exactly what the checker refuses (BadInput before anything is written), and an
    existing ``out`` unless ``force``. With ``targets``, each site is padded to the smallest
    size that is also fast on every target, where zero padding is exact.
    """
    return repair_checked(model_dir, out, gpu, strategy, dtype, force, targets)[1]


def repair_checked(model_dir: Path | str, out: Path | str, gpu: str = "auto",
                   strategy: str = "minimal", dtype: str | None = None,
                   force: bool = False, targets: Sequence[Target | str] = (),
                   show_progress: bool = True
                   ) -> tuple[CheckResult, RepairReport]:
    """:func:`repair_dir`, also returning the check of the input the repair was planned from.

    OUT is re-checked before it appears, so its ``gac-repair.json`` records what remains.
    """
    if strategy not in STRATEGIES:
        raise BadInput(f"--strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    result = check(model_dir, gpu, dtype, targets)
    ckpt = result.checkpoint
    why = unsupported(result.format.name, result.family)
    if why:
        raise BadInput(why, ckpt.path)
    check_output_dir(Path(out), force, ckpt.path)
    repair_plan = plan(result.sites, result.contract, strategy, shapes=ckpt.shapes,
                       config=ckpt.config)
    choice = result.dtype_choice
    report = apply(repair_plan, ckpt, out, force=force,
                   recheck=lambda tmp: check(tmp, gpu, result.contract.dtype,
                                             result.targets).findings,
                   extra_notes=[choice.note] if choice and choice.note else [],
                   show_progress=show_progress)
    return result, report
