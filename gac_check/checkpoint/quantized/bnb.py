"""bitsandbytes checkpoints (``quant_method: "bitsandbytes"``) as ``save_pretrained`` writes
them, read at their logical [out, in] (the layouts: :mod:`gac_check.checkpoint.quantized.reader`).

Every 4-bit linear needs its ``weight.quant_state.bitsandbytes__<type>`` (the JSON holding its
shape), ``weight.absmax`` and ``weight.quant_map``, and ``weight.nested_absmax`` /
``weight.nested_quant_map`` where the state says it is double-quantized
(bitsandbytes ``functional.py`` ``QuantState.as_dict``: the nested tensors and
``nested_blocksize`` / ``nested_offset`` are written together, and ``QuantState.from_dict``
reads them back together); every 8-bit linear its ``SCB`` row scale
(``Linear8bitLt._save_to_state_dict``). A linear that lacks one is found by the tensors it does
have (any of them, or a packed ``uint8`` / ``int8`` weight) and refused naming the missing one.
"""
from __future__ import annotations

import math

from gac_check.checkpoint.files import parse_json
from gac_check.checkpoint.quantized.layout import Layout
from gac_check.checkpoint.quantized.marks import BNB_STATE
from gac_check.checkpoint.quantized.scheme import Quantization

BNB4_AUX = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


def read_bitsandbytes(layout: Layout) -> Quantization:
    qc = layout.qc
    four, eight = bool(qc.get("load_in_4bit")), bool(qc.get("load_in_8bit"))
    if four == eight:
        raise layout.refuse("config.json's bitsandbytes quantization_config sets neither (or "
                            "both) of load_in_4bit and load_in_8bit")
    ignored = tuple(qc.get("llm_int8_skip_modules") or ())
    return _int8(layout, ignored) if eight else _four_bit(layout, ignored)


def _int8(layout: Layout, ignored: tuple[str, ...]) -> Quantization:
    """LLM.int8(), as it runs: not weight-only. bitsandbytes 0.45.5
    ``bitsandbytes/autograd/_functions.py`` ``MatMul8bitLt.forward`` quantizes each
    activation row to int8 (``int8_vectorwise_quant`` of the float16 input), multiplies on
    the int8 GEMM (``int8_linear_matmul``) and dequantizes with both scales
    (``int8_mm_dequant``); only the input columns past ``llm_int8_threshold`` (6.0 by
    default, transformers' ``BitsAndBytesConfig``) are multiplied in float16
    (``output.addmm(subA, state.subB)``). So it is W8A8 with dynamic per-token int8
    activations, judged in int8."""
    quant = Quantization("bitsandbytes", "int8", 8, "int", "channel", symmetric=True,
                         activations="int8", activations_dynamic=True,
                         activations_symmetric=True, ignored=ignored)
    threshold = layout.qc.get("llm_int8_threshold", 6.0)
    quant.notes.append(f"LLM.int8(): int8 GEMM on per-token int8 activations; input columns "
                       f"with an activation above llm_int8_threshold ({threshold}) run in "
                       "float16 beside it (not judged apart)")
    modules = sorted({*layout.modules(".SCB"), *layout.modules(".weight_format"),
                      *(n.removesuffix(".weight") for n, t in layout.ckpt.tensors.items()
                        if n.endswith(".weight") and t.dtype == "int8")})
    for m in modules:
        layout.require(m + ".SCB", "the per-row scale bitsandbytes' LLM.int8 dequantizes "
                       f"{m}.weight with")
        w = layout.t(m + ".weight") if layout.has(m + ".weight") else None
        if w is None or len(w.shape) != 2 or w.dtype != "int8" \
                or layout.t(m + ".SCB").shape != (w.shape[0],):
            raise layout.refuse(f"{m}.SCB is not the [out] row scale of an int8 matrix "
                                f"{m}.weight")
        layout.unknown_tensors(m, ("weight", "SCB", "weight_format"))
        layout.aux(m + ".SCB", "int8 row scale")
        layout.aux(m + ".weight_format", "int8 weight layout tag")
        layout.backing[m + ".weight"] = (m + ".weight",)
    quant.quantized = tuple(modules)
    return quant


def _four_bit(layout: Layout, ignored: tuple[str, ...]) -> Quantization:
    kind = str(layout.qc.get("bnb_4bit_quant_type", "fp4"))
    quant = Quantization("bitsandbytes", kind, 4, kind, "block", ignored=ignored)
    states = {n[: BNB_STATE.search(n).start()]: n
              for n in layout.ckpt.tensors if BNB_STATE.search(n)}
    modules = sorted({*states, *(m.removesuffix(".weight") for a in BNB4_AUX
                                 for m in layout.modules(f".weight.{a}")),
                      *(n.removesuffix(".weight") for n, t in layout.ckpt.tensors.items()
                        if n.endswith(".weight") and t.dtype == "uint8")})
    for m in modules:
        layout.require(states.get(m, f"{m}.weight.quant_state.bitsandbytes__{kind}"),
                       f"the JSON quantization state that holds {m}.weight's shape and "
                       "block size")
    layout.prefetch(sorted(states.values()))
    for m in modules:
        _linear4(layout, quant, m, states[m])
    quant.quantized = tuple(modules)
    return quant


def _linear4(layout: Layout, quant: Quantization, m: str, state: str) -> None:
    found = BNB_STATE.search(state).group(1)
    if found not in ("nf4", "fp4"):
        raise layout.refuse(f"{state}: bitsandbytes 4-bit type {found!r} is not nf4 or fp4")
    doc = _bnb_state(layout, state)
    shape = doc.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2
            and all(type(x) is int and x > 0 for x in shape)):
        raise layout.refuse(f"{state} holds shape {shape!r}, not a matrix's [out, in]")
    w = layout.t(m + ".weight") if layout.has(m + ".weight") else None
    stored = math.ceil(shape[0] * shape[1] / 2)
    if w is None or w.dtype != "uint8" or w.numel != stored:
        raise layout.refuse(f"{m}.weight is not the {stored} packed bytes of the "
                            f"{shape} 4-bit matrix {state} describes")
    nested = "nested_blocksize" in doc
    for aux in BNB4_AUX:
        if nested or not aux.startswith("nested"):
            layout.require(f"{m}.weight.{aux}", f"the bitsandbytes 4-bit {aux.replace('_', ' ')}"
                           f" that {state} needs to dequantize {m}.weight")
    if isinstance(doc.get("blocksize"), int):
        quant.block = (1, doc["blocksize"])
    quant.format = found
    quant.weight_type = found
    for aux in BNB4_AUX:
        layout.aux(f"{m}.weight.{aux}", f"bitsandbytes 4-bit {aux.replace('_', ' ')}")
    layout.aux(state, "bitsandbytes 4-bit quantization state (JSON)")
    for name in layout.ckpt.tensors:
        if name.startswith(m + ".weight.") and name not in layout.auxiliary:
            raise layout.refuse(f"tensor {name!r} is not part of the bitsandbytes 4-bit "
                                "layout gac-check reads")
    layout.replace(m, (shape[0], shape[1]), found, (m + ".weight",))


def _bnb_state(layout: Layout, name: str) -> dict:
    info = layout.t(name)
    if info.dtype != "uint8" or len(info.shape) != 1:
        raise layout.refuse(f"{name} is {info.dtype} {list(info.shape)}, not the uint8 bytes "
                            "of a JSON quantization state")
    raw = layout.data(name)
    try:
        doc = parse_json(raw.decode("utf-8"), info.file, what=f"{name} ")
    except UnicodeDecodeError:
        raise layout.refuse(f"{name} is not UTF-8 JSON") from None
    if not isinstance(doc, dict):
        raise layout.refuse(f"{name} does not hold a JSON object")
    return doc


__all__ = ["BNB4_AUX", "read_bitsandbytes"]
