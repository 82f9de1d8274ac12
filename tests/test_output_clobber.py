"""Outputs that must not clobber: the run JSON beside ``--report FILE.html`` is the user's file
too, and two writers racing for one name (a report's JSON, a ``--repair`` OUT) get the same
clear refusal, never an OSError about a hidden temporary."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gac_check.checkpoint import outdir
from gac_check.errors import BadInput
from gac_check.report import outputs
from tests.helpers import gac, tiny_llama

FOREIGN = "exists and is not a gac-check run document"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clobber") / "model"
    tiny_llama(hidden_size=32, intermediate_size=37, num_hidden_layers=1,
               num_attention_heads=2, vocab_size=64).save_pretrained(path)
    return path


def test_report_never_overwrites_a_foreign_json_beside_it(model, tmp_path) -> None:
    report, mine = tmp_path / "r.html", tmp_path / "r.json"
    mine.write_text('{"my": "data"}')
    r = gac(model, "--gpu", "a100", "--report", report)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.splitlines() == [f"gac-check: {mine}: {FOREIGN} (--report FILE.html "
                                     "writes its run JSON beside it); pass --force to replace "
                                     "it, or name the report otherwise"]
    assert mine.read_text() == '{"my": "data"}' and not report.exists()
    again = gac(model, "--gpu", "a100", "--report", report, "--force")
    assert again.returncode in (0, 1), again.stderr
    assert '"schema": "gac-check-run/1"' in mine.read_text()
    rerun = gac(model, "--gpu", "a100", "--report", report)  # an earlier run document: ours
    assert rerun.returncode == again.returncode, rerun.stderr


def test_a_foreign_json_appearing_after_the_plan_gets_the_same_refusal(tmp_path,
                                                                        monkeypatch) -> None:
    """Another writer lands between the check and the write: the link that publishes ours
    fails with EEXIST, and the answer is the refusal a user would get without the race."""
    report, mine = tmp_path / "r.html", tmp_path / "r.json"
    planned = outputs.plan(str(report), None, tmp_path / "model")
    mine.write_text("the other writer's")
    real = outputs.refuse_foreign
    calls = []
    monkeypatch.setattr(outputs, "refuse_foreign",  # the first look saw no file yet
                        lambda p: bool(calls.append(p)) if not calls else real(p))
    with pytest.raises(BadInput, match=FOREIGN):
        outputs.write_files([(report, "<html>"), (mine, "{}")], mine, planned.force)
    assert mine.read_text() == "the other writer's" and not report.exists()
    assert not list(tmp_path.glob(".r.json.*"))  # no temporary left behind


def test_a_repair_out_landing_mid_swap_is_already_exists(tmp_path, monkeypatch) -> None:
    """Two --repair runs for one OUT: the loser's rename hits the winner's OUT; it must say
    "already exists", not "Directory not empty" about its hidden partial, and leave none."""
    out = tmp_path / "out"
    real = os.path.lexists  # OUT was looked for before the winner's rename landed
    monkeypatch.setattr(outdir.os.path, "lexists",
                        lambda p: False if Path(p) == out.resolve() else real(p))
    refused = pytest.raises(BadInput, match=r"out: already exists \(use --force to replace it\)")
    with refused, outdir.atomic_output_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
        out.mkdir()
        (out / "winner.txt").write_text("first")
    assert (out / "winner.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
