"""DeciLM / Nemotron-NAS checkpoints (NVIDIA Puzzle, ModelOpt Puzzletron): per-layer blocks.

config.json names ``DeciLMForCausalLM`` (``model_type`` ``nemotron-nas``) and gives one
``block_configs`` entry per layer: ``attention`` ({n_heads_in_group and / or
num_key_value_heads, no_op, replace_with_linear}) and ``ffn`` ({ffn_mult and / or
intermediate_size, no_op, replace_with_linear}: ModelOpt's Puzzletron writes the KV heads and
the width themselves).
The modules are Llama's where a block is full; a no-op block has no tensors (nor its norm); a
linear replacement is one hidden x hidden ``self_attn.linear_attn`` or ``mlp.linear_mlp`` (the names
NVIDIA NeMo Automodel's DeciLM layers give as the HF checkpoint's keys, and llama.cpp's
gguf-py tensor_mapping maps for ``deci``), behind its norm.

Each layer's sites come from its own tensors (its MLP width, its KV heads); the linear
replacements' axes are the hidden size's. Tensors win: a block_configs value they contradict
is a note with both values, and is handed to the targets as a conflict (an engine builds its
class from the config, so the weights would not fit). Anything in block_configs this module
does not know is a refusal, never a guess.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.architectures import LLAMA, family_sites
from gac_check.formats.base import Format
from gac_check.formats.layout import Linear, dense_linear
from gac_check.sites import DimSite, Role
from gac_check.targets.blocks import FFN_MULT, FULL, LINEAR, NO_OP, LayerBlocks, ffn_width

ARCHITECTURE = "DeciLMForCausalLM"
MODEL_TYPES = ("nemotron-nas", "deci")
#: The linear that replaces a block, per block (relative to the layer).
REPLACEMENT = {"attention": "self_attn.linear_attn", "ffn": "mlp.linear_mlp"}
#: The norm in front of each block (a no-op block has none: vLLM builds no parameter for it).
NORM = {"attention": "input_layernorm", "ffn": "post_attention_layernorm"}
#: The modules of a full block (relative to the layer).
FULL_MODULES = {"attention": (LLAMA.q, LLAMA.k, LLAMA.v, LLAMA.o),
                "ffn": (LLAMA.gate, LLAMA.up, LLAMA.down)}
#: Keys a block config may carry that set no width; accepted only at their "off" value.
_INERT = {"sparsify": None, "window_length": None, "num_sink_tokens": None,
          "use_prefill_window_in_sink_attention": False, "unshifted_sink": False}
#: ModelOpt Puzzletron's AttentionConfig and FFNConfig (modelopt/torch/puzzletron/decilm/
#: deci_lm_hf_code/block_config.py) write every field, these at their off values for a Llama
#: attention and a dense MLP.
_MODELOPT_INERT = {"moe": None, "llama4": None, "mamba": None, "weights_precision": "bf16"}
_KNOWN = {"attention": {"no_op", "replace_with_linear", "n_heads_in_group",
                        "num_key_value_heads", "weights_precision", "llama4", "mamba", *_INERT},
          "ffn": {"no_op", "replace_with_linear", "ffn_mult", "intermediate_size", "sparsify",
                  "weights_precision", "moe"}}


@dataclass(frozen=True)
class Declared:
    """One block as config.json declares it."""

    kind: str  # FULL, NO_OP or LINEAR
    value: float | int | None  # n_heads_in_group (attention) or ffn_mult (ffn)
    #: as ModelOpt writes it: num_key_value_heads (attention) or intermediate_size (ffn)
    width: int | None = None


class DeciLM(Format):
    name = "decilm"
    description = "DeciLM / Nemotron-NAS per-layer blocks (block_configs)"

    def matches(self, ckpt: Checkpoint) -> bool:
        cfg = ckpt.config
        archs = cfg.get("architectures")
        return ("block_configs" in cfg or cfg.get("model_type") in MODEL_TYPES
                or (isinstance(archs, list) and ARCHITECTURE in archs))

    def __init__(self) -> None:
        #: the blocks of the checkpoint whose sites were read last, so that ``blocks`` does
        #: not parse block_configs again (a weak reference: the format holds no checkpoint)
        self._parsed: tuple[weakref.ref[Checkpoint], tuple[LayerBlocks, ...]] | None = None

    def sites(self, ckpt: Checkpoint) -> list[DimSite]:
        sites, blocks = read(ckpt)
        self._parsed = (weakref.ref(ckpt), blocks)
        return sites

    def blocks(self, ckpt: Checkpoint) -> tuple[LayerBlocks, ...]:
        parsed = self._parsed
        if parsed is not None and parsed[0]() is ckpt:
            return parsed[1]
        return read(ckpt)[1]


def read(ckpt: Checkpoint) -> tuple[list[DimSite], tuple[LayerBlocks, ...]]:
    """The sites of a block_configs checkpoint and each layer's blocks (for the targets)."""
    cfg = ckpt.config
    hidden_cfg, heads_cfg = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    declared = _block_configs(ckpt)
    if not (_count(hidden_cfg) and _count(heads_cfg)):
        raise BadInput("block_configs without an integer hidden_size and num_attention_heads: "
                       "the layers' widths cannot be derived", ckpt.path / "config.json")
    prefix, present = _layers(ckpt, len(declared))
    for i, (_, ffn) in enumerate(declared):
        if ffn.value is not None and not math.isfinite(2 * ffn.value * hidden_cfg / 3):
            raise BadInput(f"block_configs[{i}].ffn.ffn_mult is {ffn.value!r}: the width it "
                           "builds is no finite number", ckpt.path / "config.json")

    def resolve(module: str) -> Linear | None:
        return dense_linear(ckpt.shapes, module)

    sites = family_sites(ckpt, LLAMA, prefix, present, resolve)
    hidden = next(s for s in sites if s.role is Role.HIDDEN)
    layers = []
    for i, (attn, ffn) in enumerate(declared):
        found = {block: _found(ckpt, prefix, i, block, hidden.value)
                 for block in ("attention", "ffn")}
        conflicts = [f"layer {i} {block}: block_configs says {want.kind}, the tensors have "
                     f"{found[block]}" for block, want in (("attention", attn), ("ffn", ffn))
                     if want.kind != found[block]]
        conflicts += [f"layer {i} {block}: block_configs says no_op, the tensors have its "
                      f"{NORM[block]}" for block, want in (("attention", attn), ("ffn", ffn))
                      if want.kind == found[block] == NO_OP
                      and f"{prefix}.{i}.{NORM[block]}.weight" in ckpt.shapes]
        for block in ("attention", "ffn"):
            if found[block] == LINEAR:
                lin = resolve(f"{prefix}.{i}.{REPLACEMENT[block]}")
                assert lin is not None
                hidden.axes += lin.producer_axes(ckpt.shapes) + lin.consumer_axes(ckpt.shapes)
        mult = float(ffn.value) if ffn.kind == FULL and ffn.value is not None else None
        blocks = LayerBlocks(
            i, attn.kind, ffn.kind,
            kv_heads=(heads_cfg // int(attn.value) if attn.kind == FULL and attn.value
                      else attn.width),
            n_heads_in_group=int(attn.value) if attn.kind == FULL and attn.value else None,
            kv_declared=attn.width,
            ffn_mult=mult, width=ffn.width,
            intermediate=ffn_width(mult, hidden_cfg) if mult is not None else ffn.width)
        hidden.notes.extend(conflicts)  # a block's kind: the layer has no site of its own
        mlp, heads = _width_conflicts(sites, blocks)
        conflicts += [*([mlp] if mlp else []), *heads]
        layers.append(replace(blocks, conflicts=tuple(conflicts), mlp_conflict=mlp))
    full = {b.layer: b for b in layers if b.ffn == FULL}
    for site in sites:
        if site.role is Role.INTERMEDIATE:
            site.config_field = None  # block_configs records it, per layer (padding/plan.py)
            if site.layer in full:  # what padding/plan.py rewrites to record a padded width
                b = full[site.layer]
                site.attrs[FFN_MULT] = {"block_config": site.layer, "ffn_mult": b.ffn_mult,
                                        "intermediate_size": b.width, "hidden_size": hidden_cfg}
            else:
                site.inexact = (f"block_configs[{site.layer}].ffn is no full MLP, so no ffn_mult "
                                "or intermediate_size records this width: not padded")
        if site.role is Role.HEADS:  # per-layer KV heads: block_configs' n_heads_in_group
            site.notes[:] = [n for n in site.notes
                             if not n.startswith("the config says num_key_value_heads")]
    return sites, tuple(layers)


def _count(value: object) -> int | None:
    return value if type(value) is int and value > 0 else None


def _block_configs(ckpt: Checkpoint) -> list[tuple[Declared, Declared]]:
    """block_configs, each entry read or refused (one line naming the entry and the key)."""
    cfg = ckpt.config
    where = ckpt.path / "config.json"
    archs = cfg.get("architectures")
    blocks = cfg.get("block_configs")
    if not isinstance(blocks, list) or not blocks:
        raise BadInput(f"names {ARCHITECTURE} / model_type {cfg.get('model_type')!r} without a "
                       "block_configs list (DeciLM-7B's num_key_value_heads_per_layer is not "
                       "read yet): its layers cannot be known", where)
    if not (isinstance(archs, list) and ARCHITECTURE in archs):
        raise BadInput(f"has block_configs but architectures {archs!r}, not {ARCHITECTURE}: "
                       "gac-check reads block_configs only as DeciLM / Nemotron-NAS writes "
                       "them", where)
    layers = cfg.get("num_hidden_layers")
    if layers != len(blocks):
        raise BadInput(f"block_configs has {len(blocks)} entries, num_hidden_layers is "
                       f"{layers!r}: every engine builds one layer per entry", where)
    heads = cfg.get("num_attention_heads")
    for i, entry in enumerate(blocks):
        extra = sorted(k for k, v in entry.items() if k not in ("attention", "ffn")
                       and (k, v) != ("parallel_blocks", None)) if isinstance(entry, dict) else []
        if extra:  # ModelOpt's BlockConfig: parallel_blocks, null unless blocks run in parallel
            raise BadInput(f"block_configs[{i}] has {', '.join(map(repr, extra))}, which "
                           "gac-check does not read: refusing rather than guess the layer's "
                           "blocks", where)
    return [(_declared(entry, i, "attention", heads, where),
             _declared(entry, i, "ffn", heads, where)) for i, entry in enumerate(blocks)]


def _declared(entry: object, i: int, block: str, heads: object, where) -> Declared:
    raw = entry.get(block) if isinstance(entry, dict) else None
    name = f"block_configs[{i}].{block}"
    if not isinstance(raw, dict):
        raise BadInput(f"{name} is missing or not an object", where)
    unknown = sorted(set(raw) - _KNOWN[block])
    if unknown:
        raise BadInput(f"{name} has {', '.join(map(repr, unknown))}, which gac-check does not "
                       "read: refusing rather than guess the layer's widths", where)
    for key, off in (_INERT | _MODELOPT_INERT).items():
        if key in raw and raw[key] != off and key in _KNOWN[block]:
            raise BadInput(f"{name}.{key} is {raw[key]!r}: gac-check models only "
                           f"{key}={off!r}", where)
    no_op, linear = raw.get("no_op", False), raw.get("replace_with_linear", False)
    if type(no_op) is not bool or type(linear) is not bool or (no_op and linear):
        raise BadInput(f"{name}: no_op={no_op!r}, replace_with_linear={linear!r} (two "
                       "booleans, at most one true)", where)
    if no_op or linear:
        return Declared(NO_OP if no_op else LINEAR, None)
    if block == "attention":
        group, kv = raw.get("n_heads_in_group"), raw.get("num_key_value_heads")
        if kv is not None and not (_count(kv) and _count(heads) and heads % kv == 0):
            raise BadInput(f"{name}.num_key_value_heads is {kv!r}: a full attention block needs "
                           f"a positive divisor of num_attention_heads={heads!r}", where)
        if group is None and kv is not None:
            return Declared(FULL, None, kv)
        if not (_count(group) and _count(heads) and heads % group == 0):
            raise BadInput(f"{name}.n_heads_in_group is {group!r}: a full attention block needs "
                           f"a positive divisor of num_attention_heads={heads!r} (or a "
                           "num_key_value_heads)", where)
        return Declared(FULL, group, kv)
    width = raw.get("intermediate_size")
    if width is not None and not _count(width):
        raise BadInput(f"{name}.intermediate_size is {width!r}: a full FFN block's width is a "
                       "positive integer", where)
    mult = raw.get("ffn_mult")
    if mult is None and width is not None:
        return Declared(FULL, None, width)
    if isinstance(mult, bool) or not isinstance(mult, int | float) or mult <= 0:
        raise BadInput(f"{name}.ffn_mult is {mult!r}: a full FFN block needs a positive "
                       "number (or an intermediate_size)", where)
    return Declared(FULL, mult, width)


def _layers(ckpt: Checkpoint, count: int) -> tuple[str, list[int]]:
    """The layer prefix and the layers that have tensors (a layer with both blocks no-op has
    none); a tensor of a layer past block_configs is a refusal."""
    prefix, present = "model.layers", set()
    for name in ckpt.tensors:
        head, sep, rest = name.partition(".layers.")
        index = rest.split(".", 1)[0]
        if sep and index.isdigit():
            prefix = f"{head}.layers"
            present.add(int(index))
    beyond = sorted(i for i in present if i >= count)
    if beyond:
        raise BadInput(f"has tensors of layer {beyond[0]}, but block_configs describes "
                       f"{count} layers", ckpt.path)
    return prefix, sorted(present)


def _found(ckpt: Checkpoint, prefix: str, i: int, block: str, hidden: int) -> str:
    """What the tensors make of one block: FULL, NO_OP or LINEAR; both kinds, or a linear
    replacement that is not hidden x hidden, is a refusal."""
    base = f"{prefix}.{i}"
    full = [m for m in FULL_MODULES[block] if f"{base}.{m}.weight" in ckpt.shapes]
    linear = f"{base}.{REPLACEMENT[block]}.weight"
    if linear in ckpt.shapes:
        if full:
            raise BadInput(f"layer {i} has both {REPLACEMENT[block]} and {full[0]}: a block is "
                           "full or a linear replacement, not both", ckpt.path)
        if ckpt.shapes[linear] != (hidden, hidden):
            shape = "x".join(map(str, ckpt.shapes[linear]))
            raise BadInput(f"{linear} is [{shape}]: a linear replacement is hidden x hidden "
                           f"({hidden} x {hidden})", ckpt.path)
        return LINEAR
    return FULL if full else NO_OP


def _width_conflicts(sites: list[DimSite], blocks: LayerBlocks
                     ) -> tuple[str | None, list[str]]:
    """The layer's config widths its tensors contradict: its MLP width against what ffn_mult
    builds and against its intermediate_size, either one a contradiction (which ``--repair``
    resolves: padding/plan.py), and its KV heads against
    num_attention_heads // n_heads_in_group (which it does not), each also a note on the site
    whose value the tensors give."""
    mlp, heads = None, []
    for site in sites:
        if site.layer != blocks.layer:
            continue
        if site.role is Role.INTERMEDIATE:
            mlp = _mlp_conflict(blocks, site.value)
            if mlp:
                site.notes.append(mlp)
        kv = site.attrs.get("kv_heads")
        if site.role is not Role.HEADS:
            continue
        said = []
        if blocks.n_heads_in_group is not None and blocks.kv_heads != kv:
            said.append(f"n_heads_in_group gives {blocks.kv_heads} KV heads")
        if blocks.kv_declared is not None and blocks.kv_declared != kv:
            said.append(f"num_key_value_heads={blocks.kv_declared}")
        if said:
            heads.append(f"layer {blocks.layer} attention: block_configs' "
                         f"{' and its '.join(said)}, the tensors have {kv}")
            site.notes.append(heads[-1])
    return mlp, heads


def _mlp_conflict(blocks: LayerBlocks, width: int) -> str | None:
    """What the layer's ffn entry declares that its MLP of ``width`` contradicts, both values
    said: an ffn_mult building another width, an intermediate_size of another width (an engine
    builds the one its config class reads: vLLM v0.33.0's DeciLMDecoderLayer, ffn_mult where
    the class has it, else intermediate_size as given)."""
    said = []
    if blocks.ffn_mult is not None and blocks.intermediate != width:  # ffn_mult's width
        said.append(f"ffn_mult={blocks.ffn_mult:g} builds an MLP of {blocks.intermediate}")
    if blocks.width is not None and blocks.width != width:
        said.append(f"intermediate_size={blocks.width}")
    if not said:
        return None
    return (f"layer {blocks.layer} ffn: block_configs' {' and its '.join(said)}, the tensors "
            f"have {width}")
