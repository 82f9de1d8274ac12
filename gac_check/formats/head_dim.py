"""A model's head_dim where config.json does not say it: from the config's other sizes, a
pickled model's attention modules, or a rotary buffer (split from architectures.py)."""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint


def head_dim_of(config: dict) -> int | None:
    if isinstance(config.get("head_dim"), int):
        return config["head_dim"]
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads:
        return hidden // heads
    return None


def infer_head_dim(ckpt: Checkpoint) -> tuple[int | None, str]:
    """head_dim without a config.json value, from what the checkpoint says about itself.

    In order: the attention modules' ``head_dim`` attribute in a pickled model (when all
    agree), a rotary ``inv_freq`` buffer (head_dim / 2 entries; older transformers and
    LLM-Pruner's own modeling keep it in the state dict, current transformers pickle it as a
    non-persistent buffer), and the pickled config's head_dim (or hidden / heads). Returns
    (value, where it came from), or (None, "") when none of them is there.
    """
    model = ckpt.pickled_model
    if model is not None:
        dims = {a.get("head_dim") for p, a in model.attributes.items()
                if p.endswith(".self_attn") or p.endswith(".attention")}
        dims.discard(None)
        if len(dims) == 1 and isinstance(hd := next(iter(dims)), int) and hd > 0:
            return hd, "the pickled attention modules' head_dim attribute"
    buffers = dict(model.buffers) if model else {}
    buffers.update((n, t.shape) for n, t in ckpt.tensors.items())
    for name, shape in sorted(buffers.items()):
        if name.endswith("inv_freq") and len(shape) == 1 and shape[0] > 0:
            return 2 * shape[0], f"{name} ({shape[0]} rotary frequencies)"
    if model is not None and (hd := head_dim_of(model.config)):
        return hd, "the pickled model's config"
    return None, ""

