"""transformers' per-layer configs: config.json's ``per_layer_config``.

transformers 5.x (``HeterogeneousConfigMixin``) reads ``"per_layer_config": {"1":
{"intermediate_size": 107, "num_key_value_heads": 4}, "2": {"skip": ["mlp"]}}``: a sparse
map from layer index (a decimal string, zero-padded when transformers writes it) to the
attributes that layer overrides; a layer without an entry takes the global values, and
``skip`` names blocks the layer does not have. transformers itself validates only the index
range and that ``skip`` holds strings; its Llama-family classes cannot be built from such a
config at all (:mod:`gac_check.targets.per_layer`).

Each layer's sites come from its own tensors, as for any dense layout; this module reads the
overrides so that a layer's width is compared with what its own entry declares (not with
the global value), so that ``--repair`` records a padded width in that entry, and so that
the targets hear which layers no global-config class builds. What it reads is strict: an
index, attribute or ``skip`` entry it does not understand is a refusal, never a guess.
Tensors win: an override they contradict is a note with both values; so is a block that
``skip`` names but whose tensors are there (read as a full block: the tensors decide the
layout), and a block with no tensors that ``skip`` does not name.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.architectures import Family, find_family
from gac_check.formats.base import Format
from gac_check.formats.layout import Linear
from gac_check.sites import DimSite, Role
from gac_check.targets.per_layer import LayerDiff

KEY = "per_layer_config"
#: Overrides gac-check reads whatever their value: the MLP width (the family's own key is
#: added), the head counts and the head size, all of which each layer's tensors carry (the
#: entry says how the layer's q/k widths split into heads, the tensors hold it to that).
WIDTHS = ("num_key_value_heads", "num_attention_heads", "head_dim")
#: Overrides read only at the global value (transformers then drops them): every layer reads
#: and writes the one residual stream.
GLOBAL_ONLY = ("hidden_size",)


@dataclass(frozen=True)
class Override:
    """One per_layer_config entry as read: its key in config.json, the width overrides that
    differ from the global value, and the blocks it skips."""

    key: str
    values: dict[str, int]
    skip: tuple[str, ...]


class PerLayer(Format):
    name = "per-layer"
    description = "transformers per-layer config (per_layer_config)"

    def matches(self, ckpt: Checkpoint) -> bool:
        text = ckpt.config.get("text_config")
        return (ckpt.config.get(KEY) not in (None, {})
                or (isinstance(text, dict) and text.get(KEY) not in (None, {})))

    def sites(self, ckpt: Checkpoint) -> list[DimSite]:
        return read(ckpt, super().sites(ckpt))[0]

    def head_dims(self, ckpt: Checkpoint, fam: Family, prefix: str) -> dict[int, int]:
        overrides = parse(ckpt.config, fam, ckpt.path / "config.json")
        return layer_head_dims(ckpt, fam, prefix, overrides,
                               lambda m: self.linear(ckpt, m))

    def per_layer(self, ckpt: Checkpoint) -> tuple[LayerDiff, ...]:
        return read(ckpt, super().sites(ckpt))[1]


def read(ckpt: Checkpoint, sites: list[DimSite]) -> tuple[list[DimSite], tuple[LayerDiff, ...]]:
    """The sites (from the tensors) with each layer's own entry as its declared value, and
    each layer that is not what the global config builds."""
    where = ckpt.path / "config.json"
    if "block_configs" in ckpt.config:
        raise BadInput("has both per_layer_config and block_configs: gac-check reads each "
                       "alone and will not guess which one describes the layers", where)
    found = find_family(ckpt, strict=False)
    if found is None:
        raise BadInput("has per_layer_config, but its layers are of no architecture gac-check "
                       "knows: their widths cannot be read", where)
    fam, prefix, present = found
    overrides = parse(ckpt.config, fam, where)
    count = ckpt.config["num_hidden_layers"]
    beyond = sorted(set(present) - set(range(count)))
    if beyond:
        raise BadInput(f"has tensors of layer {beyond[0]}, but num_hidden_layers is {count}: "
                       f"{KEY} cannot describe it", ckpt.path)
    hidden = next(s for s in sites if s.role is Role.HIDDEN)
    diffs = []
    for i in range(count):
        own = [s for s in sites if s.layer == i]
        over = overrides.get(i)
        if over:
            _own_entry(own, fam, over)
        differs = _widths(own, fam, ckpt.config, over) + _blocks(ckpt, fam, prefix, i, over,
                                                                  hidden)
        if differs:
            diffs.append(LayerDiff(i, ", ".join(differs)))
    return sites, tuple(diffs)


def layer_head_dims(ckpt: Checkpoint, fam: Family, prefix: str, overrides: dict[int, Override],
                    resolve: Callable[[str], Linear | None]) -> dict[int, int]:
    """Each layer whose entry sets its own head_dim or head count: the head_dim its q/k
    widths split into. What the layer declares (its entry's value, else the global one)
    where its q width is that many heads of that size; else the declared head_dim where the
    tensors are whole heads of it, else the width over the declared head count (the tensors
    win: the declared value they contradict is a note, :func:`_own_entry`); where none
    splits them, a refusal."""
    where = ckpt.path / "config.json"
    out = {}
    for i, over in sorted(overrides.items()):
        heads, hd = over.values.get("num_attention_heads"), over.values.get("head_dim")
        if heads is None and hd is None:
            continue
        if fam.qkv:
            raise BadInput(f"{KEY}[{over.key!r}] sets a per-layer head count or head_dim in "
                           f"a fused qkv projection ({fam.qkv}), whose split gac-check reads "
                           "from the global head counts only", where)
        q, k = (resolve(f"{prefix}.{i}.{m}") for m in (fam.q, fam.k))
        if not (q and k):
            continue  # no attention tensors: the layer has no head sites
        width = q.out_features
        glob_hd, glob_heads = (global_value(ckpt.config, a) for a in ("head_dim",
                                                                      "num_attention_heads"))
        hd = hd or (glob_hd if type(glob_hd) is int else None)
        heads = heads or (glob_heads if type(glob_heads) is int else None)
        by_heads = width // heads if heads and width % heads == 0 else None
        candidates = [hd if hd and heads and hd * heads == width else None, hd, by_heads]
        found = next((c for c in candidates
                      if c and width % c == 0 and k.out_features % c == 0), None)
        if found is None:
            raise BadInput(f"{KEY}[{over.key!r}]: layer {i}'s q/k widths {width}/"
                           f"{k.out_features} are whole heads of neither its head_dim "
                           f"{hd} nor {heads} heads: the layer's head layout cannot be "
                           "known", where)
        out[i] = found
    return out


def blocks_of(fam: Family) -> tuple[str, str]:
    """The blocks a ``skip`` may name: the layer's attention and MLP modules."""
    return ((fam.qkv or fam.q or fam.o).split(".")[0],
            (fam.gate_up or fam.up or fam.down).split(".")[0])


def parse(cfg: dict, fam: Family, where: Path) -> dict[int, Override]:
    """per_layer_config, each entry read or refused (one line naming the entry and the key)."""
    raw = cfg.get(KEY)
    if raw is None and isinstance(cfg.get("text_config"), dict):
        raise BadInput(f"has text_config.{KEY}: transformers v5.24.0 reads it there "
                       "(get_text_config() is the text config, with its per-layer layers), "
                       "but gac-check does not read a nested text config's widths (hidden "
                       "size, heads, per-layer overrides) yet: refusing rather than hold the "
                       "layers to the wrong global values", where)
    layers = cfg.get("num_hidden_layers")
    if not isinstance(raw, dict):
        raise BadInput(f"{KEY} is {type(raw).__name__}, not an object mapping layer indices "
                       "to overrides", where)
    if type(layers) is not int or layers <= 0:
        raise BadInput(f"has {KEY} but num_hidden_layers is {layers!r}: its layer indices "
                       "cannot be checked", where)
    out: dict[int, Override] = {}
    for key, entry in raw.items():
        if not (key.isascii() and key.isdigit()):
            raise BadInput(f"{KEY} key {key!r} is not a layer index", where)
        i = int(key)
        if i >= layers:
            raise BadInput(f"{KEY}[{key!r}] names layer {i}, but num_hidden_layers is "
                           f"{layers}", where)
        if i in out:
            raise BadInput(f"{KEY} names layer {i} twice ({out[i].key!r} and {key!r})", where)
        out[i] = _entry(cfg, fam, key, entry, where)
    return out


def _entry(cfg: dict, fam: Family, key: str, entry: object, where: Path) -> Override:
    name = f"{KEY}[{key!r}]"
    if not isinstance(entry, dict):
        raise BadInput(f"{name} is {type(entry).__name__}, not an object of overrides", where)
    values: dict[str, int] = {}
    skip: tuple[str, ...] = ()
    for attr, value in entry.items():
        if attr == "skip":
            skip = _skip(name, value, blocks_of(fam), where)
        elif attr in (fam.intermediate_key, *WIDTHS, *GLOBAL_ONLY):
            if type(value) is not int or value <= 0:
                raise BadInput(f"{name}.{attr} is {value!r}, not a positive integer", where)
            if value == global_value(cfg, attr):
                continue  # the global value: transformers drops the override
            if attr in GLOBAL_ONLY:
                raise BadInput(f"{name}.{attr} is {value} (global "
                               f"{global_value(cfg, attr)!r}): "
                               f"a per-layer {attr} is no layout gac-check knows (every "
                               "layer reads and writes the one residual stream)", where)
            values[attr] = value
        else:
            raise BadInput(f"{name} has {attr!r}, which gac-check does not read: refusing "
                           "rather than guess the layer's widths", where)
    return Override(key, values, skip)


def global_value(cfg: dict, attr: str) -> object:
    """The global value of ``attr`` as transformers' config holds it: config.json's, where
    absent the default Llama-family configs derive (KV heads: the head count; head_dim:
    hidden_size // num_attention_heads)."""
    if attr in cfg:
        return cfg[attr]
    heads = cfg.get("num_attention_heads")
    if attr == "num_key_value_heads":
        return heads
    if attr == "head_dim" and type(heads) is int and heads > 0:
        hidden = cfg.get("hidden_size")
        return hidden // heads if type(hidden) is int else None
    return None


def _skip(name: str, value: object, blocks: tuple[str, str], where: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(b, str) for b in value):
        raise BadInput(f"{name}.skip is {value!r}, not a list of block names", where)
    unknown = sorted(set(value) - set(blocks))
    if unknown:
        raise BadInput(f"{name}.skip names {', '.join(map(repr, unknown))}; a layer's blocks "
                       f"are {' and '.join(map(repr, blocks))}", where)
    return tuple(sorted(set(value)))


def _own_entry(own: list[DimSite], fam: Family, over: Override) -> None:
    """A layer's sites against its own entry: the global value's notes give way to the
    entry's (a note only where the tensors contradict it), and the MLP width is recorded in
    the entry (so --repair writes a padded width there)."""
    inter = over.values.get(fam.intermediate_key)
    for site in own:
        if site.role is Role.INTERMEDIATE and inter is not None:
            site.notes[:] = [n for n in site.notes if f"{fam.intermediate_key}=" not in n]
            site.config_field = (KEY, over.key, fam.intermediate_key)
            _contradiction(site, over, fam.intermediate_key, inter, site.value)
        found = {Role.HEADS: {"num_key_value_heads": site.attrs.get("kv_heads"),
                              "num_attention_heads": site.value},
                 Role.HEAD_DIM: {"head_dim": site.value}}.get(site.role, {})
        for attr, value in found.items():
            if attr in over.values:
                site.notes[:] = [n for n in site.notes if f"{attr}=" not in n]
                _contradiction(site, over, attr, over.values[attr], value)


def _contradiction(site: DimSite, over: Override, attr: str, declared: int,
                   found: object) -> None:
    if declared != found:
        site.notes.append(f"{KEY}[{over.key!r}] says {attr}={declared}, tensors have {found}")


def _widths(own: list[DimSite], fam: Family, cfg: dict, over: Override | None) -> list[str]:
    """How a layer's tensors differ from the global config, and each override of its entry
    the tensors contradict (the entry alone makes transformers' config per-layer)."""
    out = []
    declared = over.values if over else {}
    for site in own:
        if site.role is Role.INTERMEDIATE:
            read = [(site.value, fam.intermediate_key, f"MLP {site.value}")]
        elif site.role is Role.HEADS:
            kv = site.attrs.get("kv_heads")
            read = [(site.value, "num_attention_heads", f"{site.value} heads"),
                    (kv, "num_key_value_heads", f"{kv} KV heads")]
        elif site.role is Role.HEAD_DIM:
            read = [(site.value, "head_dim", f"head_dim {site.value}")]
        else:
            continue
        for width, attr, what in read:
            of = global_value(cfg, attr)
            if width != of:
                out.append(f"{what} (global {attr} {of})")
            if attr in declared and declared[attr] != width:
                out.append(f"{KEY} sets {attr} {declared[attr]}, the tensors have {width}")
    return out


def _blocks(ckpt: Checkpoint, fam: Family, prefix: str, i: int, over: Override | None,
            hidden: DimSite) -> list[str]:
    """Layer ``i``'s blocks against ``skip``: a skipped block must have no tensors, and a
    block without tensors must be skipped; either contradiction is a note (the tensors
    decide), each skipped block a difference from what a global-config class builds."""
    skip = over.skip if over else ()
    base = f"{prefix}.{i}."
    differs = []
    for block in blocks_of(fam):
        has = sorted(n for n in ckpt.tensors if n.startswith(f"{base}{block}."))
        if block in skip and has:
            hidden.notes.append(f"{KEY}[{over.key!r}] skips layer {i}'s {block}, the tensors "
                                f"have it ({has[0]}): read as a full block")
            differs.append(f"{block} skipped by {KEY} but present in the tensors")
        elif block in skip:
            differs.append(f"no {block} ({KEY} skips it)")
        elif not has:
            hidden.notes.append(f"layer {i} has no {block} tensors, and {KEY} does not skip it")
            differs.append(f"no {block} tensors")
    return differs
