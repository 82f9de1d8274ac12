"""Multi-head latent attention (DeepSeek-V2/V3): the latent ranks and head sizes as sites.

An MLA layer keeps no per-head k/v projections from the residual stream. ``kv_a_proj_with_mqa``
compresses it to a latent of ``kv_lora_rank`` (normed by ``kv_a_layernorm``) plus one shared
rotary key of ``qk_rope_head_dim``; ``kv_b_proj`` expands the latent into every head's
non-rotary key (``qk_nope_head_dim``) and value (``v_head_dim``). Queries come from ``q_proj``
or through a second latent (``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``,
``q_lora_rank``). The engines' MLA backends pick their kernel from these sizes
(:mod:`gac_check.targets.mla`), so each is a site.

The sizes are read from the tensors (config.json is only compared with them, a contradiction
is a note with both values): the latent from ``kv_b_proj``'s input, the rope part from what
``kv_a_proj_with_mqa`` makes beyond it, and the head count from the three per-head widths
(q: H x (nope + rope), kv_b: H x (nope + v), o's input: H x v). The mixture-of-experts layers
DeepSeek-V2/V3 have after ``first_k_dense_replace`` dense ones are read by
:mod:`gac_check.formats.moe` (its ``deepseek_moe`` layout), as every format's are.
"""
from __future__ import annotations

from dataclasses import dataclass

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.architectures import DEEPSEEK, HEADS_NOT_PADDED, find_family
from gac_check.formats.base import Format
from gac_check.formats.gated_norm import gated_norm_sites
from gac_check.formats.layout import Linear, dense_linear
from gac_check.formats.mla_indexer import indexer_sites, residual_axes
from gac_check.formats.mla_layouts import gated_dims, layout_gap
from gac_check.formats.moe import find_moe
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

#: Why a latent is not padded. p zeros shrink its RMSNorm's mean square by r / (r + p);
#: scaling the norm's weight by sqrt(r / (r + p)) undoes that only for eps = 0, since it
#: leaves x / sqrt(mean + eps (r + p) / r): eps would have to grow for this norm alone, and
#: it is the model's one rms_norm_eps in vLLM (v0.33.0 deepseek_v2.py,
#: DeepseekV2MLAAttention.__init__) and a fixed 1e-6 in transformers (v5.24.0
#: DeepseekV2/V3Attention.__init__: DeepseekV3RMSNorm(config.kv_lora_rank)); the scaled
#: weight also rounds in a 16-bit dtype. Close, not equal: this tool's repairs are equal.
LATENT_NORM_INEXACT = (
    "an MLA latent cannot be zero-padded exactly: its RMSNorm ({norm}) averages over the "
    "latent width, so p zeros shrink every normalised value's mean square by r/(r+p); scaling "
    "the norm's weight by sqrt(r/(r+p)) would undo that only with eps 0 (eps would have to "
    "become eps*(r+p)/r for this norm alone, but it is the model's one rms_norm_eps in vLLM "
    "and a fixed 1e-6 in transformers), and the scaled weight rounds in a 16-bit dtype: the "
    "logits would be close, not equal"
)
#: A latent with no norm (TransMLA's conversions without --use-qkv-norm write none and set
#: ``qk_latent_layernorm: false`` for their own modeling code, transmla/transformers/mla.py at
#: fxmeng/TransMLA 9c0d254): zeros would pass through kv_b_proj's zero columns there, but the
#: engines' DeepSeek classes normalise every latent, and gac-check proves no repair through
#: modeling code a checkpoint ships.
LATENT_UNNORMED = (
    "this MLA latent has no kv_a_layernorm (TransMLA's qk_latent_layernorm: false): padding it "
    "is exact only in the conversion's own modeling code, which gac-check does not run; "
    "transformers' and vLLM's DeepSeek classes normalise every latent"
)
QK_INEXACT = (
    "the MLA q/k head size is qk_nope_head_dim + qk_rope_head_dim: its rope part cannot grow "
    "(transformers derives the rotary frequencies from qk_rope_head_dim) and growing the nope "
    "part changes the softmax scale 1/sqrt(q/k head size), which gac-check does not "
    "compensate for MLA"
)


@dataclass(frozen=True)
class MLADims:
    """One layer's MLA sizes as the tensors give them."""

    heads: int
    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    #: AXK2's query projection: per head the query, then a gate over the value (v_head_dim)
    gated: bool = False

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def as_attrs(self) -> dict[str, int]:
        """What the MLA backend rules read (:mod:`gac_check.targets.mla`)."""
        return {"heads": self.heads, "kv_lora_rank": self.kv_lora_rank,
                "qk_nope_head_dim": self.qk_nope_head_dim,
                "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim}


@dataclass(frozen=True)
class MLALinears:
    q: Linear  # q_proj, or q_b_proj behind the q latent
    q_a: Linear | None
    kv_a: Linear
    kv_b: Linear
    o: Linear


class MLA(Format):
    name = "mla"
    description = ("multi-head latent attention (DeepSeek-V2/V3: kv_lora_rank, q_lora_rank, "
                   "qk_nope/qk_rope/v head sizes)")

    def matches(self, ckpt: Checkpoint) -> bool:
        return any(".self_attn.kv_a_proj_with_mqa." in n for n in ckpt.tensors)

    def own_sites(self, ckpt: Checkpoint) -> list[DimSite]:
        # every layer past first_k_dense_replace has experts in place of the dense MLP the
        # family names: with no dense layer at all, the family is matched without it
        found = find_family(ckpt, strict=find_moe(ckpt) is None)
        if found is None or found[0] is not DEEPSEEK:
            raise BadInput("has multi-head latent attention (kv_a_proj_with_mqa) but not "
                           "DeepSeek's layer layout (q_a_proj/q_b_proj or q_proj, "
                           "kv_a_layernorm, kv_b_proj, o_proj, a gated MLP)"
                           + layout_gap(ckpt), ckpt.path)
        _, prefix, layers = found
        sites: list[DimSite] = []
        for i in layers:
            sites.extend(layer_sites(ckpt, f"{prefix}.{i}.self_attn", i))
        return sites

    def sites(self, ckpt: Checkpoint) -> list[DimSite]:
        """The family's and MLA's sites, with a DSA indexer's residual-stream columns
        (:mod:`.mla_indexer`) and AXK2's gated norms' (:mod:`.gated_norm`) on the hidden site
        that the family's reader builds."""
        sites = super().sites(ckpt)
        extra = residual_axes(ckpt)
        if any(n.endswith(".W_down.weight") for n in ckpt.shapes):  # AXK2's gated norms
            hidden_size = next((s.value for s in sites if s.role is Role.HIDDEN), 0)
            gates, residual = gated_norm_sites(ckpt, hidden_size)
            sites, extra = sites + gates, extra + residual
        if extra:
            hidden = next((s for s in sites if s.role is Role.HIDDEN and s.layer is None), None)
            if hidden is None:
                raise BadInput("a DSA lightning indexer reads the residual stream, but no "
                               "hidden-size site was read to put it on", ckpt.path)
            hidden.axes.extend(extra)
        return sites


def _linears(ckpt: Checkpoint, module: str) -> MLALinears:
    shapes = ckpt.shapes
    q_a = dense_linear(shapes, f"{module}.q_a_proj")
    q = dense_linear(shapes, f"{module}.q_b_proj" if q_a else f"{module}.q_proj")
    kv_a = dense_linear(shapes, f"{module}.kv_a_proj_with_mqa")
    kv_b = dense_linear(shapes, f"{module}.kv_b_proj")
    o = dense_linear(shapes, f"{module}.o_proj")
    if not (q and kv_a and kv_b and o):
        missing = [n for n, lin in (("q_proj or q_a_proj/q_b_proj", q),
                                    ("kv_a_proj_with_mqa", kv_a), ("kv_b_proj", kv_b),
                                    ("o_proj", o)) if lin is None]
        raise BadInput(f"{module}: an MLA layer without {', '.join(missing)}", ckpt.path)
    return MLALinears(q, q_a, kv_a, kv_b, o)


def _dims(ckpt: Checkpoint, module: str, lin: MLALinears) -> MLADims:
    """The layer's sizes from its tensors; the head count from config.json only where the
    tensors cannot give it (no rope part: q and kv_b then differ by nothing per head)."""
    latent = lin.kv_b.in_features
    rope = lin.kv_a.out_features - latent
    if lin.q_a and lin.q.in_features == 2 * lin.q_a.out_features:
        heads, nope, v = gated_dims(ckpt, module, lin.q, lin.kv_b, lin.o, rope)
        return MLADims(heads, latent, lin.q_a.out_features, nope, rope, v, gated=True)
    q_out, kv_out, o_in = lin.q.out_features, lin.kv_b.out_features, lin.o.in_features
    per_head_rope = q_out - kv_out + o_in  # H x rope
    heads = per_head_rope // rope if rope > 0 and per_head_rope % rope == 0 else None
    if heads is None:
        declared = ckpt.config.get("num_attention_heads")
        heads = declared if type(declared) is int and declared > 0 else None
    if (rope < 0 or not heads or o_in % heads or q_out % heads or kv_out % heads
            or q_out // heads < rope):
        raise BadInput(f"{module}: MLA tensors that split into no whole heads (q {q_out}, "
                       f"kv_b {kv_out}, o input {o_in}, latent {latent}, rope {rope})",
                       ckpt.path)
    v = o_in // heads
    nope = q_out // heads - rope
    if kv_out // heads != nope + v:
        # each size named from the tensor it is read from: q_proj's rows give the query's
        # nope part, kv_b_proj's the key's, and they disagree
        raise BadInput(f"{module}: q_proj makes {q_out // heads} rows per head, so "
                       f"qk_nope_head_dim = {q_out // heads} - qk_rope_head_dim {rope} = "
                       f"{nope}; kv_b_proj makes {kv_out // heads} per head, so "
                       f"qk_nope_head_dim = {kv_out // heads} - v_head_dim {v} (o_proj's "
                       f"columns per head) = {kv_out // heads - v}: the query and key nope "
                       "widths disagree", ckpt.path)
    q_rank = lin.q_a.out_features if lin.q_a else None
    return MLADims(heads, latent, q_rank, nope, rope, v)


def _note(site: DimSite, cfg: dict, key: str, value: int | None) -> None:
    declared = cfg.get(key)
    if declared is not None and declared != value:
        site.notes.append(f"the config says {key}={declared}, tensors have {value}")


def layer_sites(ckpt: Checkpoint, module: str, layer: int) -> list[DimSite]:
    shapes, cfg = ckpt.shapes, ckpt.config
    lin = _linears(ckpt, module)
    d = _dims(ckpt, module, lin)
    mla = d.as_attrs()
    sites: list[DimSite] = []
    norm = f"{module}.kv_a_layernorm.weight"
    kv_axes = ([TensorAxis(t, a, AxisKind.PRODUCER) for t, a in lin.kv_a.rows]
               + [TensorAxis(b, 0, AxisKind.BIAS) for b in lin.kv_a.biases]
               + lin.kv_b.consumer_axes(shapes))
    normed = shapes.get(norm) == (d.kv_lora_rank,)
    if normed:
        kv_axes.append(TensorAxis(norm, 0, AxisKind.NORM))
    kv = DimSite(f"{module}:kv_lora_rank", Role.KV_LATENT, d.kv_lora_rank, kv_axes,
                 layer=layer, module=module, config_field=("kv_lora_rank",),
                 inexact=(LATENT_NORM_INEXACT.format(norm="kv_a_layernorm") if normed
                          else LATENT_UNNORMED),
                 attrs={"mla": {**mla, "dim": "kv_lora_rank"}})
    _note(kv, cfg, "kv_lora_rank", d.kv_lora_rank)
    sites.append(kv)
    if lin.q_a:
        q_norm = f"{module}.q_a_layernorm.weight"
        axes = lin.q_a.producer_axes(shapes) + (
            [TensorAxis(t, a, AxisKind.CONSUMER, blocks=2, stride=d.q_lora_rank)
             for t, a in lin.q.cols] if d.gated else lin.q.consumer_axes(shapes))
        if shapes.get(q_norm) == (d.q_lora_rank,):
            axes.append(TensorAxis(q_norm, 0, AxisKind.NORM))
        qr = DimSite(f"{module}:q_lora_rank", Role.RANK, lin.q_a.out_features, axes,
                     layer=layer, module=module, config_field=("q_lora_rank",),
                     inexact=LATENT_NORM_INEXACT.format(norm="q_a_layernorm"))
        _note(qr, cfg, "q_lora_rank", d.q_lora_rank)
        sites.append(qr)
    indexer, q_latent = indexer_sites(ckpt, module, layer, lin.q_a, lin.kv_a.in_features)
    if lin.q_a:
        qr.axes.extend(q_latent)
    elif cfg.get("q_lora_rank") is not None:
        kv.notes.append(f"the config says q_lora_rank={cfg['q_lora_rank']}, tensors have "
                        "q_proj (no q latent)")
    per_head = d.qk_head_dim + (d.v_head_dim if d.gated else 0)  # q rows per head
    q_axes = ([TensorAxis(t, a, AxisKind.PRODUCER, blocks=d.heads, stride=per_head)
               for t, a in lin.q.rows] if d.gated else lin.q.producer_axes(shapes, d.qk_head_dim))
    qk = DimSite(f"{module}:qk_head_dim", Role.HEAD_DIM, d.qk_head_dim,
                 q_axes, layer=layer, module=module,
                 inexact=QK_INEXACT, attrs={"rope": True, "mla": {**mla, "dim": "qk_head_dim"}})
    for key in ("qk_nope_head_dim", "qk_rope_head_dim"):
        _note(qk, cfg, key, mla[key])
    sites.append(qk)
    # v: per head, after the head's nope rows in kv_b_proj; o_proj reads it per head. The
    # softmax scale is the q/k head size's, so no query row needs compensation.
    v_axes = [TensorAxis(t, a, AxisKind.PRODUCER, start=d.qk_nope_head_dim, blocks=d.heads,
                         stride=d.qk_nope_head_dim + d.v_head_dim) for t, a in lin.kv_b.rows]
    v_axes += lin.o.consumer_axes(shapes, d.v_head_dim)
    if d.gated:  # AXK2's gate rows, one per value unit, after each head's query
        v_axes += [TensorAxis(t, a, AxisKind.PRODUCER, start=d.qk_head_dim, blocks=d.heads,
                              stride=per_head) for t, a in lin.q.rows]
    v = DimSite(f"{module}:v_head_dim", Role.HEAD_DIM, d.v_head_dim, v_axes, layer=layer,
                module=module, config_field=("v_head_dim",),
                attrs={"softmax_scale_rows": (), "mla": {**mla, "dim": "v_head_dim"}})
    _note(v, cfg, "v_head_dim", d.v_head_dim)
    sites.append(v)
    heads = DimSite(f"{module}:heads", Role.HEADS, d.heads, [], layer=layer, module=module,
                    config_field=("num_attention_heads",), inexact=HEADS_NOT_PADDED,
                    attrs={"kv_heads": d.heads})
    _note(heads, cfg, "num_attention_heads", d.heads)
    sites.append(heads)
    return sites + indexer
