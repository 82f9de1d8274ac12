"""MXFP4 checkpoints (``quant_method: "mxfp4"``), the layout openai/gpt-oss-20b and -120b ship:
only the experts are quantized, each fused expert tensor ``X`` stored as

- ``X_blocks`` uint8 [E, rows, groups, 16]: 32 FP4 (E2M1) values per group, two per byte;
- ``X_scales`` uint8 [E, rows, groups]: one E8M0 exponent (biased by 127) per group of 32;

and everything else (attention, router, embeddings, the experts' biases) left in bf16
(``modules_to_not_convert``). transformers 5.24 dequantizes them in
``integrations/mxfp4.py`` (``_convert_moe_packed_tensors``): the groups run along the input
of the projection and the result is transposed, so ``X`` is [E, groups * 32, rows]:
``gate_up_proj`` [E, hidden, 2I] from blocks [E, 2I, hidden / 32, 16], ``down_proj``
[E, I, hidden] from blocks [E, hidden, I / 32, 16]. Here each pair becomes that one logical
``X`` (:class:`gac_check.checkpoint.quantized.layout.Layout`), so :mod:`gac_check.formats.gpt_oss`
reads the same sites as from a bf16 checkpoint, and the scales are auxiliary.

A 4-D ``_blocks`` tensor with anything but 16 bytes per group, a missing or misshapen
``_scales``, or a ``_scales`` without its blocks is a refusal.
"""
from __future__ import annotations

from gac_check.checkpoint.quantized.layout import Layout
from gac_check.checkpoint.quantized.scheme import Quantization
from gac_check.checkpoint.tensorinfo import TensorInfo

#: FP4 values per group (one shared exponent), and the bytes that hold them.
GROUP = 32
GROUP_BYTES = GROUP // 2


def read_mxfp4(layout: Layout) -> Quantization:
    ignored = layout.qc.get("modules_to_not_convert") or ()
    quant = Quantization("mxfp4", "mxfp4", 4, "fp4", "block", block=(1, GROUP),
                         ignored=tuple(str(x) for x in ignored) if isinstance(ignored, list)
                         else ())
    tensors = layout.modules("_blocks")
    for orphan in layout.modules("_scales"):
        if orphan not in tensors:
            raise layout.refuse(f"{orphan}_scales has no {orphan}_blocks beside it")
    for x in tensors:
        blocks = layout.t(x + "_blocks")
        if blocks.dtype != "uint8" or len(blocks.shape) != 4 or blocks.shape[3] != GROUP_BYTES:
            raise layout.refuse(f"{x}_blocks is {blocks.dtype} {list(blocks.shape)}, not MXFP4's "
                                f"uint8 [experts, rows, groups, {GROUP_BYTES}]")
        experts, rows, groups, _ = blocks.shape
        layout.require(x + "_scales", f"the E8M0 exponents {x}_blocks is dequantized with")
        scales = layout.t(x + "_scales")
        if scales.dtype != "uint8" or scales.shape != (experts, rows, groups):
            raise layout.refuse(f"{x}_scales is {scales.dtype} {list(scales.shape)}; "
                                f"{x}_blocks {list(blocks.shape)} needs one uint8 exponent "
                                f"per group: [{experts}, {rows}, {groups}]")
        layout.aux(x + "_scales", "MXFP4 group exponents (E8M0, one per 32 values)")
        shape = (experts, groups * GROUP, rows)  # transformers' dequantized layout
        layout.logical[x] = TensorInfo(x, shape, "fp4", blocks.file, blocks.begin, blocks.end)
        layout.backing[x] = (x + "_blocks",)
        layout.removed.add(x + "_blocks")
    quant.quantized = tuple(tensors)
    return quant


__all__ = ["GROUP", "read_mxfp4"]
