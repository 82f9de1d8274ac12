"""Nothing gac-check writes may land in, replace or delete a model directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import gac, tiny_llama, tree_digest


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "victim" / "model"
    tiny_llama(hidden_size=32, intermediate_size=37, num_hidden_layers=1,
               num_attention_heads=2, vocab_size=64).save_pretrained(path)
    (tmp_path / "victim" / "precious.txt").write_text("keep me")
    return path


@pytest.mark.parametrize("flag", ["--repair", "--realign"])
def test_force_never_replaces_a_directory_holding_the_input(model, flag):
    victim = model.parent
    before = tree_digest(victim)
    r = gac(model, flag, victim, "--force", "--gpu", "a100", "--dtype", "float16")
    assert r.returncode == 2 and "contain it" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert tree_digest(victim) == before


def test_report_inside_the_model_directory_is_refused(model):
    before = tree_digest(model)
    for args in (["--report", model / "config.html"], ["--junit", model / "junit.xml"]):
        r = gac(model, *args)
        assert r.returncode == 2 and "inside the model directory" in r.stderr, r.stderr
    assert tree_digest(model) == before


def test_existing_file_as_out_is_refused_without_leftovers(model, tmp_path):
    out = tmp_path / "afile"
    out.write_text("x")
    r = gac(model, "--repair", out, "--force", "--gpu", "a100", "--dtype", "float16")
    assert r.returncode == 2 and "not a directory" in r.stderr
    assert out.read_text() == "x"
    assert not list(tmp_path.glob(".afile.*"))
