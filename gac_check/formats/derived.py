"""Sites from the layout table derived from transformers' own classes (no modeling import).

:mod:`gac_check.formats.derive_table` builds every architecture transformers ships on the meta
device, ahead of time, and records per ``model_type`` which width sits on each axis of every
saved tensor (``gac_check/data/architectures.json``). Here a checkpoint's tensors are looked
up in that table by name (layer and expert indices as ``{i}`` / ``{e}``) and every labelled
axis is put on its site: ``hidden`` and ``vocab`` once per model, the MLP width, the attention
head_dim (per-head segments over q, k, v, fused qkv, per-head or per-width q/k norms) and head
counts, the expert widths and the expert count per layer. The headers stay the truth: a size
that disagrees with the site its label names, or an axis the table could not name (``?``,
e.g. a Mamba mixer's state widths), is a refusal naming the tensor and its layer kind; a
tensor the class does not have stays unknown, so the accounting refuses it.

The hand-written families (:mod:`.architectures`, :mod:`.moe`, ...) are tried first; this
reader serves the model types they refuse or do not know (:func:`.reading.read_sites`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats import derive_adapters as adapters
from gac_check.formats import derived_towers as towers
from gac_check.formats.architectures import (
    HEADS_NOT_PADDED,
    HIDDEN_INEXACT,
    VOCAB_INEXACT,
    find_family,
)
from gac_check.formats.base import Format
from gac_check.formats.derive_layers import resolve
from gac_check.formats.derive_names import lookup
from gac_check.formats.derived_torn import torn_tensor
from gac_check.formats.head_dim import head_dim_inexact
from gac_check.formats.mla import layer_sites
from gac_check.formats.moe import EXPERTS_NOT_PADDED
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

TABLE = Path(__file__).resolve().parent.parent / "data" / "architectures.json"

#: A norm over an MLP / expert width: zeros in the padded units would change its statistics.
NORMED = ("{tensor} normalises over this width, so zero-padded units would change its "
          "statistics: padding it is not exact")

#: Repair of an SSM mixer's widths is out of scope (docs/formats.md "Hybrid and SSM models").
SSM_NOT_PADDED = ("an SSM mixer's GEMM width: zero padding it would change the state "
                  "recurrence (the conv channels, heads, groups and state size are cut from "
                  "these rows), and gac-check does not repair SSM widths")

#: label -> (site kind, how many site widths the axis holds)
_WIDTH = {
    "hidden": ("hidden", 1), "vocab": ("vocab", 1), "inter": ("mlp", 1), "inter2": ("mlp", 2),
    "h4": ("mlp", 1), "expert": ("expert", 1), "expert2": ("expert", 2),
    "shared": ("shared", 1), "shared2": ("shared", 2), "experts": ("experts", 1),
    "heads": ("heads", 1), "kv_heads": ("heads", 1), "cross": ("cross_hidden", 1),
    "hidden2": ("hidden", 2), "inter_half": ("mlp_half", 1), "ffn": ("mlp_derived", 1),
    "router_all": ("router", 1),
    # as many widths side by side as config.json's key says: hyper-connections' residual
    # streams of hidden (Qwen4-Exp), relative-position buckets of heads (ProphetNet)
    "hc": ("hidden", "hc_count"), "buckets_heads": ("heads", "num_buckets"),
    "experts_total": ("experts", 1),  # a router over real and identity experts (LongCat)
    "adapter": ("adapter", 1),  # X-MOD's per-language bottlenecks (:mod:`.derive_adapters`)
    "embed_concat": ("concat", 1),  # RoCBert's word, pronunciation and shape embeddings
}
_HEAD_LABELS = ("q", "kv", "qkv", "qkv_mq", "q3", "q4", "kv2", "hd", "h3")
#: value heads of config.json's v_head_dim, a width of their own (MiMo-V2-Flash)
_V_HEAD_LABELS = ("vq", "vkv", "vkv2")
V_NOT_PADDED = "a value head width of its own (v_head_dim) is reported, not padded"
#: site kind -> the derived table's role whose config.json key records it
_CONFIG = {"mlp": "inter", "expert": "expert", "shared": "shared", "experts": "experts",
           "heads": "heads", "hidden": "hidden", "vocab": "vocab", "cross_hidden": "cross"}
_ROLE = {"mlp": Role.INTERMEDIATE, "mlp_derived": Role.INTERMEDIATE,
         "mlp_half": Role.INTERMEDIATE, "expert": Role.EXPERT, "shared": Role.SHARED_EXPERT,
         "experts": Role.EXPERTS, "heads": Role.HEADS, "hidden": Role.HIDDEN,
         "vocab": Role.VOCAB, "cross_hidden": Role.HIDDEN, "router": Role.EXPERTS,
         "adapter": Role.INTERMEDIATE, "concat": Role.HIDDEN}
#: a decoder's cross-attention reads an encoder this checkpoint does not hold
CROSS_INEXACT = ("the encoder's width, which the cross-attention's k/v projections read: "
                 "the encoder is not in this checkpoint, so its output cannot be padded")


#: an MLP width config.json records only through a formula (xLSTM's hidden x ffn_proj_factor
#: rounded up); RecurrentGemma's, intermediate_size // 2, is padded with that key at twice the
#: padded width, held to the class by padding/class_proof.py
DERIVED_INEXACT = ("an MLP width config.json does not record as itself (its class derives it "
                   "from another key by a formula), so OUT's config could not build the "
                   "padded width; gac-check does not rewrite such keys")


@lru_cache(maxsize=1)
def table() -> dict:
    """The shipped table (read once per process; a few hundred kB of JSON)."""
    return json.loads(TABLE.read_text())


def entry_for(ckpt: Checkpoint) -> dict | None:
    """The table's entry for config.json's model_type; for a type the table lacks (a newer
    transformers than the one it was derived from), derived now from the installed class."""
    model_type = ckpt.config.get("model_type")
    if not isinstance(model_type, str):
        return None
    shipped = table()
    if model_type in shipped["types"] or model_type in shipped["not_built"]:
        return shipped["types"].get(model_type)
    return derive_now(model_type)


@lru_cache(maxsize=8)
def derive_now(model_type: str) -> dict | None:
    """Build a built-in class on the meta device at run time (seconds: transformers'
    modeling import; benchmarks/RESULTS.md); None when transformers has no such class."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return None
    if model_type not in CONFIG_MAPPING_NAMES:
        return None
    from gac_check.formats.derive_table import derive

    try:
        return derive(model_type)
    except Exception:  # a class that does not build: unknown, as without the table
        return None


_INDEX = re.compile(r"\.(\d+)\.")


def _lookup(entry: dict, name: str) -> tuple[str, int | None, int | None]:
    """(pattern, layer, expert) of a saved name: X-MOD's language segment as ``{lang}``,
    then the layer and list indices (:func:`.derive_names.lookup`)."""
    return lookup(entry["tensors"], adapters.pattern(name))


def _tensor(entry: dict, ckpt: Checkpoint, name: str,
            found: tuple[str, int | None, int | None] | None = None) -> dict | None:
    """The table's record of a tensor, with its layer kind's labels: under its own name where
    the table keeps one (an index that is no layer's), else under its pattern (``found``:
    :func:`_lookup`'s answer, where the caller has it already)."""
    pattern, layer, _ = found or _lookup(entry, name)
    tensor = entry["tensors"].get(name) or entry["tensors"].get(pattern)
    return tensor and resolve(tensor, ckpt.config, name, layer, ckpt.path)


@dataclass
class _Group:
    """The axes of one site being collected, and the widths they imply."""

    kind: str
    layer: int | None
    module: str
    axes: list[TensorAxis] = field(default_factory=list)
    widths: dict[str, int] = field(default_factory=dict)  # tensor -> implied width


def _kind(entry: dict, name: str, axis: int, ndim: int, label: str) -> AxisKind:
    """Producer (rows that compute the width), consumer, bias or norm, by the module kind."""
    module_kind = entry["kind"]
    if ndim == 1:  # named a norm by its own module, not a prefix (roberta_prelayernorm.)
        own = ".".join(name.split(".")[-2:])
        return AxisKind.NORM if module_kind == "norm" or "norm" in own else AxisKind.BIAS
    if module_kind == "embedding":
        return AxisKind.PRODUCER if axis == 0 else AxisKind.CONSUMER
    if ndim == 2:
        out_axis = 1 if module_kind == "conv1d" else 0
        return AxisKind.PRODUCER if axis == out_axis else AxisKind.CONSUMER
    down = any(w in name for w in ("down", "w2", "fc2", "out"))
    inner = label not in ("hidden", "experts")
    return AxisKind.CONSUMER if inner == down else AxisKind.PRODUCER


class Derived(Format):
    """Any architecture in the shipped table, read from the class's own layout."""

    name = "derived"
    description = "Hugging Face model, layout read from transformers' class table"

    def matches(self, ckpt: Checkpoint) -> bool:
        return entry_for(ckpt) is not None

    def fixed(self, ckpt: Checkpoint) -> frozenset[str]:
        """Tensors the class builds with no config-derived width on any axis (a scalar gate,
        a convolution's kernel taps): accounted, with nothing to judge. Only at the sizes
        the class builds: a tensor whose sizes moved with a config width the table did not
        vary (a sub-config's) was read as fixed and the model passed with 0 sites. A table
        length (ELECTRA's and ALBERT's position table over their fixed embedding size) is
        no GEMM width: such a tensor is accounted too."""
        entry = entry_for(ckpt) or {"tensors": {}}
        out = set()
        for name, shape in ckpt.shapes.items():
            tensor = _tensor(entry, ckpt, name)
            if (tensor and len(tensor["axes"]) == len(shape)
                    and all(_fixed(a, n) for a, n in zip(tensor["axes"], shape, strict=True))):
                out.add(name)  # the class's fixed size; any other size is not the class's
        return frozenset(out)

    def family_in_tower(self, ckpt: Checkpoint) -> bool:
        """Whether the layers a hand-written family found are an encoder tower's."""
        entry = entry_for(ckpt)
        found = find_family(ckpt, strict=False)
        return bool(entry and found and towers.is_tower(entry, found[1]))

    def ssm_parameters(self, ckpt: Checkpoint) -> frozenset[str]:
        """An SSM mixer's tensors that are not a linear's (conv taps, ``A_log``, ``D``,
        ``dt_bias``, the gated norm): accounted as read by the mixer's own kernels."""
        entry = entry_for(ckpt) or {"tensors": {}}
        out = set()
        for name, shape in ckpt.shapes.items():
            tensor = _tensor(entry, ckpt, name)
            if (tensor and tensor["kind"] != "linear" and len(tensor["axes"]) == len(shape)
                    and "ssm" in tensor["axes"]
                    and not any(name.endswith("." + k[0]) and k[1] == len(shape)
                                for k in _SSM_KERNEL_AXES)):
                out.add(name)
        return frozenset(out)

    def sites(self, ckpt: Checkpoint) -> list[DimSite]:
        entry = entry_for(ckpt)
        if entry is None:
            return []
        cls = entry["class"]
        missing = torn_tensor(entry, ckpt)
        if missing:
            raise BadInput(f"{missing} is missing: {cls} builds it beside the tensors of that "
                           "part the checkpoint does hold, so its own class would not load it "
                           "as saved; refusing to judge a model with a part torn out", ckpt.path)
        text, path = towers.text_scope(entry, ckpt.config)
        head_dim = _head_dim(text, entry["keys"])
        groups: dict[tuple, _Group] = {}
        tower_groups: dict[tuple, towers.TowerGroup] = {}
        latent: dict[str, int | None] = {}
        for name, shape in ckpt.shapes.items():
            found = _lookup(entry, name)
            pattern, layer, expert = found
            tensor = _tensor(entry, ckpt, name, found)
            if tensor is None or len(tensor["axes"]) != len(shape):
                continue  # not the class's: the accounting names it
            for axis, (label, size) in enumerate(zip(tensor["axes"], shape, strict=False)):
                if label.startswith(("=", "positions", "rows", "vocab1")) or label == "streams":
                    continue  # a fixed size, a table length, a residual-stream count
                if label == "ssm":
                    _collect_ssm(groups, tensor, name, axis, size, layer)
                    continue
                if label == "mla":  # read whole by the latent-attention reader, below
                    latent[name.rsplit(".", 2)[0]] = layer
                    continue
                if ":" in label:  # an encoder tower's width (formats/derived_towers.py)
                    towers.collect(tower_groups, label, name, axis, size,
                                   _kind(tensor, name, axis, len(shape), label), _block(name),
                                   ckpt)
                    continue
                if label == "?":
                    raise BadInput(
                        f"{name} axis {axis} ({size}): a width of {cls}'s "
                        f"{_layer_kind(pattern)} that gac-check's class table cannot name; "
                        "refusing to judge it", ckpt.path)
                _collect(groups, tensor, name, axis, label, size, layer, expert, head_dim,
                         ckpt)
        derives = bool(entry.get("head_dim_derived"))
        sites = [_site(g, ckpt, cls, entry["keys"], text, path, derives)
                 for g in groups.values()]
        return (towers.sites(tower_groups, ckpt, cls, entry.get("towers", {})) + sites
                + [s for m, i in sorted(latent.items()) for s in layer_sites(ckpt, m, i)])


def _fixed(label: str, size: int) -> bool:
    """An axis with nothing to judge: the class's fixed size, or a table length (positions;
    an embedding's rows past the vocabulary's, which no GEMM has as a width)."""
    return label == f"={size}" or label.startswith(("positions", "rows", "vocab1"))


def _layer_kind(pattern: str) -> str:
    parts = pattern.split(".")
    return next((p for p in parts if p in ("mixer", "mamba", "ssm", "linear_attn",
                                            "conv", "feed_forward", "mlp", "self_attn")),
                parts[-2] if len(parts) > 1 else pattern)


def _collect(groups: dict[tuple, _Group], tensor: dict, name: str, axis: int, label: str,
             size: int, layer: int | None, expert: int | None, head_dim: int | None,
             ckpt: Checkpoint) -> None:
    ndim = len(tensor["axes"])
    kind = _kind(tensor, name, axis, ndim, label)
    prefix = _block(name)
    site_kind = "v_head_dim" if label in _V_HEAD_LABELS else "head_dim"
    if label in _V_HEAD_LABELS:
        head_dim = ckpt.config.get("v_head_dim")
    if label in _HEAD_LABELS or label in _V_HEAD_LABELS:
        if not isinstance(head_dim, int) or not head_dim or size % head_dim:
            raise BadInput(f"{name} axis {axis} ({size}) is not whole heads of {site_kind} "
                           f"{head_dim} (config.json): refusing to guess the heads", ckpt.path)
        g = groups.setdefault((site_kind, layer, prefix), _Group(site_kind, layer, prefix))
        g.axes.append(TensorAxis(name, axis, kind, blocks=size // head_dim, stride=head_dim))
        g.widths[name] = head_dim
        return
    if label not in _WIDTH:  # a label this reader does not know: a newer table
        raise BadInput(f"{name} axis {axis}: the class table names its width {label!r}, "
                       "which this gac-check does not read; refusing to judge it", ckpt.path)
    site_kind, parts = _WIDTH[label]
    if isinstance(parts, str):
        parts = _count(ckpt, parts, name, axis)
    if site_kind in ("hidden", "vocab", "cross_hidden", "concat"):
        key: tuple = (site_kind,)
        layer = None
    elif site_kind == "expert" and expert is not None:
        key = (site_kind, layer, expert)
        prefix = f"{prefix}.experts.{expert}"
    else:
        key = (site_kind, layer, prefix)
    g = groups.setdefault(key, _Group(site_kind, layer, prefix))
    width = size // parts
    if parts == 1:
        g.axes.append(TensorAxis(name, axis, kind))
    else:
        g.axes.extend(TensorAxis(name, axis, kind, start=s) for s in range(0, size, width))
    g.widths[name] = width


#: an SSM mixer's non-linear axes its kernels have a published limit on: (tensor leaf,
#: ndim, axis) -> site side; the rest of them are accounted (:meth:`Derived.ssm_parameters`).
#: A delta-attention mixer's q/k/v short convolutions (Kimi-Linear, Bailing-hybrid) run the
#: same causal-conv1d kernels (docs/formats.md "Hybrid and SSM models")
_SSM_KERNEL_AXES = {("conv1d.weight", 3, 2): "conv", ("q_conv1d.weight", 3, 2): "conv",
                    ("k_conv1d.weight", 3, 2): "conv", ("v_conv1d.weight", 3, 2): "conv",
                    ("A_log", 2, 1): "state"}


def _collect_ssm(groups: dict[tuple, _Group], tensor: dict, name: str, axis: int, size: int,
                 layer: int | None) -> None:
    """An SSM mixer's linear: its output rows (N; its bias too) and input columns (K) are
    each a GEMM width of their own, judged as the header has it (the fused in_proj's rows
    are z, x, B, C and dt heads side by side, whose split the GEMM never sees). Its conv
    taps and (Mamba-1) state size are sites for the SSM kernels' own limits."""
    if tensor["kind"] != "linear":
        leaf = next((k for k in _SSM_KERNEL_AXES if name.endswith("." + k[0])
                     and k[1:] == (len(tensor["axes"]), axis)), None)
        if leaf is not None:
            module = name[:-len(leaf[0]) - 1]
            side = _SSM_KERNEL_AXES[leaf]
            g = groups.setdefault(("ssm", layer, module, side), _Group("ssm", layer, module))
            g.axes.append(TensorAxis(name, axis, AxisKind.CONSUMER))
            g.widths[name] = size
        return
    module, leaf = name.rsplit(".", 1)
    side = "in" if axis == 1 else "out"
    kind = (AxisKind.CONSUMER if side == "in" else AxisKind.BIAS if leaf == "bias"
            else AxisKind.PRODUCER)
    g = groups.setdefault(("ssm", layer, module, side), _Group("ssm", layer, module))
    g.axes.append(TensorAxis(name, axis, kind))
    g.widths[name] = size


def _count(ckpt: Checkpoint, key: str, name: str, axis: int) -> int:
    """config.json's count of the widths an axis holds side by side (``hc_count``,
    ``num_buckets``); a refusal when config.json does not say it."""
    count = ckpt.config.get(key)
    if not isinstance(count, int) or count < 1:
        raise BadInput(f"{name} axis {axis} holds {key} widths side by side, and config.json "
                       f"has no {key}: refusing to guess it", ckpt.path)
    return count


def _block(name: str) -> str:
    """The module a per-layer site belongs to: the tensor's layer block (``model.layers.3``)
    plus its sub-block (``self_attn``, ``mlp``, ``mlp.shared_expert``)."""
    m = _INDEX.search(name)
    if not m:
        return ""
    rest = name[m.end():].split(".")
    head = name[:m.end() - 1]
    sub = [p for p in rest[:-2] if not p.isdigit()][:2] if len(rest) > 2 else rest[:1]
    if sub and "shared" not in sub[-1] and len(sub) > 1 and sub[-1] != "experts":
        sub = sub[:1]
    return ".".join([head, *sub])


def _head_dim(cfg: dict, keys: dict[str, str]) -> int | None:
    """config.json's head_dim, else hidden / heads under the class's own key names."""
    hd = cfg.get(keys.get("head_dim", "head_dim"))
    if isinstance(hd, int) and hd > 0:
        return hd
    hidden, heads = cfg.get(keys.get("hidden", "")), cfg.get(keys.get("heads", ""))
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
        return hidden // heads
    return None


def _site(g: _Group, ckpt: Checkpoint, cls: str, keys: dict[str, str], cfg: dict,
          path: tuple[str, ...], derives_head_dim: bool = False) -> DimSite:
    sizes = set(g.widths.values())
    if len(sizes) > 1:
        first = {w: t for t, w in sorted(g.widths.items(), reverse=True)}  # one per width
        shown = ", ".join(f"{t}: {w}" for w, t in sorted(first.items(), key=lambda i: i[1]))
        raise BadInput(f"{cls}'s {g.kind} width disagrees across its tensors ({shown}): "
                       "refusing to judge a layout its own class would not load", ckpt.path)
    value = sizes.pop()
    if g.kind == "ssm":
        first = g.axes[0]
        side = next((v for k, v in _SSM_KERNEL_AXES.items() if first.tensor.endswith(k[0])),
                    "in" if first.kind is AxisKind.CONSUMER else "out")
        role = {"conv": Role.SSM_CONV, "state": Role.SSM_STATE}.get(side, Role.SSM)
        return DimSite(f"{g.module}:ssm_{side}", role, value, g.axes, layer=g.layer,
                       module=g.module, inexact=SSM_NOT_PADDED, attrs={"derived": cls})
    if g.kind in ("head_dim", "v_head_dim"):
        name = f"{g.module}:{g.kind}"
        field_ = (*path, g.kind) if isinstance(cfg.get(g.kind), int) else None
        inexact = (V_NOT_PADDED if g.kind == "v_head_dim"
                   else head_dim_inexact(cls, cfg, derives_head_dim))
        return DimSite(name, Role.HEAD_DIM, value, g.axes, layer=g.layer, module=g.module,
                       config_field=field_, inexact=inexact, attrs={"derived": cls})
    key = keys.get(_CONFIG.get(g.kind, ""))  # none for an adapter bottleneck
    field_ = (*path, key) if key and isinstance(cfg.get(key), int) else None
    inexact = {"hidden": HIDDEN_INEXACT, "vocab": VOCAB_INEXACT, "heads": HEADS_NOT_PADDED,
               "experts": EXPERTS_NOT_PADDED, "router": EXPERTS_NOT_PADDED,
               "cross_hidden": CROSS_INEXACT, "mlp_derived": DERIVED_INEXACT,
               "adapter": adapters.ADAPTER_NOT_PADDED, "concat": adapters.CONCAT_NOT_PADDED,
               }.get(g.kind) or _normed(g)
    name = g.kind if g.layer is None else f"{g.module}:{_SITE_NAME[g.kind]}"
    site = DimSite(name, _ROLE[g.kind], value, g.axes, layer=g.layer, module=g.module,
                   config_field=field_, inexact=inexact, attrs={"derived": cls})
    if field_ and cfg[field_[-1]] != value and g.kind in ("hidden", "vocab", "mlp"):
        site.notes.append(f"the config says {'.'.join(field_)}={cfg[field_[-1]]}, "
                          f"tensors have {value}")
    return site


def _normed(g: _Group) -> str | None:
    """Why an MLP / expert width with a norm over it is not padded (None: padding is exact,
    held to the class itself by :mod:`gac_check.padding.class_proof` before anything is
    written)."""
    norm = next((ax.tensor for ax in g.axes if ax.kind is AxisKind.NORM), None)
    return NORMED.format(tensor=norm) if norm else None


_SITE_NAME = {"mlp": "intermediate", "mlp_derived": "intermediate", "mlp_half": "intermediate",
              "router": "router_experts", "expert": "expert_intermediate",
              "shared": "shared_expert_intermediate", "experts": "experts", "heads": "heads",
              "adapter": "adapter_bottleneck"}
