"""Derive each architecture's tensor roles from transformers' own classes, ahead of time.

The check reads headers only, so it cannot import transformers' modeling code per run (seconds).
This module builds every causal-LM class transformers ships (and the BERT-family masked-LM
encoders) on the meta device, twice, with distinctive config values (:data:`VARIANTS`), and
records for every saved tensor name which config-derived width sits on each axis: an axis is
``hidden`` when its size is the hidden size in both builds, ``inter`` when it is the MLP width,
``q`` when it is heads x head_dim, and so on (:func:`_labels`). An axis that moves with the
config but matches no label is ``?``; one that stays put is ``=N``. Names are the ones
``save_pretrained`` writes (transformers' own key conversion reverted), with layer and expert
indices replaced by ``{i}`` / ``{e}``. The result is data, :data:`TABLE`
(``gac_check/data/architectures.json``), read at check time by :mod:`gac_check.formats.derived`.

Built-in classes only (never ``trust_remote_code``); nothing is allocated (meta device).
Regenerate with ``python -m gac_check.formats.derive_table`` after upgrading transformers;
tests/test_derived_table.py fails when the shipped table disagrees with the installed classes.
"""
from __future__ import annotations

import json
import re
import sys
import warnings
from functools import partial
from pathlib import Path

from gac_check.formats import (
    derive_adapters,
    derive_config,
    derive_experts,
    derive_layers,
    derive_relabel,
)
from gac_check.formats import derive_composite as composite
from gac_check.formats.derive_names import layer_part, sequential_modules
from gac_check.formats.derive_names import pattern as name_pattern
from gac_check.formats.derive_recurrent import (
    config_labels,
    hybrid_layers,
    label_mixers,
    layer_leaf_kinds,
    mixer_prefixes,
    ssm_heads,
)
from gac_check.formats.derive_rows import label_lookup_rows, ties_head
from gac_check.formats.derive_saved import renamed, saved_names, saved_shapes

TABLE = Path(__file__).resolve().parent.parent / "data" / "architectures.json"

#: Two builds with values no two widths share, so each axis's role is read from its sizes.
VARIANTS = (
    {"hidden": 96, "heads": 4, "kv_heads": 2, "head_dim": 20, "inter": 136, "expert": 152,
     "shared": 168, "vocab": 517, "experts": 5, "positions": 128, "cross": 88},
    {"hidden": 120, "heads": 6, "kv_heads": 3, "head_dim": 24, "inter": 184, "expert": 200,
     "shared": 216, "vocab": 541, "experts": 7, "positions": 160, "cross": 112},
)
#: config keys set to each variant value, where the config class has them
KEYS = {
    "hidden": ("hidden_size",),
    "heads": ("num_attention_heads", "encoder_attention_heads", "decoder_attention_heads",
              "num_encoder_attention_heads", "num_decoder_attention_heads"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim", "dim_head"),
    "inter": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size",
              "encoder_ffn_dim", "decoder_ffn_dim", "dff", "dim_ff"),
    "expert": ("moe_intermediate_size", "expert_intermediate_size"),
    "shared": ("shared_expert_intermediate_size",),
    "vocab": ("vocab_size",),
    "experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "positions": ("max_position_embeddings", "n_positions"),
    # the encoder's width a decoder's cross-attention reads (TrOCR: its vision encoder's)
    "cross": ("cross_attention_hidden_size",),
}


def _labels(v: dict[str, int]) -> dict[str, int]:
    """Every width a label names, for one build's actual sizes, in the order a tie is broken
    (hidden = heads x head_dim in BERT-style configs); :func:`.config_labels` and a
    composite's tower labels follow them in :func:`derive`."""
    h, n, k, d = v["hidden"], v["heads"], v["kv_heads"], v["head_dim"]
    return {
        "hidden": h, "vocab": v["vocab"], "inter": v["inter"], "inter2": 2 * v["inter"],
        "expert": v["expert"], "expert2": 2 * v["expert"], "shared": v["shared"],
        "shared2": 2 * v["shared"], "q": n * d, "kv": k * d, "qkv": (n + 2 * k) * d,
        "q3": 3 * n * d, "qkv_mq": (n + 2) * d, "kv2": 2 * k * d, "hd": d, "heads": n,
        "kv_heads": k,
        "experts": v["experts"], "positions": v["positions"],
        "positions2": v["positions"] + 2, "h4": 4 * h, "h3": 3 * h, "cross": v["cross"],
        # after h4: where heads x head_dim is the hidden size, 4 x hidden is an MLP (BLOOM)
        "q4": 4 * n * d,
        # an embedding with one more row than the vocabulary (Moshi's padding token); the half
        # of a fused gate-and-up width a gated MLP reads back (:mod:`.derive_relabel`)
        "vocab1": v["vocab"] + 1, "inter_half": v["inter"] // 2,
        **derive_config.labels(v),  # widths only some classes have, where they do
    }



def _config(config_cls, variant: dict[str, int], layers: int | None, subs: bool = True,
            rescue: bool = False):
    """The config of one build; with ``subs``, a composite's text sub-config in the variant
    and each tower at its own widths (:mod:`.derive_composite`); with ``rescue``, the values
    a class needs to build at all (:func:`.derive_config.rescue`)."""
    default = config_cls()
    kwargs = _kwargs(config_cls, default, variant, layers)
    if rescue:
        kwargs.update(derive_config.rescue(default, variant))
    if subs:
        kwargs.update(composite.sub_kwargs(
            config_cls, default, VARIANTS.index(variant),
            lambda sub_cls: _kwargs(sub_cls, sub_cls(), variant, layers)))
    return config_cls(**kwargs)


def _kwargs(config_cls, default, variant: dict[str, int], layers: int | None) -> dict:
    """The variant's widths under every key ``config_cls`` has (one config, no sub-configs)."""
    kwargs: dict[str, object] = {}
    for role, keys in KEYS.items():
        for key in keys:
            settable = not isinstance(getattr(config_cls, key, None), property)
            if settable and hasattr(default, key):
                kwargs[key] = variant[role]
    if layers:
        kwargs["num_hidden_layers"] = layers
    kwargs.update(ssm_heads(default, variant))
    if config_cls.model_type in _EVEN_KV_HEADS and variant["kv_heads"] % 2:
        kwargs["num_key_value_heads"] = variant["kv_heads"] - 1
    kwargs.update(hybrid_layers(default, layers))
    kwargs.update(derive_config.distinct(default, VARIANTS.index(variant)))
    for token in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        if isinstance(getattr(default, token, None), int):
            kwargs[token] = 0  # a default id past the tiny vocabulary will not build
    return kwargs


#: classes whose config requires an even key/value head count (DiffLlamaAttention.__init__
#: splits the values in two along the heads); the variant's odd count is built one lower
_EVEN_KV_HEADS = ("diffllama",)

def _build(config):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    auto = (AutoModelForCausalLM if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            else AutoModelForMaskedLM)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return auto.from_config(config)


def _actual(model, variant: dict[str, int], subs: bool) -> dict[str, int]:
    """The sizes the class really built with (head_dim may be hidden / heads; a tower's
    attention modules have head widths of their own)."""
    v = dict(variant)
    towers = (composite.tower_head_dims(type(model.config), VARIANTS.index(variant)) if subs
              else set())
    dims = (_head_dims(model, attention=True) - towers) or (_head_dims(model, attention=False)
                                                            - towers)
    if len(dims) == 1:
        v["head_dim"] = dims.pop()
    text = composite.text_config(model.config) if subs else model.config
    kv = getattr(text, "num_key_value_heads", None)
    v["kv_heads"] = kv if isinstance(kv, int) and kv > 0 else v["heads"]
    v.update(derive_config.sizes(model.config))
    return v


def _head_dims(model, attention: bool) -> set[int]:
    """The head widths the modules hold; with ``attention``, the attention modules' only (a
    hybrid's SSM mixer has a head_dim of its own: Falcon-H1, Bamba)."""
    dims = {getattr(m, attr, None) for _, m in model.named_modules()
            if not attention or "attention" in type(m).__name__.lower()
            for attr in ("head_dim", "attention_head_size", "head_size", "dim_head")}
    return {d for d in dims if isinstance(d, int) and d > 0}


def built_shapes(config) -> dict[str, tuple[int, ...]]:
    """What ``config``'s own class builds on the meta device, as ``save_pretrained`` names and
    shapes it (no memory; built-in classes only): what a repair's output is held to
    (:mod:`gac_check.padding.class_proof`)."""
    return saved_shapes(_build(config))


def _pattern(name: str, seq: frozenset[str] = frozenset()) -> str:
    """The table's pattern for a saved name: X-MOD's language segment as ``{lang}``, then
    the layer and list indices (:func:`.derive_names.pattern`)."""
    return name_pattern(derive_adapters.pattern(name), seq)


def _axis_label(a: int, b: int, la: dict[str, int], lb: dict[str, int]) -> str:
    if a == b:
        return f"={a}"
    return next((lab for lab in la if la[lab] == a and lb.get(lab) == b), "?")


def _kinds(model) -> dict[str, str]:
    """Parameter name -> module kind (linear, conv1d, embedding, norm, other)."""
    import torch.nn as nn

    out = {}
    for mname, mod in model.named_modules():
        cls = type(mod).__name__
        kind = ("linear" if isinstance(mod, nn.Linear) else "embedding"
                if isinstance(mod, nn.Embedding) else "conv1d" if cls == "Conv1D"
                else "norm" if "norm" in cls.lower() else "other")
        for pname, _ in mod.named_parameters(recurse=False):
            out[f"{mname}.{pname}" if mname else pname] = kind
    return out


def _untie_attention(model, kinds: dict[str, str], tensors: dict[str, dict],
                     seq: frozenset[str]) -> None:
    """Where heads x head_dim equals the hidden size, sizes cannot tell the attention's
    per-head axes from the residual stream's: in each outermost attention module, the
    projection registered last is the output (its input is ``q``), the others produce ``q``."""
    names = [n for n, m in model.named_modules() if "attention" in type(m).__name__.lower()
             and not type(m).__name__.lower().endswith("norm")  # RobertaPreLayerNorm...
             and not type(m).__name__.endswith(("Layer", "Block"))]  # JambaAttentionDecoderLayer
    outer = [n for n in names if n and not any(n.startswith(o + ".") for o in names if o != n)]
    for mod in outer:
        weights = [n for n, k in kinds.items() if n.startswith(mod + ".")
                   and k in ("linear", "conv1d") and n.endswith(".weight")]
        named = [w for w in weights if _OUTPUT.search(w[len(mod):])]
        if len(named) == 1:  # the output projection by its name, else the last registered
            weights = [w for w in weights if w != named[0]] + named
        for pos, w in enumerate(weights):
            entry = tensors.get(_pattern(w, seq))
            if not entry or len(entry["axes"]) != 2:
                continue
            out_ax, in_ax = (1, 0) if entry["kind"] == "conv1d" else (0, 1)
            if pos == len(weights) - 1:
                entry["axes"][in_ax] = _retie(entry["axes"][in_ax])
                continue
            entry["axes"][out_ax] = _retie(entry["axes"][out_ax])
            bias = tensors.get(_pattern(w.removesuffix("weight") + "bias", seq))
            if bias and len(bias["axes"]) == 1:
                bias["axes"][0] = _retie(bias["axes"][0])


_OUTPUT = re.compile(r"\.(o_proj|out_proj|dense|c_proj|wo|o|output\.dense|proj|out)\.weight$")


def _retie(label: str) -> str:
    return "q" if label == "hidden" else label


def _layer_kinds(shapes: dict[str, tuple[int, ...]], tensors: dict[str, dict],
                 seq: frozenset[str]) -> None:
    """Where one layer child is a different module in different layers (NemotronH's
    ``mixer``, RecurrentGemma's ``temporal_block``), number each set of its tensors that
    the same layers hold (``layers``), so a layer of one kind is not asked for the other's."""
    where: dict[str, set[int]] = {}
    for name in shapes:
        found = re.search(r"\.(\d+)\.", name)
        if found:
            where.setdefault(_pattern(name, seq), set()).add(int(found.group(1)))
    parts: dict[tuple[str, bool], dict[frozenset[int], list[str]]] = {}
    for pattern, layers in where.items():
        if pattern in tensors and "{i}" in pattern:
            part = layer_part(pattern, tensors[pattern])
            parts.setdefault(part, {}).setdefault(frozenset(layers), []).append(pattern)
    for sets in parts.values():
        if len(sets) > 1:
            for n, layers in enumerate(sorted(sets, key=sorted)):
                for pattern in sets[layers]:
                    tensors[pattern]["layers"] = n


def _keys(config_cls, config) -> dict[str, str]:
    """Per role, the config.json key that records it (GPT-2's ``n_embd`` for hidden_size)."""
    mapping = getattr(config_cls, "attribute_map", {}) or {}
    saved = config.to_dict()
    out = {}
    for role, keys in KEYS.items():
        for key in keys:
            stored = mapping.get(key, key)
            if stored in saved and isinstance(saved[stored], int):
                out[role] = stored
                break
    return out


def _depths(config_cls) -> tuple[int | None, ...]:
    """Two layers, unless the first two would not build every kind of layer the default
    depth does (a hybrid's attention every 8th layer: Jamba, Bamba), then the default."""
    try:
        default = config_cls()
    except Exception:  # a config that will not build with defaults: the build says why
        return (2, None)
    kinds = next((k for k in (getattr(default, a, None) for a in _LAYER_KINDS)
                  if isinstance(k, list | tuple) and k), None)
    return (None,) if kinds and len(set(kinds[:2])) < len(set(kinds)) else (2, None)


#: config attributes listing each layer's kind (attention, mamba, linear attention, ...)
_LAYER_KINDS = ("layers_block_type", "layer_types")


def _builds(config_cls) -> tuple[tuple, tuple, bool]:
    """Both variants' (model, actual sizes), and whether the sub-configs were varied: where a
    composite will not build with them (a per-layer text config), both without them."""
    last: Exception | None = None
    for subs in (True, False):
        builds = []
        for variant in VARIANTS:  # the rescue values only where a plain build fails
            for layers, rescue in ((d, r) for d in _depths(config_cls) for r in (False, True)):
                try:
                    model = _build(_config(config_cls, variant, layers, subs, rescue))
                    builds.append((model, _actual(model, variant, subs)))
                    break
                except Exception as e:  # any class that will not build is recorded with why
                    last = last if rescue and last else e
        if len(builds) == len(VARIANTS):
            return builds[0], builds[1], subs
    raise RuntimeError(f"{type(last).__name__}: {str(last).splitlines()[0][:160]}")


def derive(model_type: str) -> dict:
    """One model_type's entry: its class and every saved tensor pattern's axis labels."""
    from transformers import AutoConfig

    config_cls = type(AutoConfig.for_model(model_type))
    (ma, va), (mb, vb), subs = _builds(config_cls)
    la = {**_labels(va), **config_labels(ma.config),
          **(composite.all_tower_labels(config_cls, 0) if subs else {})}
    lb = {**_labels(vb), **config_labels(mb.config),
          **(composite.all_tower_labels(config_cls, 1) if subs else {})}
    sa, sb = saved_shapes(ma), saved_shapes(mb)
    kinds = _kinds(ma)
    seq = sequential_modules(ma)
    pat = partial(_pattern, seq=seq)
    saved = saved_names(kinds, sa, renamed(ma))
    saved_kinds = {saved[n]: k for n, k in kinds.items()}
    saved_kinds |= layer_leaf_kinds(kinds, sa, saved_kinds)
    tensors: dict[str, dict] = {}
    for name in sorted(set(sa) & set(sb)):
        if len(sa[name]) != len(sb[name]):
            continue
        axes = [_axis_label(x, y, la, lb) for x, y in zip(sa[name], sb[name], strict=False)]
        tensors.setdefault(_pattern(name, seq), {"kind": saved_kinds.get(name, "other"),
                                            "axes": axes})
    # a hybrid's layer kinds are its recurrent mixers and attention, told apart by
    # label_mixers; the per-kind labels and the latent-attention reader serve the others
    hybrid = bool(mixer_prefixes(sa))
    if va["head_dim"] * va["heads"] == va["hidden"]:
        _untie_attention(ma, kinds, tensors, seq)
    elif not hybrid:  # per-head axes told apart by size alone, so each kind's labels hold
        derive_layers.by_kind(ma.config, (sa, sb), lambda x, y: _axis_label(x, y, la, lb),
                              pat, tensors)
    halved = derive_relabel.halve_gated(tensors)
    derive_experts.counts((sa, sb), lambda x, y: _axis_label(x, y, la, lb), pat, tensors)
    derive_relabel.table_rows(tensors)
    derive_relabel.mark_tied(ma, tensors)
    label_mixers(sa, tensors, seq)
    if not hybrid:
        derive_relabel.label_mla(ma, kinds, saved, tensors, pat)
    label_lookup_rows(tensors, ties_head(ma))
    _layer_kinds(sa, tensors, seq)
    if subs:
        composite.mark_optional(ma.config, built_shapes, pat, tensors)
    text = composite.text_config(ma.config) if subs else ma.config
    entry = {
        "class": type(ma).__name__,
        "keys": derive_relabel.without_halved(_keys(type(text), text), halved),
        "tied": bool(getattr(ma.config, "tie_word_embeddings", False)) and ties_head(ma),
        "head_dim_derived": va["head_dim"] * va["heads"] == va["hidden"],
        "tensors": tensors,
    }
    if text is not ma.config:
        entry["text_config"] = composite.TEXT
    towers = composite.tower_keys(ma.config, config_cls) if subs else {}
    if towers:
        entry["towers"] = towers
    return entry


def model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    encoders = [t for t in MODEL_FOR_MASKED_LM_MAPPING_NAMES
                if t in ("bert", "roberta", "distilbert", "albert", "electra", "xlm-roberta",
                         "camembert", "deberta", "deberta-v2", "modernbert")]
    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(encoders))


def build_table(types: list[str]) -> dict:
    import transformers

    table: dict = {"transformers": transformers.__version__, "types": {}, "not_built": {}}
    for t in types:
        try:
            table["types"][t] = derive(t)
        except Exception as e:  # recorded with why, never silently dropped
            table["not_built"][t] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    return table


def main(argv: list[str]) -> int:
    types = argv or model_types()
    table = build_table(types)
    if argv:  # a few types: print them, never overwrite the shipped table
        print(json.dumps(table, indent=1, sort_keys=True))
        return 0
    TABLE.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    print(f"wrote {TABLE}: {len(table['types'])} types, {len(table['not_built'])} not built")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
