"""Config values a class needs before it builds at all, for the table's meta-device builds.

:mod:`.derive_table` sets a few widths to distinctive values; some classes then refuse their
own config (Qwen4-Exp's router picks 10 experts of a table build's 5; its indexed-attention
layers need the QSA indexer's widths, which default to unset). A class the table cannot build
is unknown at check time ("no transformer layers found"), so each such value is completed
here, from the variant's own widths, so that every kind of layer the default depth holds is
built and its tensors labelled. Read in each class's config validation and ``__init__``
(transformers 5.24: ``Qwen4ExpTextConfig.validate_architecture``,
``Qwen4ExpTextQSAIndexer.__init__``).
"""
from __future__ import annotations

#: the residual-stream count of hyper-connections (Qwen4-Exp's ``hc_count``): per variant,
#: so an axis of streams x hidden is told from 4 x hidden (an MLP width)
STREAMS = (3, 5)
#: a value head width of its own beside head_dim (MiMo-V2-Flash's ``v_head_dim``), per
#: variant; never a latent-attention class's (its own reader, :mod:`.mla`)
V_HEAD_DIM = (28, 36)


def completions(default, variant: dict[str, int], index: int) -> dict[str, object]:
    """Keyword arguments that make ``default``'s class build in ``variant`` (the ``index``-th
    of :data:`.derive_table.VARIANTS`): a top-k no larger than the expert count, an unset
    indexer given the variant's head widths, the hyper-connection stream count."""
    out: dict[str, object] = {}
    top_k = getattr(default, "num_experts_per_tok", None)
    if isinstance(top_k, int) and top_k > variant["experts"]:
        out["num_experts_per_tok"] = 2
    if hasattr(default, "indexer_n_heads") and default.indexer_n_heads is None:
        # Qwen4ExpTextQSAIndexer: one key head; the rotary width must fit its head_dim
        out.update(indexer_n_heads=variant["heads"], indexer_kv_heads=1,
                   indexer_head_dim=variant["head_dim"], indexer_budget=64,
                   indexer_compress_ratio=4)
    if isinstance(getattr(default, "hc_count", None), int):
        out["hc_count"] = STREAMS[index]
    if (isinstance(getattr(default, "v_head_dim", None), int) and hasattr(default, "head_dim")
            and not hasattr(default, "qk_nope_head_dim")):
        out["v_head_dim"] = V_HEAD_DIM[index]
    text = getattr(default, "text_config", None)
    if not out and text is not None and hasattr(text, "to_dict"):
        # a composite keeps its text model's defaults: complete them from those
        own = {**variant, "head_dim": getattr(text, "head_dim", variant["head_dim"]),
               "experts": getattr(text, "num_experts", variant["experts"])}
        inner = completions(text, own, index)
        if inner:
            out["text_config"] = {**text.to_dict(), **inner}
    return out
