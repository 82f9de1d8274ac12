"""Model families: which logical linears a layer has and which dimensions they share.

Sites that every checkpoint of a family has (MLP intermediate, head_dim, head counts, hidden,
vocab) are built here from logical linears (:mod:`gac_check.formats.layout`), whatever format
stores them. Tensor shapes are trusted over config.json, because structured pruners (LLM-Pruner)
keep the dense sizes in the config; every disagreement becomes a note on the site.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.pickletree import pickled_model
from gac_check.formats.declared import config_head_dim
from gac_check.formats.layout import Linear, Shapes
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

Resolver = Callable[[str], "Linear | None"]

ROPE_INEXACT = (
    "q/k head_dim cannot be zero-padded exactly under RoPE: stock modeling code derives the "
    "rotary frequencies from head_dim, so every real dimension would rotate differently"
)
HIDDEN_INEXACT = (
    "the hidden size cannot be zero-padded exactly: RMSNorm/LayerNorm statistics would be "
    "computed over the padded width"
)
VOCAB_INEXACT = (
    "padded vocabulary rows produce logits for tokens the tokenizer does not have; stock "
    "generation could sample them"
)
HEADS_NOT_PADDED = "head counts are reported, not padded: the stock config holds one count"


@dataclass(frozen=True)
class Family:
    """Module names of one architecture family, relative to a layer prefix."""

    name: str
    layer_pattern: str  # regex with a group for the prefix and one for the layer index
    q: str
    k: str
    v: str
    o: str
    up: str
    down: str
    gate: str | None
    rope: bool
    norms: tuple[str, ...]
    embed: str


LLAMA = Family(
    "llama", r"^(.*?layers)\.(\d+)\.self_attn\.",
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.up_proj", "mlp.down_proj", "mlp.gate_proj", True,
    ("input_layernorm", "post_attention_layernorm"), "embed_tokens",
)
BERT = Family(
    "bert", r"^(.*?encoder\.layer)\.(\d+)\.attention\.",
    "attention.self.query", "attention.self.key", "attention.self.value",
    "attention.output.dense", "intermediate.dense", "output.dense", None, False,
    ("attention.output.LayerNorm", "output.LayerNorm"), "embeddings.word_embeddings",
)
FAMILIES = (LLAMA, BERT)


def find_family(ckpt: Checkpoint) -> tuple[Family, str, list[int]] | None:
    """The family, the layer-list prefix (``model.layers``) and the layer indices present."""
    for fam in FAMILIES:
        rx = re.compile(fam.layer_pattern)
        prefixes: dict[str, set[int]] = {}
        for name in ckpt.tensors:
            m = rx.match(name)
            if m:
                prefixes.setdefault(m.group(1), set()).add(int(m.group(2)))
        if prefixes:
            prefix = max(prefixes, key=lambda p: len(prefixes[p]))
            return fam, prefix, sorted(prefixes[prefix])
    return None


def head_dim_of(config: dict) -> int | None:
    if isinstance(config.get("head_dim"), int):
        return config["head_dim"]
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads:
        return hidden // heads
    return None


def infer_head_dim(ckpt: Checkpoint) -> tuple[int | None, str]:
    """head_dim without a config.json value, from what the checkpoint says about itself.

    In order: the attention modules' ``head_dim`` attribute in a pickled model (when all
    agree), a rotary ``inv_freq`` buffer (head_dim / 2 entries; older transformers and
    LLM-Pruner's own modeling keep it in the state dict, current transformers pickle it as a
    non-persistent buffer), and the pickled config's head_dim (or hidden / heads). Returns
    (value, where it came from), or (None, "") when none of them is there.
    """
    model = pickled_model(ckpt)
    if model is not None:
        dims = {a.get("head_dim") for p, a in model.attributes.items()
                if p.endswith(".self_attn") or p.endswith(".attention")}
        dims.discard(None)
        if len(dims) == 1 and isinstance(hd := next(iter(dims)), int) and hd > 0:
            return hd, "the pickled attention modules' head_dim attribute"
    buffers = dict(model.buffers) if model else {}
    buffers.update((n, t.shape) for n, t in ckpt.tensors.items())
    for name, shape in sorted(buffers.items()):
        if name.endswith("inv_freq") and len(shape) == 1 and shape[0] > 0:
            return 2 * shape[0], f"{name} ({shape[0]} rotary frequencies)"
    if model is not None and (hd := head_dim_of(model.config)):
        return hd, "the pickled model's config"
    return None, ""


def family_sites(ckpt: Checkpoint, fam: Family, prefix: str, layers: list[int],
                 resolve: Resolver, head_dim: tuple[int, str] | None = None) -> list[DimSite]:
    """Per-layer intermediate/head_dim/heads sites plus the global hidden and vocab sites.

    head_dim is config.json's where the tensors agree (:func:`.declared.config_head_dim`: a
    refuted value is a note, a head count that does not divide the width a refusal); else what
    :func:`infer_head_dim` finds, else
    ``head_dim`` (value, how) from a format that can infer it from shapes alone (LLM-Pruner's
    whole-head pruning). An inferred head_dim is noted on every head_dim site.
    """
    shapes = ckpt.shapes
    cfg = ckpt.config
    hd, disagree = config_head_dim(ckpt, [(resolve(f"{prefix}.{i}.{fam.q}"),
                                           resolve(f"{prefix}.{i}.{fam.k}")) for i in layers])
    how = ""
    if hd is None:
        hd, how = infer_head_dim(ckpt)
    if hd is None and head_dim is not None:
        hd, how = head_dim
    sites: list[DimSite] = []
    for i in layers:
        base = f"{prefix}.{i}"
        lin = {key: resolve(f"{base}.{getattr(fam, key)}")
               for key in ("q", "k", "v", "o", "up", "down", "gate") if getattr(fam, key)}
        if lin.get("up") and lin.get("down"):
            sites.append(_intermediate_site(cfg, shapes, fam, base, i, lin))
        if hd and all(lin.get(k) for k in ("q", "k", "v", "o")):
            attention = _attention_sites(cfg, shapes, fam, base, i, lin, hd)
            if how:
                attention[0].notes.append(f"head_dim {hd} inferred from {how}")
            sites.extend(attention)
    sites.append(_hidden_site(ckpt, fam, prefix, layers, resolve))
    sites[-1].notes.extend(disagree)  # config.json values the tensors refute, never used
    vocab = _vocab_site(ckpt, fam)
    if vocab:
        sites.append(vocab)
    return sites


def _intermediate_site(cfg: dict, shapes: Shapes, fam: Family, base: str, i: int,
                       lin: dict[str, Linear | None]) -> DimSite:
    up, down = lin["up"], lin["down"]
    assert up and down
    axes = up.producer_axes(shapes) + down.consumer_axes(shapes)
    if lin.get("gate"):
        axes = lin["gate"].producer_axes(shapes) + axes  # type: ignore[union-attr]
    module = f"{base}.{fam.up.rsplit('.', 1)[0]}"
    site = DimSite(f"{module}:intermediate", Role.INTERMEDIATE, up.out_features, axes,
                   layer=i, module=module, config_field=("intermediate_size",))
    _note_disagreement(site, cfg, "intermediate_size")
    if down.in_features != up.out_features:
        site.notes.append(f"down takes {down.in_features} inputs, up makes {up.out_features}")
    return site


def _attention_sites(cfg: dict, shapes: Shapes, fam: Family, base: str, i: int,
                     lin: dict[str, Linear | None], hd: int) -> list[DimSite]:
    q, k, v, o = (lin[x] for x in ("q", "k", "v", "o"))
    assert q and k and v and o
    module = f"{base}.{fam.q.rsplit('.', 1)[0]}"
    axes = (q.producer_axes(shapes, hd) + k.producer_axes(shapes, hd)
            + v.producer_axes(shapes, hd) + o.consumer_axes(shapes, hd))
    inexact = ROPE_INEXACT if fam.rope else (
        "BERT's config derives head_dim from hidden_size / num_attention_heads, so a padded "
        "head_dim cannot be recorded in a stock config"
    )
    head = DimSite(f"{module}:head_dim", Role.HEAD_DIM, hd, axes, layer=i, module=module,
                   config_field=("head_dim",) if "head_dim" in cfg else None, inexact=inexact,
                   attrs={"rope": fam.rope})
    heads = DimSite(f"{module}:heads", Role.HEADS, q.out_features // hd, [], layer=i,
                    module=module, config_field=("num_attention_heads",), inexact=HEADS_NOT_PADDED,
                    attrs={"kv_heads": k.out_features // hd})
    _note_disagreement(heads, cfg, "num_attention_heads")
    kv_cfg = cfg.get("num_key_value_heads")
    if isinstance(kv_cfg, int) and kv_cfg != k.out_features // hd:
        heads.notes.append(f"config.json says num_key_value_heads={kv_cfg}, tensors have "
                           f"{k.out_features // hd}")
    return [head, heads]


def _hidden_site(ckpt: Checkpoint, fam: Family, prefix: str, layers: list[int],
                 resolve: Resolver) -> DimSite:
    shapes = ckpt.shapes
    embed = next((n for n in shapes if n.endswith(f"{fam.embed}.weight")), None)
    declared = ckpt.config.get("hidden_size")
    fallback = declared if isinstance(declared, int) else 0  # null or "64" count as missing
    value = shapes[embed][1] if embed else fallback
    axes: list[TensorAxis] = []
    if embed:
        axes.append(TensorAxis(embed, 1, AxisKind.CONSUMER))
    for i in layers:
        base = f"{prefix}.{i}"
        for key in ("q", "k", "v", "up", "gate"):
            lin = resolve(f"{base}.{getattr(fam, key)}") if getattr(fam, key) else None
            if lin:
                axes.extend(lin.consumer_axes(shapes))
        for key in ("o", "down"):
            lin = resolve(f"{base}.{getattr(fam, key)}")
            if lin:
                axes.extend(lin.producer_axes(shapes))
    for name, shape in shapes.items():
        is_norm = any(f".{n}." in f".{name}" for n in fam.norms) or "norm." in name.lower()
        if is_norm and len(shape) == 1 and shape[0] == value:
            axes.append(TensorAxis(name, 0, AxisKind.NORM))
    site = DimSite("hidden", Role.HIDDEN, value, axes, config_field=("hidden_size",),
                   inexact=HIDDEN_INEXACT)
    _note_disagreement(site, ckpt.config, "hidden_size")
    return site


def _vocab_site(ckpt: Checkpoint, fam: Family) -> DimSite | None:
    shapes = ckpt.shapes
    head = "lm_head.weight" if "lm_head.weight" in shapes else None
    embed = next((n for n in shapes if n.endswith(f"{fam.embed}.weight")), None)
    archs = ckpt.config.get("architectures")
    if not isinstance(archs, list):
        archs = []  # a bare string would be searched per character
    causal = any(str(a).endswith("ForCausalLM") for a in archs)
    if not head and not (causal and embed):
        return None
    axes = [TensorAxis(t, 0, AxisKind.PRODUCER) for t in (head, embed) if t]
    value = shapes[axes[0].tensor][0]
    site = DimSite("vocab", Role.VOCAB, value, axes, config_field=("vocab_size",),
                   inexact=VOCAB_INEXACT)
    _note_disagreement(site, ckpt.config, "vocab_size")
    return site


def _note_disagreement(site: DimSite, cfg: dict, key: str) -> None:
    declared = cfg.get(key)
    if isinstance(declared, int) and declared != site.value:
        site.notes.append(f"config.json says {key}={declared}, tensors have {site.value}")
