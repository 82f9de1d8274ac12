"""The bounded JSON read (gac_check/checkpoint/files.py ``read_json``) at its bound: a file of
exactly ``max_bytes`` is read, one byte more is refused as too large (not misread as
truncated JSON), before more than ``max_bytes + 1`` bytes are read. Seen red under its mutants
(the bound off by one either way, the read not one byte past the bound)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gac_check.checkpoint.files import read_json
from gac_check.errors import BadInput

LIMIT = 64


def _json_of(size: int) -> str:
    """A JSON object of exactly ``size`` bytes (its string padded)."""
    text = json.dumps({"model_type": ""})
    return json.dumps({"model_type": "x" * (size - len(text))})


@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT])
def test_a_json_file_up_to_the_bound_is_read(tmp_path: Path, size: int) -> None:
    path = tmp_path / "config.json"
    path.write_text(_json_of(size))
    assert path.stat().st_size == size
    assert read_json(path, max_bytes=LIMIT) == json.loads(path.read_text())


@pytest.mark.parametrize("size", [LIMIT + 1, LIMIT + 2, 10 * LIMIT])
def test_a_json_file_past_the_bound_is_refused_as_too_large(tmp_path: Path, size: int) -> None:
    path = tmp_path / "config.json"
    path.write_text(_json_of(size))
    assert path.stat().st_size == size
    with pytest.raises(BadInput, match=f"is larger than {LIMIT} bytes"):
        read_json(path, max_bytes=LIMIT)
