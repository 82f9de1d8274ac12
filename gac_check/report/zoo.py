"""The model-zoo view: several models checked in one run, compared side by side.

A compressor author publishing a release (or a user choosing between compressed models)
checks every model at once: ``gac-check A B C`` or ``--models-from FILE``. The run is an
ordinary run document (:mod:`gac_check.report.run`) whose ``checks`` hold one ``gac-check/1``
object per model, so the HTML report, ``--format json`` and ``gac-check report merge`` need
nothing new; this module adds the comparison table a terminal shows after the per-model
summaries, and writes ``--report`` / ``--junit`` for several models at once.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gac_check.report.outputs import REPORTS_DIR, Outputs, write_files
from gac_check.report.run import dumps, new_run

#: A Hub model's full commit id, shortened in the table (the JSON and HTML keep it whole).
_COMMIT = re.compile(r"(@[0-9a-f]{12})[0-9a-f]{28}$")
COLUMNS = ("model", "format", "dtype", "params", "sites", "misaligned", "errors", "warnings",
           "repair")


def zoo_run(checks: list[dict], label: str, fail_on: str) -> dict:
    """One run document holding every model's check, in the order they were named."""
    return new_run(checks, label=label, fail_on=fail_on)


def render_zoo(checks: list[dict]) -> str:
    """The models as rows of one table: what each costs to serve misaligned, and to fix."""
    profiles = sorted({c["hardware"]["profile"] for c in checks})
    rows = [COLUMNS] + [_row(c) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    left = (0, 1, 2)  # text columns; the counts are right-aligned

    def line(row: tuple[str, ...]) -> str:
        return "  " + "  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                                for i, (cell, w) in enumerate(zip(row, widths, strict=True)))

    out = [f"model zoo: {len(checks)} models against the {', '.join(profiles)} contract"
           f"{'s' if len(profiles) > 1 else ''}", line(rows[0]),
           "  " + "-" * (sum(widths) + 2 * (len(widths) - 1))]
    out += [line(r) for r in rows[1:]]
    out.append("  repair: parameters zero-padding (--repair) adds; misaligned: sites off "
               "the contract's multiples")
    return "\n".join(out)


def _row(check: dict) -> tuple[str, ...]:
    s = check["summary"]
    return (_COMMIT.sub(r"\1", check["model_dir"]), str(check.get("format", "")),
            str(check["hardware"].get("dtype", "")), f"{s.get('params', 0):,}",
            str(s.get("sites", 0)), str(s.get("misaligned", 0)), str(s.get("errors", 0)),
            str(s.get("warnings", 0)), f"+{s.get('repair_overhead_fraction', 0.0):.2%}")


def default_zoo_path(checks: list[dict]) -> Path:
    """``reports/zoo-<profile>.html``, beside where a single model's report would land."""
    return REPORTS_DIR / f"zoo-{checks[0]['hardware']['profile']}.html"


def write_zoo(outputs: Outputs, checks: list[dict], fail_on: str) -> list[Path]:
    """``--report`` (one HTML, one run JSON) and ``--junit`` (one suite per model) for a zoo;
    everything is rendered before the first file is written."""
    if outputs.report is None and not outputs.default_report and outputs.junit is None:
        return []
    from gac_check.report.html import render_html

    files: list[tuple[Path, str]] = []
    report = outputs.report
    if outputs.default_report:
        report = default_zoo_path(checks)
        report.parent.mkdir(parents=True, exist_ok=True)
    if report is not None:
        run = zoo_run(checks, report.stem, fail_on)
        files += [(report, render_html([run])), (report.with_suffix(".json"), dumps(run))]
    if outputs.junit is not None:
        files.append((outputs.junit, zoo_junit(checks, fail_on)))
    write_files(files, report.with_suffix(".json") if report else None, outputs.force)
    return [p for p, _ in files]


def zoo_junit(checks: list[dict], fail_on: str) -> str:
    """One ``<testsuites>`` with each model's suite, as :func:`.junit.to_junit` writes it."""
    from gac_check.report.junit import to_junit

    root = ET.Element("testsuites", name="gac-check")
    for check in checks:
        root.extend(ET.fromstring(to_junit(check, fail_on)))
    for key in ("tests", "failures", "errors"):
        root.set(key, str(sum(int(s.get(key, 0)) for s in root)))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
