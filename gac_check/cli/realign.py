"""``gac-check MODEL_DIR --realign OUT``: run the realign flow, print it, write its reports."""
from __future__ import annotations

import argparse
import json

from gac_check.api.flows import realign, realign_usage
from gac_check.cli.exits import exit_code
from gac_check.cli.fixing import plan_fix_outputs, write_fix_outputs
from gac_check.threads import set_torch_threads


def run_realign(args: argparse.Namespace) -> int:
    """Realign, then gate on the re-check of OUT (like --repair), which ``--report`` and
    ``--junit`` describe."""
    realign_usage(args.budget, args.base, args.calib)  # before set_torch_threads imports torch
    outputs = plan_fix_outputs(args, args.realign)
    set_torch_threads()
    fix = realign(args.model_dir, args.realign, args.base, args.gpu, args.dtype, args.budget,
                  args.strategy, args.force, args.calib, args.targets,
                  progress=args.output != "json")
    from gac_check.report.realign import render_realign  # torch: usage errors never get here

    print(json.dumps(fix.report.to_json(), indent=2) if args.output == "json"
          else render_realign(fix.report))
    kept = fix.report.kept
    write_fix_outputs(outputs, "realign", fix, args.fail_on, kept.to_json() if kept else None)
    return exit_code(fix.remaining, args.fail_on)
