"""Model families: which logical linears a layer has and which dimensions they share.

Sites that every checkpoint of a family has (MLP intermediate, head_dim, head counts, hidden,
vocab) are built here from logical linears (:mod:`gac_check.formats.layout`), whatever format
stores them. Tensor shapes are trusted over config.json, because structured pruners (LLM-Pruner)
keep the dense sizes in the config; every disagreement becomes a note on the site.
"""
from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from gac_check.checkpoint.index import Checkpoint
from gac_check.formats.declared import config_head_dim
from gac_check.formats.head_dim import ROPE_INEXACT, infer_head_dim
from gac_check.formats.layout import Linear, Shapes
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

Resolver = Callable[[str], "Linear | None"]

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
    """Module names of one architecture family, relative to a layer prefix.

    A family is recognised by modules, never guessed: every name in :meth:`required` must be
    present in the first layer. Fused projections (``qkv``, ``gate_up``) replace their parts;
    ``positions`` is a learned position table over the residual stream (OPT); ``parallel``
    blocks feed attention and MLP the same normed input (Phi-2), so one norm serves both.
    """

    name: str
    model_types: tuple[str, ...]
    layer_pattern: str  # regex with a group for the prefix and one for the layer index
    q: str | None
    k: str | None
    v: str | None
    o: str
    up: str | None
    down: str
    gate: str | None
    rope: bool
    norms: tuple[str, ...]
    embed: str
    final_norm: str
    qkv: str | None = None
    gate_up: str | None = None
    positions: str | None = None
    parallel: bool = False
    intermediate_key: str = "intermediate_size"  # the config.json key of the MLP width
    #: multi-head latent attention (DeepSeek-V2/V3): the modules that identify it, and the
    #: linears that read the residual stream (q_a_proj or q_proj, kv_a_proj_with_mqa); its
    #: own sites are :mod:`gac_check.formats.mla`'s
    latent: tuple[str, ...] = ()
    latent_inputs: tuple[str, ...] = ()

    def required(self) -> tuple[str, ...]:
        """The modules (relative to a layer) whose presence identifies the family."""
        names = (self.qkv, self.q, self.k, self.v, self.o, self.gate_up, self.up, self.gate,
                 self.down, *self.latent)
        return tuple(n for n in names if n)

    @property
    def attention_inputs(self) -> tuple[str, ...]:
        if self.latent_inputs:
            return self.latent_inputs
        return (self.qkv,) if self.qkv else tuple(n for n in (self.q, self.k, self.v) if n)

    @property
    def mlp_inputs(self) -> tuple[str, ...]:
        return (self.gate_up,) if self.gate_up else tuple(n for n in (self.gate, self.up) if n)


_DECODER = r"^(.*?layers)\.(\d+)\."
LLAMA = Family(
    "llama", ("llama", "mistral", "qwen2"), _DECODER,
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.up_proj", "mlp.down_proj", "mlp.gate_proj", True,
    ("input_layernorm", "post_attention_layernorm"), "embed_tokens", "norm",
)
OPT = Family(
    "opt", ("opt",), _DECODER,
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
    "fc1", "fc2", None, False, ("self_attn_layer_norm", "final_layer_norm"), "embed_tokens",
    "final_layer_norm", positions="embed_positions", intermediate_key="ffn_dim",
)
PHI = Family(  # Phi-2 (transformers' PhiForCausalLM)
    "phi", ("phi",), _DECODER,
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.dense",
    "mlp.fc1", "mlp.fc2", None, True, ("input_layernorm",), "embed_tokens", "final_layernorm",
    parallel=True,
)
PHI3 = Family(
    "phi3", ("phi3",), _DECODER,
    None, None, None, "self_attn.o_proj", None, "mlp.down_proj", None, True,
    ("input_layernorm", "post_attention_layernorm"), "embed_tokens", "norm",
    qkv="self_attn.qkv_proj", gate_up="mlp.gate_up_proj",
)
BERT = Family(
    "bert", ("bert",), r"^(.*?encoder\.layer)\.(\d+)\.",
    "attention.self.query", "attention.self.key", "attention.self.value",
    "attention.output.dense", "intermediate.dense", "output.dense", None, False,
    ("attention.output.LayerNorm", "output.LayerNorm"), "embeddings.word_embeddings",
    "",
)
DEEPSEEK = Family(  # DeepSeek-V2/V3: multi-head latent attention; MoE layers: formats/moe.py
    "deepseek", ("deepseek_v2", "deepseek_v3"), _DECODER,
    None, None, None, "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj", "mlp.gate_proj", True,
    ("input_layernorm", "post_attention_layernorm"), "embed_tokens", "norm",
    latent=("self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj"),
    latent_inputs=("self_attn.q_a_proj", "self_attn.q_proj", "self_attn.kv_a_proj_with_mqa"),
)
#: Most specific first: Phi-3's fused names, then OPT's and Phi-2's own output names, before
#: Llama's (which OPT and Phi-2 share q/k/v names with).
FAMILIES = (PHI3, OPT, PHI, LLAMA, BERT, DEEPSEEK)


def _modules(ckpt: Checkpoint) -> set[str]:
    """Every module path that owns a tensor (``a.b.weight`` -> ``a.b``)."""
    return {n.rsplit(".", 1)[0] for n in ckpt.tensors if "." in n}


def _layers(ckpt: Checkpoint, fam: Family) -> tuple[str, list[int]] | None:
    found = _layer_list(tuple(ckpt.tensors), fam.layer_pattern)
    return (found[0], list(found[1])) if found else None


@lru_cache(maxsize=32)
def _layer_list(names: tuple[str, ...], pattern: str) -> tuple[str, tuple[int, ...]] | None:
    """The layer list ``pattern`` finds among ``names``: pure, so memoised (detection asks
    for it a dozen times per check, each a regex over every tensor name)."""
    rx = re.compile(pattern)
    prefixes: dict[str, set[int]] = {}
    for name in names:
        m = rx.match(name)
        if m:
            prefixes.setdefault(m.group(1), set()).add(int(m.group(2)))
    if not prefixes:
        return None
    prefix = max(prefixes, key=lambda p: len(prefixes[p]))
    return prefix, tuple(sorted(prefixes[prefix]))


def _has(modules: list[str], module: str) -> bool:
    """A logical linear is present in whatever layout a format stores it (``X.weight``,
    ASVD's ``X.ALinear``, SVD-LLM's ``X_u_proj``, PaLU's ``X.VT``). ``modules`` is sorted, so
    each look-up is a bisection, not a scan of every module (a 70B model has ~700; a check
    asks ~70 times)."""
    stem = module.removesuffix("_proj")
    return (_first_from(modules, module) == module
            or _first_from(modules, module + ".").startswith(module + ".")
            or _first_from(modules, stem + "_u_proj").startswith(stem + "_u_proj"))


def _first_from(modules: list[str], prefix: str) -> str:
    """The first of the sorted ``modules`` not before ``prefix`` ("" past the end)."""
    i = bisect_left(modules, prefix)
    return modules[i] if i < len(modules) else ""


def find_family(ckpt: Checkpoint, strict: bool = True) -> tuple[Family, str, list[int]] | None:
    """The family, the layer-list prefix (``model.layers``) and the layer indices present.

    Strictly, a family is chosen only when its first layer has every module the family
    requires: a layer list whose modules no family names is unknown
    (:func:`unknown_architecture`), never read as Llama; a repair needs that. A check may take
    the family most of whose modules are there (``strict=False``), so a partial checkpoint
    still gets the sites it has.
    """
    modules = sorted(_modules(ckpt))
    best: tuple[int, tuple[Family, str, list[int]]] | None = None
    for fam in FAMILIES:
        found = _layers(ckpt, fam)
        if found is None:
            continue
        prefix, layers = found
        base = f"{prefix}.{layers[0]}"
        present = sum(_has(modules, f"{base}.{m}") for m in fam.required())
        if present == len(fam.required()):
            return fam, prefix, layers
        if not strict and present and (best is None or present > best[0]):
            best = present, (fam, prefix, layers)
    return best[1] if best else None


def unknown_architecture(ckpt: Checkpoint) -> str | None:
    """Why the layers of this checkpoint belong to no known family (None when one is found,
    or when there are no recognisable layers at all)."""
    if find_family(ckpt) is not None:
        return None
    found = next((f for fam in FAMILIES if (f := _layers(ckpt, fam))), None)
    if found is None:
        return None
    prefix, layers = found
    base = f"{prefix}.{layers[0]}."
    names = sorted({m[len(base):] for m in _modules(ckpt) if m.startswith(base)})
    model_type = ckpt.config.get("model_type")
    kind = f"model_type {model_type!r}, " if isinstance(model_type, str) else ""
    return (f"an architecture gac-check does not know ({kind}layer modules "
            f"{', '.join(names[:8])}); known families: "
            f"{', '.join(f.name for f in FAMILIES)}")


def family_sites(ckpt: Checkpoint, fam: Family, prefix: str, layers: list[int],
                 resolve: Resolver, head_dim: tuple[int, str] | None = None,
                 layer_head_dims: Mapping[int, int] | None = None) -> list[DimSite]:
    """Per-layer intermediate/head_dim/heads sites plus the global hidden and vocab sites.

    head_dim is config.json's where the tensors agree (:func:`.declared.config_head_dim`: a
    refuted value is a note, a head count that does not divide the width a refusal); else what
    :func:`.head_dim.infer_head_dim` finds, else
    ``head_dim`` (value, how) from a format that can infer it from shapes alone (LLM-Pruner's
    whole-head pruning). An inferred head_dim is noted on every head_dim site.
    ``layer_head_dims`` are layers with a head_dim of their own (per_layer_config's), split
    by it and left out of the model's.
    """
    shapes = ckpt.shapes
    cfg = ckpt.config
    own = dict(layer_head_dims or {})
    hd, disagree = config_head_dim(ckpt, [(resolve(f"{prefix}.{i}.{fam.q}"),
                                           resolve(f"{prefix}.{i}.{fam.k}"),
                                           resolve(f"{prefix}.{i}.{fam.v}") if fam.v else None)
                                          for i in layers if i not in own])
    how = ""
    if hd is None:
        hd, how = infer_head_dim(ckpt)
    if hd is None and head_dim is not None:
        hd, how = head_dim
    sites: list[DimSite] = []
    for i in layers:
        base = f"{prefix}.{i}"
        lin = {key: resolve(f"{base}.{getattr(fam, key)}")
               for key in ("q", "k", "v", "qkv", "o", "up", "down", "gate", "gate_up")
               if getattr(fam, key)}
        mlp = _intermediate_site(cfg, shapes, fam, base, i, lin)
        if mlp:
            sites.append(mlp)
        layer_hd = own.get(i, hd)
        attention = _attention_sites(cfg, shapes, fam, base, i, lin, layer_hd) if layer_hd else []
        if attention and how and i not in own:
            attention[0].notes.append(f"head_dim {hd} inferred from {how}")
        sites.extend(attention)
    sites.append(_hidden_site(ckpt, fam, prefix, layers, resolve))
    sites[-1].notes.extend(disagree)  # config.json values the tensors refute, never used
    vocab = _vocab_site(ckpt, fam)
    if vocab:
        sites.append(vocab)
    return sites


def _fused_rows(lin: Linear, starts: list[int], blocks: int, stride: int) -> list[TensorAxis]:
    """Producer axes of a fused projection: one run of ``blocks`` segments per part."""
    return [TensorAxis(t, a, kind, start=s, blocks=blocks, stride=stride)
            for t, a, kind in ([(t, a, AxisKind.PRODUCER) for t, a in lin.rows]
                               + [(b, 0, AxisKind.BIAS) for b in lin.biases])
            for s in starts]


def _intermediate_site(cfg: dict, shapes: Shapes, fam: Family, base: str, i: int,
                       lin: dict[str, Linear | None]) -> DimSite | None:
    down = lin.get("down")
    if not down:
        return None
    if fam.gate_up:
        gate_up = lin.get("gate_up")
        if not gate_up or gate_up.out_features % 2:
            return None
        width = gate_up.out_features // 2  # gate rows, then up rows (Phi-3 chunks it in two)
        axes = _fused_rows(gate_up, [0, width], 1, width) + down.consumer_axes(shapes)
        module_of = fam.gate_up
    else:
        up = lin.get("up")
        if not up:
            return None
        width = up.out_features
        gate = lin.get("gate")
        axes = ((gate.producer_axes(shapes) if gate else []) + up.producer_axes(shapes)
                + down.consumer_axes(shapes))
        module_of = fam.up or ""
    module = f"{base}.{module_of.rsplit('.', 1)[0]}" if "." in module_of else base
    key = fam.intermediate_key
    site = DimSite(f"{module}:intermediate", Role.INTERMEDIATE, width, axes,
                   layer=i, module=module, config_field=(key,))
    _note_disagreement(site, cfg, key)
    if down.in_features != width:
        site.notes.append(f"down takes {down.in_features} inputs, up makes {width}")
    return site


def _attention_sites(cfg: dict, shapes: Shapes, fam: Family, base: str, i: int,
                     lin: dict[str, Linear | None], hd: int) -> list[DimSite]:
    o = lin.get("o")
    if not o:
        return []
    module = f"{base}.{(fam.qkv or fam.q or fam.o).rsplit('.', 1)[0]}"
    if fam.qkv:
        found = _fused_heads(cfg, lin.get("qkv"), hd)
        if not found:
            return []
        qkv, heads_n, kv_n = found
        axes = (_fused_rows(qkv, [0], heads_n, hd)
                + _fused_rows(qkv, [heads_n * hd, (heads_n + kv_n) * hd], kv_n, hd))
    else:
        q, k, v = (lin.get(x) for x in ("q", "k", "v"))
        if not (q and k and v):
            return []
        heads_n, kv_n = q.out_features // hd, k.out_features // hd
        axes = (q.producer_axes(shapes, hd) + k.producer_axes(shapes, hd)
                + v.producer_axes(shapes, hd))
    axes += o.consumer_axes(shapes, hd)
    for norm in (f"{module}.q_norm.weight", f"{module}.k_norm.weight"):  # Qwen3: per head
        if shapes.get(norm) == (hd,):
            axes.append(TensorAxis(norm, 0, AxisKind.NORM))
    inexact = ROPE_INEXACT if fam.rope else (
        f"{fam.name}'s config derives head_dim from hidden_size / num_attention_heads, so a "
        "padded head_dim cannot be recorded in a stock config"
    )
    head = DimSite(f"{module}:head_dim", Role.HEAD_DIM, hd, axes, layer=i, module=module,
                   config_field=("head_dim",) if "head_dim" in cfg else None, inexact=inexact,
                   attrs={"rope": fam.rope})
    heads = DimSite(f"{module}:heads", Role.HEADS, heads_n, [], layer=i,
                    module=module, config_field=("num_attention_heads",), inexact=HEADS_NOT_PADDED,
                    attrs={"kv_heads": kv_n})
    sinks = f"{module}.sinks"  # gpt-oss: one learned sink logit per query head
    if shapes.get(sinks) == (heads_n,):
        heads.axes.append(TensorAxis(sinks, 0, AxisKind.BIAS))
    _note_disagreement(heads, cfg, "num_attention_heads")
    kv_cfg = cfg.get("num_key_value_heads")
    if isinstance(kv_cfg, int) and kv_cfg != kv_n:
        heads.notes.append(f"the config says num_key_value_heads={kv_cfg}, tensors have "
                           f"{kv_n}")
    return [head, heads]


def _fused_heads(cfg: dict, qkv: Linear | None, hd: int) -> tuple[Linear, int, int] | None:
    """A fused qkv projection's head counts: config.json's, when its rows agree with them."""
    heads_n = cfg.get("num_attention_heads")
    kv_n = cfg.get("num_key_value_heads", heads_n)
    if not (qkv and isinstance(heads_n, int) and isinstance(kv_n, int)):
        return None
    if (heads_n + 2 * kv_n) * hd != qkv.out_features:
        return None
    return qkv, heads_n, kv_n


def embeddings(ckpt: Checkpoint, fam: Family) -> list[str]:
    """The tables whose rows are residual-stream vectors: tokens, and positions (OPT)."""
    out = []
    for module in (fam.embed, fam.positions):
        name = next((n for n in ckpt.shapes if module and n.endswith(f"{module}.weight")), None)
        if name and len(ckpt.shapes[name]) == 2:
            out.append(name)
    return out


def _hidden_site(ckpt: Checkpoint, fam: Family, prefix: str, layers: list[int],
                 resolve: Resolver) -> DimSite:
    shapes = ckpt.shapes
    embed = next((n for n in shapes if n.endswith(f"{fam.embed}.weight")), None)
    declared = ckpt.config.get("hidden_size")
    fallback = declared if isinstance(declared, int) else 0  # null or "64" count as missing
    value = shapes[embed][1] if embed else fallback
    axes = [TensorAxis(t, 1, AxisKind.CONSUMER) for t in embeddings(ckpt, fam)]
    for i in layers:
        base = f"{prefix}.{i}"
        for name in fam.attention_inputs + fam.mlp_inputs:
            lin = resolve(f"{base}.{name}")
            if lin:
                axes.extend(lin.consumer_axes(shapes))
        for name in (fam.o, fam.down):
            lin = resolve(f"{base}.{name}")
            if lin:
                axes.extend(lin.producer_axes(shapes))
    for name, shape in sorted(shapes.items()):  # by name: a state dict's order is no index's
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
    # BERT's masked-LM / LM head: the decoder is tied to the token table (not stored), its
    # bias is; its GEMM's N is the vocabulary all the same
    mlm = next((n for n in shapes if n.endswith("cls.predictions.bias")), None)
    if not head and not (causal and embed) and not (mlm and embed):
        return None
    axes = [TensorAxis(t, 0, AxisKind.PRODUCER) for t in (head, embed) if t]
    if head and len(shapes.get("lm_head.bias", ())) == 1:  # OPT under SliceGPT, Phi-2
        axes.append(TensorAxis("lm_head.bias", 0, AxisKind.BIAS))
    if mlm and embed and len(shapes[mlm]) == 1:
        axes.append(TensorAxis(mlm, 0, AxisKind.BIAS))
    value = shapes[axes[0].tensor][0]
    site = DimSite("vocab", Role.VOCAB, value, axes, config_field=("vocab_size",),
                   inexact=VOCAB_INEXACT)
    _note_disagreement(site, ckpt.config, "vocab_size")
    return site


def _note_disagreement(site: DimSite, cfg: dict, key: str) -> None:
    declared = cfg.get(key)
    if isinstance(declared, int) and declared != site.value:
        site.notes.append(f"the config says {key}={declared}, tensors have {site.value}")
