"""docs/targets.md lists every rule of every shipped pack, as the packs say it."""
from __future__ import annotations

from pathlib import Path

from gac_check.targets.packs import packs
from gac_check.targets.table import markdown_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "targets.md"


def test_docs_table_is_the_packs():
    text = DOC.read_text()
    table = text.split("<!-- rules:begin -->\n", 1)[1].split("\n<!-- rules:end -->", 1)[0]
    assert table == markdown_table(), "regenerate: python -m gac_check.targets.table"


def test_docs_name_every_engine_version_and_note():
    text = DOC.read_text()
    for pack in packs().values():
        assert f"`{pack.engine}`" in text
        for version in pack.versions:
            assert version in text
        for note in pack.notes:
            assert note in text
