"""The terminal table's layer ranges (issue 22, "tests that bite"): sites that differ only by
layer fold into one row whose layers read "0-2,4,7,9-11"; different values never fold together;
the "+params" of a folded row is the sum over its layers; a wide range moves no column.

Each test fails on one of the "layers" mutants in benchmarks/hand_mutants.py.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from gac_check.report.text import _ranges
from tests.helpers import gac, prune_linear, tiny_llama

RANGES = [
    ([], "-"),
    ([3], "3"),
    ([0, 1], "0-1"),
    ([0, 1, 2, 5], "0-2,5"),
    ([0, 2, 4], "0,2,4"),
    ([0, 1, 3, 4, 9], "0-1,3-4,9"),
    ([5, 0, 2, 1], "0-2,5"),  # in any order
    ([1, 1, 2, 2, 2], "1-2"),  # a layer twice (two sites of one layer) is one layer
    ([7, 7], "7"),
    ([10, 9, 11, 2], "2,9-11"),  # numbers, not text: 10 after 9
    ([0, 31], "0,31"),
]


@pytest.mark.parametrize(("layers", "text"), RANGES)
def test_ranges(layers, text):
    assert _ranges(layers) == text


#: per-layer MLP widths: 170 in layers 0-2, 4, 7, 9-11; 176 (aligned) in 3 and 8; 171 in 5-6
WIDTHS = [170, 170, 170, 176, 170, 171, 171, 170, 176, 170, 170, 170]


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    model = tiny_llama(num_hidden_layers=len(WIDTHS))
    for i, width in enumerate(WIDTHS):
        mlp, keep = model.model.layers[i].mlp, torch.arange(width)
        mlp.gate_proj = prune_linear(mlp.gate_proj, rows=keep)
        mlp.up_proj = prune_linear(mlp.up_proj, rows=keep)
        mlp.down_proj = prune_linear(mlp.down_proj, cols=keep)
    path = tmp_path_factory.mktemp("layers") / "pruned"
    model.save_pretrained(path)
    proc = gac(path, "--gpu", "a100", "--dtype", "float16")
    assert proc.returncode == 1, proc.stderr
    return proc.stdout


def rows(text: str) -> dict[tuple[str, int], list[str]]:
    """(site pattern, value) -> the row's columns (the "slower" column is two: "n/m [1]")."""
    out = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) > 3 and cols[0].startswith("model.layers.*") and cols[2].isdigit():
            out[(cols[0], int(cols[2]))] = cols
    return out


def test_sites_differing_only_by_layer_fold_into_ranges(table):
    got = rows(table)
    mlp = "model.layers.*.mlp:intermediate"
    assert set(got) == {(mlp, 170), (mlp, 171), ("model.layers.*.self_attn:head_dim", 16)}
    assert got[(mlp, 170)][1] == "0-2,4,7,9-11"
    assert got[(mlp, 171)][1] == "5-6"
    assert got[("model.layers.*.self_attn:head_dim", 16)][1] == "0-11"


def test_a_folded_rows_params_are_the_sum_over_its_layers(table):
    """Padding 170 -> 176 adds 6 rows of gate and up (64 each) and 6 columns of down (64) in
    each of 8 layers; 171 -> 176 adds 5 of each in 2 layers."""
    got = rows(table)
    mlp = "model.layers.*.mlp:intermediate"
    assert got[(mlp, 170)][3:4] + got[(mlp, 170)][7:8] == ["176", f"{8 * 6 * 3 * 64:,}"]
    assert got[(mlp, 171)][3:4] + got[(mlp, 171)][7:8] == ["176", f"{2 * 5 * 3 * 64:,}"]


def test_a_wide_layer_range_moves_no_column(table):
    """"0-2,4,7,9-11" is wider than the layers column (10): every value still ends under
    "value", every rule list starts under "rules"."""
    lines = table.splitlines()
    header = next(line for line in lines if re.match(r"\s+site\s+layers", line))
    value_end, rules_at = header.index("value") + len("value"), header.index("rules")
    body = [line for line in lines if line.startswith("  model.layers.*")]
    assert len(body) == 3
    for line in body:
        assert line[value_end - 1].isdigit() and line[value_end] == " ", line
        assert line[rules_at - 2:rules_at] == "  " and line[rules_at] != " ", line


def test_one_layer_model_has_no_range_dash(tmp_path: Path):
    model = tiny_llama(num_hidden_layers=1, intermediate_size=170)
    model.save_pretrained(tmp_path / "m")
    got = rows(gac(tmp_path / "m", "--gpu", "a100", "--dtype", "float16").stdout)
    assert got[("model.layers.*.mlp:intermediate", 170)][1] == "0"
