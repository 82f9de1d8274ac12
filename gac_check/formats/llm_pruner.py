"""LLM-Pruner (horseee/LLM-Pruner): plain Llama modules with rows and columns removed.

Block-wise pruning removes whole attention heads (q/k/v rows, o columns) and single MLP
channels (gate/up rows, down columns) in a range of layers, so sizes vary per layer (11008 ->
8806 at 20%); channel-wise pruning narrows the hidden size everywhere. The pruned model is
pickled whole (``torch.save({'model': model, 'tokenizer': tok})``) and any config.json next to
it keeps the dense sizes, or there is none. The tensors are the truth: the family sites already
trust shapes and note where config.json disagrees; this adapter recognises the pattern (also
from the pickled model's own config when there is no config.json) and, when nothing records
head_dim, infers it from the shapes.
"""
from __future__ import annotations

from functools import reduce
from math import gcd

from gac_check.checkpoint.index import Checkpoint
from gac_check.formats.architectures import Family, family_sites, find_family
from gac_check.formats.base import Format
from gac_check.formats.head_dim import head_dim_of
from gac_check.formats.layout import dense_linear
from gac_check.sites import DimSite, Role

#: Largest head_dim a GCD of projection widths is believed to be (FlashAttention's limit).
MAX_INFERRED_HEAD_DIM = 256
NO_CONFIG = "no config.json: sizes come from tensor shapes only"
#: What to do about a hidden size channel-wise pruning left misaligned (padding it is not
#: exact, so the repair refuses it).
CHANNEL_WISE_ADVICE = (
    "; to fix it, prune again: hf_prune.py --channel_wise with a --pruning_ratio that leaves "
    "the hidden size a multiple of the alignment, or --block_wise, which prunes heads and MLP "
    "channels and leaves the hidden size dense"
)


class LLMPruner(Format):
    name = "llm-pruner"
    description = ("LLM-Pruner structured pruning (per-layer heads / MLP channels removed; "
                   "config.json keeps the dense sizes)")
    #: appended to the hidden site's refusal: how this tool leaves the hidden size aligned
    hidden_advice = CHANNEL_WISE_ADVICE

    def matches(self, ckpt: Checkpoint) -> bool:
        sizes = _layer_sizes(ckpt)
        if not sizes:
            return False
        cfg = ckpt.config
        per_key = {k: {s[k] for s in sizes.values() if k in s} for k in ("q", "up", "in")}
        if any(len(v) > 1 for v in per_key.values()):
            return True
        declared = {"up": cfg.get("intermediate_size"), "in": cfg.get("hidden_size")}
        hd = head_dim_of(cfg)
        if hd and any(q % hd for q in per_key["q"]):
            hd = None  # a head_dim the tensors refute says nothing (formats/declared.py)
        if hd and isinstance(cfg.get("num_attention_heads"), int):
            declared["q"] = hd * cfg["num_attention_heads"]
        return any(isinstance(declared.get(k), int) and v and v != {declared[k]}
                   for k, v in per_key.items())

    def sites(self, ckpt: Checkpoint) -> list[DimSite]:
        found = find_family(ckpt, strict=False)
        if not found:
            return []
        fam, prefix, layers = found
        gcd = _head_dim_from_widths(ckpt, fam, prefix, layers)
        sites = family_sites(ckpt, fam, prefix, layers, lambda m: self.linear(ckpt, m),
                             gcd if gcd[0] else None)
        head = next((s.value for s in sites if s.role is Role.HEAD_DIM), None)
        for site in sites:
            if site.role is Role.HEADS:
                _note_partial_heads(ckpt, fam, prefix, site, head)
                _note_head_attributes(ckpt, site, head)
        hidden = next(s for s in sites if s.role is Role.HIDDEN)
        if hidden.inexact:
            hidden.inexact += self.hidden_advice
        if not ckpt.config:
            hidden.notes.append(NO_CONFIG)
            if not head:
                hidden.notes.append("head_dim could not be inferred from the shapes; attention "
                                    "sites were not checked")
        return sites


def _layer_sizes(ckpt: Checkpoint) -> dict[int, dict[str, int]]:
    """Per layer: q rows, MLP width and the hidden width q reads, from dense linears only."""
    found = find_family(ckpt, strict=False)
    if not found:
        return {}
    fam, prefix, layers = found
    shapes = ckpt.shapes
    out: dict[int, dict[str, int]] = {}
    for i in layers:
        q = dense_linear(shapes, f"{prefix}.{i}.{fam.q}")
        up = dense_linear(shapes, f"{prefix}.{i}.{fam.up}")
        sizes = {}
        if q:
            sizes["q"], sizes["in"] = q.out_features, q.in_features
        if up:
            sizes["up"] = up.out_features
        out[i] = sizes
    return out


def _head_dim_from_widths(ckpt: Checkpoint, fam: Family, prefix: str,
                          layers: list[int]) -> tuple[int | None, str]:
    """head_dim from shapes alone, when nothing records it: the GCD of q/k/v widths.

    Whole-head pruning leaves every q/k/v width a multiple of head_dim, and unpruned layers
    keep the dense width, so their GCD is head_dim unless all layers share a factor (GQA
    pruned alike everywhere: 192 and 96 give 96, which is why the pickle's own records come
    first, :func:`~gac_check.formats.head_dim.infer_head_dim`); a GCD above 256 is no
    head_dim and is not used.
    """
    widths = []
    for i in layers:
        for key in ("q", "k", "v"):
            lin = dense_linear(ckpt.shapes, f"{prefix}.{i}.{getattr(fam, key)}")
            if lin:
                widths.append(lin.out_features)
    g = reduce(gcd, widths, 0)
    if 0 < g <= MAX_INFERRED_HEAD_DIM:
        return g, "the GCD of all q/k/v projection widths (whole heads are pruned)"
    return None, ""


def _note_head_attributes(ckpt: Checkpoint, site: DimSite, hd: int | None) -> None:
    """LLM-Pruner sets each attention's num_heads / num_key_value_heads after pruning; say
    where those pickled attributes disagree with the head counts the tensors give."""
    model = ckpt.pickled_model
    attrs = model.attributes.get(site.module, {}) if model and hd else {}
    for attr, value in (("num_heads", site.value), ("num_key_value_heads",
                                                    site.attrs.get("kv_heads"))):
        recorded = attrs.get(attr)
        if isinstance(recorded, int) and recorded != value:
            site.notes.append(f"the pickled module says {attr}={recorded}, tensors have {value}")


def _note_partial_heads(ckpt: Checkpoint, fam: Family, prefix: str, site: DimSite,
                        hd: int | None) -> None:
    """Flag layers whose q/k widths are not whole heads: head counts there are meaningless."""
    if not hd:
        return
    for key in ("q", "k", "v"):
        lin = dense_linear(ckpt.shapes, f"{prefix}.{site.layer}.{getattr(fam, key)}")
        if lin and lin.out_features % hd:
            site.notes.append(f"{key} has {lin.out_features} rows, not a whole number of "
                              f"{hd}-wide heads")
