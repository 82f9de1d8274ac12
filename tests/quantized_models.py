"""Quantized checkpoints written in tests, in each format's documented layout, from a real tiny
transformers Llama: compressed-tensors ``pack-quantized`` (packed by compressed-tensors' own
``pack_to_int32``), ``float-quantized`` FP8, GPTQ (AutoGPTQ / GPTQModel's layout), AWQ GEMM,
block FP8 (DeepSeek's), bitsandbytes NF4 and 8-bit as ``save_pretrained`` writes them, and a
method nobody knows. The layouts and their sources: gac_check/checkpoint/quantized/reader.py.

The weights are quantized for real (symmetric round-to-nearest per group), so the packed
integers are what the format's own unpacking turns back into a [out, in] matrix.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gac_check.testing.models import LLAMA, build

#: A Llama small enough to build in a second with widths group 128 can split: hidden 256,
#: 4 heads of 64; ``intermediate`` is what each test prunes.
BASE = {**LLAMA, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 256,
        "intermediate_size": 688}


def model(intermediate: int):
    return build("llama", {**BASE, "intermediate_size": intermediate}, dtype=torch.float16)


def linears(m) -> dict[str, torch.Tensor]:
    """The quantized linears (every projection of every layer; lm_head stays dense)."""
    return {name: mod.weight.detach() for name, mod in m.named_modules()
            if isinstance(mod, torch.nn.Linear) and ".layers." in name}


def _dense_rest(m, quantized: dict) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in m.state_dict().items()
            if k.removesuffix(".weight") not in quantized}


def _config(m, quantization_config: dict | None) -> dict:
    cfg = m.config.to_dict()
    cfg["torch_dtype"] = "float16"
    cfg.pop("dtype", None)
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    return cfg


def _write(root: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(config))
    return root


def dense(root: Path, intermediate: int) -> Path:
    m = model(intermediate)
    return _write(root, _dense_rest(m, {}), _config(m, None))


def quantize_groups(w: torch.Tensor, group: int,
                    bits: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest: (q in [-2^(b-1), 2^(b-1)-1] as int8 [out, in], scale
    [out, ceil(in/group)]); the last group may be partial."""
    out, width = w.shape
    groups = math.ceil(width / group)
    qmax = 2 ** (bits - 1) - 1
    scale = torch.empty(out, groups, dtype=torch.float32)
    q = torch.empty(out, width, dtype=torch.int8)
    for g in range(groups):
        part = w[:, g * group:(g + 1) * group].float()
        s = part.abs().amax(dim=1).clamp(min=1e-8) / qmax
        scale[:, g] = s
        q[:, g * group:(g + 1) * group] = (part / s[:, None]).round().clamp(-qmax - 1, qmax)
    return q, scale


# --- compressed-tensors (llm-compressor) ----------------------------------------------------

def ct_config(fmt: str, weights: dict, activations: dict | None = None) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status":
            "compressed", "ignore": ["lm_head"], "config_groups": {"group_0": {
                "targets": ["Linear"], "weights": weights, "input_activations": activations,
                "output_activations": None, "format": fmt}}}


W4A16 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
         "group_size": 128, "actorder": None, "block_structure": None, "dynamic": False}


def compressed_tensors_w4a16(root: Path, intermediate: int, group: int = 128) -> Path:
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        tensors.update(_ct_w4a16_linear(name, w, group))
    cfg = ct_config("pack-quantized", {**W4A16, "group_size": group})
    return _write(root, tensors, _config(m, cfg))


def _ct_w4a16_linear(name: str, w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    q, scale = quantize_groups(w, group)
    return {f"{name}.weight_packed": pack_to_int32(q, 4),
            f"{name}.weight_scale": scale.half(),
            f"{name}.weight_shape": torch.tensor(w.shape)}


def compressed_tensors_fp8(root: Path, intermediate: int) -> Path:
    """FP8_DYNAMIC: float8_e4m3fn weights, one scale per output channel, dynamic tokens."""
    return _per_channel_8bit(root, intermediate, "float")


# --- GPTQ (AutoGPTQ / GPTQModel) --------------------------------------------------------------

def _pack_rows(u: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """Unsigned values [rows, cols] -> int32 [rows * bits / 32, cols], 8 rows per word, the
    lowest bits first (GPTQ's qweight)."""
    per = 32 // bits
    u = u.to(torch.int64).reshape(-1, per, u.shape[1])
    word = sum(u[:, k, :] << (bits * k) for k in range(per))
    return (word - (word >= 2 ** 31).to(torch.int64) * 2 ** 32).to(torch.int32)  # as int32 bits


def gptq(root: Path, intermediate: int, group: int = 128, desc_act: bool = False) -> Path:
    """GPTQModel's layout: qweight [in/8, out], qzeros [ceil(in/g), out/8], scales
    [ceil(in/g), out], g_idx [in] (ceil groups where the width does not divide)."""
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        tensors.update(_gptq_linear(name, w, group))
    return _write(root, tensors, _config(m, gptq_config(group, desc_act)))


def gptq_config(group: int = 128, desc_act: bool = False) -> dict:
    return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": desc_act,
            "sym": True, "checkpoint_format": "gptq"}


def _gptq_linear(name: str, w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    q, scale = quantize_groups(w, group)
    out, width = w.shape
    zeros = torch.full((scale.shape[1], out), 8, dtype=torch.int32)
    return {f"{name}.qweight": _pack_rows((q.int() + 8).t()),
            f"{name}.qzeros": _pack_rows(zeros.t()).t().contiguous(),
            f"{name}.scales": scale.t().half().contiguous(),
            f"{name}.g_idx": (torch.arange(width) // group).to(torch.int32)}


#: how each scheme writes one linear, and its quantization_config, for :func:`quantized_moe`
MOE_SCHEMES = {
    "gptq": (lambda name, w, g: _gptq_linear(name, w, g), lambda g: gptq_config(g)),
    "awq": (lambda name, w, g: _awq_linear(name, w, g), lambda g: awq_config(g)),
    "ct_w4a16": (lambda name, w, g: _ct_w4a16_linear(name, w, g),
                 lambda g: ct_config("pack-quantized", {**W4A16, "group_size": g})),
    # llm-compressor's FP8_DYNAMIC and DeepSeek-style 128x128 block FP8 (the group unused)
    "ct_fp8": (lambda name, w, g: _per_channel_8bit_linear(name, w, "float"),
               lambda g: per_channel_8bit_config("float")),
    "fp8_block": (lambda name, w, g: _block_fp8_linear(name, w, 128),
                  lambda g: block_fp8_config(128)),
}


def quantized_moe(root: Path, saved: Path, scheme: str, group: int = 128) -> Path:
    """A ``save_pretrained`` MoE directory (one module per expert) quantized as GPTQModel,
    AutoAWQ or llm-compressor write an MoE: every expert's and attention projection in the
    scheme's layout; the router, the embeddings and the head stay dense (none of them
    quantizes the router)."""
    write, config = MOE_SCHEMES[scheme]
    state = load_file(saved / "model.safetensors")
    tensors: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        module = name.removesuffix(".weight")
        if (w.dim() == 2 and ".layers." in name and name.endswith(".weight")
                and not module.endswith(".gate")):
            tensors.update(write(module, w.half(), group))
        else:
            tensors[name] = w.half() if w.is_floating_point() else w
    cfg = json.loads((saved / "config.json").read_text())
    cfg["quantization_config"] = {**config(group), "ignore": ["lm_head", "re:.*gate$"]} \
        if scheme.startswith("ct_") else config(group)
    return _write(root, tensors, cfg)


def awq_gemm(root: Path, intermediate: int, group: int = 128) -> Path:
    """AutoAWQ's WQLinear_GEMM: qweight [in, out/8], qzeros [in/g, out/8], scales [in/g, out]."""
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        tensors.update(_awq_linear(name, w, group))
    return _write(root, tensors, _config(m, awq_config(group)))


def awq_config(group: int = 128) -> dict:
    return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
            "version": "gemm"}


def _awq_linear(name: str, w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    q, scale = quantize_groups(w, group)
    out, width = w.shape
    zeros = torch.full((out, width // group), 8, dtype=torch.int32)
    return {f"{name}.qweight": _pack_rows(q.int() + 8).t().contiguous(),  # [in, out/8]
            f"{name}.qzeros": _pack_rows(zeros).t().contiguous(),
            f"{name}.scales": scale.t().half().contiguous()}


def block_fp8(root: Path, intermediate: int, block: int = 128) -> Path:
    """DeepSeek-V3 / Qwen3 FP8: float8_e4m3fn weight, weight_scale_inv [ceil(out/b), ceil(in/b)]."""
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        tensors.update(_block_fp8_linear(name, w, block))
    return _write(root, tensors, _config(m, block_fp8_config(block)))


def _block_fp8_linear(name: str, w: torch.Tensor, block: int) -> dict[str, torch.Tensor]:
    out, width = w.shape
    return {f"{name}.weight": w.float().clamp(-448, 448).to(torch.float8_e4m3fn),
            f"{name}.weight_scale_inv": torch.ones(math.ceil(out / block),
                                                   math.ceil(width / block))}


def block_fp8_config(block: int = 128) -> dict:
    return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
            "weight_block_size": [block, block]}


# --- bitsandbytes ---------------------------------------------------------------------------

def bnb_nf4(root: Path, intermediate: int, blocksize: int = 64, nested: bool = False) -> Path:
    """``save_pretrained`` of a 4-bit model: weight uint8 [ceil(out*in/2), 1] and the
    QuantState packed beside it (absmax, quant_map, the JSON state as uint8); ``nested``
    (``bnb_4bit_use_double_quant``): absmax itself quantized, ``nested_absmax`` and
    ``nested_quant_map`` beside it and ``nested_blocksize`` / ``nested_offset`` in the JSON
    (``QuantState.as_dict``)."""
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        n = w.numel()
        tensors[f"{name}.weight"] = torch.zeros(math.ceil(n / 2), 1, dtype=torch.uint8)
        tensors[f"{name}.weight.absmax"] = torch.ones(math.ceil(n / blocksize))
        tensors[f"{name}.weight.quant_map"] = torch.linspace(-1, 1, 16)
        state = {"quant_type": "nf4", "blocksize": blocksize, "dtype": "float16",
                 "shape": list(w.shape)}
        if nested:
            tensors[f"{name}.weight.absmax"] = torch.zeros(math.ceil(n / blocksize),
                                                           dtype=torch.uint8)
            tensors[f"{name}.weight.nested_absmax"] = torch.ones(1)
            tensors[f"{name}.weight.nested_quant_map"] = torch.linspace(-1, 1, 256)
            state.update(nested_blocksize=256, nested_dtype="float32", nested_offset=0.5)
        raw = json.dumps(state).encode()
        tensors[f"{name}.weight.quant_state.bitsandbytes__nf4"] = torch.tensor(list(raw),
                                                                               dtype=torch.uint8)
    cfg = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
           "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "float16",
           "bnb_4bit_use_double_quant": nested}
    return _write(root, tensors, _config(m, cfg))


def bnb_int8(root: Path, intermediate: int) -> Path:
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        scb = w.float().abs().amax(dim=1)
        tensors[f"{name}.weight"] = (w.float() / scb[:, None] * 127).round().to(torch.int8)
        tensors[f"{name}.SCB"] = scb
        tensors[f"{name}.weight_format"] = torch.tensor(0, dtype=torch.uint8)
    cfg = {"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False}
    return _write(root, tensors, _config(m, cfg))


def mystery(root: Path, intermediate: int) -> Path:
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        tensors[f"{name}.qweight_mystery"] = torch.zeros(w.shape[0], w.shape[1] // 8,
                                                         dtype=torch.int32)
    return _write(root, tensors, _config(m, {"quant_method": "mystery", "bits": 4}))


def awq_gemv(root: Path, intermediate: int, group: int = 128) -> Path:
    """AutoAWQ's WQLinear_GEMV: qweight [out, in/8], scales [out, zeros_width * 8], qzeros
    [out, zeros_width] with zeros_width = ceil(in / group / 8) (calculate_zeros_width)."""
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        q, _ = quantize_groups(w, group)
        out, width = w.shape
        zw = math.ceil(width // group / 8)
        tensors[f"{name}.qweight"] = _pack_rows((q.int() + 8).t()).t().contiguous()
        tensors[f"{name}.scales"] = torch.ones(out, zw * 8, dtype=torch.float16)
        tensors[f"{name}.qzeros"] = torch.zeros(out, zw, dtype=torch.int32)
    cfg = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
           "version": "gemv"}
    return _write(root, tensors, _config(m, cfg))


def compressed_tensors_w8a8(root: Path, intermediate: int) -> Path:
    """INT8 W8A8 (llm-compressor's SmoothQuant + GPTQ recipe): int8 weights per channel,
    dynamic per-token int8 activations."""
    return _per_channel_8bit(root, intermediate, "int")


def _per_channel_8bit(root: Path, intermediate: int, kind: str,
                      activations: str = "dynamic") -> Path:
    """compressed-tensors' 8-bit weights with one scale per output channel: ``kind`` "float"
    (float8_e4m3fn) or "int" (int8, rounded); ``activations`` "dynamic" per token, "static"
    per tensor (an ``input_scale`` beside each weight), "asymmetric" dynamic per token with a
    zero point, or "none" (weight-only, W8A16)."""
    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        tensors.update(_per_channel_8bit_linear(name, w, kind))
        if activations == "static":
            tensors[f"{name}.input_scale"] = torch.tensor([0.02], dtype=torch.float16)
    cfg = per_channel_8bit_config(kind)
    group = cfg["config_groups"]["group_0"]
    scheme = {"num_bits": 8, "type": kind, "symmetric": True}
    group["input_activations"] = {
        "dynamic": group["input_activations"], "none": None,
        "static": {**scheme, "strategy": "tensor", "dynamic": False},
        "asymmetric": {**scheme, "strategy": "token", "dynamic": True, "symmetric": False},
    }[activations]
    return _write(root, tensors, _config(m, cfg))


def compressed_tensors_8bit(root: Path, intermediate: int, kind: str, activations: str) -> Path:
    """compressed-tensors FP8 or INT8 per channel with the activations ``activations``
    (:func:`_per_channel_8bit`): the schemes vLLM runs on different kernels."""
    return _per_channel_8bit(root, intermediate, kind, activations)


def _per_channel_8bit_linear(name: str, w: torch.Tensor, kind: str) -> dict[str, torch.Tensor]:
    top, dtype = (448.0, torch.float8_e4m3fn) if kind == "float" else (127.0, torch.int8)
    scale = w.float().abs().amax(dim=1, keepdim=True) / top
    q = w.float() / scale
    return {f"{name}.weight": (q if kind == "float" else q.round()).to(dtype),
            f"{name}.weight_scale": scale.half()}


def per_channel_8bit_config(kind: str) -> dict:
    scheme = {"num_bits": 8, "type": kind, "symmetric": True}
    return ct_config(f"{kind}-quantized", {**scheme, "strategy": "channel"},
                     {**scheme, "strategy": "token", "dynamic": True})


def compressed_tensors_w4a16_channel(root: Path, intermediate: int) -> Path:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    m = model(intermediate)
    tensors = _dense_rest(m, linears(m))
    for name, w in linears(m).items():
        q, scale = quantize_groups(w, w.shape[1])
        tensors[f"{name}.weight_packed"] = pack_to_int32(q, 4)
        tensors[f"{name}.weight_scale"] = scale.half()  # [out, 1]
        tensors[f"{name}.weight_shape"] = torch.tensor(w.shape)
    cfg = ct_config("pack-quantized", {**W4A16, "strategy": "channel", "group_size": None})
    return _write(root, tensors, _config(m, cfg))
