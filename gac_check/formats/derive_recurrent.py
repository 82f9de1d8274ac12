"""Recurrent and hybrid mixers in the class table: which saved tensors form a mixer, and the
widths their config determines that no plain label names.

:mod:`.derive_table` labels an axis by its sizes in two builds. Inside a recurrent mixer
(Mamba's selective scan, a gated delta net or Kimi's delta attention, RecurrentGemma's RG-LRU,
xLSTM's mLSTM) most widths are config values the two builds do not move together (state
size, heads x head width, a dt rank), so sizes alone would call them ``?`` or a constant; the
mixer is found here instead and :func:`label_mixers` labels its inner widths
``ssm``. A mixer is the saved prefix of a tensor named for its recurrence
(:data:`MARKERS`), found in the names ``save_pretrained`` writes, so a class whose
checkpoint names differ from its modules (Kimi-Linear's ``self_attn.A_log`` is the module
``self_attn.forget_gate``'s) is found all the same.

Widths a config derives by a formula of its own (Zamba's shared block over 2 x hidden,
RecurrentGemma's MLP of half ``intermediate_size``, xLSTM's feed-forward: hidden x
``ffn_proj_factor`` rounded up to ``ffn_round_up_to_multiple_of``; Inkling's router over the
routed and shared experts) are labels only where the config determines them exactly
(:func:`config_labels`): sizes alone would also match them by chance elsewhere (a fused qkv
of 2 x hidden, a gated MLP's half-width down projection).
"""
from __future__ import annotations

import re

from gac_check.formats.derive_names import pattern as name_pattern

#: saved-name tails that mark their prefix as a recurrent mixer: the SSM / delta-rule decay
#: (Mamba, Mamba2, Jamba, Bamba, Zamba, NemotronH, Qwen3-Next, Kimi-Linear, Bailing-hybrid),
#: RG-LRU's recurrence parameter (RecurrentGemma), mLSTM's forget gate (xLSTM)
MARKERS = (".A_log", ".recurrent_param", ".fgate_preact.weight")

_INDEX = re.compile(r"\.(\d+)\.")


def mixer_prefixes(saved: dict[str, tuple[int, ...]]) -> list[str]:
    """Each recurrent mixer's saved prefix (``model.layers.3.mamba.``), from its marker."""
    out = []
    for name in saved:
        tail = next((m for m in MARKERS if name.endswith(m)), None)
        if tail is not None:
            out.append(name[:-len(tail)] + ".")
    return out


def mixer_kind(name: str, kind: str, shape: tuple[int, ...]) -> str:
    """A mixer tensor's module kind: the class's own where the saved name is a module's; a
    2-D ``weight`` whose saved name is no module's (Bailing's ``attention.dense``, saved
    from ``self_attn.o_proj``) is a linear, since these mixers hold no other 2-D weight."""
    if kind == "other" and len(shape) == 2 and name.endswith(".weight"):
        return "linear"
    return kind


def label_mixers(shapes: dict[str, tuple[int, ...]], tensors: dict[str, dict],
                 seq: frozenset[str]) -> None:
    """Label every width inside a recurrent mixer ``ssm`` (:func:`mixer_prefixes`: the
    saved prefix of an SSM decay ``A_log``, an RG-LRU ``recurrent_param`` or an mLSTM forget
    gate). Its inner widths (heads x head width, groups x state size, conv channels, dt
    rank) are config values the two variants do not all move, so sizes alone would call
    them ``?`` or a constant; only a linear's hidden axis keeps its label. :mod:`.derived`
    reads a linear's ``ssm`` axes as GEMM widths, the rest as the mixer's own parameters."""
    mixers = tuple(mixer_prefixes(shapes))
    for name, shape in shapes.items():
        entry = tensors.get(name_pattern(name, seq))
        if entry is None or not name.startswith(mixers):
            continue
        entry["kind"] = mixer_kind(name, entry["kind"], shape)
        keep = ("hidden", "vocab") if entry["kind"] == "linear" else ()
        entry["axes"] = [a if a in keep else "ssm" for a in entry["axes"]]


def layer_leaf_kinds(kinds: dict[str, str], saved: dict[str, tuple[int, ...]],
                     named: dict[str, str]) -> dict[str, str]:
    """Saved name -> module kind for a mixer's saved names that are no parameter's, matched
    by layer and leaf (``model.layers.0.self_attn.f_a_proj.weight`` saved from
    ``...self_attn.forget_gate.f_a_proj.weight``) where exactly one parameter of that layer
    has that leaf. Only inside a mixer: elsewhere a renamed tensor keeps the kind it has."""
    by_leaf: dict[tuple[str, str], list[str]] = {}
    for name in kinds:
        by_leaf.setdefault(_layer_leaf(name), []).append(name)
    mixers = tuple(mixer_prefixes(saved))
    out = {}
    for name in saved:
        if name in named or not name.startswith(mixers):
            continue
        match = by_leaf.get(_layer_leaf(name), [])
        if len(match) == 1:
            out[name] = kinds[match[0]]
    return out


def _layer_leaf(name: str) -> tuple[str, str]:
    found = _INDEX.search(name)
    layer = found.group(1) if found else ""
    return layer, ".".join(name.split(".")[-2:])


def config_labels(config) -> dict[str, int]:
    """Widths a config determines by a formula of its own, by label: a router's rows over
    routed and shared experts (:func:`_router_rows`); xLSTM's feed-forward
    width (transformers 5.24 models/xlstm/modeling_xlstm.py, ``xLSTMFeedForward.__init__``:
    ``round_up_to_next_multiple_of(hidden_size * ffn_proj_factor,
    ffn_round_up_to_multiple_of)``)."""
    out = _router_rows(config) | _concat_input(config) | _half_mlp(config)
    factor = getattr(config, "ffn_proj_factor", None)
    multiple = getattr(config, "ffn_round_up_to_multiple_of", None)
    hidden = getattr(config, "hidden_size", None)
    if (isinstance(factor, float | int) and isinstance(multiple, int) and multiple > 0
            and isinstance(hidden, int)):
        out["ffn"] = int(((hidden * factor + multiple - 1) // multiple) * multiple)
    return out


def _concat_input(config) -> dict[str, int]:
    """Zamba's and Zamba2's shared transformer block reads concat(hidden, the original
    embeddings): ``attention_hidden_size`` (ZambaConfig / Zamba2Config: 2 x hidden_size),
    the width its q/k/v and input norm are built over (ZambaAttention.__init__)."""
    width, hidden = (getattr(config, "attention_hidden_size", None),
                     getattr(config, "hidden_size", None))
    if isinstance(hidden, int) and width == 2 * hidden:
        return {"hidden2": width}
    return {}


def _half_mlp(config) -> dict[str, int]:
    """RecurrentGemma's MLP is ``intermediate_size // 2`` wide (transformers 5.24
    models/recurrent_gemma/modeling_recurrent_gemma.py, ``RecurrentGemmaMlp.__init__``):
    named by model type, never matched by size (Moshi's gated fc2 also reads ffn_dim // 2)."""
    inter = getattr(config, "intermediate_size", None)
    if getattr(config, "model_type", None) == "recurrent_gemma" and isinstance(inter, int):
        return {"inter_half": inter // 2}
    return {}


def _router_rows(config) -> dict[str, int]:
    """A router scoring the routed and the shared experts together: Inkling's
    (transformers 5.24 models/inkling/modeling_inkling.py, ``InklingTopkRouter.__init__``:
    ``n_routed_experts + n_shared_experts`` rows)."""
    routed = getattr(config, "n_routed_experts", None)
    shared = getattr(config, "n_shared_experts", None)
    if isinstance(routed, int) and isinstance(shared, int) and shared > 0:
        return {"router_all": routed + shared}
    return {}


#: (heads key, head width key, expand key) of the SSM mixers whose config requires
#: heads x head width = expand x hidden (Mamba2Config / BambaConfig.validate_architecture)
_SSM_HEADS = (("num_heads", "head_dim", "expand"),
              ("mamba_n_heads", "mamba_d_head", "mamba_expand"))


def ssm_heads(default, variant: dict[str, int]) -> dict[str, int | None]:
    """SSM head counts that split the mixer's inner width evenly in this variant, so a class
    whose config validates them builds at all (one group, which divides any head count;
    Falcon-H1's explicit inner width unset, so it is expand x hidden)."""
    for heads, width, expand in _SSM_HEADS:
        factor = getattr(default, expand, None)
        if isinstance(factor, int) and hasattr(default, heads) and hasattr(default, width):
            out: dict[str, int | None] = {
                heads: variant["heads"], width: factor * variant["hidden"] // variant["heads"]}
            if hasattr(default, "mamba_d_ssm"):
                out["mamba_d_ssm"] = None
            groups = "n_groups" if hasattr(default, "n_groups") else "mamba_n_groups"
            if hasattr(default, groups):
                out[groups] = 1
            return out
    return {}


def hybrid_layers(default, layers: int | None) -> dict[str, object]:
    """An attention layer beside the SSM ones where a hybrid's default builds none (Bamba's
    ``attn_layer_indices``, Granite-MoE-hybrid's ``layer_types``), so the table knows both."""
    if getattr(default, "attn_layer_indices", 0) is None:
        return {"attn_layer_indices": [1]}
    kinds = getattr(default, "layer_types", None)
    if layers == 2 and isinstance(kinds, list) and set(kinds) == {"linear_attention"}:
        return {"layer_types": ["linear_attention", "attention"]}
    return {}
