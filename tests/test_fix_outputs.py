"""What --repair and --realign record: the provenance file, --report and --junit of OUT.

Real CLI runs on real checkpoints; every file is read back and compared with what the CLI
itself printed, so a provenance written before the re-check (``remaining: []``) or a report
of the input instead of OUT shows up as a disagreement.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from functools import partial
from pathlib import Path

import pytest
import torch

from gac_check.models.compress import compress_dir
from tests import helpers
from tests.compressors import build_slicegpt, tiny_llama

#: the CLI, with the time a repair (writing a whole model) may take
gac = partial(helpers.gac, timeout=300)


@pytest.fixture(scope="module")
def asvd(tmp_path_factory) -> Path:
    """ASVD layout with irregular ranks and intermediate 37 (repairable) and head_dim 16
    (fine for errors, off FlashAttention's optimal buckets: refused, so it remains)."""
    root = tmp_path_factory.mktemp("fix")
    tiny_llama(0, intermediate_size=37).save_pretrained(root / "dense")
    compress_dir(root / "dense", root / "asvd", 0.7)
    return root / "asvd"


def test_provenance_records_what_the_recheck_found(asvd, tmp_path):
    out = tmp_path / "fixed"
    run = gac(asvd, "--repair", out, "--strategy", "optimal", "--gpu", "gpu", "--dtype",
              "float16", "--format", "json", "--fail-on", "never")
    assert run.returncode == 0, run.stderr
    printed = json.loads(run.stdout)["remaining"]
    recorded = json.loads((out / "gac-repair.json").read_text())["remaining"]
    assert printed, "the optimal strategy leaves the refused head_dim sites"
    assert recorded == printed
    again = json.loads(gac(out, "--gpu", "gpu", "--dtype", "float16", "--format", "json").stdout)
    assert {r["name"] for r in recorded} == {s["name"] for s in again["sites"]
                                              if not s["aligned"]}


def test_sidecar_changes_are_config_changes(tmp_path):
    """SliceGPT's slicing config records every stream width: each rewritten entry is listed."""
    built = build_slicegpt(tmp_path / "sliced", [44, 52, 36, 40], config_dtype="float16")
    out = tmp_path / "fixed"
    run = gac(built.path, "--repair", out, "--gpu", "gpu", "--format", "json")
    assert run.returncode == 0, run.stderr
    name = "tiny-llama_0.3.json"
    old = json.loads((built.path / name).read_text())
    new = json.loads((out / name).read_text())
    changed = {(key, index, old[key][index], new[key][index])
               for key in old if key.endswith("_dimensions")
               for index in old[key] if old[key][index] != new[key][index]}
    assert len(changed) >= 6  # 44, 52, 36 -> 48, 56, 40 in every table naming them
    for doc in (json.loads(run.stdout), json.loads((out / "gac-repair.json").read_text())):
        listed = {(c["field"][0], c["index"], c["from"], c["to"])
                  for c in doc["config_changes"] if c["file"] == name}
        assert listed == changed


def junit_cases(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    return {c.get("name"): c for c in root.iter("testcase")}


@pytest.mark.parametrize("job", ["repair", "realign"])
def test_report_and_junit_describe_the_recheck_of_out(job, asvd, tmp_path):
    out, html, junit = tmp_path / "fixed", tmp_path / "fix.html", tmp_path / "fix.xml"
    run = gac(asvd, f"--{job}", out, "--gpu", "gpu", "--dtype", "float16", "--report", html,
              "--junit", junit, "--format", "json")
    # realign re-selects ranks only: the intermediate (37) stays an error and fails the gate
    assert run.returncode == (0 if job == "repair" else 1), run.stderr
    doc = json.loads(html.with_suffix(".json").read_text())
    (checked,) = doc["checks"]
    assert Path(checked["model_dir"]) == out.resolve()
    errors = {s["name"] for s in checked["sites"] if s["severity"] == "error"}
    assert all(s["role"] != "rank" for s in checked["sites"] if s["name"] in errors)
    fix = doc["fix"]
    assert (fix["kind"], Path(fix["source"]), Path(fix["out"])) == (job, asvd.resolve(),
                                                                    out.resolve())
    assert fix["before"]["errors"] > fix["after"]["errors"] == len(errors)
    ranks = [c for c in fix["changes"] if c["role"] == "rank"]
    assert ranks and all(c["to"] % 8 == 0 and c["from"] % 8 and c["before"] == "error"
                         and c["after"] in ("aligned", "warning") for c in ranks)
    page = html.read_text()
    assert "Before and after" in page and str(ranks[0]["from"]) in page
    cases = junit_cases(junit)
    assert set(cases) == {s["name"] for s in checked["sites"]}
    first = ranks[0]
    note = cases[first["name"]].find("system-out").text
    assert note.endswith(f"was {first['from']} (error) in the input, now {first['to']} "
                         f"({first['after']})")
    assert {n for n, c in cases.items() if c.find("failure") is not None} == errors
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert Path(props["fixed_from"]) == asvd.resolve()
    assert Path(props["model_dir"]) == out.resolve()


def test_report_inside_out_is_refused_before_work(asvd, tmp_path):
    out = tmp_path / "fixed"
    out.mkdir()
    run = gac(asvd, "--repair", out, "--force", "--gpu", "gpu", "--junit", out / "j.xml")
    assert run.returncode == 2 and "inside OUT" in run.stderr
    assert list(out.iterdir()) == []


def test_no_report_without_the_options(asvd, tmp_path):
    run = gac(asvd, "--repair", tmp_path / "fixed", "--gpu", "gpu", "--dtype", "float16")
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixed"]
    assert torch.__version__  # torch was importable: the model above was built with it
