"""A model's head_dim where config.json does not say it (from the config's other sizes, a
pickled model's attention modules, or a rotary buffer), and why a q/k head_dim is not
zero-padded (split from architectures.py)."""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint

ROPE_INEXACT = (
    "q/k head_dim cannot be zero-padded exactly under RoPE: stock modeling code derives the "
    "rotary frequencies from head_dim, so every real dimension would rotate differently"
)


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


def head_dim_inexact(cls: str, cfg: dict, derives: bool) -> str:
    """Why this class's q/k head_dim is not zero-padded: a head_dim it derives from
    hidden_size / heads has no key to record a padded one (BERT, BART, ALBERT); RoPE (a
    ``rope*`` / ``rotary*`` key in config.json) rotates pairs across the padded lanes; a
    head_dim key without RoPE still sets the attention scale 1/sqrt(head_dim)."""
    why = []
    if derives:
        why.append(f"{cls}'s config derives head_dim from hidden_size / num_attention_heads, "
                   "so a padded head_dim cannot be recorded in a stock config")
    if any(k.startswith(("rope", "rotary")) and v for k, v in cfg.items()) \
            or cfg.get("position_embedding_type") == "rotary":
        why.append(ROPE_INEXACT)
    return "; ".join(why) or (f"q/k head_dim cannot be zero-padded exactly: {cls} scales the "
                              "attention scores by 1/sqrt(head_dim), which padding changes")
