"""``gac-check report merge RUN.json ... -o FILE.html``: several machines' runs side by side.

CI runs the same suite on an A100 job and an H100 job; each leaves a run document (the JSON
written next to every HTML report, or a bare ``gac-check --format json`` object). Merging
renders them into one report whose maps, staircases and environments sit next to each other.
Every input is read and validated before anything is written, so a bad file leaves no output.
Errors reach the one boundary in :func:`gac_check.cli.main.guarded` (exit 2 or 3, one line).

A run document may come from anywhere, and the report reads dozens of its fields; rather than
a second copy of the renderer's expectations, each document is rendered alone first, and one
the renderer cannot draw (``rules: true``, a slowdown without its provenance) is refused,
naming the file. Everything gac-check itself writes renders (tests/test_report.py).
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from jinja2 import TemplateError

from gac_check.checkpoint.atomic import write_atomic
from gac_check.errors import BadInput
from gac_check.report.html import render_html
from gac_check.report.outputs import announce
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
    for run, path in zip(runs, args.runs, strict=True):
        _rendered([run], path)
    label_runs(runs, args.runs)
    html = _rendered(runs, None, title=args.title)
    write_atomic(out, html)
    announce(out)
    return 0


#: What rendering a document of the wrong shape raises (a string where a list is expected, a
#: key the template needs missing): the document's fault, as one line naming it.
RENDER_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError,
                 TemplateError)


def _rendered(runs: list[dict], path: Path | None, title: str | None = None) -> str:
    try:
        return render_html(runs, title=title)
    except RENDER_ERRORS as exc:
        what = f"{type(exc).__name__}: {str(exc)[:200]}"
        if path is None:
            raise BadInput(f"these runs cannot be drawn in one report ({what})") from None
        raise BadInput(f"is not a run document gac-check can draw ({what})", path) from None


def label_runs(runs: list[dict], paths: list[Path]) -> None:
    """Give runs distinct labels: two runs both called ``h100`` get their file names added."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run["label"]] = seen.get(run["label"], 0) + 1
    stems = [p.stem for p in paths]
    for run, path in zip(runs, paths, strict=True):
        if seen[run["label"]] > 1:
            run["label"] += f" ({path.stem if stems.count(path.stem) == 1 else path})"
