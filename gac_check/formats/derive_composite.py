"""Composite classes in the class table: a language model under ``text_config``, towers beside it.

A vision-language or speech model (Gemma-3, GOT-OCR2, Fuyu, MOSS-transcribe, GIT, Phi-4
multimodal) keeps its language model's widths in a sub-config (``text_config``) or at the top
level, and each encoder tower's (a ViT, a Whisper-style or Conformer audio encoder) in its
own (``vision_config``, ``audio_config``). Varying only the top-level keys left every axis of
such a class a constant, so the table could name none of the language model's widths. Here
:mod:`.derive_table` is told how to vary each sub-config: the text one with the variant's
values, exactly like a top-level language model, and each tower with values of its own
(:data:`TOWER_VARIANTS`, distinct from every text width), so an axis that moves with a
tower's width is labelled ``SCOPE:LABEL`` (``vision_config:inter``). :mod:`.derived` judges
those as the tower's own GEMM widths (never padded: --repair pads the language model only).
"""
from __future__ import annotations

import re

#: the sub-config that holds the language model, where the class has one
TEXT = "text_config"
#: sub-configs that are encoder towers beside the language model
_TOWER = re.compile(r"^(vision|audio|speech|image)_config$")
#: per tower (in sub-config order), two builds; no value pair equals a text label's pair,
#: and no tower's head width is one the text model builds (20 or 24: a class may derive its
#: head_dim as hidden / heads), since the text head_dim is told from the towers' by value
#: (tests/test_composite_models.py holds the table to both)
TOWER_VARIANTS = (
    ({"hidden": 56, "heads": 2, "inter": 104}, {"hidden": 88, "heads": 4, "inter": 232}),
    ({"hidden": 72, "heads": 4, "inter": 144}, {"hidden": 112, "heads": 7, "inter": 264}),
)
#: a tower config's keys per role (GOT-OCR2's ViT calls its MLP width ``mlp_dim``)
_TOWER_KEYS = {"hidden": ("hidden_size",), "heads": ("num_attention_heads",),
               "inter": ("intermediate_size", "mlp_dim")}
#: tower labels: a ViT's q/k/v are heads x head_dim = its hidden width, so they read as it
TOWER_LABELS = ("hidden", "inter", "inter2", "h3", "h4", "hd", "heads")


def sub_configs(config_cls) -> tuple[str | None, list[str]]:
    """(the text sub-config's name or None, the tower sub-configs' names) of a config class."""
    names = list(getattr(config_cls, "sub_configs", None) or {})
    return (TEXT if TEXT in names else None), [n for n in names if _TOWER.match(n)]


def tower_values(index: int, build: int) -> dict[str, int]:
    """Tower ``index``'s widths in build ``build`` (0 or 1), with its head_dim."""
    v = dict(TOWER_VARIANTS[index % len(TOWER_VARIANTS)][build])
    v["head_dim"] = v["hidden"] // v["heads"]
    return v


def tower_labels(scope: str, v: dict[str, int]) -> dict[str, int]:
    """Every width a tower label names, for one build's tower sizes."""
    h, i = v["hidden"], v["inter"]
    sizes = {"hidden": h, "inter": i, "inter2": 2 * i, "h3": 3 * h, "h4": 4 * h,
             "hd": v["head_dim"], "heads": v["heads"]}
    return {f"{scope}:{k}": sizes[k] for k in TOWER_LABELS}


def tower_kwargs(default_sub, v: dict[str, int]) -> dict[str, int]:
    """Keyword arguments that build a tower sub-config at ``v``'s widths, two layers deep."""
    out = {"num_hidden_layers": 2} if hasattr(default_sub, "num_hidden_layers") else {}
    for role, keys in _TOWER_KEYS.items():
        out.update({k: v[role] for k in keys if hasattr(default_sub, k)})
    return out


def sub_kwargs(config_cls, default, build: int, text_kwargs) -> dict[str, object]:
    """Sub-config objects for one build: the text one from ``text_kwargs(sub_cls)`` (the
    variant's keys, as a top-level language model gets them), each tower at its own widths."""
    text, towers = sub_configs(config_cls)
    out: dict[str, object] = {}
    if text and getattr(default, text, None) is not None:
        out[text] = _built(type(getattr(default, text)), text_kwargs(type(getattr(default, text))))
    for index, name in enumerate(towers):
        sub = getattr(default, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            out[name] = _built(type(sub), tower_kwargs(sub, tower_values(index, build)))
    return out


def _built(config_cls, kwargs: dict[str, object]):
    """The sub-config, else at its default depth (a layer pattern that wants its length),
    as the zoo builds it (gac_check/testing/zoo.py)."""
    try:
        return config_cls(**kwargs)
    except Exception:  # a hybrid layer pattern that wants its own length
        return config_cls(**{k: v for k, v in kwargs.items() if k != "num_hidden_layers"})


def text_config(config):
    """The config object that holds the language model's widths."""
    return getattr(config, TEXT, None) or config


def tower_head_dims(config_cls, build: int) -> set[int]:
    """The towers' head widths in one build: not the language model's head_dim."""
    _, towers = sub_configs(config_cls)
    return {tower_values(i, build)["head_dim"] for i in range(len(towers))}


def all_tower_labels(config_cls, build: int) -> dict[str, int]:
    """Every tower label of a class in one build."""
    _, towers = sub_configs(config_cls)
    out: dict[str, int] = {}
    for index, name in enumerate(towers):
        out.update(tower_labels(name, tower_values(index, build)))
    return out


def tower_keys(config, config_cls) -> dict[str, dict[str, str]]:
    """Per tower sub-config, the key that records each of its widths."""
    _, towers = sub_configs(config_cls)
    out = {}
    for name in towers:
        saved = getattr(config, name, None)
        saved = saved.to_dict() if hasattr(saved, "to_dict") else {}
        out[name] = {role: next(k for k in keys if isinstance(saved.get(k), int))
                     for role, keys in _TOWER_KEYS.items()
                     if any(isinstance(saved.get(k), int) for k in keys)}
    return out


def mark_optional(config, build, pattern, tensors: dict[str, dict]) -> None:
    """Mark the tensors a tower builds only under one of its ``use_`` flags
    (``vision_use_head``: SigLIP's pooling head, which Gemma-3 turns off) ``optional`` with
    that flag, so a checkpoint whose config turns the part off is not refused as torn.
    ``build(config)`` returns the saved shapes; ``pattern(name)`` a name's table pattern."""
    _, towers = sub_configs(type(config))
    try:
        base = set(build(config)) if towers else set()
    except Exception:  # a class built only through its parent's Auto mapping: no flags read
        return
    for name in towers:
        sub = getattr(config, name, None)
        flags = [k for k, v in (sub.to_dict() if sub is not None else {}).items()
                 if isinstance(v, bool) and "use_" in k]
        for flag in flags:
            setattr(sub, flag, not getattr(sub, flag))
            try:
                gone = base - set(build(config))
            except Exception:  # the flag will not build flipped: nothing is optional by it
                gone = set()
            setattr(sub, flag, not getattr(sub, flag))
            for tensor in gone:
                entry = tensors.get(pattern(tensor)) or tensors.get(tensor)
                if entry is not None:
                    entry["optional"] = f"{name}.{flag}"
