"""config.json's attention sizes held to the tensors: the tensors win, a lie is a note.

A config.json is written by whoever published the model, and nothing forces it to describe
the tensors beside it. ``hidden_size`` 4096 over tensors 64 wide would make head_dim
4096 / heads = 1024 and every attention site wrong; ``num_attention_heads`` 7 over a width of
64 would make head_dim 9 and a --repair pad the wrong thing. So head_dim is taken from
config.json only where the tensors agree with it: an explicit ``head_dim`` must split every
layer's q and k widths into whole heads, and ``hidden_size / num_attention_heads`` uses the
tensors' width when the config's disagrees, or q's own width where hidden_size splits into no
whole heads (a channel-wise pruned residual stream). A head count that divides neither width
leaves head_dim unknowable: a refusal, for the check and for ``--repair`` alike.
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.layout import Linear


def _count(value: object) -> int | None:
    return value if type(value) is int and value > 0 else None


def config_head_dim(ckpt: Checkpoint,
                    attention: list[tuple[Linear | None, Linear | None]]) -> tuple[int | None,
                                                                                   list[str]]:
    """head_dim as config.json gives it, where each layer's (q, k) agree; and notes for every
    config value the tensors contradict (both values shown). None: config.json does not say,
    or says something the tensors refute (then the caller infers head_dim as without one)."""
    cfg = ckpt.config
    widths = [(q.out_features, k.out_features, q.in_features) for q, k in attention if q and k]
    notes: list[str] = []

    def whole(hd: int) -> bool:
        return all(q % hd == 0 and k % hd == 0 for q, k, _ in widths)

    declared = _count(cfg.get("head_dim"))
    if declared is not None:
        if whole(declared):
            return declared, notes
        q, k, _ = next(w for w in widths if w[0] % declared or w[1] % declared)
        notes.append(f"config.json says head_dim={declared}, tensors have q/k widths {q}/{k}, "
                     "not whole heads of it: not used")
    heads = _count(cfg.get("num_attention_heads"))
    hidden = _count(cfg.get("hidden_size"))
    if heads is None or (hidden is None and not widths):
        return None, notes
    tensor_width = max((q for q, _, _ in widths), default=None)
    if widths and (hidden is None or hidden not in {i for _, _, i in widths}):
        if hidden is not None:
            notes.append(f"head_dim from the tensors' attention width {tensor_width} / "
                         f"num_attention_heads={heads}, not from config.json's "
                         f"hidden_size={hidden} (the tensors have {widths[0][2]})")
        hidden = None  # the config's hidden_size is refuted (or absent): the tensors' width
    # The attention width is q's output, which a channel-wise pruner leaves dense while it
    # narrows hidden_size (LLM-Pruner --channel_wise: hidden 179, q_proj [256, 179]): where
    # hidden_size / heads does not split into whole heads, q's own width may.
    candidates = [w for w in dict.fromkeys((hidden, tensor_width)) if w is not None]
    splits = [w for w in candidates if w % heads == 0 and w // heads and whole(w // heads)]
    if splits:
        if splits[0] != candidates[0]:
            notes.append(f"head_dim from q's width {splits[0]} / num_attention_heads={heads}: "
                         f"config.json's hidden_size={candidates[0]} does not split into "
                         "whole heads")
        return splits[0] // heads, notes
    width = candidates[0]
    if width % heads:
        raise BadInput(f"says num_attention_heads={heads}, which does not divide the attention "
                       f"width {width} (head_dim would be {width / heads:.4g}): the head layout "
                       "cannot be known; correct config.json", ckpt.path / "config.json")
    if width // heads:  # a width of 0: nothing to split into heads
        notes.append(f"config.json's hidden_size / num_attention_heads = {width // heads} does "
                     "not split the tensors' q/k widths into whole heads: not used")
    return None, notes
