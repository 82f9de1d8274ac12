"""``gac-check``: check a model directory, and repair, realign or benchmark it.

Exit codes are a contract (DESIGN.md): 0 nothing at or above --fail-on, 1 findings at or above
it, 2 bad input or usage with one line on stderr; 3 is ours: an internal error (a bug).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gac_check.errors import BadInput
from gac_check.hardware import CHOICES, resolve_profile
from gac_check.report.outputs import DEFAULT_REPORT
from gac_check.report.outputs import plan as plan_outputs
from gac_check.report.outputs import write as write_outputs

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
DTYPES = ("float16", "bfloat16", "float32", "float8_e4m3fn", "int8")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"gac-check: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gac-check", description="Find, repair and gate GPU-hostile dimensions "
                "in a compressed model checkpoint.")
    p.add_argument("model_dir", type=Path, help="model directory (config.json + weights)")
    p.add_argument("--gpu", default="auto", metavar="PROFILE", type=str.lower,
                   help=f"hardware the model will be served on: {', '.join(CHOICES)} "
                   "(default auto: the GPU present, else the generic published GPU contract)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="dtype the model will be served in (default: config.json's dtype, "
                   "else the weights')")
    p.add_argument("--format", choices=("text", "json"), default="text", dest="output")
    p.add_argument("--fail-on", choices=("error", "warning", "never"), default="error")
    p.add_argument("--report", nargs="?", const=DEFAULT_REPORT, metavar="FILE.html",
                   help="write the HTML alignment report (and its run JSON beside it); "
                   "without FILE: reports/<model>-<profile>.html")
    p.add_argument("--junit", type=Path, metavar="FILE.xml",
                   help="write one JUnit testcase per site; gated sites fail")
    p.add_argument("--bench", action="store_true",
                   help="time the misaligned sites against their repaired sizes on the "
                   "device present and print the measured speedups")
    fix = p.add_argument_group("fixing")
    fix.add_argument("--strategy", choices=("minimal", "optimal"), default="minimal",
                     help="minimal: the required multiple; optimal: the fastest one "
                     "(for --repair and --realign)")
    fix.add_argument("--force", action="store_true", help="replace an existing OUT")
    fix.add_argument("--repair", type=Path, metavar="OUT",
                     help="write the exact zero-padded repair of the model to OUT")
    fix.add_argument("--realign", type=Path, metavar="OUT",
                     help="write a model with aligned ranks re-selected under the same "
                     "parameter budget (exact multi-choice knapsack)")
    fix.add_argument("--base", type=Path, metavar="DENSE_DIR",
                     help="the dense original, so --realign can choose any aligned rank")
    fix.add_argument("--calib", type=Path, metavar="TEXT_FILE",
                     help="--realign objective: activation-aware (ASVD scaling) from this "
                     "calibration text run through the --base model")
    fix.add_argument("--budget", default="same", metavar="same|FLOAT",
                     help="--realign budget: the input's parameter count (same) or a "
                     "fraction of the dense matrices' parameters")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:  # `gac-check report merge ...`; MODEL_DIR is positional
        return _report_command(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except BadInput as exc:
        sys.stderr.write(f"gac-check: {exc}\n")
        return EXIT_BAD_INPUT
    except OSError as exc:  # the filesystem said no: still the user's input, still one line
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"gac-check: {where}{exc.strerror or exc}\n")
        return EXIT_BAD_INPUT
    except Exception as exc:
        # A bug, not a finding: never exit 1 (which a CI gate reads as "findings").
        if os.environ.get("GAC_DEBUG"):
            raise
        sys.stderr.write(f"gac-check: internal error ({type(exc).__name__}: {exc}); "
                         "rerun with GAC_DEBUG=1 for the traceback and please report it\n")
        return EXIT_INTERNAL


def run(args: argparse.Namespace) -> int:
    from gac_check.analysis import check
    from gac_check.report.json_report import to_json
    from gac_check.report.text import render_text

    resolve_profile(args.gpu)  # an unknown --gpu is bad input before anything is read
    if args.base and not args.realign:
        raise BadInput("--base is only used with --realign")
    if args.repair and args.realign:
        raise BadInput("--repair and --realign write different models; choose one")
    if args.repair:
        return run_repair(args)
    if args.realign:
        return run_realign(args)
    outputs = plan_outputs(args.report, args.junit, args.model_dir)
    result = check(args.model_dir, args.gpu, args.dtype)
    doc = to_json(result)
    bench = None
    if args.bench:
        from gac_check.bench.model_bench import bench_findings

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


def _report_command(argv: list[str]) -> int:
    from gac_check.report.merge import main as report_main

    try:
        return report_main(argv, _Parser)
    except BadInput as exc:
        sys.stderr.write(f"gac-check: {exc}\n")
        return EXIT_BAD_INPUT


def run_repair(args: argparse.Namespace) -> int:
    """Repair, then gate on what the re-check of OUT still finds (refused sites remain)."""
    from gac_check.repair import repair_dir

    report = repair_dir(args.model_dir, args.repair, args.gpu, args.strategy, args.dtype,
                        args.force)
    print(json.dumps(report.to_json(), indent=2) if args.output == "json"
          else report.render_text())
    return exit_code(report.remaining, args.fail_on)


def run_realign(args: argparse.Namespace) -> int:
    """Realign, then gate on the re-check of OUT (like --repair)."""
    from gac_check.analysis import check
    from gac_check.realign import realign_dir

    report = realign_dir(args.model_dir, args.realign, args.base, args.gpu, args.dtype,
                         args.budget, args.strategy, args.force, args.calib)
    remaining = check(args.realign, args.gpu, args.dtype).findings
    if args.output == "json":
        counts = {sev: sum(f.severity == sev for f in remaining) for sev in ("error", "warning")}
        print(json.dumps({**report.to_json(), "remaining": counts}, indent=2))
    else:
        print(report.summary())
    return exit_code(remaining, args.fail_on)


def exit_code(findings: list, fail_on: str) -> int:
    if fail_on == "never":
        return EXIT_OK
    levels = ("error",) if fail_on == "error" else ("error", "warning")
    return EXIT_FINDINGS if any(f.severity in levels for f in findings) else EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
