"""Every check of a flow happens once: ``--repair`` and ``--realign`` check the input once and
OUT once (in its temporary directory, before it appears), with or without ``--report`` and
``--junit``, and every output describes that one re-check.

The real CLI runs in-process; a counter wraps the reading every check starts with
(``gac_check.analysis.read_sites``), so a second check is counted however it is reached.
"""
from __future__ import annotations

import json

import pytest

from gac_check import analysis
from gac_check.cli.main import main
from gac_check.models.compress import compress_dir
from tests.helpers import tiny_llama


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    root = tmp_path_factory.mktemp("flows")
    tiny_llama(1, num_key_value_heads=2).save_pretrained(root / "dense")
    compress_dir(root / "dense", root / "c", 0.7)
    return root


@pytest.fixture
def checks(monkeypatch):
    """The directories checked, in order."""
    seen: list[str] = []
    read_sites = analysis.read_sites

    def counting(ckpt):
        seen.append(ckpt.path.name)
        return read_sites(ckpt)

    monkeypatch.setattr(analysis, "read_sites", counting)
    return seen


@pytest.mark.parametrize("job", ["--repair", "--realign"])
@pytest.mark.parametrize("reports", [False, True], ids=["plain", "report+junit"])
def test_a_fix_checks_its_input_once_and_out_once(compressed, tmp_path, checks, capsys, job,
                                                 reports):
    out = tmp_path / "out"
    args = [str(compressed / "c"), "--gpu", "a100", "--dtype", "float16", job, str(out)]
    if job == "--realign":
        args += ["--base", str(compressed / "dense")]
    if reports:
        args += ["--report", str(tmp_path / "r.html"), "--junit", str(tmp_path / "j.xml")]
    assert main(args) in (0, 1), capsys.readouterr().err
    assert len(checks) == 2, checks
    assert checks[0] == "c" and checks[1].startswith(".out.") and checks[1].endswith(".partial")
    kind = job.removeprefix("--")
    record = json.loads((out / f"gac-{kind}.json").read_text())
    if not reports:
        return
    run = json.loads((tmp_path / "r.json").read_text())
    (check,) = run["checks"]
    assert check["model_dir"] == str(out.resolve())  # the re-check, named where OUT is
    assert run["fix"]["out"] == str(out.resolve()) and run["fix"]["kind"] == kind
    errors = sum(s["severity"] == "error" for s in check["sites"])
    assert errors == check["summary"]["errors"]
    remaining = record["remaining"]
    assert (len(remaining) if isinstance(remaining, list) else remaining["error"]
            + remaining["warning"]) == check["summary"]["misaligned"]
