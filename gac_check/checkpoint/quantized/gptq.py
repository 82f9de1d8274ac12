"""GPTQ and AWQ checkpoints (``quant_method: "gptq"`` / ``"awq"``): each linear's int32
``qweight`` read at its logical [out, in], beside the ``scales`` and ``qzeros`` (and GPTQ's
``g_idx``) that dequantize it. The layouts, as AutoGPTQ, GPTQModel and AutoAWQ write them, are
described in :mod:`gac_check.checkpoint.quantized.reader`, which dispatches here.

A linear without one of its auxiliary tensors is a refusal naming that tensor: ``scales`` and
``qzeros`` always (both writers register them for every linear: AutoGPTQ
``qlinear_cuda_old.py`` ``QuantLinear.__init__``, AutoAWQ ``gemm.py``
``WQLinear_GEMM.__init__``), ``g_idx`` with ``desc_act`` (the permutation of the input
columns; without it act-order weights dequantize against the wrong groups) or where the other
linears store theirs.
"""
from __future__ import annotations

import math

from gac_check.checkpoint.quantized.layout import Layout, config_bits, config_int, group_note
from gac_check.checkpoint.quantized.scheme import Quantization

INT_DTYPE = {4: "int4", 8: "int8", 2: "int2", 3: "int3"}
GPTQ_AUX = {"qzeros": "packed zero points", "scales": "group scales",
            "g_idx": "group index per input column"}
GPTQ_NEEDS = {".scales": "the group scales GPTQ dequantizes with",
              ".qzeros": "the packed zero points GPTQ dequantizes with"}
AWQ_NEEDS = {".scales": "the group scales AWQ dequantizes with",
             ".qzeros": "the packed zero points AWQ dequantizes with"}


def _qweight(layout: Layout, m: str, whose: str, pack: int, packed: int,
             out_axis: int) -> tuple[int, int]:
    """``m``'s (out, in) once unpacked, from its int32 ``qweight``: GPTQ packs ``pack``
    values per int32 along the input (axis 0, outputs on axis 1), AWQ GEMM along the output
    (axis 1, outputs on axis 1), AWQ GEMV along the input (axis 1, outputs on axis 0)."""
    q = layout.t(m + ".qweight")
    if q.dtype != "int32" or len(q.shape) != 2:
        names = ["in", "in"]
        names[out_axis] = "out"
        names[packed] += " * bits / 32"
        raise layout.refuse(f"{m}.qweight is {q.dtype} {list(q.shape)}, not {whose} int32 "
                            f"[{', '.join(names)}]")
    dims = list(q.shape)
    dims[packed] *= pack
    return dims[out_axis], dims[1 - out_axis]


def read_gptq(layout: Layout) -> Quantization:
    qc = layout.qc
    fmt = qc.get("checkpoint_format", qc.get("format", "gptq"))  # GPTQModel: "format"
    if fmt not in ("gptq", "gptq_v2"):
        raise layout.refuse(f"config.json's GPTQ checkpoint_format {fmt!r} is not gptq or "
                            "gptq_v2 (Marlin- or BitBLAS-repacked weights are not read)")
    bits = config_bits(qc.get("bits"), layout, (2, 4, 8))
    group = config_int(qc.get("group_size", 128), "group_size", layout, allow=(-1,))
    quant = Quantization("gptq", fmt, bits, "int", "group" if group > 0 else "channel",
                         group_size=group if group > 0 else None,
                         symmetric=bool(qc.get("sym", True)),
                         act_order=bool(qc.get("desc_act", False)),
                         group_act_order=bool(qc.get("desc_act", False)) and group > 0,
                         ignored=tuple(qc.get("modules_to_not_convert") or ()))
    pack = 32 // bits
    modules = layout.modules(".qweight")
    layout.consistent(modules, (".g_idx",))
    for m in modules:
        out, width = _qweight(layout, m, "GPTQ's", pack, packed=0, out_axis=1)
        rows = width // pack
        for suffix, why in GPTQ_NEEDS.items():
            layout.require(m + suffix, why)
        if quant.act_order:
            layout.require(m + ".g_idx", "desc_act is true, and g_idx is the order of the "
                           "input columns the groups were quantized in")
        if layout.has(m + ".g_idx"):
            g = layout.t(m + ".g_idx").shape
            if len(g) != 1 or g[0] != width:
                raise layout.refuse(f"{m}.g_idx is {list(g)}, but {m}.qweight [{rows}, {out}] "
                                    f"packs {width} input columns")
        groups = math.ceil(width / group) if group > 0 else 1
        for name, shape in ((m + ".scales", (groups, out)),
                            (m + ".qzeros", (groups, out // pack))):
            if layout.t(name).shape != shape:
                raise layout.refuse(f"{name} is {list(layout.t(name).shape)}; GPTQ with group "
                                    f"{group} on [{out}, {width}] stores {list(shape)}")
        if out % pack:
            raise layout.refuse(f"{m}: GPTQ cannot pack {out} output columns into qzeros "
                                f"(not a multiple of {pack})")
        group_note(quant, m, width, "input width")
        layout.unknown_tensors(m, ("qweight", *GPTQ_AUX))
        for suffix, what in GPTQ_AUX.items():
            layout.aux(f"{m}.{suffix}", what)
        layout.replace(m, (out, width), INT_DTYPE[bits], (m + ".qweight",))
    quant.quantized = tuple(modules)
    return quant


def read_awq(layout: Layout) -> Quantization:
    qc = layout.qc
    version = str(qc.get("version", "gemm")).lower()
    if version not in ("gemm", "gemv"):
        raise layout.refuse(f"config.json's AWQ version {version!r} is not gemm or gemv "
                            "(gemv_fast, marlin and exllama repackings are not read)")
    bits = config_bits(qc.get("bits", qc.get("w_bit")), layout, (4,))
    group = config_int(qc.get("group_size", qc.get("q_group_size")), "group_size", layout)
    quant = Quantization("awq", version, bits, "int", "group", group_size=group,
                         symmetric=not bool(qc.get("zero_point", True)),
                         ignored=tuple(qc.get("modules_to_not_convert") or ()))
    pack = 32 // bits
    modules = layout.modules(".qweight")
    for m in modules:
        gemm = version == "gemm"  # qweight [in, out/8]; GEMV: [out, in/8]
        out, width = _qweight(layout, m, f"AWQ {version.upper()}'s", pack, packed=1,
                              out_axis=1 if gemm else 0)
        for suffix, why in AWQ_NEEDS.items():
            layout.require(m + suffix, why)
        scales = layout.t(m + ".scales").shape
        if gemm:  # scales [in/group, out]
            want = (width // group, out)
            if scales != want:
                raise layout.refuse(f"{m}.scales is {list(scales)}; AWQ GEMM with group {group} "
                                    f"on [{out}, {width}] stores {list(want)}")
        else:  # GEMV: scales [out, padded groups]
            if len(scales) != 2 or scales[0] != out:
                raise layout.refuse(f"{m}.scales is {list(scales)}; AWQ GEMV stores one row of "
                                    f"scales per output ({out})")
        group_note(quant, m, width, "input width")
        layout.unknown_tensors(m, ("qweight", "qzeros", "scales"))
        layout.aux(m + ".qzeros", "packed zero points")
        layout.aux(m + ".scales", "group scales")
        layout.replace(m, (out, width), INT_DTYPE[bits], (m + ".qweight",))
    quant.quantized = tuple(modules)
    return quant


__all__ = ["INT_DTYPE", "read_awq", "read_gptq"]
