"""Strict types in run documents given to ``gac-check report merge`` (issue 22, "tests that
bite"): a string where a number goes, a bool where a number goes, a wrong type nested in a
site, a summary, the test counts or a perf record is one line and exit 2, never a traceback
and never a report drawn from it ("0" failed tests is truthy: the run would show as failing).

The documents start from a real one (``gac-check MODEL --report``); each case changes one
field. Each test fails on one of the "rundoc" mutants in benchmarks/hand_mutants.py.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gac_check.errors import BadInput
from gac_check.report.html import render_html
from gac_check.report.run import load_run
from tests.helpers import gac


@pytest.fixture(scope="module")
def real_run(tiny_checkpoints, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("rundoc") / "a100.html"
    proc = gac(tiny_checkpoints["single"], "--gpu", "a100", "--report", out)
    assert proc.returncode == 1, proc.stderr  # the seed Llama's MLP of 170 is an error
    run = json.loads(out.with_suffix(".json").read_text())
    run["tests"] = {"counts": {"passed": 3, "failed": 0}, "failures": []}
    run["perf"] = [{"case": "gemm/M=64,K=1024,N=1024,dtype=float16", "device": "cuda:0",
                    "measured_ms": 1.5, "measured_iqr_ms": 0.01, "samples": 9,
                    "baseline_ms": 1.4, "baseline_iqr_ms": 0.01, "baseline_source": "measured",
                    "ratio": 1.07, "delta": 0.07, "p_value": 0.2, "verdict": "unchanged",
                    "reason": ""}]
    return run


def misaligned(run: dict) -> int:
    return next(i for i, s in enumerate(run["checks"][0]["sites"]) if not s["aligned"])


def edit(run: dict, where: str, value: object) -> dict:
    """A copy of ``run`` with the field at ``where`` ("checks.0.sites.M.layer", M: the first
    misaligned site) set to ``value``."""
    doc = copy.deepcopy(run)
    keys = [misaligned(run) if k == "M" else int(k) if k.isdigit() else k
            for k in where.split(".")]
    obj = doc
    for k in keys[:-1]:
        obj = obj[k]
    obj[keys[-1]] = value
    return doc


def write(tmp_path: Path, doc: dict, name: str = "run.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


#: (field, wrong value, what the one line must say)
WRONG = [
    ("checks.0.sites.M.value", "170", "sites[M].value is missing or not int"),
    ("checks.0.sites.M.value", True, "sites[M].value is missing or not int"),
    ("checks.0.sites.M.aligned", 0, "sites[M].aligned is missing or not bool"),
    ("checks.0.sites.M.layer", "0", "sites[M].layer is str, not int"),
    ("checks.0.sites.M.layer", False, "sites[M].layer is bool, not int"),
    ("checks.0.sites.M.repair_to", "176", "sites[M].repair_to is str, not int"),
    ("checks.0.sites.M.repair_to", 176.0, "sites[M].repair_to is float, not int"),
    ("checks.0.sites.M.padding_params", "1024", "sites[M].padding_params is str, not int"),
    ("checks.0.sites.M.padding_params", True, "sites[M].padding_params is bool, not int"),
    ("checks.0.sites.M.severity", 2, "sites[M].severity is int, not str"),
    ("checks.0.sites.M.rules", "gemm-align-16B", "sites[M].rules is str, not list"),
    ("checks.0.sites.M.rules", [7], "sites[M].rules[0] is not str"),
    ("checks.0.sites.M.expected_slowdown", "1.4", "expected_slowdown is str, not int or float"),
    ("checks.0.summary.errors", "0", "summary.errors is str, not int"),
    ("checks.0.summary.warnings", True, "summary.warnings is bool, not int"),
    ("checks.0.summary.repair_overhead_fraction", "0.01",
     "summary.repair_overhead_fraction is str, not int or float"),
    ("tests.counts.failed", "0", "tests.counts.failed is str, not int"),
    ("tests.counts.failed", False, "tests.counts.failed is bool, not int"),
    ("tests.counts", [], "tests.counts is not an object"),
    ("tests.failures", {}, "tests.failures is dict, not list"),
    ("perf.0.measured_ms", "1.5", "perf[0].measured_ms is str, not int or float"),
    ("perf.0.baseline_ms", True, "perf[0].baseline_ms is bool, not int or float"),
    ("perf.0.samples", 9.0, "perf[0].samples is float, not int"),
    ("perf.0.verdict", None, None),  # null is allowed: absent
    ("label", 7, "label is missing or not str"),
    ("fail_on", "sometimes", "fail_on must be one of"),
]


@pytest.mark.parametrize(("where", "value", "says"), WRONG,
                         ids=[f"{w}={v!r}" for w, v, _ in WRONG])
def test_a_wrong_type_is_refused_naming_the_field(real_run, tmp_path, where, value, says):
    path = write(tmp_path, edit(real_run, where, value))
    if says is None:
        render_html([load_run(path)])
        return
    with pytest.raises(BadInput) as info:
        load_run(path)
    assert says.replace("[M]", f"[{misaligned(real_run)}]") in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("where", "value"), [
    ("checks.0.sites.M.layer", None), ("checks.0.sites.M.padding_params", 0),
    ("checks.0.sites.M.expected_slowdown", 1), ("checks.0.summary.errors", 0),
    ("perf.0.p_value", None), ("perf.0.ratio", 1), ("tests.counts", {})])
def test_the_types_gac_check_writes_are_accepted(real_run, tmp_path, where, value):
    render_html([load_run(write(tmp_path, edit(real_run, where, value)))])


def test_merge_refuses_a_wrong_type_in_one_line_and_writes_nothing(real_run, tmp_path):
    good = write(tmp_path, real_run, "a100.json")
    bad = write(tmp_path, edit(real_run, "tests.counts.failed", "0"), "h100.json")
    out = tmp_path / "merged.html"
    proc = gac("report", "merge", good, bad, "-o", out)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "tests.counts.failed is str, not int" in proc.stderr and "h100.json" in proc.stderr
    assert not out.exists()


def test_merge_of_the_real_documents_still_passes(real_run, tmp_path):
    a = write(tmp_path, real_run, "a100.json")
    b = write(tmp_path, edit(real_run, "label", "h100"), "h100.json")
    out = tmp_path / "merged.html"
    proc = gac("report", "merge", a, b, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert out.exists()
