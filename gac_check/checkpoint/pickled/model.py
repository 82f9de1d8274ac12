"""What a whole pickled model says about itself beyond its tensors: a pass over the judged tree.

Attention modules' ``head_dim``, rotary buffers that ``state_dict()`` leaves out, the pickled
config (which structured pruners leave at the dense sizes): formats read these from
:class:`PickledModel`, and a repair finds the integers to rewrite through
:func:`module_index`. Module paths are named as the tensors are (``model.layers.0.mlp``):
a parameter's storage ties the two namings, since naming may have stepped into a wrapper
(``{'model': m}``) or not. Traversals are bounded like the naming pass's.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gac_check.checkpoint.pickled.allowlist import TensorRef
from gac_check.checkpoint.pickled.machine import MAX_DEPTH, Node
from gac_check.checkpoint.pickled.naming import MAX_VISITS
from gac_check.errors import PickleRefused


@dataclass
class PickledModel:
    """What a whole pickled model carries besides its state dict, named as its tensors are.

    ``attributes``: each module's scalar attributes (an attention's ``head_dim``,
    ``num_heads``); ``buffers``: every buffer's shape, non-persistent ones (rotary
    ``inv_freq`` in current transformers) included; ``config``: the scalars of the outermost
    module's pickled ``config`` object.
    """

    attributes: dict[str, dict[str, Any]]
    buffers: dict[str, tuple[int, ...]]
    config: dict[str, Any]

    def merge(self, other: PickledModel | None) -> PickledModel:
        """This file's model with another shard's (the first config found is kept)."""
        if other is None:
            return self
        return PickledModel({**self.attributes, **other.attributes},
                            {**self.buffers, **other.buffers}, self.config or other.config)


def describe_model(root: Node, named: list[tuple[str, TensorRef]]) -> PickledModel | None:
    """The modules of a judged tree, or None when it holds none (a state dict)."""
    index = module_index(root, named)
    if not index:
        return None
    outermost = min(index, key=len)
    attributes: dict[str, dict[str, Any]] = {}
    buffers: dict[str, tuple[int, ...]] = {}
    for path, mod in index.items():
        attributes[path] = object_fields(mod.node)
        for name, node in mod.buffers():
            if node.kind == "tensor":
                buffers[f"{path}.{name}" if path else name] = node.value.shape
    config = object_fields(index[outermost].attribute("config"))
    return PickledModel(attributes, buffers, config)


def is_module(node: Node) -> bool:
    """An nn.Module's object node: its state dict has _parameters and _modules."""
    return node.kind == "obj" and node.state is not None and node.state.kind == "dict" and \
        node.state.get("_parameters") is not None and node.state.get("_modules") is not None


@dataclass(eq=False)
class ModuleNode:
    """A pickled nn.Module at its dotted path (relative to the outermost module)."""

    path: str
    node: Node

    @property
    def state(self) -> Node:
        assert self.node.state is not None
        return self.node.state

    def parameters(self) -> Iterator[tuple[str, Node]]:
        group = self.state.get("_parameters")
        yield from (group.dict_items() if group is not None else ())

    def buffers(self) -> Iterator[tuple[str, Node]]:
        group = self.state.get("_buffers")
        yield from (group.dict_items() if group is not None else ())

    def attribute(self, name: str) -> Node | None:
        return self.state.get(name)


def module_index(root: Node, named: list[tuple[str, TensorRef]]) -> dict[str, ModuleNode]:
    """Every pickled module by the path its tensors are named under (``model.layers.0.mlp``).

    ``named`` is the naming pass's answer for the same tree.
    """
    mods = modules(root)
    shift = _name_prefix(mods, {id(ref.storage): name for name, ref in named})
    return {(shift + m.path) if m.path else shift.rstrip("."): m for m in mods}


def modules(root: Node) -> list[ModuleNode]:
    """Every module under the outermost modules of the pickle, by path (``model.layers.0``)."""
    out: list[ModuleNode] = []
    visits = 0
    for top in _outermost_modules(root):
        todo = [("", top, 0)]
        while todo:
            path, node, depth = todo.pop()
            visits += 1
            if visits > MAX_VISITS or depth > MAX_DEPTH:
                raise PickleRefused("the pickled module tree is too large or too deep to read")
            mod = ModuleNode(path, node)
            out.append(mod)
            children = mod.state.get("_modules")
            kids = [(f"{path}.{k}" if path else k, v, depth + 1)
                    for k, v in (children.dict_items() if children is not None else ())
                    if is_module(v)]
            todo.extend(reversed(kids))
    return out


def _outermost_modules(root: Node) -> list[Node]:
    """Modules reachable from the root without passing through another module (a wrapper dict
    ``{'model': m, 'tokenizer': t}`` has one; a bare state dict none)."""
    found: list[Node] = []
    todo, seen = [(root, 0)], set()
    while todo:
        node, depth = todo.pop()
        if id(node) in seen or depth > MAX_DEPTH or len(seen) > MAX_VISITS:
            continue
        seen.add(id(node))
        if is_module(node):
            found.append(node)
            continue
        if node.kind == "dict":
            todo.extend((v, depth + 1) for _, v in node.pairs)
        elif node.kind in ("list", "tuple"):
            todo.extend((v, depth + 1) for v in node.items)
    return found


def _name_prefix(mods: list[ModuleNode], by_storage: dict[int, str]) -> str:
    """What naming put before module paths (nothing when it unwrapped to the model)."""
    for mod in mods:
        for pname, node in mod.parameters():
            name = by_storage.get(id(node.value.storage)) if node.kind == "tensor" else None
            rel = f"{mod.path}.{pname}" if mod.path else pname
            if name and name.endswith(rel):
                return name[: -len(rel)]
    return ""


def scalar(node: Node | None) -> Any:
    """A node's plain value: ints, floats, strings, bools, None, and torch dtypes by name."""
    if node is None:
        return None
    if node.kind in ("const", "bool"):
        return node.value
    if node.kind == "global" and node.value[0] == "torch":
        return node.value[1]
    return None


def object_fields(node: Node | None) -> dict[str, Any]:
    """The scalar attributes of a pickled object (a config's hidden_size, head_dim...)."""
    if node is None or node.kind != "obj" or node.state is None or node.state.kind != "dict":
        return {}
    out = {}
    for key, value in node.state.dict_items():
        v = scalar(value)
        if v is not None or value.kind == "none":
            out[key] = v
    return out
