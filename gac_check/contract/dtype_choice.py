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
from gac_check.checkpoint.tensorinfo import DTYPE_ITEMSIZE

FLOAT_PREFIXES = ("float", "bfloat")


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a contract is built for, where it came from, and any disagreement seen."""

    dtype: str
    source: str  # "--dtype" | "config.json" | "weights" | "stricter of config.json and weights"
    note: str | None = None


def declared_dtype(ckpt: Checkpoint) -> str | None:
    """config.json's ``dtype`` (transformers 5) or ``torch_dtype``, without ``torch.``."""
    declared = ckpt.config.get("dtype") or ckpt.config.get("torch_dtype")
    if isinstance(declared, str) and declared not in ("auto", ""):
        return declared.removeprefix("torch.")
    return None


def weights_dtype(ckpt: Checkpoint) -> str | None:
    """The floating dtype holding most of the weights' elements, or None (no float tensors)."""
    counts: dict[str, int] = {}
    for t in ckpt.tensors.values():
        if t.dtype.startswith(FLOAT_PREFIXES):
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel
    return max(counts, key=counts.__getitem__) if counts else None


def mixed_weights(ckpt: Checkpoint) -> str | None:
    """A sentence naming the float dtypes the weights mix (SVD-LLM keeps fp32 factors beside
    fp16 embeddings), with a few tensors of each minority dtype, or None when they do not."""
    by_dtype: dict[str, list[str]] = {}
    for name, t in sorted(ckpt.tensors.items()):
        if t.dtype.startswith(FLOAT_PREFIXES):
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
    declared, stored = declared_dtype(ckpt), weights_dtype(ckpt)
    disagree = declared is not None and stored is not None and declared != stored
    seen = (f"config.json says {declared}, the weights are {stored}" if disagree else None)
    mixed = mixed_weights(ckpt)
    if requested:
        said = "; ".join(x for x in (mixed, seen) if x)
        return DtypeChoice(requested, "--dtype", f"{said}; checked against --dtype {requested}"
                           if said else None)
    if not disagree:
        if declared:
            return DtypeChoice(declared, "config.json",
                               f"{mixed}: {declared}, config.json's" if mixed else None)
        chosen = stored or "float32"
        return DtypeChoice(chosen, "weights" if stored else "default",
                           f"{mixed}: {chosen}, the dtype of most weight elements (pass --dtype "
                           "to judge in the dtype it is served in)" if mixed else None)
    assert declared and stored
    stricter = min((stored, declared), key=_itemsize)  # min keeps the weights' on a tie
    return DtypeChoice(stricter, "stricter of config.json and weights",
                       f"{seen}: checked against {stricter}, the stricter of the two "
                       f"({_itemsize(stricter)} bytes per element; pass --dtype to choose)")


def _itemsize(dtype: str) -> int:
    return DTYPE_ITEMSIZE.get(dtype, 4)
