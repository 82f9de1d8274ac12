"""A quantized checkpoint missing one auxiliary tensor is refused, naming that tensor (issue
39): every scheme the reader knows, written as a real safetensors checkpoint
(tests/quantized_models.py) that first checks clean, then with one scale, zero point, group
index, absmax, quantization state or SCB of one linear deleted. Before, an FP8 checkpoint
without one ``weight_scale`` passed with that linear judged unquantized, an NF4 one without
one ``absmax`` passed although transformers cannot load it, and an 8-bit one without ``SCB``
(NF4 without ``quant_state``) was refused naming another tensor.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests import helpers
from tests import quantized_models as qm

LINEAR = "model.layers.0.mlp.down_proj"


def _config(root: Path, edit: Callable[[dict], None]) -> None:
    path = root / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg["quantization_config"])
    path.write_text(json.dumps(cfg))


def _ct_asymmetric(root: Path) -> Path:
    """W4A16 asymmetric: a packed ``weight_zero_point`` [ceil(out/8), groups] per linear."""
    qm.compressed_tensors_w4a16(root, 688)

    def add(state: dict) -> None:
        for name in [n for n in state if n.endswith(".weight_scale")]:
            out, groups = state[name].shape
            state[name.replace("weight_scale", "weight_zero_point")] = torch.zeros(
                math.ceil(out / 8), groups, dtype=torch.int32)
    helpers.rewrite_safetensors(root, add)
    _config(root, lambda qc: qc["config_groups"]["group_0"]["weights"].update(symmetric=False))
    return root


def _ct_actorder(root: Path) -> Path:
    """W4A16 with ``actorder: group``: a ``weight_g_idx`` [in] per linear."""
    qm.compressed_tensors_w4a16(root, 688)

    def add(state: dict) -> None:
        for name in [n for n in state if n.endswith(".weight_shape")]:
            width = int(state[name][1])
            state[name.replace("weight_shape", "weight_g_idx")] = (
                torch.arange(width) // 128).to(torch.int32)
    helpers.rewrite_safetensors(root, add)
    _config(root, lambda qc: qc["config_groups"]["group_0"]["weights"].update(actorder="group"))
    return root


def _fp8_per_tensor(root: Path) -> Path:
    """transformers' FP8 without ``weight_block_size``: one ``weight_scale`` per linear."""
    qm.block_fp8(root, 688)

    def per_tensor(state: dict) -> None:
        for name in [n for n in state if n.endswith(".weight_scale_inv")]:
            del state[name]
            state[name.removesuffix("_inv")] = torch.ones(1)
    helpers.rewrite_safetensors(root, per_tensor)
    _config(root, lambda qc: qc.pop("weight_block_size"))
    return root


WRITERS: dict[str, Callable[[Path], Path]] = {
    "ct_w4a16": lambda r: qm.compressed_tensors_w4a16(r, 688),
    "ct_asym": _ct_asymmetric,
    "ct_actorder": _ct_actorder,
    "ct_fp8": lambda r: qm.compressed_tensors_fp8(r, 688),
    "ct_fp8_static": lambda r: qm.compressed_tensors_8bit(r, 688, "float", "static"),
    "ct_int8": lambda r: qm.compressed_tensors_w8a8(r, 688),
    "gptq": lambda r: qm.gptq(r, 640),
    "gptq_act": lambda r: qm.gptq(r, 640, desc_act=True),
    "awq": lambda r: qm.awq_gemm(r, 640),
    "fp8_block": lambda r: qm.block_fp8(r, 688),
    "fp8_tensor": _fp8_per_tensor,
    "nf4": lambda r: qm.bnb_nf4(r, 688),
    "nf4_nested": lambda r: qm.bnb_nf4(r, 688, nested=True),
    "int8": lambda r: qm.bnb_int8(r, 688),
}

#: (scheme, the auxiliary tensor of LINEAR deleted)
MISSING = [
    ("ct_w4a16", ".weight_scale"), ("ct_w4a16", ".weight_shape"),
    ("ct_asym", ".weight_zero_point"), ("ct_actorder", ".weight_g_idx"),
    ("ct_fp8", ".weight_scale"), ("ct_fp8_static", ".input_scale"),
    ("ct_int8", ".weight_scale"),
    ("gptq", ".qzeros"), ("gptq", ".scales"), ("gptq", ".g_idx"), ("gptq_act", ".g_idx"),
    ("awq", ".qzeros"), ("awq", ".scales"),
    ("fp8_block", ".weight_scale_inv"), ("fp8_tensor", ".weight_scale"),
    ("nf4", ".weight.absmax"), ("nf4", ".weight.quant_map"),
    ("nf4", ".weight.quant_state.bitsandbytes__nf4"),
    ("nf4_nested", ".weight.nested_absmax"), ("nf4_nested", ".weight.nested_quant_map"),
    ("int8", ".SCB"),
]


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("intact")
    return {name: write(root / name) for name, write in WRITERS.items()}


@pytest.mark.parametrize("scheme", sorted(WRITERS))
def test_the_intact_checkpoint_is_read(intact, scheme):
    """The baseline each deletion below breaks: every writer's checkpoint checks clean."""
    run = helpers.gac(intact[scheme], "--gpu", "h100", "--format", "json")
    assert run.returncode in (0, 1), run.stderr
    assert json.loads(run.stdout)["quantization"]["quantized"] == 14


@pytest.mark.parametrize(("scheme", "suffix"), MISSING)
def test_a_missing_auxiliary_tensor_is_refused_naming_it(intact, tmp_path, scheme, suffix):
    root = tmp_path / scheme
    WRITERS[scheme](root)
    helpers.rewrite_safetensors(root, lambda state: state.pop(LINEAR + suffix))
    run = helpers.gac(root, "--gpu", "h100")
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"{LINEAR}{suffix} is missing" in lines[0], lines[0]
