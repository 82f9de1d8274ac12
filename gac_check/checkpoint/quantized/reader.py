"""Quantized safetensors checkpoints read at their logical widths, with their own scheme.

A quantized checkpoint stores each linear in a packed form whose shape is not the linear's:
llm-compressor's ``pack-quantized`` keeps ``X.weight_packed`` int32 [out, in/8]; GPTQ keeps
``X.qweight`` int32 [in/8, out]; bitsandbytes' NF4 keeps ``X.weight`` uint8 [in*out/2, 1]. Read
as dense, such a model shows only its embeddings, counts packed words as parameters and
passes (issue 27). Here each layout is recognised from ``config.json``'s
``quantization_config`` and its tensor names, every quantized linear becomes one logical
``X.weight`` :class:`TensorInfo` of shape [out, in] (so formats, sites and parameter counts
work unchanged), the physical tensors behind it are kept (:attr:`Quantization.backing`: never
to be written as if dense) and every auxiliary tensor (scales, zero points, group indices,
shapes, quantization states) goes to :attr:`Checkpoint.auxiliary`. A ``quantization_config``,
method, format or tensor this module does not understand is a refusal, never a dense read.

The layouts, as the libraries that write them define them:

- compressed-tensors (neuralmagic/compressed-tensors, written by vllm-project/llm-compressor),
  ``compressed_tensors/compressors/pack_quantized/base.py``,
  ``PackedQuantizationCompressor.compress`` (0.20.0): ``weight_packed`` int32
  [out, ceil(in * bits / 32)], ``weight_shape`` = ``torch.tensor(weight.shape)`` (the only exact
  record of ``in``: the packed width pins it to within 32/bits), ``weight_scale`` [out,
  ceil(in/group)] (group), [out, 1] (channel), ``weight_zero_point`` packed along dim 0 when
  asymmetric, ``weight_g_idx`` [in] with activation ordering. ``int-quantized`` /
  ``float-quantized`` / ``naive-quantized`` keep ``weight`` at [out, in] (int8 / float8_e4m3fn)
  beside ``weight_scale`` (and ``input_scale`` for static activations).
- GPTQ: AutoGPTQ ``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`` ``QuantLinear.__init__``
  and GPTQModel ``gptqmodel/nn_modules/qlinear/__init__.py`` ``PackableQuantLinear``:
  ``qweight`` int32 [in * bits / 32, out], ``qzeros`` int32 [ceil(in/group), out * bits / 32],
  ``scales`` [ceil(in/group), out], ``g_idx`` int32 [in] (GPTQModel writes ceil groups, so 688
  with group 128 has 6 group rows); ``desc_act`` in the config.
- AWQ: AutoAWQ ``awq/modules/linear/gemm.py`` ``WQLinear_GEMM.__init__``: ``qweight`` int32
  [in, out * bits / 32], ``qzeros`` [in/group, out * bits / 32], ``scales`` [in/group, out];
  ``awq/modules/linear/gemv.py`` ``WQLinear_GEMV``: ``qweight`` [out, in * bits / 32],
  ``scales`` and ``qzeros`` [out, ...] (their widths padded by ``calculate_zeros_width``).
- FP8 (transformers ``integrations/finegrained_fp8.py``, the DeepSeek-V3 / Qwen3 FP8
  releases): ``weight`` float8_e4m3fn [out, in] and ``weight_scale_inv`` float32
  [ceil(out/b0), ceil(in/b1)] for ``weight_block_size`` [b0, b1].
- bitsandbytes (bitsandbytes ``bitsandbytes/nn/modules.py`` ``Params4bit`` /
  ``Linear4bit._save_to_state_dict`` and ``bitsandbytes/functional.py``
  ``QuantState.as_dict(packed=True)``): 4-bit ``weight`` uint8 [ceil(out*in/2), 1] beside
  ``weight.absmax``, ``weight.quant_map``, ``weight.nested_absmax``,
  ``weight.nested_quant_map`` and ``weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``), a
  uint8 tensor holding the JSON of the state, whose ``shape`` is the logical [out, in];
  8-bit (``Linear8bitLt._save_to_state_dict``): ``weight`` int8 [out, in], ``SCB`` [out] and,
  in older releases, ``weight_format``.

- MXFP4 (gpt-oss's experts): :mod:`gac_check.checkpoint.quantized.mxfp4`.

Only two layouts keep a logical width in tensor data (compressed-tensors' ``weight_shape``,
bitsandbytes' quantization state): those few bytes are read through
:func:`gac_check.checkpoint.files.open_regular`, at most :data:`MAX_DATA_BYTES` each.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from gac_check.checkpoint.quantized.bnb import read_bitsandbytes
from gac_check.checkpoint.quantized.gptq import INT_DTYPE, read_awq, read_gptq
from gac_check.checkpoint.quantized.layout import (
    MAX_DATA_BYTES,
    ByteReader,
    Checkpoint,
    Layout,
    config_bits,
    config_int,
    group_note,
    hub_reader,
    local_bytes,
)
from gac_check.checkpoint.quantized.marks import (
    METHODS,
    quantization_config,
    refuse_stray_packed,
)
from gac_check.checkpoint.quantized.mxfp4 import read_mxfp4
from gac_check.checkpoint.quantized.scheme import STRATEGIES, Quantization
from gac_check.checkpoint.tensorinfo import IN_MEMORY
from gac_check.errors import BadInput

CT_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized")
#: Per-attention KV-cache scales (compressed-tensors ``initialize_module_for_quantization``
#: registers ``self_attn.k_scale`` / ``v_scale`` for a ``kv_cache_scheme``).
KV_SCALES = (".k_scale", ".v_scale", ".q_scale")
#: The dtypes a compressed-tensors int-/float-quantized or FP8 weight is stored in: such a
#: ``.weight`` with no scale beside it is a linear that lost its scale, not a dense one.
QUANTIZED_DTYPES = ("int8", "float8_e4m3fn", "float8_e5m2")


def read_quantization(ckpt: Checkpoint, read: ByteReader | None = None) -> Checkpoint:
    """``ckpt`` with its quantized linears at their logical widths, or unchanged when it is not
    quantized. ``read`` fetches a tensor's bytes (default: from its local file, bounded)."""
    qc = quantization_config(ckpt)
    if qc is None:
        refuse_stray_packed(ckpt)
        return ckpt
    if ckpt.container not in ("safetensors", IN_MEMORY):
        raise BadInput(f"config.json says it is quantized, but its weights are a "
                       f"{ckpt.container} pickle; gac-check reads quantized checkpoints from "
                       "safetensors only", ckpt.path)
    method = qc.get("quant_method")
    reader = _READERS.get(method) if isinstance(method, str) else None
    if reader is None:
        raise BadInput(f"config.json's quantization_config has quant_method {method!r}, which "
                       f"gac-check does not read (it reads {', '.join(METHODS)}); refusing "
                       "rather than judging packed tensors as dense", ckpt.path)
    layout = Layout(ckpt, qc, read or local_bytes)
    quant = reader(layout)
    for name in ckpt.tensors:  # compressed-tensors' kv_cache_scheme, FP8 releases' KV scales
        if name.endswith(KV_SCALES):
            layout.aux(name, "KV-cache quantization scale")
    return layout.result(quant)  # type: ignore[return-value]  # a replace() of ckpt


# --- compressed-tensors --------------------------------------------------------------------

def _compressed_tensors(layout: Layout) -> Quantization:
    qc = layout.qc
    fmt = qc.get("format")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise layout.refuse("config.json's compressed-tensors quantization_config has no "
                            "config_groups")
    schemes = [g for g in groups.values() if isinstance(g, dict)]
    if len(schemes) != len(groups):
        raise layout.refuse("config.json's compressed-tensors config_groups hold a group that "
                            "is not an object")
    weights = [s.get("weights") for s in schemes]
    if any(not isinstance(w, dict) for w in weights) or any(w != weights[0] for w in weights):
        raise layout.refuse("config.json's compressed-tensors config_groups quantize weights "
                            "in more than one way (or not at all); gac-check reads one weight "
                            "scheme per checkpoint")
    fmts = {s.get("format", fmt) for s in schemes}
    if len(fmts) != 1 or next(iter(fmts)) not in CT_FORMATS:
        raise layout.refuse(f"config.json's compressed-tensors format {sorted(map(str, fmts))} "
                            f"is not one gac-check reads ({', '.join(CT_FORMATS)})")
    fmt = next(iter(fmts))
    w = weights[0]
    strategy = w.get("strategy")
    if strategy not in STRATEGIES:
        raise layout.refuse(f"config.json's compressed-tensors weight strategy {strategy!r} is "
                            f"not one gac-check reads ({', '.join(STRATEGIES)})")
    wtype = w.get("type", "int")
    if wtype not in ("int", "float"):
        raise layout.refuse(f"config.json's compressed-tensors weight type {wtype!r} is not "
                            "int or float")
    bits = config_bits(w.get("num_bits"), layout, (2, 3, 4, 8) if wtype == "int" else (8,))
    acts = [s.get("input_activations") for s in schemes]
    act = acts[0] if isinstance(acts[0], dict) else None
    activations = None
    if act is not None:
        activations = "float8_e4m3fn" if act.get("type") == "float" else "int8"
    block = w.get("block_structure")
    ignore = qc.get("ignore") or []
    quant = Quantization(
        "compressed-tensors", fmt, bits, wtype, strategy,
        group_size=config_int(w.get("group_size"), "group_size", layout) if strategy == "group"
        else None,
        block=tuple(block) if strategy == "block" and isinstance(block, list) else None,
        symmetric=bool(w.get("symmetric", True)),
        act_order=w.get("actorder") not in (None, False),
        group_act_order=w.get("actorder") in ("group", "dynamic", True),
        activations=activations,
        activations_dynamic=None if act is None else bool(act.get("dynamic", False)),
        activations_symmetric=None if act is None else bool(act.get("symmetric", True)),
        ignored=tuple(str(x) for x in ignore) if isinstance(ignore, list) else ())
    needs = _ct_needs(quant, w.get("actorder"), act)
    if fmt == "pack-quantized":
        _ct_packed(layout, quant, needs)
    else:
        _ct_unpacked(layout, quant, needs)
    layout.consistent(list(quant.quantized), tuple("." + x for x in CT_AUX))
    return quant


CT_AUX = {"weight_scale": "quantization scale", "weight_zero_point": "quantization zero point",
          "weight_g_idx": "activation-order group index", "weight_shape": "logical weight shape",
          "input_scale": "activation scale", "input_zero_point": "activation zero point",
          "weight_global_scale": "global weight scale", "input_global_scale":
          "global activation scale", "output_scale": "output scale"}


def _ct_needs(quant: Quantization, actorder: object, act: dict | None) -> dict[str, str]:
    """The auxiliary tensors every linear of this scheme stores, as compressed-tensors writes
    them (``compressors/base.py`` ``BaseCompressor.compress`` drops a symmetric scheme's zero
    points; ``quantization/lifecycle/initialize.py`` ``initialize_module_for_quantization``
    registers ``weight_g_idx`` for ``actorder: group`` and ``input_scale`` for static
    activations), each with why a linear without it cannot be read."""
    needs = {".weight_scale": "the scale its weights are dequantized with"}
    if quant.symmetric is False:
        needs[".weight_zero_point"] = "the scheme is asymmetric and this is its zero point"
    if actorder == "group":
        needs[".weight_g_idx"] = "actorder is group, and this is the group of each input column"
    if act is not None and not act.get("dynamic", False):
        needs[".input_scale"] = "the activations are quantized with static scales"
        if act.get("symmetric", True) is False:
            needs[".input_zero_point"] = "the static activation scheme is asymmetric"
    return needs


def _ct_packed(layout: Layout, quant: Quantization, needs: dict[str, str]) -> None:
    modules = layout.modules(".weight_packed")
    layout.prefetch([m + ".weight_shape" for m in modules if layout.has(m + ".weight_shape")])
    for m in modules:
        packed = layout.t(m + ".weight_packed")
        layout.require(m + ".weight_shape", f"the only record of {m}.weight_packed's logical "
                       "width")
        out, width = _shape_of(layout, m + ".weight_shape")
        for suffix, why in needs.items():
            layout.require(m + suffix, why)
        cols = math.ceil(width * quant.bits / 32)
        if packed.dtype != "int32" or packed.shape != (out, cols):
            raise layout.refuse(f"{m}.weight_packed is {packed.dtype} {list(packed.shape)}, but "
                                f"{m}.weight_shape [{out}, {width}] at {quant.bits} bits packs "
                                f"to int32 [{out}, {cols}]")
        _ct_scale(layout, quant, m, out, width)
        group_note(quant, m, width, "input width")
        pack = 32 // quant.bits
        if width % pack:
            quant.notes.append(f"{m}: input width {width} is not a multiple of the pack factor "
                               f"{pack}: its last int32 word is partly padding")
        layout.unknown_tensors(m, ("weight_packed", *CT_AUX))
        for suffix, what in CT_AUX.items():
            layout.aux(f"{m}.{suffix}", what)
        dtype = INT_DTYPE.get(quant.bits, f"int{quant.bits}")
        layout.replace(m, (out, width), dtype, (m + ".weight_packed",))
    quant.quantized = tuple(modules)


def _ct_unpacked(layout: Layout, quant: Quantization, needs: dict[str, str]) -> None:
    """int-/float-/naive-quantized: ``weight`` keeps its logical shape beside its scale."""
    modules = layout.modules(".weight_scale")
    layout.stray_weights(modules, QUANTIZED_DTYPES, ".weight_scale")
    for m in modules:
        for suffix, why in needs.items():
            layout.require(m + suffix, why)
        if not layout.has(m + ".weight"):
            raise layout.refuse(f"{m}.weight_scale has no {m}.weight beside it")
        w = layout.t(m + ".weight")
        if len(w.shape) != 2:
            raise layout.refuse(f"{m}.weight is {list(w.shape)}, not a matrix")
        _ct_scale(layout, quant, m, *w.shape)
        group_note(quant, m, w.shape[1], "input width")
        layout.unknown_tensors(m, ("weight", *CT_AUX))
        for suffix, what in CT_AUX.items():
            layout.aux(f"{m}.{suffix}", what)
        layout.backing[m + ".weight"] = (m + ".weight",)
    quant.quantized = tuple(modules)


def _ct_scale(layout: Layout, quant: Quantization, m: str, out: int, width: int) -> None:
    """``weight_scale``'s shape against the strategy: a scale that contradicts it means the
    scheme is not the one the config says."""
    shape = layout.t(m + ".weight_scale").shape
    if quant.strategy == "group":
        want: tuple[tuple[int, ...], ...] = ((out, math.ceil(width / quant.group_size)),)
    elif quant.strategy == "channel":
        want = ((out, 1), (out,))
    elif quant.strategy == "tensor":
        want = ((1,), (), (1, 1))
    else:
        b = quant.block or (128, 128)
        want = ((math.ceil(out / b[0]), math.ceil(width / b[1])),)
    if shape not in want:
        raise layout.refuse(f"{m}.weight_scale is {list(shape)}; a {quant.granularity} scale "
                            f"of a [{out}, {width}] weight is {list(want[0])}")


def _shape_of(layout: Layout, name: str) -> tuple[int, int]:
    """The two integers of a ``weight_shape`` tensor (int32 or int64, little-endian)."""
    info = layout.t(name)
    size = {"int64": 8, "int32": 4}.get(info.dtype)
    if size is None or info.shape != (2,):
        raise layout.refuse(f"{name} is {info.dtype} {list(info.shape)}, not the two integers "
                            "of a weight shape")
    raw = layout.data(name)
    if len(raw) != 2 * size:
        raise layout.refuse(f"{name} holds {len(raw)} bytes, not two {info.dtype} integers")
    out, width = (int.from_bytes(raw[i:i + size], "little", signed=True) for i in (0, size))
    if out < 1 or width < 1:
        raise layout.refuse(f"{name} says [{out}, {width}], not a weight shape")
    return out, width


# --- FP8 (fine-grained, DeepSeek / Qwen releases) ------------------------------------------

def _fp8(layout: Layout) -> Quantization:
    qc = layout.qc
    block = qc.get("weight_block_size")
    if block is not None and (not isinstance(block, list) or len(block) != 2
                              or not all(type(b) is int and b > 0 for b in block)):
        raise layout.refuse(f"config.json's weight_block_size {block!r} is not two positive "
                            "integers")
    act = qc.get("activation_scheme", "dynamic")
    quant = Quantization("fp8", "block-fp8" if block else "fp8", 8, "float",
                         "block" if block else "tensor", block=tuple(block) if block else None,
                         activations="float8_e4m3fn", activations_dynamic=act == "dynamic",
                         activations_symmetric=True,
                         ignored=tuple(qc.get("modules_to_not_convert") or ()))
    suffix = ".weight_scale_inv" if block else ".weight_scale"
    strategies: set[str] = set()
    modules = layout.modules(suffix)
    layout.stray_weights(modules, QUANTIZED_DTYPES, suffix)
    layout.consistent(modules, (".input_scale", ".activation_scale"))
    for m in modules:
        w = layout.t(m + ".weight") if layout.has(m + ".weight") else None
        if w is None or len(w.shape) != 2:
            raise layout.refuse(f"{m}{suffix} has no matrix {m}.weight beside it")
        out, width = w.shape
        scale = layout.t(m + suffix).shape
        if block:
            want = (math.ceil(out / block[0]), math.ceil(width / block[1]))
            if scale != want:
                raise layout.refuse(f"{m}{suffix} is {list(scale)}; block {block} on "
                                    f"[{out}, {width}] stores {list(want)}")
            for axis, n, b in (("output width", out, block[0]), ("input width", width, block[1])):
                if n % b:
                    quant.notes.append(f"{m}: {axis} {n} is not a multiple of the FP8 block "
                                       f"{b}: its last block is partial")
        else:
            strategies.add(_fp8_strategy(layout, m + suffix, scale, out, width))
        if layout.t(m + suffix).dtype not in SCALE_DTYPES:
            raise layout.refuse(f"{m}{suffix} is {layout.t(m + suffix).dtype}: an FP8 weight "
                                f"scale is a float ({', '.join(SCALE_DTYPES)})")
        layout.unknown_tensors(m, ("weight", suffix[1:], "input_scale", "activation_scale"))
        layout.aux(m + suffix, "FP8 weight scale")
        layout.aux(m + ".input_scale", "FP8 activation scale")
        layout.aux(m + ".activation_scale", "FP8 activation scale")
        layout.backing[m + ".weight"] = (m + ".weight",)
    if len(strategies) > 1:
        raise layout.refuse("its FP8 weight scales are per tensor in some linears and per "
                            "output channel in others; one checkpoint holds one scheme")
    quant.strategy = strategies.pop() if strategies else quant.strategy
    if act == "static":
        quant.notes.append("activations are quantized with static scales (input_scale)")
    quant.quantized = tuple(modules)
    return quant


#: The dtypes an FP8 weight scale is stored in (transformers' FP8 integration and vLLM's
#: Fp8LinearMethod read float32; bfloat16 and float16 scales load too).
SCALE_DTYPES = ("float32", "bfloat16", "float16")


def _fp8_strategy(layout: Layout, name: str, scale: tuple[int, ...], out: int,
                  width: int) -> str:
    """Per tensor (one scale) or per output channel (one per row), read from the scale's
    shape; any other shape is a layout gac-check does not know, never guessed as either."""
    if scale in ((), (1,), (1, 1)):
        return "tensor"
    if scale in ((out, 1), (out,)):
        return "channel"
    raise layout.refuse(f"{name} is {list(scale)}: neither one scale for the tensor nor one "
                        f"per output row of [{out}, {width}] ([{out}, 1])")


_READERS: dict[str, Callable[[Layout], Quantization]] = {
    "compressed-tensors": _compressed_tensors, "gptq": read_gptq, "awq": read_awq, "fp8": _fp8,
    "bitsandbytes": read_bitsandbytes, "mxfp4": read_mxfp4,
}

__all__ = ["MAX_DATA_BYTES", "METHODS", "Quantization", "hub_reader", "local_bytes",
           "quantization_config", "read_quantization"]
