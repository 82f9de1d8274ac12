"""``--report``/``--junit`` for ``--repair`` and ``--realign``: the re-check of OUT.

A CI gate judges what it will ship (OUT), so both files describe OUT's re-check, the one the
flow made before OUT appeared; each site also says what it was in the input
(:mod:`gac_check.report.fixing`). Paths are validated before any work, like a plain check's,
and may not lie inside OUT, which the fix replaces.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from gac_check.api.flows import FixResult
from gac_check.errors import BadInput
from gac_check.report.fixing import annotate, fix_record
from gac_check.report.json_report import to_json
from gac_check.report.outputs import Outputs
from gac_check.report.outputs import plan as plan_outputs
from gac_check.report.outputs import write as write_outputs


def plan_fix_outputs(args: argparse.Namespace, out: Path) -> Outputs:
    outputs = plan_outputs(args.report, args.junit, args.model_dir, force=args.force)
    root = Path(out).resolve()
    for path in (outputs.report, outputs.junit):
        if path is not None and (path.resolve() == root or root in path.resolve().parents):
            raise BadInput("is inside OUT, which the fix writes as a whole", path)
    return outputs


def write_fix_outputs(outputs: Outputs, kind: str, fix: FixResult, fail_on: str,
                      quality: dict | None = None) -> list[Path]:
    """Write the requested files from the fix's re-check of OUT (``quality``: a realign's
    kept energy per choice, which the HTML report charts)."""
    was, after = to_json(fix.before), to_json(fix.after)
    return write_outputs(outputs, annotate(was, after), fail_on,
                         fix_record(kind, was, after, quality))
