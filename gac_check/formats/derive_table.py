"""Derive each architecture's tensor roles from transformers' own classes, ahead of time.

The check reads headers only, so it cannot import transformers' modeling code per run (seconds).
This module builds every causal-LM class transformers ships (and the BERT-family masked-LM
encoders) on the meta device, twice, with distinctive config values (:data:`VARIANTS`), and
records for every saved tensor name which config-derived width sits on each axis: an axis is
``hidden`` when its size is the hidden size in both builds, ``inter`` when it is the MLP width,
``q`` when it is heads x head_dim, and so on (:data:`LABELS`). An axis that moves with the
config but matches no label is ``?``; one that stays put is ``=N``. Names are the ones
``save_pretrained`` writes (transformers' own key conversion reverted), with layer and expert
indices replaced by ``{i}`` / ``{e}``. The result is data, :data:`TABLE`
(``gac_check/data/architectures.json``), read at check time by :mod:`gac_check.formats.derived`.

Built-in classes only (never ``trust_remote_code``); nothing is allocated (meta device).
Regenerate with ``python -m gac_check.formats.derive_table`` after upgrading transformers;
tests/test_derived_table.py fails when the shipped table disagrees with the installed classes.
"""
from __future__ import annotations

import contextlib
import json
import re
import sys
import warnings
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "data" / "architectures.json"

#: Two builds with values no two widths share, so each axis's role is read from its sizes.
VARIANTS = (
    {"hidden": 96, "heads": 4, "kv_heads": 2, "head_dim": 20, "inter": 136, "expert": 152,
     "shared": 168, "vocab": 517, "experts": 5, "positions": 128},
    {"hidden": 120, "heads": 6, "kv_heads": 3, "head_dim": 24, "inter": 184, "expert": 200,
     "shared": 216, "vocab": 541, "experts": 7, "positions": 160},
)
#: config keys set to each variant value, where the config class has them
KEYS = {
    "hidden": ("hidden_size",),
    "heads": ("num_attention_heads", "encoder_attention_heads", "decoder_attention_heads"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "inter": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size",
              "encoder_ffn_dim", "decoder_ffn_dim"),
    "expert": ("moe_intermediate_size", "expert_intermediate_size"),
    "shared": ("shared_expert_intermediate_size",),
    "vocab": ("vocab_size",),
    "experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "positions": ("max_position_embeddings", "n_positions"),
}


def _labels(v: dict[str, int]) -> dict[str, int]:
    """Every width a label names, for one build's actual sizes."""
    h, n, k, d = v["hidden"], v["heads"], v["kv_heads"], v["head_dim"]
    return {
        "hidden": h, "vocab": v["vocab"], "inter": v["inter"], "inter2": 2 * v["inter"],
        "expert": v["expert"], "expert2": 2 * v["expert"], "shared": v["shared"],
        "shared2": 2 * v["shared"], "q": n * d, "kv": k * d, "qkv": (n + 2 * k) * d,
        "q3": 3 * n * d, "qkv_mq": (n + 2) * d, "kv2": 2 * k * d, "hd": d, "heads": n,
        "kv_heads": k,
        "experts": v["experts"], "positions": v["positions"],
        "positions2": v["positions"] + 2, "h4": 4 * h, "h3": 3 * h,
    }


#: Labels in the order a tie is broken (hidden = heads x head_dim in BERT-style configs).
LABELS = tuple(_labels(VARIANTS[0]))


def _config(config_cls, variant: dict[str, int], layers: int | None):
    default = config_cls()
    kwargs: dict[str, object] = {}
    for role, keys in KEYS.items():
        for key in keys:
            settable = not isinstance(getattr(config_cls, key, None), property)
            if settable and hasattr(default, key):
                kwargs[key] = variant[role]
    if layers:
        kwargs["num_hidden_layers"] = layers
    for token in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        if isinstance(getattr(default, token, None), int):
            kwargs[token] = 0  # a default id past the tiny vocabulary will not build
    return config_cls(**kwargs)


def _build(config):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    auto = (AutoModelForCausalLM if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            else AutoModelForMaskedLM)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return auto.from_config(config)


def _actual(model, variant: dict[str, int]) -> dict[str, int]:
    """The sizes the class really built with (head_dim may be hidden / heads)."""
    v = dict(variant)
    dims = {getattr(m, attr, None) for _, m in model.named_modules()
            for attr in ("head_dim", "attention_head_size", "head_size")}
    dims = {d for d in dims if isinstance(d, int) and d > 0}
    if len(dims) == 1:
        v["head_dim"] = dims.pop()
    kv = getattr(model.config, "num_key_value_heads", None)
    v["kv_heads"] = kv if isinstance(kv, int) and kv > 0 else v["heads"]
    return v


def _saved_shapes(model) -> dict[str, tuple[int, ...]]:
    """The tensors ``save_pretrained`` would write (key conversion reverted), by shape."""
    from transformers.core_model_loading import revert_weight_conversion

    state = model.state_dict()
    with contextlib.suppress(Exception):
        state = revert_weight_conversion(model, state)
    return {n: tuple(t.shape) for n, t in state.items()}


def built_shapes(config) -> dict[str, tuple[int, ...]]:
    """What ``config``'s own class builds on the meta device, as ``save_pretrained`` names and
    shapes it (no memory; built-in classes only): what a repair's output is held to
    (:mod:`gac_check.padding.class_proof`)."""
    return _saved_shapes(_build(config))


def _pattern(name: str) -> str:
    name = re.sub(r"\.(\d+)\.", ".{i}.", name, count=1)
    return re.sub(r"\.(\d+)\.", ".{e}.", name)


def _axis_label(a: int, b: int, la: dict[str, int], lb: dict[str, int]) -> str:
    if a == b:
        return f"={a}"
    return next((lab for lab in LABELS if la[lab] == a and lb[lab] == b), "?")


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


def _untie_attention(model, kinds: dict[str, str], tensors: dict[str, dict]) -> None:
    """Where heads x head_dim equals the hidden size, sizes cannot tell the attention's
    per-head axes from the residual stream's: in each outermost attention module, the
    projection registered last is the output (its input is ``q``), the others produce ``q``."""
    names = [n for n, m in model.named_modules() if "attention" in type(m).__name__.lower()
             and "norm" not in type(m).__name__.lower()]
    outer = [n for n in names if n and not any(n.startswith(o + ".") for o in names if o != n)]
    for mod in outer:
        weights = [n for n, k in kinds.items() if n.startswith(mod + ".")
                   and k in ("linear", "conv1d") and n.endswith(".weight")]
        named = [w for w in weights if _OUTPUT.search(w[len(mod):])]
        if len(named) == 1:  # the output projection by its name, else the last registered
            weights = [w for w in weights if w != named[0]] + named
        for pos, w in enumerate(weights):
            entry = tensors.get(_pattern(w))
            if not entry or len(entry["axes"]) != 2:
                continue
            out_ax, in_ax = (1, 0) if entry["kind"] == "conv1d" else (0, 1)
            if pos == len(weights) - 1:
                entry["axes"][in_ax] = _retie(entry["axes"][in_ax])
                continue
            entry["axes"][out_ax] = _retie(entry["axes"][out_ax])
            bias = tensors.get(_pattern(w.removesuffix("weight") + "bias"))
            if bias and len(bias["axes"]) == 1:
                bias["axes"][0] = _retie(bias["axes"][0])


_OUTPUT = re.compile(r"\.(o_proj|out_proj|dense|c_proj|wo|o|output\.dense|proj|out)\.weight$")


def _retie(label: str) -> str:
    return "q" if label == "hidden" else label


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


def derive(model_type: str) -> dict:
    """One model_type's entry: its class and every saved tensor pattern's axis labels."""
    from transformers import AutoConfig

    config_cls = type(AutoConfig.for_model(model_type))
    builds = []
    for variant in VARIANTS:
        last: Exception | None = None
        for layers in (2, None):
            try:
                model = _build(_config(config_cls, variant, layers))
                break
            except Exception as e:  # any class that will not build is recorded with why
                last = e
        else:
            raise RuntimeError(f"{type(last).__name__}: {str(last).splitlines()[0][:160]}")
        builds.append((model, _actual(model, variant)))
    (ma, va), (mb, vb) = builds
    la, lb = _labels(va), _labels(vb)
    sa, sb = _saved_shapes(ma), _saved_shapes(mb)
    kinds = _kinds(ma)
    tensors: dict[str, dict] = {}
    for name in sorted(set(sa) & set(sb)):
        if len(sa[name]) != len(sb[name]):
            continue
        axes = [_axis_label(x, y, la, lb) for x, y in zip(sa[name], sb[name], strict=False)]
        tensors.setdefault(_pattern(name), {"kind": kinds.get(name, "other"), "axes": axes})
    if va["head_dim"] * va["heads"] == va["hidden"]:
        _untie_attention(ma, kinds, tensors)
    return {
        "class": type(ma).__name__,
        "keys": _keys(type(ma.config), ma.config),
        "tied": bool(getattr(ma.config, "tie_word_embeddings", False)),
        "head_dim_derived": va["head_dim"] * va["heads"] == va["hidden"],
        "tensors": tensors,
    }


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
