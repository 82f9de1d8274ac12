"""``gac-check MODEL_DIR``: check, print, optionally time the sites and write the reports."""
from __future__ import annotations

import argparse
import dataclasses
import json

from gac_check.analysis import check
from gac_check.cli.exits import exit_code
from gac_check.report.json_report import to_json
from gac_check.report.outputs import plan as plan_outputs
from gac_check.report.outputs import write as write_outputs
from gac_check.report.text import render_text


def run_check(args: argparse.Namespace) -> int:
    outputs = plan_outputs(args.report, args.junit, args.model_dir)
    result = check(args.model_dir, args.gpu, args.dtype)
    doc = to_json(result)
    bench = None
    if args.bench:
        from gac_check.bench.model_bench import bench_findings  # imports torch: only on --bench

        bench = bench_findings(result)
    if args.output == "json":
        if bench is not None:
            doc["bench"] = dataclasses.asdict(bench)
        print(json.dumps(doc, indent=2))
    else:
        print(render_text(result))
        if bench is not None:
            from gac_check.bench.model_bench import render

            print(render(bench))
    write_outputs(outputs, doc, args.fail_on)
    return exit_code(result.findings, args.fail_on)
