"""Loadability first: whether a target's engine has a model class for this model at all.

Kernel verdicts assume the engine builds the model; many compressed checkpoints never get that
far. An engine loads a checkpoint by building its own model class for the architecture
config.json names and copying each weight into the parameter of that name, with every layer
built from config.json's one width. So it refuses, before any kernel is chosen:

- a compressor's custom modules (ASVD's BLinear/ALinear, SVD-LLM's u/v factors, PaLU's latent
  K/V, SliceGPT's shortcut matrices): no parameter of the stock class has those names;
- a pickled whole model (the loaders read state dicts with ``torch.load(weights_only=True)``);
- an architecture its registry does not list at that release (where the registry was read in
  full: ``registries.json``);
- layers of different widths or head counts (per-layer pruning).

Each refusal says what would make the model servable. The data, with a citation per engine,
is ``gac_check/targets/registries.json`` (docs/targets.md, "Loadability").
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gac_check.errors import BadInput
from gac_check.targets.blocks import (
    BLOCK_CLASSES,
    FULL,
    NO_OP,
    NOT_READ,
    LayerBlocks,
    describe,
)
from gac_check.targets.packs import PackError, Source, _source
from gac_check.targets.per_layer import GLOBAL_CLASSES, LayerDiff, not_built
from gac_check.targets.shards import ModelShape
from gac_check.targets.spec import Target

SCHEMA = "gac-check-registry/1"
#: Beside this module, read as a file as the rule packs are (packs.PACKS_DIR).
REGISTRIES = Path(__file__).resolve().parent / "registries.json"
#: the blockers, in the order they are checked (the first one found is reported)
CUSTOM, CONTAINER, ARCHITECTURE, CONFIG, LAYERS = ("custom modules", "container", "architecture",
                                                  "config", "layers")
#: vLLM's attention derives head_dim from config.json's hidden_size / num_attention_heads
#: where config.json records none (qwen2.py at v0.33.0; llama.py's LlamaAttention reads
#: config.head_dim first and falls back the same way).
HEAD_DIM_SOURCE = Source("vllm-project/vllm", "vllm/model_executor/models/qwen2.py",
                         "Qwen2Attention.__init__ (head_dim = hidden_size // total_num_heads)",
                         "v0.33.0")
EXPERT_REMEDY = ("pad every routed expert of every layer to the widest (--repair OUT "
                 "--uniform: exact zero padding; config.json then records the one width), "
                 "or re-run the expert-width pruning with one width for every expert of "
                 "every layer")
UNIFORM_REMEDY = ("pad every layer to the widest (--repair OUT --uniform: exact zero padding), "
                  "or re-run the compressor with the same width in every layer")
HEADS_REMEDY = ("re-run the compressor with the same head count in every layer (head counts "
                "cannot be padded exactly)")


@dataclass(frozen=True)
class ModelKind:
    """What a target needs to know about the model beyond its widths: the layout a compressor
    wrote (the format's name), config.json's architectures and whether the weights are a
    pickled whole model."""

    format: str = "dense"
    architectures: tuple[str, ...] = ()
    pickled_model: bool = False
    #: per layer, what config.json's block_configs builds (DeciLM / Nemotron-NAS); empty
    #: for a model whose layers are all built from one width
    blocks: tuple[LayerBlocks, ...] = ()
    #: config.json values a class built from it contradicts the tensors with, both values
    #: each (Torch-Pruning's head_dim, formats/declared.py)
    config_conflicts: tuple[str, ...] = ()
    #: the layers that are not what the global config builds, where config.json has
    #: transformers' per_layer_config (formats/per_layer.py); empty otherwise
    per_layer: tuple[LayerDiff, ...] = ()


@dataclass(frozen=True)
class Loadability:
    """Whether ``target`` builds the model; when not, why, what it prints and what would help."""

    target: Target
    loads: bool = True
    blocker: str | None = None
    why: str = ""
    remedy: str = ""
    source: Source | None = None

    def as_dict(self) -> dict:
        return {"loads": self.loads, "blocker": self.blocker, "why": self.why or None,
                "remedy": self.remedy or None,
                "source": self.source.as_dict() if self.source else None}


@dataclass(frozen=True)
class Registry:
    """One engine's model registry as read: architectures by release (where read in full)
    and the loader's refusals, each with its citation."""

    engine: str
    architectures: dict[str, frozenset[str]]
    registry: Source
    refusals: dict[str, tuple[str, Source]]

    def listed(self, version: str, versions: tuple[str, ...]) -> tuple[frozenset[str], str] | None:
        """The architectures of the newest read release at or before ``version`` (the oldest
        read one for an older version), and that release; None where none was read."""
        if not self.architectures:
            return None
        read = sorted(self.architectures, key=lambda v: versions.index(v)
                      if v in versions else -1)
        at = [v for v in read if v in versions and versions.index(v) <= versions.index(version)]
        ref = at[-1] if at else read[0]
        return self.architectures[ref], ref


@cache
def _data() -> dict:
    raw = json.loads(REGISTRIES.read_text(encoding="utf-8"))
    if raw.get("schema") != SCHEMA:
        raise PackError(f"registries.json: schema must be {SCHEMA!r}")
    return raw


@cache
def registry(engine: str) -> Registry | None:
    raw = _data()["engines"].get(engine)
    if raw is None:
        return None
    where = f"registries.json {engine}"
    # moe_widths where the engine's fused-MoE weights were read; else its per-layer refusal
    keys = ("unknown_weights", "pickled_model", "per_layer") + (
        ("moe_widths",) if "moe_widths" in raw else ())
    refusals = {key: (raw[key]["message"], _source(raw[key].get("source"), f"{where} {key}"))
                for key in keys}
    refusals.setdefault("moe_widths", refusals["per_layer"])
    return Registry(engine, {v: frozenset(a) for v, a in (raw.get("architectures") or {}).items()},
                    _source(raw.get("registry"), f"{where} registry"), refusals)


def custom_modules() -> dict[str, dict[str, str]]:
    """The compressors' layouts no engine has a model class for: what they are, what helps."""
    return _data()["custom_modules"]


def judge_load(kind: ModelKind, shape: ModelShape, target: Target) -> Loadability:
    """Whether ``target``'s engine builds this model, the first blocker found otherwise."""
    reg = registry(target.engine)
    if reg is None:
        return Loadability(target)
    custom = custom_modules().get(kind.format)
    if custom is not None:
        message, source = reg.refusals["unknown_weights"]
        return Loadability(target, False, CUSTOM,
                           f"{target.engine} has no model class for {custom['modules']} "
                           f"({message.format(module='...', architecture=_arch(kind))})",
                           custom["remedy"], source)
    if kind.pickled_model:
        message, source = reg.refusals["pickled_model"]
        return Loadability(target, False, CONTAINER,
                           f"the weights are a pickled whole model: {message}",
                           "save the model with save_pretrained (safetensors) and judge that",
                           source)
    listed = reg.listed(target.version, target.pack.versions)
    arch = _arch(kind)
    if listed is not None and kind.architectures and arch not in listed[0]:
        return Loadability(target, False, ARCHITECTURE,
                           f"{target.engine} {listed[1]} has no model class for architecture "
                           f"{arch} (not in its model registry)",
                           "serve it on an engine that has a class for it, or convert it to "
                           "an architecture the engine lists", reg.registry)
    if kind.config_conflicts:
        source = HEAD_DIM_SOURCE if target.engine == "vllm" else reg.refusals["per_layer"][1]
        return Loadability(target, False, CONFIG,
                           f"{target.engine} builds its model class from config.json, which "
                           f"the tensors contradict ({_some(list(kind.config_conflicts))}): the "
                           "weights do not fit the class",
                           "record the tensors' head_dim in config.json (--repair OUT writes "
                           "it; no tensor changes)", source)
    if kind.blocks:
        return judge_blocks(kind, target)
    if kind.per_layer:
        return judge_per_layer(kind, shape, target)
    missing = missing_blocks(shape)
    if missing:
        message, source = reg.refusals["per_layer"]
        return Loadability(target, False, LAYERS,
                           f"{_some(missing)}, where the class builds every block of every "
                           f"layer; {message}",
                           "restore the missing blocks' weights (no Llama-family class skips "
                           "a block)", source)
    widths = layer_widths(shape)
    if len(widths["heads"]) > 1 or len(widths["head_dim"]) > 1:
        message, source = reg.refusals["per_layer"]
        return Loadability(target, False, LAYERS,
                           f"the layers have different head counts or head sizes "
                           f"({_list(widths['heads'])} heads); {message}", HEADS_REMEDY, source)
    if len(widths["expert"]) > 1:
        message, source = reg.refusals["moe_widths"]
        return Loadability(target, False, LAYERS,
                           f"the routed experts differ in width ({_expert_widths(shape)}); "
                           f"{message}", EXPERT_REMEDY, source)
    if len(widths["intermediate"]) > 1:
        message, source = reg.refusals["per_layer"]
        return Loadability(target, False, LAYERS,
                           f"the layers have different MLP widths "
                           f"({_per_layer(shape)}); {message}", UNIFORM_REMEDY,
                           source)
    return Loadability(target)


def judge_blocks(kind: ModelKind, target: Target) -> Loadability:
    """A block_configs model on ``target``: its engine builds each layer from its own block
    config where it has such a class at that release (then per-layer widths and KV groupings
    load, and what stops it is a block the class does not build or a config the tensors
    contradict); an engine without one refuses it; one not read is a refusal to judge."""
    if target.engine in NOT_READ:
        raise BadInput(f"--target {target.spec}: {NOT_READ[target.engine]}, so gac-check "
                       "cannot say whether it loads this block_configs (DeciLM / "
                       f"Nemotron-NAS) model; judge it on {' or '.join(BLOCK_CLASSES)}")
    cls = BLOCK_CLASSES.get(target.engine)
    versions = target.pack.versions
    if cls is None or versions.index(target.version) < versions.index(cls.since):
        reg = registry(target.engine)
        since = f" before {cls.since}" if cls else ""
        return Loadability(target, False, ARCHITECTURE,
                           f"{target.engine} {target.version} has no model class for "
                           f"block_configs (DeciLM / Nemotron-NAS) checkpoints{since}; its "
                           "classes build every layer from one width and head count",
                           "serve it on an engine release with a DeciLM class ("
                           + ", ".join(f"{e} from {c.since}" for e, c in BLOCK_CLASSES.items())
                           + ")", (cls and cls.before) or (reg.registry if reg else None))
    linear = [f"layer {b.layer} {block}" for b in kind.blocks
              for block, built in (("attention", b.attention), ("ffn", b.ffn))
              if built not in (FULL, NO_OP)]
    if linear:
        return Loadability(target, False, LAYERS,
                           f"{target.engine}'s {cls.name} builds full or no-op blocks only, "
                           f"not the linear replacement of {_some(linear)} (with "
                           "n_heads_in_group / ffn_mult null it fails building the layer; "
                           "otherwise the linear's weight names no parameter)",
                           "serve it where linear replacements are built (the checkpoint's "
                           "own modeling_decilm.py through transformers' trust_remote_code)",
                           cls.source)
    grouped = [f"layer {b.layer}" for b in kind.blocks
               if b.attention == FULL and b.n_heads_in_group is None]
    if grouped:
        return Loadability(target, False, LAYERS,
                           f"the attention of {_some(grouped)} is recorded by "
                           "num_key_value_heads alone (ModelOpt Puzzletron's AttentionConfig), "
                           f"and {target.engine}'s {cls.name} builds a full attention from "
                           "num_attention_heads // n_heads_in_group, which that entry does not "
                           "have: building the layer fails",
                           "write n_heads_in_group (num_attention_heads // num_key_value_heads) "
                           "beside it", cls.source)
    explicit = [f"layer {b.layer}" for b in kind.blocks if b.ffn == FULL and b.ffn_mult is None]
    if explicit and (cls.explicit_width is None
                     or versions.index(target.version) < versions.index(cls.explicit_width)):
        why = (f"was not read to build a full FFN from intermediate_size (read at "
               f"{cls.explicit_width}): refused rather than guessed" if cls.explicit_width
               else "builds every full FFN from its ffn_mult, never from intermediate_size: "
               "building the layer fails")
        return Loadability(target, False, LAYERS,
                           f"the FFN of {_some(explicit)} is recorded by intermediate_size "
                           f"alone (ModelOpt Puzzletron's FFNConfig), and {target.engine} "
                           f"{target.version}'s {cls.name} {why}",
                           "serve it on " + ", ".join(
                               f"{e} from {c.explicit_width}" for e, c in BLOCK_CLASSES.items()
                               if c.explicit_width) + ", or write the ffn_mult that builds "
                           "each width (a multiple of 256) beside it", cls.source)
    conflicts = [c for b in kind.blocks for c in b.conflicts]
    if conflicts:
        return Loadability(target, False, LAYERS,
                           f"{target.engine}'s {cls.name} builds each layer from config.json's "
                           f"block_configs, which the tensors contradict ({_some(conflicts)})",
                           "correct block_configs to the tensors' widths (ffn_mult builds "
                           "int(2 * ffn_mult * hidden / 3) rounded up to 256)", cls.source)
    return Loadability(target, why=f"{target.engine}'s {cls.name} builds each layer from its "
                       "own block config: " + describe(kind.blocks),
                       source=cls.source)


def judge_per_layer(kind: ModelKind, shape: ModelShape, target: Target) -> Loadability:
    """A per_layer_config model whose layers are not all what the global config builds:
    the classes read (targets/per_layer.py) build every layer from the global values, so it
    does not load there; where the class was not read, judging it would be a guess."""
    arch = _arch(kind)
    source = GLOBAL_CLASSES.get(target.engine, {}).get(arch)
    if source is None:
        read = ", ".join(f"{e} ({', '.join(c)})" for e, c in GLOBAL_CLASSES.items())
        raise BadInput(f"--target {target.spec}: gac-check has not read whether "
                       f"{target.engine}'s class for {arch} reads per_layer_config, so it "
                       f"cannot say whether this per-layer model loads; it has read {read}")
    widths = layer_widths(shape)
    uniform = len(widths["heads"]) <= 1 and len(widths["head_dim"]) <= 1
    return Loadability(target, False, LAYERS,
                       not_built(target.engine, target.version, arch, kind.per_layer),
                       (UNIFORM_REMEDY if uniform else HEADS_REMEDY) + "; every "
                       "per_layer_config override must then equal the global value, and no "
                       "layer skip a block", source)


def _some(items: list[str]) -> str:
    """Up to three of ``items``, and how many more."""
    more = f" and {len(items) - 3} more" if len(items) > 3 else ""
    return ", ".join(items[:3]) + more


def missing_blocks(shape: ModelShape) -> list[str]:
    """The layers that have no attention, or (a dense layer) no MLP, where other layers have
    one: a block dropped from the checkpoint. A site exists wherever the tensors are (one
    that none reads is refused by the accounting before any target is judged)."""
    layers = [(i, shape.layers[i]) for i in sorted(shape.layers)]
    attention = any(lay.heads is not None for _, lay in layers)
    mlp = any(lay.intermediate is not None for _, lay in layers if not lay.moe)
    out = []
    for i, lay in layers:
        if attention and lay.heads is None:
            out.append(f"layer {i} has no attention tensors")
        if mlp and not lay.moe and lay.intermediate is None:
            out.append(f"layer {i} has no MLP tensors")
    return out


def layer_widths(shape: ModelShape) -> dict[str, list[int]]:
    """The distinct per-layer values of each width, in layer order."""
    out: dict[str, list[int]] = {"heads": [], "head_dim": [], "intermediate": [], "expert": []}
    for i in sorted(shape.layers):
        lay = shape.layers[i]
        for key, value in (("heads", (lay.heads, lay.kv_heads)), ("head_dim", lay.head_dim),
                           ("intermediate", lay.intermediate)):
            if value is not None and value != (None, None) and value not in out[key]:
                out[key].append(value)  # type: ignore[arg-type]
        out["expert"] += [w for w in lay.expert_widths if w not in out["expert"]]
    return out


def _expert_widths(shape: ModelShape) -> str:
    """Each MoE layer's expert widths (up to 4 layers), else how many widths in all."""
    layers = [(i, shape.layers[i].expert_widths) for i in sorted(shape.layers)
              if shape.layers[i].expert_widths]
    if len(layers) <= 4:
        return "; ".join(f"layer {i}: {', '.join(map(str, w))}" for i, w in layers)
    distinct = sorted({w for _, ws in layers for w in ws})
    return f"{len(distinct)} widths over {len(layers)} layers, {distinct[0]} to {distinct[-1]}"


def _per_layer(shape: ModelShape) -> str:
    """The MLP width of each layer (up to 8 layers), else how many widths and their range."""
    values = [shape.layers[i].intermediate for i in sorted(shape.layers)
              if shape.layers[i].intermediate is not None]
    if len(values) <= 8:
        return "[" + ", ".join(map(str, values)) + "]"
    distinct = sorted(set(values))
    return f"{len(distinct)} widths over {len(values)} layers, {distinct[0]} to {distinct[-1]}"


def _arch(kind: ModelKind) -> str:
    return kind.architectures[0] if kind.architectures else "(none in the config)"


def _list(values: list) -> str:
    return "[" + ", ".join("/".join(map(str, v)) if isinstance(v, tuple) else str(v)
                           for v in values) + "]"
