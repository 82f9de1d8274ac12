"""A composite model's language model under ``text_config`` and its encoder towers' widths.

The class table (:mod:`.derive_composite`) labels a tower's axes ``SCOPE:LABEL``
(``vision_config:inter``: the MLP width of the tower built from ``vision_config``). A tower's
linears are GEMMs like the language model's, run on the same accelerator, so their widths are
judged by the same rules: per tower its residual width (``SCOPE:hidden``), per tower layer its
MLP width, head count and (where a tensor shows it apart from the hidden width) head_dim.
They are never padded: --repair pads the language model only, so every tower site carries
:data:`TOWER_NOT_PADDED` and a misaligned tower is a finding --repair leaves standing.
Tower sites carry no layer index, so a serving target's per-layer shapes stay the language
model's (targets/shards.py).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

TOWER_NOT_PADDED = ("an encoder tower's width ({scope}): --repair pads the language model's "
                    "widths only, so a tower's are judged, never padded")

#: tower label -> (site kind, how many site widths the axis holds)
_WIDTH = {"hidden": ("hidden", 1), "inter": ("mlp", 1), "inter2": ("mlp", 2),
          "h4": ("mlp", 1), "heads": ("heads", 1)}
_HEAD_LABELS = ("hd", "h3")
_ROLE = {"hidden": Role.HIDDEN, "mlp": Role.INTERMEDIATE, "heads": Role.HEADS,
         "head_dim": Role.HEAD_DIM}
_KEY = {"hidden": "hidden", "mlp": "inter", "heads": "heads"}


def text_scope(entry: Mapping, config: Mapping) -> tuple[Mapping, tuple[str, ...]]:
    """The config.json mapping that holds the language model's widths, and its path
    (``text_config`` for a composite class; the top level otherwise)."""
    scope = entry.get("text_config")
    sub = config.get(scope) if scope else None
    return (sub, (scope,)) if isinstance(sub, Mapping) else (config, ())


def tied(entry: Mapping, config: Mapping) -> bool:
    """Whether the output head is tied to the embedding: config.json's
    ``tie_word_embeddings`` (the top-level class's, which owns the head), else the text
    sub-config's, else the class's default."""
    for node in (config, text_scope(entry, config)[0]):
        if isinstance(node.get("tie_word_embeddings"), bool):
            return node["tie_word_embeddings"]
    return bool(entry.get("tied"))


def is_tower(entry: Mapping, prefix: str) -> bool:
    """Whether the class table labels the tensors under ``prefix`` with a tower's widths."""
    return any(p.startswith(prefix + ".") and any(":" in a for a in t["axes"])
               for p, t in entry["tensors"].items())


def parts_present(entry: Mapping, ckpt: Checkpoint) -> set[str]:
    """The optional tower parts (``vision_config.vision_use_head``) the checkpoint holds a
    tensor of: those are held whole, like every other part."""
    present: set[str] = set()
    for name, tensor in entry["tensors"].items():
        if "optional" in tensor and name in ckpt.shapes:
            present.add(tensor["optional"])
    return present


@dataclass
class TowerGroup:
    """The axes of one tower site being collected, and the widths they imply."""

    scope: str
    kind: str
    module: str
    axes: list[TensorAxis] = field(default_factory=list)
    widths: dict[str, int] = field(default_factory=dict)


def collect(groups: dict[tuple, TowerGroup], label: str, name: str, axis: int, size: int,
            kind: AxisKind, block: str, ckpt: Checkpoint) -> None:
    """Put one tower-labelled axis on its site."""
    scope, base = label.split(":", 1)
    block = block or name.rsplit(".", 2)[0]  # a tower's head outside its layers
    if base in _HEAD_LABELS:
        head_dim = _tower_head_dim(ckpt.config.get(scope))
        if not head_dim or size % head_dim:
            raise BadInput(f"{name} axis {axis} ({size}) is not whole heads of the {scope} "
                           f"tower's head_dim {head_dim} (config.json): refusing to guess "
                           "its heads", ckpt.path)
        g = groups.setdefault((scope, "head_dim", block), TowerGroup(scope, "head_dim", block))
        g.axes.append(TensorAxis(name, axis, kind, blocks=size // head_dim, stride=head_dim))
        g.widths[name] = head_dim
        return
    if base not in _WIDTH:
        raise BadInput(f"{name} axis {axis}: the class table names its width {label!r}, "
                       "which this gac-check does not read; refusing to judge it", ckpt.path)
    site_kind, parts = _WIDTH[base]
    module = scope if site_kind == "hidden" else block
    g = groups.setdefault((scope, site_kind, module), TowerGroup(scope, site_kind, module))
    width = size // parts
    g.axes.extend(TensorAxis(name, axis, kind, start=s) if parts > 1
                  else TensorAxis(name, axis, kind) for s in range(0, size, width))
    g.widths[name] = width


def _tower_head_dim(sub: object) -> int | None:
    if not isinstance(sub, Mapping):
        return None
    hidden, heads = sub.get("hidden_size"), sub.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
        return hidden // heads
    return None


def sites(groups: dict[tuple, TowerGroup], ckpt: Checkpoint, cls: str,
          keys: Mapping[str, Mapping[str, str]]) -> list[DimSite]:
    """One site per tower group, each refused for --repair (:data:`TOWER_NOT_PADDED`)."""
    return [_site(g, ckpt, cls, keys.get(g.scope, {})) for g in groups.values()]


def _site(g: TowerGroup, ckpt: Checkpoint, cls: str, keys: Mapping[str, str]) -> DimSite:
    sizes = set(g.widths.values())
    if len(sizes) > 1:
        shown = ", ".join(f"{t}: {w}" for t, w in sorted(g.widths.items())[:4])
        raise BadInput(f"{cls}'s {g.scope} tower {g.kind} width disagrees across its tensors "
                       f"({shown}): refusing to judge a layout its own class would not load",
                       ckpt.path)
    sub = ckpt.config.get(g.scope)
    key = keys.get(_KEY.get(g.kind, ""))
    field_ = ((g.scope, key) if key and isinstance(sub, Mapping)
              and isinstance(sub.get(key), int) else None)
    name = f"{g.scope}:hidden" if g.kind == "hidden" else f"{g.module}:{g.kind}"
    return DimSite(name, _ROLE[g.kind], sizes.pop(), g.axes, module=g.module,
                   config_field=field_, inexact=TOWER_NOT_PADDED.format(scope=g.scope),
                   attrs={"derived": cls, "tower": g.scope})
