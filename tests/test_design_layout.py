"""docs/design.md's "Layout" names every module gac_check has: a module nobody lists is one
a reader of the design cannot find (the section had fallen four modules behind)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_entries(design: Path = ROOT / "docs" / "design.md") -> dict[str, str]:
    """``gac_check/...`` path of each entry of the Layout block -> the entry's text."""
    text = design.read_text(encoding="utf-8")
    block = text[text.index("## Layout"):]
    block = block[block.index("```\n") + 4:]
    block = block[:block.index("```")]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        head = re.match(r"(gac_check/\S*)\s", line + " ")
        if head:
            current = head.group(1)
            entries[current] = line[len(current):]
        elif line.startswith(" ") and current is not None:
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def unlisted(entries: dict[str, str], package: Path = ROOT / "gac_check") -> list[str]:
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if path.name == "__init__.py" or rel in entries:
            continue
        folder = rel.rsplit("/", 1)[0] + "/"
        if not re.search(rf"(?<![\w.]){re.escape(path.stem)}\b", entries.get(folder, "")):
            missing.append(rel)
    return missing


def test_every_module_is_in_the_layout():
    assert unlisted(layout_entries()) == []


def test_an_unlisted_module_is_found():
    entries = layout_entries()
    entries["gac_check/padding/"] = entries["gac_check/padding/"].replace("sink.py", "")
    assert unlisted(entries) == ["gac_check/padding/sink.py"]
