"""A target on a quantized checkpoint is judged with the checkpoint's own quantization.

``--target vllm,tp=2`` on an llm-compressor W4A16 checkpoint deploys that W4A16, not an
unquantized model: the engine picks its kernel from the checkpoint's scheme, and a 128-wide
group that straddles a TP shard refuses to load whatever the target says. So the target's
``quant`` and ``group`` come from :class:`gac_check.checkpoint.quantized.Quantization`, under
the name the engine's pack gives that scheme; a ``quant=`` or ``group=`` that contradicts the
checkpoint is bad input (a target cannot re-quantize a model), and a scheme the pack does not
model is refused rather than judged as unquantized.

Which pack name runs which scheme: vLLM loads GPTQ checkpoints through ``gptq_marlin`` and
llm-compressor's ``pack-quantized`` WNA16 through ``CompressedTensorsWNA16``, and both choose
their kernel with ``choose_mp_linear_kernel`` (vllm-project/vllm,
``vllm/model_executor/layers/quantization/kernels/mixed_precision/__init__.py``), so a
``pack-quantized`` checkpoint is judged by the pack's ``gptq`` rules; AWQ by ``awq``; FP8
(compressed-tensors ``float-quantized``) by ``fp8``, block FP8 by ``fp8_block`` where the
pack has it (vLLM), else ``fp8``; INT8 W8A8 by ``int8``. Where a pack has a finer name for the
scheme the checkpoint's ``quantization_config`` declares (vLLM: ``fp8_w8a16`` weight-only,
``fp8_static`` compressed-tensors static activation scales, ``int8_dynamic``,
``int8_static``, ``int8_asym``), that name is taken, else the coarse one; a ``quant=`` that
gives the coarse name of the checkpoint's scheme agrees with it. MXFP4 (gpt-oss's experts) by
``mxfp4`` where the pack has it (vLLM).
llama.cpp converts and re-quantizes a checkpoint its converter reads, so its targets keep
their own ``quant`` (a GGUF type); a checkpoint the converter does not read is refused
(:func:`llama_cpp_refusal`).
"""
from __future__ import annotations

import dataclasses

from gac_check.checkpoint.quantized.scheme import Quantization
from gac_check.errors import BadInput
from gac_check.targets.spec import Target

#: Engines that re-quantize on conversion: the checkpoint's scheme does not reach them.
REQUANTIZING = ("llama.cpp",)
#: Why a target whose pack has no ``mxfp4`` (every engine but vLLM) does not judge an MXFP4
#: checkpoint (gpt-oss's experts). vLLM's pack judges it (vllm-moe-mxfp4: the engine zero-pads
#: each rank's expert width itself, vllm-project/vllm v0.33.0,
#: vllm/model_executor/layers/fused_moe/oracle/mxfp4.py,
#: mxfp4_round_up_hidden_size_and_intermediate_size); the others were not read for it.
MXFP4_NOT_JUDGED = (
    "the checkpoint is MXFP4 (gpt-oss's experts), which the {engine} rule pack does not model: "
    "not judged (--target vllm judges it: vLLM v0.33.0 pads each rank's expert width to its "
    "MXFP4 backend's multiple itself); check without --target for the GPU contract's findings"
)


#: Where llama.cpp's converter decides which quantized checkpoints it reads: the pinned
#: llama.cpp (ggml-org/llama.cpp@0c1e57098, vendored in the llama-cpp-python 0.3.36 sdist).
CONVERTER = "conversion/base.py ModelBase.dequant_model @ llama.cpp 0c1e57098"


def llama_cpp_refusal(q: Quantization) -> str | None:
    """Why convert_hf_to_gguf.py cannot turn this checkpoint into a GGUF, or None.
    ``ModelBase.dequant_model`` dequantizes only quant_method bitnet, fp8 (``*_scale_inv``
    scales), gptq (2/4/8-bit), compressed-tensors (one config group: ``pack-quantized`` only
    with ``strategy: group``, int/float/naive-quantized only per channel or block) and
    modelopt; any other method raises "Quant method is not yet supported"."""
    method = q.method
    if method not in ("fp8", "gptq", "compressed-tensors"):
        return (f"llama.cpp's converter does not read {method} checkpoints ({CONVERTER} raises "
                "'Quant method is not yet supported'); convert the unquantized model instead")
    if method == "fp8" and q.block is None:
        return ("llama.cpp's converter dequantizes FP8 only through weight_scale_inv "
                f"(block-quantized FP8), not a per-tensor weight_scale ({CONVERTER})")
    if method == "gptq" and q.bits == 3:
        return f"llama.cpp's converter has no 3-bit GPTQ dequantization ({CONVERTER})"
    if method == "compressed-tensors":
        packed = q.format == "pack-quantized"
        if packed and q.strategy != "group":
            return (f"llama.cpp's converter reads compressed-tensors pack-quantized only with "
                    f"strategy group, not {q.strategy} ({CONVERTER} asserts it); convert the "
                    "unquantized model instead")
        if not packed and q.strategy not in ("channel", "block"):
            return (f"llama.cpp's converter reads compressed-tensors {q.format} only per "
                    f"channel or block, not per {q.strategy} ({CONVERTER} asserts it)")
    return None


def pack_names(q: Quantization) -> tuple[str, ...]:
    """The names packs give this scheme, most specific first."""
    if q.method in ("bitsandbytes", "mxfp4"):
        return (q.method,)
    if q.weight_type == "float" or (q.activations or "").startswith("float8"):
        # block-quantized FP8 loads only in whole blocks per rank (validate_fp8_block_shape):
        # the pack's own name where it has one, else its FP8
        if q.strategy == "block":  # vLLM's own fp8 refines its MoE blocks, compressed-tensors' not
            return (("ct_fp8_block",) * (q.method == "compressed-tensors") + ("fp8_block", "fp8"))
        if q.weight_only:  # CompressedTensorsW8A16Fp8: weight-only kernels on every GPU
            return ("fp8_w8a16", "fp8")
        if q.method == "compressed-tensors" and q.activations_dynamic is False:
            return ("fp8_static", "fp8")  # FlashInfer CUTLASS MoE on sm90 (vLLM)
        return ("fp8",)
    if q.activations == "int8":
        if q.activations_symmetric is False:  # cutlass_scaled_mm_azp: no Triton fallback
            return ("int8_asym", "int8")
        return ("int8_dynamic" if q.activations_dynamic else "int8_static", "int8")
    if q.method == "awq":
        return ("awq", "int4_awq", "w4a16")
    if q.bits == 8:
        return ("gptq", "int8_wo")
    # compressed-tensors' WNA16 checks its groups per rank where GPTQ's loader does not
    # (vLLM's wna16); activation ordering by groups is refused at load (vLLM's *_act_order)
    ct = ("wna16_act_order",) * q.group_act_order + ("wna16",)
    own = ("gptq_act_order",) * q.group_act_order
    return (*(ct if q.method == "compressed-tensors" else own), "gptq", "int4_gptq", "w4a16")


def for_checkpoint(target: Target, q: Quantization | None) -> Target:
    """``target`` as it deploys a checkpoint quantized with ``q`` (unchanged when ``q`` is
    None: a prediction for an unquantized model, or llama.cpp)."""
    if q is not None and target.engine == "llama.cpp" and (why := llama_cpp_refusal(q)):
        raise BadInput(f"--target {target.spec}: the checkpoint is {q.method} {q.scheme}, "
                       f"{q.granularity}; {why}")
    if q is None or target.engine in REQUANTIZING:
        return target
    names = pack_names(q)
    quant = next((n for n in names if n in target.pack.quants), None)
    if quant is None and q.method == "mxfp4":
        raise BadInput(f"--target {target.spec}: "
                       + MXFP4_NOT_JUDGED.format(engine=target.engine))
    if quant is None:
        raise BadInput(f"--target {target.spec}: the checkpoint is {q.method} {q.scheme}, which "
                       f"the {target.engine} rule pack does not model (it knows quant="
                       f"{', '.join(target.pack.quants)}); gac-check will not judge it as "
                       "unquantized")
    group = q.group_size if q.strategy == "group" else (-1 if q.strategy == "channel"
                                                        and not quant.startswith("fp8")
                                                        else None)
    if "quant" in target.given and target.quant not in names:
        raise BadInput(f"--target {target.spec}: the checkpoint is already quantized ({q.method} "
                       f"{q.scheme}, {q.granularity}), which {target.engine} runs as "
                       f"quant={quant}; a target cannot re-quantize it: drop quant= or give "
                       f"quant={quant}")
    if "group" in target.given and group is not None and target.group != group:
        raise BadInput(f"--target {target.spec}: the checkpoint's quantization group is "
                       f"{group}, not {target.group}; drop group= or give group={group}")
    return dataclasses.replace(target, quant=quant, group=group)
