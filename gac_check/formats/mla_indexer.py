"""DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-MoE-DSA): its GEMMs as sites.

Beside an MLA layer's attention, a DSA layer's ``self_attn.indexer`` scores every cached token
and keeps the top ``index_topk`` for the attention to read. It has linears of its own
(transformers 5.24.0 ``DeepseekV32Indexer.__init__`` / ``GlmMoeDsaIndexer.__init__``):
``wq_b`` [index_n_heads x index_head_dim, q_lora_rank] reads the query latent ``q_a_proj``
makes, ``wk`` [index_head_dim, hidden] and ``weights_proj`` [index_n_heads, hidden] read the
residual stream, and ``k_norm`` (a LayerNorm with bias) normalises each key over
index_head_dim. vLLM runs them as GEMMs too (v0.33.0 ``vllm/model_executor/models/
deepseek_v2.py``, ``Indexer.__init__``: ``wq_b`` a ReplicatedLinear, ``wk`` and
``weights_proj`` one MergedColumnParallelLinear of N = index_head_dim + index_n_heads), so
each width is a GEMM width here (role ``indexer_width``), judged by the same GEMM rules as an
MLP's; no indexer-specific kernel rule is added. ``wq_b``'s input columns are the q latent's
consumers (the q_lora_rank site), ``wk``'s and ``weights_proj``'s the residual stream's.

Neither width pads exactly: ``k_norm`` averages over index_head_dim, whose first
qk_rope_head_dim units are rotated, and the scores are scaled by index_head_dim^-0.5 and
index_n_heads^-0.5 (transformers' ``softmax_scale``, vLLM's ``n_head_scale``).
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.layout import Linear, dense_linear
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

INDEXER_INEXACT = (
    "a DSA lightning indexer's width: its k_norm (a LayerNorm) averages over index_head_dim, "
    "whose first qk_rope_head_dim units are rotated, and its scores are scaled by "
    "index_head_dim^-0.5 and index_n_heads^-0.5, so zero padding would change which tokens "
    "it selects"
)


#: the indexer's linears that read the residual stream
_RESIDUAL = (".indexer.wk.weight", ".indexer.weights_proj.weight")


def residual_axes(ckpt: Checkpoint) -> list[TensorAxis]:
    """Every indexer's residual-stream columns (``wk``, ``weights_proj``): the hidden site's."""
    return [TensorAxis(n, 1, AxisKind.CONSUMER) for n in sorted(ckpt.shapes)
            if n.endswith(_RESIDUAL) and len(ckpt.shapes[n]) == 2]


def indexer_sites(ckpt: Checkpoint, module: str, layer: int, q_a: Linear | None,
                  hidden: int) -> tuple[list[DimSite], list[TensorAxis]]:
    """The indexer's sites of the MLA layer ``module`` (none without an indexer) and the q
    latent's consumer axes (``wq_b``'s columns); BadInput when it is not the layout its class
    builds."""
    prefix = f"{module}.indexer."
    if not any(n.startswith(prefix) for n in ckpt.shapes):
        return [], []
    shapes = ckpt.shapes
    wq_b, wk, weights = (dense_linear(shapes, prefix + n) for n in ("wq_b", "wk", "weights_proj"))
    norm = {p: shapes.get(f"{prefix}k_norm.{p}") for p in ("weight", "bias")}
    if not (wq_b and wk and weights and q_a) or None in norm.values():
        raise BadInput(f"{module}.indexer: a DSA lightning indexer without the layout its class "
                       "builds (wq_b reading q_a_proj's latent, wk, weights_proj, k_norm weight "
                       "and bias); refusing to judge it", ckpt.path)
    head_dim, heads = wk.out_features, weights.out_features
    expected = {"wq_b rows": (wq_b.out_features, heads * head_dim),
                "wq_b columns": (wq_b.in_features, q_a.out_features),
                "wk columns": (wk.in_features, hidden),
                "weights_proj columns": (weights.in_features, hidden),
                "k_norm": (norm["weight"], (head_dim,)), "k_norm bias": (norm["bias"], (head_dim,))}
    wrong = next((k for k, (got, want) in expected.items() if got != want), None)
    if wrong:
        got, want = expected[wrong]
        raise BadInput(f"{module}.indexer: {wrong} {got}, but the indexer's index_n_heads "
                       f"{heads} x index_head_dim {head_dim} (weights_proj's and wk's rows) "
                       f"make {want}: refusing to judge a layout its class would not load",
                       ckpt.path)
    attrs = {"indexer": {"index_head_dim": head_dim, "index_n_heads": heads}}
    dim_axes = (wq_b.producer_axes(shapes, head_dim) + wk.producer_axes(shapes)
                + [TensorAxis(f"{prefix}k_norm.{p}", 0, AxisKind.NORM) for p in norm])
    sites = [
        DimSite(f"{module}.indexer:index_head_dim", Role.INDEXER, head_dim, dim_axes,
                layer=layer, module=f"{module}.indexer", config_field=("index_head_dim",),
                inexact=INDEXER_INEXACT, attrs=attrs),
        DimSite(f"{module}.indexer:index_n_heads", Role.INDEXER, heads,
                weights.producer_axes(shapes), layer=layer, module=f"{module}.indexer",
                config_field=("index_n_heads",), inexact=INDEXER_INEXACT, attrs=attrs),
    ]
    for site, key in zip(sites, ("index_head_dim", "index_n_heads"), strict=True):
        declared = ckpt.config.get(key)
        if declared is not None and declared != site.value:
            site.notes.append(f"the config says {key}={declared}, tensors have {site.value}")
    return sites, wq_b.consumer_axes(shapes)
