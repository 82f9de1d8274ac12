"""The re-quantization hint a quantized checkpoint's ``--repair`` refusal prints names only what
llm-compressor accepts (issue 39): a preset name from compressed-tensors' own
``PRESET_SCHEMES`` (0.20.0, the test extra; llm-compressor 0.14's presets) that re-creates the
checkpoint's scheme exactly, else one config group that compressed-tensors' own
``QuantizationScheme`` validates and that equals the checkpoint's. Before, an FP8 checkpoint's
hint said ``scheme='W8A8-FP8'``, a name llm-compressor rejects (its preset is ``FP8_DYNAMIC``).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from compressed_tensors.quantization import QuantizationScheme
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES, preset_name_to_scheme

from gac_check.checkpoint.quantized.scheme import PRESETS
from tests import helpers
from tests import quantized_models as qm


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_preset_table_is_compressed_tensors_own(name):
    w = PRESET_SCHEMES[name]["weights"]
    a = PRESET_SCHEMES[name].get("input_activations")
    bits, kind, strategy, group, symmetric, block, acts = PRESETS[name]
    assert (w.num_bits, w.type, w.strategy, w.group_size, w.symmetric) == (
        bits, kind, strategy, group, symmetric)
    assert (tuple(w.block_structure) if w.block_structure else None) == block
    assert (None if a is None else (a.type, a.dynamic, a.symmetric)) == acts


CHECKPOINTS = {
    "w4a16_g128": lambda r: qm.compressed_tensors_w4a16(r, 688),
    "w4a16_g64": lambda r: qm.compressed_tensors_w4a16(r, 688, group=64),
    "w4a16_channel": lambda r: qm.compressed_tensors_w4a16_channel(r, 688),
    "fp8_dynamic": lambda r: qm.compressed_tensors_8bit(r, 688, "float", "dynamic"),
    "fp8_static": lambda r: qm.compressed_tensors_8bit(r, 688, "float", "static"),
    "fp8_weight_only": lambda r: qm.compressed_tensors_8bit(r, 688, "float", "none"),
    "int8_dynamic": lambda r: qm.compressed_tensors_8bit(r, 688, "int", "dynamic"),
    "int8_asym": lambda r: qm.compressed_tensors_8bit(r, 688, "int", "asymmetric"),
}


def _hint_scheme(stderr: str) -> QuantizationScheme:
    """The scheme the refusal's QuantizationModifier(...) re-creates, read with
    compressed-tensors' own presets and validation."""
    preset = re.search(r"scheme='([^']+)'", stderr)
    if preset:
        assert preset.group(1) in PRESET_SCHEMES, stderr
        return preset_name_to_scheme(preset.group(1), ["Linear"])
    groups = re.search(r"config_groups=(\{.*\}), ignore=", stderr)
    assert groups, stderr
    return QuantizationScheme.model_validate(ast.literal_eval(groups.group(1))["group_0"])


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_the_repair_hint_recreates_the_checkpoints_scheme(tmp_path: Path, name: str):
    root = CHECKPOINTS[name](tmp_path / name)
    run = helpers.gac(root, "--repair", tmp_path / "out")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "scheme='W8A8-FP8'" not in run.stderr
    scheme = _hint_scheme(run.stderr)
    group = json.loads((root / "config.json").read_text())[
        "quantization_config"]["config_groups"]["group_0"]
    w, a = group["weights"], group["input_activations"]
    assert (scheme.weights.num_bits, scheme.weights.type, scheme.weights.strategy,
            scheme.weights.group_size, scheme.weights.symmetric) == (
        w["num_bits"], w["type"], w["strategy"], w.get("group_size"), w["symmetric"])
    got = scheme.input_activations
    assert (got is None) == (a is None)
    if a is not None:
        assert (got.type, got.dynamic, got.symmetric) == (a["type"], a["dynamic"],
                                                         a["symmetric"])
