"""Which dtype a model is checked in when config.json and its weights disagree.

Alignment rules count elements per aligned byte run, so a narrower dtype needs larger multiples
(180 passes fp32's multiple of 4 and fails fp16's multiple of 8).
Compressors routinely copy the base model's config.json (``torch_dtype: float32``) beside the
fp16 weights they wrote, so trusting the config would plan repairs that are still misaligned
when the model runs. Without ``--dtype`` the check uses the stricter of the two (the one with
fewer bytes per element; on a tie, the weights', which is what runs) and says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.quantized.scheme import Quantization
from gac_check.checkpoint.tensorinfo import DTYPE_ITEMSIZE
from gac_check.errors import BadInput

FLOAT_PREFIXES = ("float", "bfloat")
#: The dtypes a model can be judged in (``--dtype``; the rules know no other).
DTYPES = ("float16", "bfloat16", "float32", "float8_e4m3fn", "int8")
#: Other spellings the Python API takes for them (torch's and the engines' short names).
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "f16": "float16", "bf16": "bfloat16",
                 "fp32": "float32", "float": "float32", "f32": "float32",
                 "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8": "float8_e4m3fn",
                 "i8": "int8"}


def dtype_name(value: object) -> str:
    """``value`` (``"fp16"``, ``"Float16"``, ``torch.float16``) as one of :data:`DTYPES`;
    anything else is refused, since rules judged in a dtype they do not know would pass what
    they never checked."""
    name = str(value).strip().lower().removeprefix("torch.")
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise BadInput(f"unknown dtype {value!r} (choose from {', '.join(DTYPES)}; also "
                       f"{', '.join(DTYPE_ALIASES)})")
    return name


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a contract is built for, where it came from, and any disagreement seen."""

    dtype: str
    #: "--dtype" | "the config" | "weights" | "default" | "stricter of the config and weights"
    #: | "quantization_config" (the config's source is the report's ``config_source``)
    source: str
    note: str | None = None


#: How a dtype source names the model's config, whatever it was read from (config.json, a whole
#: pickled model's own config, a module's in memory: ``Checkpoint.config_source``), so a module
#: and its save are judged in the same words.
CONFIG = "the config"


def declared_dtype(ckpt: Checkpoint) -> str | None:
    """The config's ``dtype`` (transformers 5) or ``torch_dtype``, without ``torch.``."""
    config = ckpt.config
    declared = config.get("dtype") or config.get("torch_dtype")
    if isinstance(declared, str) and declared not in ("auto", ""):
        return declared.removeprefix("torch.")
    return None


def weights_dtype(ckpt: Checkpoint) -> str | None:
    """The floating dtype holding most of the weights' elements, or None (no float tensors)."""
    counts: dict[str, int] = {}
    for name, t in ckpt.tensors.items():
        if t.dtype.startswith(FLOAT_PREFIXES) and name not in ckpt.auxiliary:
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel
    return max(counts, key=counts.__getitem__) if counts else None


def mixed_weights(ckpt: Checkpoint) -> str | None:
    """A sentence naming the float dtypes the weights mix (SVD-LLM keeps fp32 factors beside
    fp16 embeddings), with a few tensors of each minority dtype, or None when they do not."""
    by_dtype: dict[str, list[str]] = {}
    for name, t in sorted(ckpt.tensors.items()):
        if t.dtype.startswith(FLOAT_PREFIXES) and name not in ckpt.auxiliary:
            by_dtype.setdefault(t.dtype, []).append(name)
    if len(by_dtype) < 2:
        return None
    main = weights_dtype(ckpt)
    others = "; ".join(f"{d} in {len(names)} ({', '.join(names[:2])}"
                       f"{', ...' if len(names) > 2 else ''})"
                       for d, names in sorted(by_dtype.items()) if d != main)
    return (f"the weights mix dtypes: {main} in {len(by_dtype[main])} tensors (most elements), "
            f"{others}; every site is judged in one dtype")


def choose_dtype(ckpt: Checkpoint, requested: str | None = None) -> DtypeChoice:
    """``requested`` if given; else config.json's and the weights' dtype, the stricter when
    they disagree (with a note saying both and which was used). Weights that mix float dtypes
    are noted too, since every role is then judged in a dtype some of its tensors do not
    have."""
    if ckpt.quantization is not None:
        return _quantized(ckpt, ckpt.quantization, requested)
    declared, stored = declared_dtype(ckpt), weights_dtype(ckpt)
    where = CONFIG
    disagree = declared is not None and stored is not None and declared != stored
    seen = (f"{where} says {declared}, the weights are {stored}" if disagree else None)
    mixed = mixed_weights(ckpt)
    if requested:
        said = "; ".join(x for x in (mixed, seen) if x)
        return DtypeChoice(requested, "--dtype", f"{said}; checked against --dtype {requested}"
                           if said else None)
    if not disagree:
        if declared:
            return DtypeChoice(declared, where,
                               f"{mixed}: {declared}, {where}'s" if mixed else None)
        chosen = stored or "float32"
        return DtypeChoice(chosen, "weights" if stored else "default",
                           f"{mixed}: {chosen}, the dtype of most weight elements (pass --dtype "
                           "to judge in the dtype it is served in)" if mixed else None)
    assert declared and stored
    stricter = min((stored, declared), key=_itemsize)  # min keeps the weights' on a tie
    return DtypeChoice(stricter, f"stricter of {where} and weights",
                       f"{seen}: checked against {stricter}, the stricter of the two "
                       f"({_itemsize(stricter)} bytes per element; pass --dtype to choose)")


def _quantized(ckpt: Checkpoint, q: Quantization, requested: str | None) -> DtypeChoice:
    """A quantized model's sites are judged in what its kernels compute in: an FP8 or INT8
    W8A8 GEMM multiplies quantized activations by quantized weights; a weight-only kernel
    (W4A16: Marlin, Machete, GPTQ/AWQ GEMMs, bitsandbytes) dequantizes the weights to the
    activation dtype (config.json's) and multiplies in that."""
    if q.activations:
        why = (f"{q.scheme}: its linears run as {q.activations} GEMMs (both operands "
               f"quantized), so they are judged in {q.activations}")
        chosen = q.activations
    else:
        chosen = declared_dtype(ckpt) or _activation_dtype(ckpt)
        why = (f"{q.scheme}: weight-only quantization; its kernels dequantize the {q.bits}-bit "
               f"weights and multiply in the activation dtype, {chosen}")
    if requested:
        return DtypeChoice(requested, "--dtype", f"{why}; checked against --dtype {requested}")
    return DtypeChoice(chosen, "quantization_config", why)


def _activation_dtype(ckpt: Checkpoint) -> str:
    """Without a config dtype: the float dtype of the unquantized weights, else the scales'."""
    q = ckpt.quantization
    backed = q.backing if q else {}
    floats = [t.dtype for n, t in ckpt.tensors.items()
              if t.dtype.startswith(FLOAT_PREFIXES) and "float8" not in t.dtype
              and n not in backed]
    return max(set(floats), key=floats.count) if floats else "float16"


def _itemsize(dtype: str) -> int:
    return DTYPE_ITEMSIZE.get(dtype, 4)
