"""Multi-head latent attention layouts beside DeepSeek's: AXK2's sizes, and why others are refused.

:mod:`.mla` reads DeepSeek-V2/V3's layer (and V3.2's indexer). Two classes transformers 5.24.0
ships put other modules around the same latents:

- AXK2 (``AXK2Attention.__init__``): its query projection, saved as ``q_b_proj``, reads the
  normed and the raw q latent side by side (2 x q_lora_rank columns) and makes, per head, the
  query (qk_nope + qk_rope) and a sigmoid gate over the value (v_head_dim) rows: heads x
  (qk_head_dim + v_head_dim). DeepSeek's arithmetic (q - kv_b + o = heads x rope) counts the
  gate as query and finds no whole heads; the head count is (q - kv_b) / rope instead
  (:func:`gated_dims`). Its layers' gated norms are :mod:`.gated_norm`'s.
- HunYuan-V4 (``hy_v4``) and others are refused, the layer's modules listed against
  DeepSeek's (:func:`layout_gap`: what it lacks, what it has that DeepSeek's does not).
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.architectures import DEEPSEEK, find_family
from gac_check.formats.layout import Linear

_SHOWN = 4
#: a DeepSeek layer's modules beyond the family's required ones: its latents, norms, the
#: V3.2 indexer, and the MoE layers' router and experts (formats/moe.py)
_KNOWN = (*DEEPSEEK.required(), *DEEPSEEK.latent_inputs, "self_attn.q_b_proj",
          "self_attn.q_a_layernorm", "self_attn.kv_a_layernorm", "self_attn.indexer",
          "mlp.gate", "mlp.experts", "mlp.shared_experts")


def _module(name: str) -> str:
    """A layer tensor's module, at most two levels deep (``self_attn.o_proj.weight`` ->
    ``self_attn.o_proj``, ``hc_pre.hc_attn_layer.hc_fn`` -> ``hc_pre.hc_attn_layer``; a
    module's own parameter, ``self_attn.learnable_sink_param``, as it is)."""
    name = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
    return ".".join(name.split(".")[:2])


def gated_dims(ckpt: Checkpoint, module: str, q: Linear, kv_b: Linear, o: Linear,
               rope: int) -> tuple[int, int, int]:
    """AXK2's (heads, qk_nope_head_dim, v_head_dim): the head count is (q - kv_b) / rope,
    since per head q makes nope + rope + gate (v) rows and kv_b nope + v; BadInput where they
    split into no whole heads of that layout."""
    q_out, kv_out, o_in = q.out_features, kv_b.out_features, o.in_features
    heads = (q_out - kv_out) // rope if rope > 0 and (q_out - kv_out) % rope == 0 else 0
    if heads <= 0 or o_in % heads or kv_out % heads or q_out % heads:
        raise BadInput(f"{module}: q_b_proj reads 2 x q_lora_rank ({q.in_features}), AXK2's "
                       f"gated query, but its rows ({q_out}), kv_b_proj's ({kv_out}) and "
                       f"o_proj's columns ({o_in}) split into no whole heads of query (nope + "
                       f"rope {rope}) and value gate", ckpt.path)
    v = o_in // heads
    nope = kv_out // heads - v
    if nope < 0 or q_out // heads != nope + rope + v:
        raise BadInput(f"{module}: q_b_proj makes {q_out // heads} rows per head, but AXK2's "
                       f"gated query makes qk_nope {nope} + qk_rope {rope} + gate {v} "
                       f"(kv_b_proj's and o_proj's per head): refusing to guess", ckpt.path)
    return heads, nope, v


def layout_gap(ckpt: Checkpoint) -> str:
    """``: model.layers.0 lacks ...; has ...`` against DeepSeek's layer (empty when no layer
    list is found)."""
    found = find_family(ckpt, strict=False)
    if found is None:
        return ""
    _, prefix, layers = found
    base = f"{prefix}.{layers[0]}."
    own = sorted({_module(n[len(base):]) for n in ckpt.shapes if n.startswith(base)})
    lacks = [m for m in DEEPSEEK.required() if not any(o == m or o.startswith(m + ".")
                                                        for o in own)]
    extra = [m for m in own if not m.startswith(_KNOWN)
             and m not in ("input_layernorm", "post_attention_layernorm")]
    parts = []
    if lacks:
        parts.append("lacks " + ", ".join(lacks[:_SHOWN]))
    if extra:
        more = f" and {len(extra) - _SHOWN} more" if len(extra) > _SHOWN else ""
        parts.append("has " + ", ".join(extra[:_SHOWN]) + more)
    return f": {base[:-1]} " + "; ".join(parts) if parts else ""
