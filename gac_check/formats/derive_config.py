"""Config values the table's meta-device builds set beyond :data:`.derive_table.KEYS`.

Two kinds. :func:`distinct`: a width a class has beside the ones the table varies, set per
variant so the axes it sizes get a label of their own (Qwen4-Exp's hyper-connection stream
count, else 4 x hidden would read as an MLP width; MiMo-V2-Flash's value head width).
:func:`rescue`: values a class needs before it builds at all, tried only where the plain
build fails, so no class that built before is built otherwise (Qwen4-Exp's router picks 10
experts of a table build's 5; its indexed-attention layers need the QSA indexer's widths,
unset by default). A class the table cannot build is unknown at check time ("no transformer
layers found"). Read in each class's config validation and ``__init__`` (transformers 5.24:
``Qwen4ExpTextConfig.validate_architecture``, ``Qwen4ExpTextQSAIndexer.__init__``,
``MiMoV2FlashAttention.__init__``).
"""
from __future__ import annotations

#: the residual-stream count of hyper-connections (Qwen4-Exp's ``hc_count``), per variant
STREAMS = (3, 5)
#: a value head width of its own beside head_dim (MiMo-V2-Flash's ``v_head_dim``), per
#: variant; never a latent-attention class's (its own reader, :mod:`.mla`)
V_HEAD_DIM = (28, 36)
#: the identity-expert count per variant (LongCat-Flash's ``zero_expert_num``,
#: :mod:`.derive_experts`)
ZERO_EXPERTS = (2, 3)


def _get(config, name: str):
    """``config.name``, or None where it is absent or ambiguous (a per-layer config refuses
    a global read of a per-layer attribute: Gemma-4's ``head_dim``)."""
    try:
        return getattr(config, name, None)
    except Exception:  # AmbiguousGlobalPerLayerAttributeError is no AttributeError
        return None


def distinct(default, index: int) -> dict[str, object]:
    """Per-variant values (the ``index``-th of :data:`.derive_table.VARIANTS`) for widths
    the table would otherwise see constant or tied to another's."""
    out: dict[str, object] = {}
    if isinstance(_get(default, "hc_count"), int):
        out["hc_count"] = STREAMS[index]
    if (isinstance(_get(default, "v_head_dim"), int) and isinstance(_get(default, "head_dim"), int)
            and _get(default, "qk_nope_head_dim") is None):
        out["v_head_dim"] = V_HEAD_DIM[index]
    if isinstance(_get(default, "zero_expert_num"), int):
        out["zero_expert_num"] = ZERO_EXPERTS[index]
    return out


def sizes(config) -> dict[str, int]:
    """The sizes of these widths a build really has (:func:`labels` names axes by them)."""
    out = {}
    for size, key, mine in (("streams", "hc_count", STREAMS), ("v_head_dim", "v_head_dim",
                            V_HEAD_DIM), ("zero_experts", "zero_expert_num", ZERO_EXPERTS)):
        if _get(config, key) in mine:  # set by distinct(), not a class's own constant
            out[size] = _get(config, key)
    if isinstance(_get(config, "num_buckets"), int):
        out["buckets"] = _get(config, "num_buckets")
    if _get(config, "concat_input") and isinstance(_get(config, "shape_embed_dim"), int):
        # RoCBertEmbeddings.__init__: map_inputs_layer reads word, pronunciation and shape
        # embeddings side by side, each part where its enable_* flag is set
        out["concat"] = sum(_get(config, f"{part}_embed_dim") for part in (
            "pronunciation", "shape") if _get(config, f"enable_{part}"))
    if isinstance(_get(config, "adapter_reduction_factor"), int):
        out["reduction"] = _get(config, "adapter_reduction_factor")
    return out


def labels(v: dict[str, int]) -> dict[str, int]:
    """Labels for the widths a build has (:func:`sizes`): hyper-connection streams and
    streams x hidden; value heads of v_head_dim (q, kv, 2 x kv of them); a router over real
    and identity experts; ProphetNet's relative-position buckets x heads; X-MOD's adapter
    bottleneck; RoCBert's concatenated input embeddings."""
    h, n, k = v["hidden"], v["heads"], v["kv_heads"]
    out = {}
    if "streams" in v:
        out.update(streams=v["streams"], hc=v["streams"] * h)
    if "v_head_dim" in v:
        vd = v["v_head_dim"]
        out.update(vq=n * vd, vkv=k * vd, vkv2=2 * k * vd)
    if "zero_experts" in v:
        out["experts_total"] = v["experts"] + v["zero_experts"]
    if "buckets" in v:
        out["buckets_heads"] = v["buckets"] * n
    if "concat" in v:  # RoCBert's hidden with its pronunciation and shape embeddings
        out["embed_concat"] = h + v["concat"]
    if "reduction" in v:  # X-MOD's adapter bottleneck (:mod:`.derive_adapters`)
        out["adapter"] = h // v["reduction"]
    return out


def rescue(default, variant: dict[str, int]) -> dict[str, object]:
    """Values that make ``default``'s class build in ``variant`` where it would not: a top-k
    no larger than the expert count, an unset indexer given the variant's head widths; for
    a composite config, its text config's."""
    out: dict[str, object] = {}
    top_k = _get(default, "num_experts_per_tok")
    if isinstance(top_k, int) and top_k > variant["experts"]:
        out["num_experts_per_tok"] = 2
    if hasattr(default, "indexer_n_heads") and _get(default, "indexer_n_heads") is None:
        # Qwen4ExpTextQSAIndexer: one key head; the rotary width must fit its head_dim
        out.update(indexer_n_heads=variant["heads"], indexer_kv_heads=1,
                   indexer_head_dim=variant["head_dim"], indexer_budget=64,
                   indexer_compress_ratio=4)
    text = _get(default, "text_config")
    if not out and text is not None and hasattr(text, "to_dict"):
        # a composite keeps its text model's defaults: complete them from those
        own = {**variant, "head_dim": _get(text, "head_dim") or variant["head_dim"],
               "experts": _get(text, "num_experts") or variant["experts"]}
        inner = rescue(text, own)
        if inner:
            out["text_config"] = {**text.to_dict(), **inner}
    return out
