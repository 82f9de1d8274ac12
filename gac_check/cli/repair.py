"""``gac-check MODEL_DIR --repair OUT``: run the repair flow, print it, write its reports."""
from __future__ import annotations

import argparse
import json

from gac_check.api.flows import repair
from gac_check.cli.exits import exit_code
from gac_check.cli.fixing import plan_fix_outputs, write_fix_outputs
from gac_check.report.repair import render_repair


def run_repair(args: argparse.Namespace) -> int:
    """Repair, then gate on what the re-check of OUT still finds (refused sites remain);
    ``--report``/``--junit`` describe that re-check, with what each site was before."""
    outputs = plan_fix_outputs(args, args.repair)
    fix = repair(args.model_dir, args.repair, args.gpu, args.strategy, args.dtype, args.force,
                 args.targets, uniform=args.uniform, progress=args.output != "json")
    print(json.dumps(fix.report.to_json(), indent=2) if args.output == "json"
          else render_repair(fix.report))
    write_fix_outputs(outputs, "repair", fix, args.fail_on)
    return exit_code(fix.remaining, args.fail_on)
