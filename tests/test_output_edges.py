"""What lands in OUT, and where outputs may go when several models are checked at once."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests import helpers


@pytest.fixture(scope="module")
def misaligned(tmp_path_factory) -> Path:
    """A Llama whose MLP (170) a repair pads, carrying a tokenizer folder and dot-entries."""
    root = tmp_path_factory.mktemp("side") / "model"
    helpers.tiny_llama(intermediate_size=170).save_pretrained(root)
    for name in (".git/config", ".cache/huggingface/download/x.lock", "extra/.secret",
                 "extra/vocab.txt", ".env"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    return root


def test_dot_entries_of_the_model_directory_are_not_copied(misaligned, tmp_path) -> None:
    out = tmp_path / "out"
    run = helpers.gac(misaligned, "--repair", out, "--gpu", "h100", timeout=300)
    assert run.returncode == 0, run.stderr
    assert (out / "extra" / "vocab.txt").read_text() == "extra/vocab.txt"
    dotted = [p.relative_to(out).as_posix() for p in out.rglob(".*")]
    assert dotted == []


@pytest.mark.parametrize("flag", ["--report", "--junit"])
@pytest.mark.parametrize("which", [0, 1])
def test_outputs_are_checked_against_every_model(misaligned, tmp_path, flag, which) -> None:
    """With several models, a report inside any of them (not only the first) is refused
    before anything is read or written."""
    other = tmp_path / "other"
    helpers.tiny_llama().save_pretrained(other)
    models = [other, misaligned] if which else [misaligned, other]
    target = models[which] / ("r.html" if flag == "--report" else "r.xml")
    before = [helpers.tree_digest(m) for m in models]
    run = helpers.gac(*models, flag, target, "--gpu", "h100")
    assert run.returncode == 2 and "model directory" in run.stderr, run.stderr
    assert not target.exists() and [helpers.tree_digest(m) for m in models] == before
