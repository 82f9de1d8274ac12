"""``gac-check MODEL_DIR --realign OUT``: re-select aligned ranks, then re-check OUT."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from gac_check.analysis import CheckResult, check
from gac_check.checkpoint.outdir import check_output_dir
from gac_check.cli.exits import exit_code
from gac_check.cli.fixing import plan_fix_outputs, write_fix_outputs
from gac_check.errors import BadInput
from gac_check.realign.factors import RealignReport, rank_alignment, realign
from gac_check.realign.knapsack import budget_fraction
from gac_check.report.realign import render_realign
from gac_check.sites import Role


def run_realign(args: argparse.Namespace) -> int:
    """Realign, then gate on the re-check of OUT (like --repair), which ``--report`` and
    ``--junit`` describe."""
    outputs = plan_fix_outputs(args, args.realign)
    before, report = realign_checked(args.model_dir, args.realign, args.base, args.gpu,
                                     args.dtype, args.budget, args.strategy, args.force,
                                     args.calib, progress=args.output != "json")
    if before.dtype_choice and before.dtype_choice.note:
        report.notes.insert(0, before.dtype_choice.note)
    print(json.dumps(report.to_json(), indent=2) if args.output == "json"
          else render_realign(report))
    write_fix_outputs(outputs, "realign", before, args.realign, args.gpu,
                      before.contract.dtype, args.fail_on)
    return exit_code(report.remaining, args.fail_on)


#: What to run instead of --realign, per format it cannot rewrite.
INSTEAD = {
    "palu": "run --repair OUT instead: it pads each group latent r_g exactly, in PaLU's own "
            "layout (VT/U, head_wise_ranks), loadable with PaLU's from_pretrained; or re-run "
            "PaLU's compress.py so that every r_g is a multiple of {align}",
    "svd-llm": "run --repair OUT instead: it pads every rank exactly, in SVD-LLM's own layout "
               "(a pickled {{'model', 'tokenizer'}} stays one, u/v factors padded), loadable "
               "with torch.load as SVD-LLM's users do; or re-run SVDLLM.py with ratios whose "
               "ranks are multiples of {align}",
}


def not_realignable(fmt: str, align: int, misaligned_ranks: int) -> str:
    """Why --realign refuses a format, and the command that fixes it instead (or, when every
    rank is already a multiple of ``align``, that there is nothing to re-select)."""
    head = (f"is in {fmt} format; --realign re-selects ranks only in the ASVD layout "
            "(BLinear/ALinear + truncation_ranks)")
    if fmt in INSTEAD and not misaligned_ranks:
        return (f"{head}; its ranks are already multiples of {align}, so there is nothing to "
                "re-select (run without --realign to see what else the check finds)")
    advice = INSTEAD.get(fmt, "it has no low-rank factors to re-select; run --repair OUT to "
                         "zero-pad its misaligned sizes exactly in its own layout")
    return f"{head}; {advice.format(align=align)}"


def realign_dir(model_dir: Path, out: Path, base_dir: Path | None = None, gpu: str = "auto",
                dtype: str | None = None, budget: str = "same", strategy: str = "minimal",
                force: bool = False, calib: Path | None = None, progress: bool = True
                ) -> RealignReport:
    """Check ``model_dir`` and write its realigned model to ``out`` (ASVD layout only; other
    formats are refused with what to run instead, before anything is written)."""
    return realign_checked(model_dir, out, base_dir, gpu, dtype, budget, strategy, force,
                           calib, progress)[1]


def realign_checked(model_dir: Path, out: Path, base_dir: Path | None = None,
                    gpu: str = "auto", dtype: str | None = None, budget: str = "same",
                    strategy: str = "minimal", force: bool = False, calib: Path | None = None,
                    progress: bool = True) -> tuple[CheckResult, RealignReport]:
    """:func:`realign_dir`, also returning the check of the input; each check runs once, and
    everything the headers can refuse is refused before any SVD."""
    inputs = [Path(model_dir)] + ([Path(base_dir)] if base_dir else [])
    check_output_dir(Path(out), force, *inputs)
    result = check(model_dir, gpu, dtype)
    align = rank_alignment(result.contract, strategy)
    if result.format.name != "asvd":
        ranks = [s for s in result.sites if s.role in (Role.RANK, Role.KV_LATENT)
                 and s.value % align]
        raise BadInput(not_realignable(result.format.name, align, len(ranks)),
                       result.checkpoint.path)
    require_feasible(result, budget, align)
    report = realign(result.checkpoint, result.sites, result.contract, Path(out), base_dir,
                     budget, strategy, force, calib, progress,
                     recheck=lambda tmp: check(tmp, gpu, result.contract.dtype).findings)
    return result, report


def require_feasible(result: CheckResult, budget: str, align: int) -> None:
    """Refuse, from the headers alone, what would otherwise fail after minutes of SVDs: a
    budget that is no fraction in (0, 1], or one no aligned choice fits."""
    fraction = budget_fraction(budget)
    shapes = result.checkpoint.shapes
    sizes = []  # (rows, columns, rank) of each factorised matrix
    for site in result.sites:
        if site.role is Role.RANK:
            b, a = (ax.tensor for ax in site.axes)  # B [r, in] then A [out, r]
            sizes.append((shapes[a][0], shapes[b][1], site.value))
    dense = sum(m * n for m, n, _ in sizes)
    spend = (sum(r * (m + n) for m, n, r in sizes) if fraction is None
             else math.floor(fraction * dense))
    least = sum(min(align * (m + n), m * n) for m, n, _ in sizes)
    if dense and spend < least:
        raise BadInput(f"--budget {budget} allows {spend:,} parameters, fewer than the "
                       f"cheapest aligned choice ({least:,}: rank {align} or dense for every "
                       f"matrix); the smallest feasible budget is "
                       f"{math.ceil(1000 * least / dense) / 1000:g}")
