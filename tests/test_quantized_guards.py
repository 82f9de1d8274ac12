"""The quantized readers' edges (gac_check/checkpoint/quantized*.py, quantization.py), each
held to what the format's own writer or config class says: a key a config omits takes the
default compressed-tensors' ``QuantizationArgs`` and transformers' ``GPTQConfig`` /
``AwqConfig`` give it; a scale's shape, not its rank, decides per-tensor against per-channel;
a quantization record is read up to its bound and refused one byte past it; MXFP4's scales are
uint8 exponents or a refusal; the older ``compression_config`` key and AutoGPTQ's
``quantize_config.json`` are read as ``quantization_config`` is.

Each test was seen red with its one-line mutant planted (the report of issue 42 names them).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from safetensors.torch import load_file, save_file

from gac_check.checkpoint.index import open_checkpoint
from gac_check.checkpoint.quantized.layout import MAX_DATA_BYTES
from gac_check.errors import BadInput
from tests import quantized_models as qm

LINEAR = "model.layers.0.mlp.down_proj"


class _Made(dict):
    """Each layout's checkpoint, written on first use (256 wide: group 128 splits it)."""

    BUILD: ClassVar[dict[str, Callable[[Path], Path]]] = {
        "ct": lambda r: qm.compressed_tensors_w4a16(r, 256),
        "w8a8": lambda r: qm.compressed_tensors_8bit(r, 256, "int", "asymmetric"),
        "static": lambda r: qm.compressed_tensors_8bit(r, 256, "float", "static"),
        "gptq": lambda r: qm.gptq(r, 256), "awq": lambda r: qm.awq_gemm(r, 256),
        "nf4": lambda r: qm.bnb_nf4(r, 256)}

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, name: str) -> Path:
        self[name] = self.BUILD[name](self.base / name)
        return self[name]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    return _Made(tmp_path_factory.mktemp("quantized"))


def _copy(src: Path, dst: Path, edit_config=None, edit_tensors=None) -> Path:
    """``src`` rewritten under ``dst``: its config.json and tensors passed through the edits."""
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    if edit_config:
        edit_config(config)
    (dst / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(src / "model.safetensors"))
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def _weights(config: dict) -> dict:
    return config["quantization_config"]["config_groups"]["group_0"]["weights"]


def _activations(config: dict) -> dict:
    return config["quantization_config"]["config_groups"]["group_0"]["input_activations"]


# --- class 1: a key the config omits takes the writer's own default --------------------------

def test_compressed_tensors_weights_without_symmetric_are_what_quantization_args_says(
        made, tmp_path):
    """llm-compressor may drop a field at its default; compressed-tensors' QuantizationArgs
    (0.20.0) fills it: symmetric=True. The reader must take that default, not another."""
    from compressed_tensors.quantization import QuantizationArgs

    def drop(config: dict) -> None:
        del _weights(config)["symmetric"]

    root = _copy(made["ct"], tmp_path / "ct", drop)
    weights = _weights(json.loads((root / "config.json").read_text()))
    quant = open_checkpoint(root).quantization
    assert quant is not None and "symmetric" not in weights
    assert quant.symmetric is QuantizationArgs.model_validate(weights).symmetric
    assert "asymmetric" not in quant.describe()


@pytest.mark.parametrize("model, key", [("w8a8", "symmetric"), ("static", "dynamic")])
def test_compressed_tensors_activations_without_a_key_are_what_quantization_args_says(
        made, tmp_path, model, key):
    """input_activations without ``symmetric`` (or ``dynamic``): the scheme engines pick a
    kernel by is QuantizationArgs' own default (symmetric=True, dynamic=False)."""
    from compressed_tensors.quantization import QuantizationArgs

    def drop(config: dict) -> None:
        del _activations(config)[key]

    root = _copy(made[model], tmp_path / model, drop)
    args = QuantizationArgs.model_validate(_activations(json.loads(
        (root / "config.json").read_text())))
    quant = open_checkpoint(root).quantization
    assert quant is not None
    assert (quant.activations_symmetric, quant.activations_dynamic) == (args.symmetric,
                                                                        args.dynamic)


def test_gptq_without_sym_group_or_desc_act_is_what_gptq_config_says(made, tmp_path):
    """A quantize config that omits ``sym``, ``group_size`` and ``desc_act`` is read with
    transformers' GPTQConfig defaults (sym=True, group_size=128, desc_act=False)."""
    from transformers import GPTQConfig

    def drop(config: dict) -> None:
        for key in ("sym", "group_size", "desc_act"):
            del config["quantization_config"][key]

    root = _copy(made["gptq"], tmp_path / "gptq", drop)
    own = GPTQConfig(bits=4)
    quant = open_checkpoint(root).quantization
    assert quant is not None
    assert (quant.symmetric, quant.group_size, quant.act_order) == (own.sym, own.group_size,
                                                                    own.desc_act)


def test_awq_without_zero_point_is_what_awq_config_says(made, tmp_path):
    """AWQ's ``zero_point`` omitted: transformers' AwqConfig defaults it to True (asymmetric
    weights, zero points stored), so the scheme is asymmetric."""
    from transformers import AwqConfig

    def drop(config: dict) -> None:
        del config["quantization_config"]["zero_point"]

    root = _copy(made["awq"], tmp_path / "awq", drop)
    quant = open_checkpoint(root).quantization
    assert quant is not None
    assert quant.symmetric is (not AwqConfig(bits=4, group_size=128).zero_point)


# --- class 2: a scale's shape, not its rank, decides its strategy ---------------------------

def _fp8(root: Path, scale_shape: tuple[int, ...], out: int = 64, width: int = 128) -> Path:
    """A per-tensor or per-channel FP8 checkpoint as transformers' FP8 releases store one
    linear: ``weight`` float8_e4m3fn [out, in] beside a float32 ``weight_scale``."""
    root.mkdir()
    save_file({f"{LINEAR}.weight": torch.randn(out, width).to(torch.float8_e4m3fn),
               f"{LINEAR}.weight_scale": torch.ones(scale_shape)},
              str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic"}}))
    return root


@pytest.mark.parametrize("scale, strategy", [
    ((), "tensor"), ((1,), "tensor"), ((1, 1), "tensor"),
    ((64,), "channel"), ((64, 1), "channel"),
])
def test_an_fp8_scale_is_per_channel_only_when_it_has_one_entry_per_output(
        tmp_path, scale, strategy):
    """One scale per output row is per-channel whatever its rank ([64] or [64, 1]); one
    scale for the tensor is per-tensor whatever its rank ([], [1] or [1, 1])."""
    quant = open_checkpoint(_fp8(tmp_path / "fp8", scale)).quantization
    assert quant is not None and quant.strategy == strategy


@pytest.mark.parametrize("scale", [(64, 4), (4,), (1, 128), (64, 128)])
def test_an_fp8_scale_of_any_other_shape_is_refused_not_read_as_per_tensor(tmp_path, scale):
    """[64, 4] is neither one scale nor one per output row: it used to be read as per
    tensor (the fallthrough), a scheme the checkpoint does not have."""
    with pytest.raises(BadInput, match=rf"weight_scale is \[{', '.join(map(str, scale))}\]: "
                       "neither one scale for the tensor nor one per output row"):
        open_checkpoint(_fp8(tmp_path / "fp8", scale))


def test_fp8_scales_per_tensor_here_and_per_channel_there_are_refused(tmp_path):
    root = _fp8(tmp_path / "fp8", (64, 1))
    state = load_file(root / "model.safetensors")
    other = LINEAR.replace("0", "1")
    state[f"{other}.weight"] = torch.randn(64, 128).to(torch.float8_e4m3fn)
    state[f"{other}.weight_scale"] = torch.ones(())
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(BadInput, match="per tensor in some linears and per output channel"):
        open_checkpoint(root)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.float8_e4m3fn])
def test_an_fp8_scale_that_is_not_a_float_is_refused(tmp_path, dtype):
    root = _fp8(tmp_path / "fp8", (64, 1))
    state = load_file(root / "model.safetensors")
    state[f"{LINEAR}.weight_scale"] = torch.ones(64, 1).to(dtype)
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(BadInput, match=r"weight_scale is (int32|uint8|float8_e4m3fn): an FP8 "
                       "weight scale is a float"):
        open_checkpoint(root)


@pytest.mark.parametrize("strategy, scale, refused", [
    ("channel", (256,), False), ("channel", (256, 1), False),
    ("channel", (1,), True), ("tensor", (256, 1), True), ("tensor", (256,), True),
    ("tensor", (1,), False), ("tensor", (1, 1), False), ("group", (256, 1), True),
])
def test_a_compressed_tensors_scale_is_held_to_the_configs_strategy(
        made, tmp_path, strategy, scale, refused):
    """int-quantized weights [256, 256]: a channel scale has 256 entries, a tensor scale one,
    a group-128 scale [256, 2]; a scale of another shape (of either rank) is refused."""
    def config(cfg: dict) -> None:
        w = _weights(cfg)
        w["strategy"] = strategy
        if strategy == "group":
            w["group_size"] = 128

    def tensors(state: dict) -> None:
        for name in [n for n in state if n.endswith(".weight_scale")]:
            state[name] = state[name].flatten()[:1].expand(scale).contiguous() \
                if scale[0] == 1 else state[name].reshape(-1)[: scale[0]].reshape(scale)

    root = _copy(made["w8a8"], tmp_path / "w8a8", config, tensors)
    if refused:
        with pytest.raises(BadInput, match=r"weight_scale is \["):
            open_checkpoint(root)
    else:
        quant = open_checkpoint(root).quantization
        assert quant is not None and quant.strategy == strategy


# --- class 3: a bounded read takes its bound and refuses one byte more ------------------------

@pytest.mark.parametrize("size, refused", [(MAX_DATA_BYTES, False), (MAX_DATA_BYTES + 1, True)])
def test_a_quant_state_is_read_up_to_its_bound_and_refused_past_it(made, tmp_path, size,
                                                                    refused):
    """A bitsandbytes quantization state (JSON, padded with spaces as JSON allows) of exactly
    MAX_DATA_BYTES is read; one byte more is refused before a byte of it is read."""
    name = f"{LINEAR}.weight.quant_state.bitsandbytes__nf4"

    def pad(state: dict) -> None:
        raw = bytes(state[name].tolist())
        state[name] = torch.tensor(list(raw + b" " * (size - len(raw))), dtype=torch.uint8)

    root = _copy(made["nf4"], tmp_path / "nf4", None, pad)
    if refused:
        with pytest.raises(BadInput, match=f"holds {size} bytes"):
            open_checkpoint(root)
    else:
        ckpt = open_checkpoint(root)
        assert ckpt.quantization is not None and ckpt.shapes[f"{LINEAR}.weight"] == (256, 256)


# --- class 4: MXFP4's scales are uint8 exponents ---------------------------------------------

EXPERTS = "model.layers.0.mlp.experts.down_proj"


def _mxfp4(root: Path, scales_dtype: torch.dtype) -> Path:
    """gpt-oss's released layout for one fused expert tensor: ``_blocks`` uint8 [E, rows,
    groups, 16] and ``_scales`` [E, rows, groups] (uint8 E8M0 exponents as released)."""
    root.mkdir()
    save_file({f"{EXPERTS}_blocks": torch.zeros(2, 64, 2, 16, dtype=torch.uint8),
               f"{EXPERTS}_scales": torch.full((2, 64, 2), 127).to(scales_dtype)},
              str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}}))
    return root


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.bfloat16, torch.float32])
def test_mxfp4_scales_of_another_dtype_are_refused(tmp_path, dtype):
    """E8M0 exponents are one uint8 each; the same shape in int8, bf16 or float32 holds
    something else (and as many bytes again), so it is refused naming its dtype."""
    root = _mxfp4(tmp_path / "mxfp4", dtype)
    if dtype == torch.uint8:
        ckpt = open_checkpoint(root)
        assert ckpt.shapes[EXPERTS] == (2, 64, 64)
        assert ckpt.auxiliary[f"{EXPERTS}_scales"].startswith("MXFP4 group exponents")
        return
    shown = str(dtype).removeprefix("torch.")
    with pytest.raises(BadInput, match=rf"_scales is {shown} \[2, 64, 2\]"):
        open_checkpoint(root)


# --- class 5: the older keys a quantizer wrote are read as quantization_config -----------------

def test_compression_config_is_read_as_quantization_config(made, tmp_path):
    """Early llm-compressor releases saved the scheme under ``compression_config``: the same
    checkpoint is read the same under either key, never as dense packed words."""
    def rename(config: dict) -> None:
        config["compression_config"] = config.pop("quantization_config")

    want = open_checkpoint(made["ct"])
    ckpt = open_checkpoint(_copy(made["ct"], tmp_path / "old", rename))
    assert ckpt.quantization is not None and want.quantization is not None
    assert ckpt.quantization.as_dict() == want.quantization.as_dict()
    assert ckpt.shapes == want.shapes


def test_autogptqs_quantize_config_json_is_read_as_its_quantization_config(made, tmp_path):
    """AutoGPTQ writes its scheme to quantize_config.json beside a config.json without one."""
    sidecar = {}

    def move(config: dict) -> None:
        sidecar.update(config.pop("quantization_config"))
        sidecar.pop("quant_method")

    root = _copy(made["gptq"], tmp_path / "autogptq", move)
    (root / "quantize_config.json").write_text(json.dumps(sidecar))
    want = open_checkpoint(made["gptq"])
    ckpt = open_checkpoint(root)
    assert ckpt.quantization is not None and want.quantization is not None
    assert ckpt.quantization.as_dict() == want.quantization.as_dict()
    assert ckpt.shapes == want.shapes
