"""docs/api.md's examples run as written: every ```python block, in order, as one session, in
a scratch directory (they build their own tiny models; nothing is downloaded), and every
assert in them holds."""
from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def test_the_page_has_an_example_of_each_function():
    text = "".join(blocks())
    for call in ("gac_check.check(", "gac_check.repair(", "gac_check.realign(",
                 "gac_check_model("):
        assert call in text, call


def test_the_examples_run_and_their_asserts_hold(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    session: dict = {"__name__": "docs_api"}
    for i, code in enumerate(blocks(), 1):
        exec(compile(code, f"{DOC.name}, python block {i}", "exec"), session)
    assert session["fix"].report.plan.within_budget  # the last block that ran a flow
