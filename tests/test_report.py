"""The HTML/JSON/JUnit reports and ``gac-check report merge``, through the real CLI.

The model is a real transformers Llama saved with ``save_pretrained`` whose MLP width is 1843
(the kind of size a pruner leaves): every layer's intermediate site is an error on a GPU
contract, everything else is aligned, so the map's colours and the JUnit failures are known.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gac_check.plugin.collect import hypothesis_failure
from gac_check.report import charts
from gac_check.report.html import render_html, run_verdict
from tests.helpers import gac, tiny_llama

LAYERS = 3


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    import torch

    path = tmp_path_factory.mktemp("models") / "llama-1843"
    tiny_llama(dtype=torch.float16, vocab_size=128, intermediate_size=1843,
               num_hidden_layers=LAYERS, num_key_value_heads=2,
               torch_dtype="float16").save_pretrained(path)
    return path


def test_report_and_junit_from_the_cli(llama, tmp_path):
    out, junit = tmp_path / "r.html", tmp_path / "r.xml"
    proc = gac(llama, "--gpu", "a100", "--report", out, "--junit", junit)
    assert proc.returncode == 1, proc.stderr  # the 1843s are errors on a100
    html = out.read_text()
    run = json.loads(out.with_suffix(".json").read_text())
    assert run["schema"] == "gac-check-run/1"
    check = run["checks"][0]
    bad = [s for s in check["sites"] if not s["aligned"]]
    errors = [s for s in bad if s["severity"] == "error"]
    assert {s["value"] for s in errors} == {1843} and len(errors) == LAYERS
    # the map: one cell per site, coloured by state
    assert html.count('class="cell error"') == len(errors)
    assert html.count('class="cell aligned"') == len(check["sites"]) - len(bad)
    assert f'fill="{charts.COLOURS["error"]}"' in html
    # findings: rule, expected slowdown on that hardware, repair and its cost
    assert "gemm-align-16B" in html and "not measured at this shape" in html  # 1843: no data
    assert "pad 1843 → 1848" in html
    assert f"+{sum(s['padding_params'] for s in errors):,} params" in html
    # self-contained: nothing fetched, nothing executed
    for needle in ("<script", "src=", "href=", "@import", "url("):
        assert needle not in html, needle
    cases = ET.parse(junit).getroot().findall(".//testcase")
    assert len(cases) == len(check["sites"])
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert sorted(failed) == sorted(s["name"] for s in errors)


@pytest.mark.parametrize(("fail_on", "expected"), [("warning", "misaligned"), ("never", "none")])
def test_junit_follows_fail_on(llama, tmp_path, fail_on, expected):
    junit = tmp_path / "r.xml"
    gac(llama, "--gpu", "a100", "--fail-on", fail_on, "--junit", junit, "--format", "json")
    suite = ET.parse(junit).getroot().find("testsuite")
    failures = int(suite.get("failures"))
    proc = gac(llama, "--gpu", "a100", "--format", "json")
    summary = json.loads(proc.stdout)["summary"]
    assert failures == (summary["misaligned"] if expected == "misaligned" else 0)


def test_report_without_a_value_lands_in_reports(llama, tmp_path):
    proc = gac(llama, "--gpu", "h100", "--report", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert (tmp_path / "reports" / "llama-1843-h100.html").is_file()
    assert (tmp_path / "reports" / "llama-1843-h100.json").is_file()


def test_merge_puts_machines_side_by_side(llama, tmp_path):
    for gpu in ("a100", "h100"):
        gac(llama, "--gpu", gpu, "--report", tmp_path / f"{gpu}.html")
    bare = tmp_path / "plain.json"
    bare.write_text(gac(llama, "--gpu", "cpu", "--format", "json").stdout)
    merged = tmp_path / "merged.html"
    proc = gac("report", "merge", tmp_path / "a100.json", tmp_path / "h100.json", bare,
               "-o", merged)
    assert proc.returncode == 0, proc.stderr
    html = merged.read_text()
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="grid"') == 6  # 3 x 2
    for label in ("a100 contract", "h100 contract", "cpu contract"):
        assert label in html
    # the environment table has one column per run
    assert "<th>a100</th><th>h100</th><th>plain</th>" in html


def hostile_run(name: str) -> dict:
    site = {"name": name, "role": "rank", "value": 107, "layer": 0, "aligned": False,
            "severity": "error", "rules": [name], "repair_to": 112, "padding_params": 10,
            "refusal": None, "tensors": [name]}
    check = {"schema": "gac-check/1", "model_dir": f"/m/{name}", "format": name,
             "hardware": {"profile": "a100", "dtype": "float16"}, "sites": [site],
             "rules": [{"id": name, "severity": "error", "why": name}],
             "summary": {"sites": 1, "misaligned": 1, "errors": 1, "warnings": 0,
                         "misaligned_fraction": 1.0, "params": 1000,
                         "repair_overhead_fraction": 0.01}}
    return {"schema": "gac-check-run/1", "label": name, "created": None, "fail_on": "error",
            "environment": {name: name}, "checks": [check],
            "tests": {"counts": {"failed": 1}, "failures": [
                {"nodeid": name, "when": "call", "message": name, "equivalence": False}]},
            "perf": [{"case": f"gemm/K={k},X={name}", "measured_ms": 1.0, "verdict": name}
                     for k in (8, 16)],
            "equivalence": [{"nodeid": name, "message": name, "examples": [name],
                             "decorator": name, "reproduce": name}]}


def test_names_from_untrusted_files_are_escaped(tmp_path):
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    run = tmp_path / "evil.json"
    run.write_text(json.dumps(hostile_run(evil)))
    out = tmp_path / "evil.html"
    proc = gac("report", "merge", run, "-o", out)
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


BAD_RUNS = {
    "newer schema": lambda r: {**r, "schema": "gac-check-run/2"},
    "unknown schema": lambda r: {**r, "schema": "something-else/1"},
    "site without a value": lambda r: {**r, "checks": [{**r["checks"][0], "sites": [
        {k: v for k, v in r["checks"][0]["sites"][0].items() if k != "value"}]}]},
    "check of another schema": lambda r: {**r, "checks": [{**r["checks"][0],
                                                           "schema": "gac-check/9"}]},
    "perf record without a case": lambda r: {**r, "perf": [{"measured_ms": 1}]},
}


@pytest.mark.parametrize("kind", [*BAD_RUNS, "not JSON", "a JSON list"])
def test_merge_refuses_bad_runs_and_writes_nothing(tmp_path, kind):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(hostile_run("ok")))
    bad = tmp_path / "bad.json"
    if kind == "not JSON":
        bad.write_text('{"schema": "gac-check-run/1", ')
    elif kind == "a JSON list":
        bad.write_text("[]")
    else:
        bad.write_text(json.dumps(BAD_RUNS[kind](hostile_run("ok"))))
    before = sorted(tmp_path.iterdir())
    proc = gac("report", "merge", good, bad, "-o", tmp_path / "out.html")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert str(bad) in proc.stderr
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("args", [
    ["--report", "{tmp}/a-file/r.html"],
    ["--junit", "{tmp}/a-file/deeper/r.xml"],
    ["--report", "{tmp}/r.txt"],
])
def test_cli_refuses_bad_report_paths_before_checking(llama, tmp_path, args):
    (tmp_path / "a-file").write_text("not a directory")
    before = sorted(tmp_path.iterdir())
    proc = gac(llama, *(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # refused before the check ran
    assert sorted(tmp_path.iterdir()) == before


def test_outputs_in_missing_directories_are_created_and_announced(llama, tmp_path):
    """A fresh CI checkout has no reports/ yet: the README's gate commands create it, and
    every file written is named on stderr, one line each."""
    html, xml = tmp_path / "new" / "r.html", tmp_path / "other" / "deep" / "sites.xml"
    proc = gac(llama, "--gpu", "gpu", "--report", html, "--junit", xml, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    assert html.is_file() and html.with_suffix(".json").is_file() and xml.is_file()
    written = [line for line in proc.stderr.splitlines() if line.startswith("gac-check: wrote")]
    assert sorted(written) == sorted(f"gac-check: wrote {p}"
                                     for p in (html, html.with_suffix(".json"), xml))
    merged = tmp_path / "merged" / "all.html"
    proc = gac("report", "merge", html.with_suffix(".json"), "-o", merged)
    assert proc.returncode == 0 and merged.is_file()
    assert proc.stderr == f"gac-check: wrote {merged}\n"


def test_merge_refuses_to_overwrite_an_input(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(hostile_run("ok")))
    proc = gac("report", "merge", run, "-o", run)
    assert proc.returncode == 2 and json.loads(run.read_text())["label"] == "ok"


def sweep(slow: int, verdict_of=lambda d, slow: "regressed" if d == slow else "unchanged"):
    return [{"case": f"sdpa/B=4,S=2048,H=32,D={d},dtype=float16", "measured_ms": 1.0 + d / 100
             + (0.5 if d == slow else 0), "baseline_ms": 1.0 + d / 100, "baseline_iqr_ms": 0.02,
             "verdict": verdict_of(d, slow)} for d in (96, 104, 107, 112, 128)]


def test_staircase_finds_the_swept_dimension_and_marks_regressions():
    (chart,) = charts.staircases([("a100", sweep(107))])
    assert chart.x_label == "D" and chart.title == "sdpa/B=4,S=2048,H=32,dtype=float16"
    by_x = sorted(chart.points, key=lambda p: p.x)
    assert len(by_x) == 5
    ringed = [p for p in by_x if p.ring]
    assert ringed == [by_x[2]]  # D=107, the only regression
    assert by_x[2].y < by_x[3].y  # higher latency is drawn higher (smaller y)
    assert len(chart.bands) == 1 and len(chart.bands[0].polygon.split()) == 10


def test_staircase_overlays_merged_runs():
    (chart,) = charts.staircases([("a100", sweep(107)), ("h100", sweep(0))])
    assert len(chart.bands) == 2 and len(chart.points) == 10
    assert [label for _, label in chart.legend] == ["a100", "h100"]


def test_staircases_of_different_shapes_stay_apart():
    cpu = [{**r, "case": r["case"].replace("S=2048", "S=128")} for r in sweep(107)]
    extra = {"case": "sdpa/B=4,S=2048,H=32,D=96,dtype=bfloat16", "measured_ms": 1.0}
    charts_ = charts.staircases([("cpu", cpu), ("a100", [*sweep(107), extra])])
    assert sorted(c.title for c in charts_) == ["sdpa/B=4,S=128,H=32,dtype=float16",
                                                "sdpa/B=4,S=2048,H=32,dtype=float16"]
    assert all(c.x_label == "D" and len(c.points) == 5 for c in charts_)


def test_perf_section_renders_with_verdicts():
    run = hostile_run("m")
    run["perf"] = sweep(107)
    html = render_html([run])
    assert html.count("<circle") == 5 and "latency (ms)" in html
    assert run_verdict(run)[0] == "fail"


def test_verdicts():
    run = hostile_run("m")
    run["tests"] = {"counts": {"passed": 3}, "failures": []}
    run["perf"] = []
    assert run_verdict(run)[0] == "fail"  # an error site, gate on error
    run["fail_on"] = "never"
    assert run_verdict(run)[0] == "warn"  # shown, not gating
    run["checks"] = []
    assert run_verdict(run) == ("pass", [])


def test_layers_text():
    assert charts.layers_text([0, 1, 2, 3, 7, 9, 10]) == "0–3, 7, 9–10"
    assert charts.layers_text([5]) == "5"


# Copied from real pytest output of hypothesis 6.170 (and the older wording).
NEW_STYLE = """E       AssertionError: padding changed the output
E       assert ((3 % 8) != 3 or 50 < 50)
E       Failing test case: test_pad(
E           d=3,
E           k=(50, 'a)'),
E       )
E
E       You can reproduce this test case by temporarily adding @reproduce_failure('6.170.15', \
b'AEEDQTI=') as a decorator on your test function"""
OLD_STYLE = """E   Falsifying example: test_pad(d=3, k=50)
E   You can add @seed(123) to this test or run pytest with --hypothesis-seed=123 to reproduce"""


def test_hypothesis_examples_are_extracted():
    new = hypothesis_failure(NEW_STYLE)
    assert new["examples"] == ["Failing test case: test_pad(\n    d=3,\n    k=(50, 'a)'),\n)"]
    assert new["decorator"] == "@reproduce_failure('6.170.15', b'AEEDQTI=')"
    old = hypothesis_failure(OLD_STYLE)
    assert old["examples"] == ["Falsifying example: test_pad(d=3, k=50)"]
    assert old["seed"] == "123"
    assert hypothesis_failure("E   AssertionError: plain failure") is None


REF_KERNEL = "sdpa/B=1,S=256,H=8,D=128,dtype=float32,backend=default"


def relative_sweep():
    """Issue 22's case: absolute 6.98 ms against a 2.79 ms baseline (a busy runner), judged on
    the time relative to the reference: +5.4%, unchanged."""
    return [{"case": f"sdpa/B=1,S=256,H=8,D={d},dtype=float32,backend=default",
             "basis": "relative", "reference": REF_KERNEL, "trials": 36,
             "measured_ms": 6.98 * d / 112, "baseline_ms": 2.79 * d / 112,
             "measured_rel": 1.054 * d / 128, "measured_rel_iqr": 0.01,
             "baseline_rel": d / 128, "baseline_rel_iqr": 0.01,
             "ratio": 1.054, "delta": 0.054, "p_value": 0.2, "verdict": "unchanged"}
            for d in (64, 107, 112)]


def test_staircase_of_relative_cases_plots_what_the_verdict_compares():
    (chart,) = charts.staircases([("cpu", relative_sweep())])
    assert chart.relative and chart.reference == REF_KERNEL
    assert chart.y_label == "time ÷ reference kernel (×)"
    # y axis in ratios (about 0.5-0.93), not milliseconds (up to 6.98)
    assert max(float(label) for _, label in chart.y_ticks) < 2
    d112 = max(chart.points, key=lambda p: p.x)
    assert d112.title.startswith("cpu: D=112: 0.9223x the time of " + REF_KERNEL)
    assert "(+5.4%); unchanged; absolute (not judged): 6.98 ms now, 2.79 ms in the baseline" \
        in d112.title


def test_perf_table_shows_the_relative_basis_first_and_absolute_times_labelled():
    run = hostile_run("m")
    run["perf"] = relative_sweep()
    html = render_html([run])
    assert "time ÷ reference kernel (×)" in html and "latency (ms)" not in html
    assert f"time ÷ reference <code>{REF_KERNEL}</code>" in html
    assert "<th>absolute now (ms)</th><th>absolute baseline (ms)</th>" in html
    row = html[html.index("D=112,dtype=float32,backend=default</code>"):]
    row = row[:row.index("</tr>")]
    cells = [c.split(">", 1)[1].strip() for c in row.split("<td")[1:]]
    assert cells[1].startswith("0.9223×") and cells[2].startswith("0.875×")
    assert cells[3] == "+5.4%</td>" and "unchanged" in cells[5]
    assert cells[6].startswith("6.98") and cells[7].startswith("2.79")
