"""``gac-check report merge RUN.json ... -o FILE.html``: several machines' runs side by side.

CI runs the same suite on an A100 job and an H100 job; each leaves a run document (the JSON
written next to every HTML report, or a bare ``gac-check --format json`` object). Merging
renders them into one report whose maps, staircases and environments sit next to each other.
Every input is read and validated before anything is written, so a bad file leaves no output.
Errors reach the one boundary in :func:`gac_check.cli.main.guarded` (exit 2 or 3, one line).
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from gac_check.checkpoint.atomic import write_atomic
from gac_check.errors import BadInput
from gac_check.report.html import render_html
from gac_check.report.run import check_writable, load_run


def build_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = parser_class(prog="gac-check report",
                     description="Render or merge saved gac-check runs into one HTML report.")
    sub = p.add_subparsers(dest="command", required=True, metavar="merge")
    m = sub.add_parser("merge", help="merge run JSON files (e.g. one per GPU) into one report",
                       description="Merge run JSON files into one HTML report, side by side.")
    m.add_argument("runs", nargs="+", type=Path, metavar="RUN.json",
                   help="run documents (written next to --report / --gac-report HTML) or "
                   "gac-check --format json objects")
    m.add_argument("-o", "--output", required=True, type=Path, metavar="FILE.html")
    m.add_argument("--title", help="the report's title (default: the runs' labels)")
    return p


def main(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    args = build_parser(parser_class).parse_args(argv)
    out = check_writable(args.output)
    runs = [load_run(path) for path in args.runs]  # each a regular file, or refused
    if any(out.resolve() == path.resolve() for path in args.runs):
        raise BadInput("the output would overwrite one of the runs being merged", out)
    label_runs(runs, args.runs)
    html = render_html(runs, title=args.title)
    write_atomic(out, html)
    return 0


def label_runs(runs: list[dict], paths: list[Path]) -> None:
    """Give runs distinct labels: two runs both called ``h100`` get their file names added."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run["label"]] = seen.get(run["label"], 0) + 1
    stems = [p.stem for p in paths]
    for run, path in zip(runs, paths, strict=True):
        if seen[run["label"]] > 1:
            run["label"] += f" ({path.stem if stems.count(path.stem) == 1 else path})"
