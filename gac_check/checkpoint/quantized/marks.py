"""What says a checkpoint is quantized: ``config.json``'s ``quantization_config``, or tensor
names only a packed layout has.

Split from the packed-layout reader (:mod:`gac_check.checkpoint.quantized.reader`) because every
check asks the question and most models answer no: the reader, its layouts and their imports
are loaded only for a model that says it is quantized. A model whose tensors are packed but
whose config does not say how is refused here, on every path, before any format reads it.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gac_check.errors import BadInput

if TYPE_CHECKING:
    from gac_check.checkpoint.quantized.layout import Indexed

METHODS = ("compressed-tensors", "gptq", "awq", "fp8", "bitsandbytes", "mxfp4")
#: Tensor name endings that only a quantized checkpoint holds: without a
#: quantization_config, their presence is a refusal, not a dense read.
PACKED_SUFFIXES = (".weight_packed", ".qweight", ".qzeros", ".g_idx", ".weight_shape",
                   ".weight_scale_inv", ".SCB")
BNB_STATE = re.compile(r"\.weight\.quant_state\.bitsandbytes__(\w+)$")


def quantization_config(ckpt: Indexed) -> dict | None:
    """config.json's ``quantization_config`` (``compression_config`` in early llm-compressor
    releases), else AutoGPTQ's ``quantize_config.json`` / AutoAWQ's ``quant_config.json``."""
    for key in ("quantization_config", "compression_config"):
        if key in ckpt.config:
            value = ckpt.config[key]
            if not isinstance(value, dict):
                raise BadInput(f"config.json's {key} is not a JSON object", ckpt.path)
            return value
    for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        if name in ckpt.sidecars:
            return {"quant_method": method, **ckpt.sidecars[name]}
    return None


def refuse_stray_packed(ckpt: Indexed) -> None:
    """A packed tensor without a config saying how it is packed would be judged as dense."""
    stray = next((n for n in sorted(ckpt.tensors) if n.endswith(PACKED_SUFFIXES)
                  or BNB_STATE.search(n)), None)
    if stray:
        raise BadInput(f"holds the quantized tensor {stray!r} but config.json has no "
                       "quantization_config saying how it is packed; gac-check reads "
                       f"{', '.join(METHODS)} checkpoints as they save themselves", ckpt.path)

