"""The CLI's report files: ``--report [FILE.html]`` and ``--junit FILE.xml``.

``--report`` writes the HTML and, beside it, the run document as ``FILE.json`` (what
``gac-check report merge`` reads); the file's stem labels the run in merged reports. With no
value it writes ``reports/<model>-<profile>.html`` under the current directory, creating
``reports/`` (docs/design.md, "Where reports land"); an explicit path's missing directories
are created. Paths are checked before the model is read, and all files are rendered in
memory before the first is written, so a bad path or a failed check leaves nothing behind.
Every file written is named on stderr.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from gac_check.checkpoint.files import open_regular
from gac_check.errors import BadInput

#: The value argparse gives ``--report`` when it is passed without a file name.
DEFAULT_REPORT = "<default>"
REPORTS_DIR = Path("reports")
HTML_SUFFIXES = (".html", ".htm")


@dataclass
class Outputs:
    report: Path | None  # None: no HTML; DEFAULT_REPORT resolved after the check
    default_report: bool
    junit: Path | None
    force: bool = False  # --force: the run JSON beside the HTML may replace any file

    @property
    def wanted(self) -> bool:
        """Whether any file is to be written (a plain check writes none)."""
        return self.report is not None or self.default_report or self.junit is not None


def plan(report: str | None, junit: Path | None, model_dir: Path,
         force: bool = False) -> Outputs:
    """Validate the requested paths before any work is done; nothing may land in the model
    directory (the run JSON beside ``x.html`` would replace a model's ``x.json``), and the run
    JSON, a file the user did not name, replaces only an earlier run document unless
    ``force``."""
    default = report == DEFAULT_REPORT
    path = None
    if report is not None and not default:
        path = _writable(Path(report))
        if path.suffix.lower() not in HTML_SUFFIXES:
            raise BadInput("--report writes HTML; give a .html file name (the run JSON is "
                           "written beside it)", path)
        if path.with_suffix(".json").is_dir():
            raise BadInput("is a directory, not a file", path.with_suffix(".json"))
    junit_path = _writable(junit) if junit is not None else None
    if default and REPORTS_DIR.exists() and not REPORTS_DIR.is_dir():
        raise BadInput("is not a directory; --report without a file writes into it",
                       REPORTS_DIR)
    for out in (path, junit_path, REPORTS_DIR if default else None):
        if out is not None and _inside(out, model_dir):
            raise BadInput("is inside the model directory, which gac-check never writes to",
                           out)
    if path is not None and not force:
        refuse_foreign(path.with_suffix(".json"))
    return Outputs(path, default, junit_path, force)


def _writable(path: Path) -> Path:
    """:func:`gac_check.report.run.check_writable`, its module (the run document) imported
    only where a file is to be written: a plain check writes none."""
    from gac_check.report.run import check_writable

    return check_writable(path)


#: How every run document :func:`gac_check.report.run.dumps` writes begins.
_RUN_DOC = re.compile(rb'\{\s*"schema":\s*"gac-check-run/')


def refuse_foreign(path: Path) -> bool:
    """Refuse ``path`` (the run JSON beside an HTML report) if it exists and is not a run
    document an earlier ``--report`` wrote: it is the user's file, not ours to replace.
    Returns whether it exists (then an earlier run document)."""
    if not os.path.lexists(path):
        return False
    try:
        with open_regular(path) as fh:
            ours = bool(_RUN_DOC.match(fh.read(256)))
    except BadInput:
        ours = False
    if not ours:
        raise BadInput("exists and is not a gac-check run document (--report FILE.html writes "
                       "its run JSON beside it); pass --force to replace it, or name the "
                       "report otherwise", path)
    return True


def write_files(files: list[tuple[Path, str]], run_json: Path | None, force: bool) -> None:
    """Write each file atomically, the run JSON first, and that over an existing file only if
    it is an earlier run document or ``force``: a file that appeared since :func:`plan`
    (another writer racing for the name) gets the same refusal."""
    from gac_check.checkpoint.atomic import write_atomic

    for path, text in sorted(files, key=lambda f: f[0] != run_json):
        if path != run_json or force:
            write_atomic(path, text)
        else:
            try:
                write_atomic(path, text, replace=refuse_foreign(path))
            except FileExistsError:
                refuse_foreign(path)  # another run's document: ours to replace after all
                write_atomic(path, text)
        announce(path)


def _inside(path: Path, directory: Path) -> bool:
    target, root = path.resolve(), directory.resolve()
    return target == root or root in target.parents


def default_report_path(check: dict) -> Path:
    """``reports/<model>-<profile>.html``; the model name is reduced to safe characters."""
    model = check["model_dir"].rstrip("/").rsplit("/", 1)[-1]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("._") or "model"
    return REPORTS_DIR / f"{safe}-{check['hardware']['profile']}.html"


def write(outputs: Outputs, check: dict, fail_on: str, fix: dict | None = None) -> list[Path]:
    """Render everything, then write each file atomically; returns the paths written.

    ``fix`` (:func:`gac_check.report.fixing.fix_record`) is the before/after of a --repair or
    --realign whose OUT ``check`` describes; the run document carries it as ``fix``.
    """
    if not outputs.wanted:
        return []  # a plain check must not pay for importing jinja2
    from gac_check.report.html import render_html
    from gac_check.report.junit import to_junit
    from gac_check.report.run import dumps, new_run

    files: list[tuple[Path, str]] = []
    report = outputs.report
    if outputs.default_report:
        report = default_report_path(check)
        report.parent.mkdir(parents=True, exist_ok=True)
    if report is not None:
        from gac_check.report.paths import shown

        # the model as the working directory names it: the report's commands show this
        check = {**check, "model_path": shown(check["model_dir"])}
        run = new_run([check], label=report.stem, fail_on=fail_on)
        if fix is not None:
            run["fix"] = fix
        files += [(report, render_html([run])), (report.with_suffix(".json"), dumps(run))]
    if outputs.junit is not None:
        files.append((outputs.junit, to_junit(check, fail_on)))
    write_files(files, report.with_suffix(".json") if report else None, outputs.force)
    return [p for p, _ in files]


def announce(path: Path) -> None:
    """Say on stderr where a file was written: one line each, so a CI log shows it."""
    print(f"gac-check: wrote {path}", file=sys.stderr)
