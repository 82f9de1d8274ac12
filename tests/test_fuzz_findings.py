"""What tests/test_fuzz.py found, pinned down: each case is one mutant the fuzzer produced that
broke the contract (exit 3 instead of a one-line refusal), rebuilt by hand so that it is tested
on every run, not only when hypothesis happens to draw it again. Real files, real CLI.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from functools import partial
from pathlib import Path

import pytest

from tests import helpers
from tests.helpers import tree_digest

gac = partial(helpers.gac, timeout=60)


def refused(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("gac-check: "), proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def copy(tiny_checkpoints: dict[str, Path], tmp_path: Path):
    def make(kind: str) -> Path:
        return Path(shutil.copytree(tiny_checkpoints[kind], tmp_path / kind))
    return make


def test_torch_zip_with_a_corrupt_local_header_is_refused(copy) -> None:
    """Mutant 'xor bytes {0: 1}' of the archive: zipfile's 'Bad magic number for file header'
    came from reading the byteorder record outside any error handling (exit 3)."""
    d = copy("torch")
    weights = d / "pytorch_model.bin"
    raw = bytearray(weights.read_bytes())
    raw[0] ^= 1  # the first local header's signature; the central directory still lists it
    weights.write_bytes(bytes(raw))
    before = tree_digest(d)
    refused(gac(d), "pytorch_model.bin", "corrupt zip archive")
    assert tree_digest(d) == before


def test_weight_map_value_that_is_a_list_is_refused(copy) -> None:
    """Mutant "sets 'lm_head.weight' to [[1]]" of the shard index: the values were put in a
    set before their type was checked (TypeError: unhashable type: 'list', exit 3)."""
    d = copy("sharded")
    index = d / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["lm_head.weight"] = [[1]]
    index.write_text(json.dumps(doc))
    refused(gac(d), "model.safetensors.index.json", "must be shard file names")


def test_run_document_the_report_cannot_draw_is_refused(tiny_checkpoints: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """Mutant 'sets sites[0].rules to true' of a run document: it passed load_run and broke
    the renderer (TypeError: can only join an iterable, exit 3); now the run document's types
    are checked when it is read, and one that fails is refused by name and field."""
    proc = gac(tiny_checkpoints["single"], "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    good, bad, out = tmp_path / "a100.json", tmp_path / "h100.json", tmp_path / "m.html"
    good.write_text(proc.stdout)
    doc = json.loads(proc.stdout)
    misaligned = next(s for s in doc["sites"] if not s["aligned"])
    misaligned["rules"] = True
    bad.write_text(json.dumps(doc))
    refused(gac("report", "merge", good, bad, "-o", out), "h100.json",
            "rules is bool, not list")
    assert not out.exists()
