"""Tensor naming: a pass over the judged pickle tree that names every tensor as a user would.

A state dict's tensors are named by their keys; a whole pickled model's (LLM-Pruner, SVD-LLM)
are rebuilt from its module tree exactly as ``model.state_dict()`` names them (parameters,
then persistent buffers, then submodules); a wrapper (``{'model': m, 'tokenizer': t}``,
``{'state_dict': sd, 'epoch': 3}``) is stepped into. The tree is a DAG (memo reads share
nodes), so the walk is bounded: :data:`MAX_VISITS` nodes and :data:`MAX_DEPTH` levels, never
recursion; nothing the pickle built is hashed but flat keys (strings, small integers).
"""
from __future__ import annotations

from collections.abc import Iterator

from gac_check.checkpoint.pickled.allowlist import TensorRef
from gac_check.checkpoint.pickled.machine import MAX_DEPTH, Node
from gac_check.errors import PickleRefused

#: Nodes visited while naming tensors; bounds DAG blow-ups (a list referencing itself twice,
#: sixty levels deep) that would otherwise name 2**60 paths.
MAX_VISITS = 1_000_000
#: Keys under which people wrap a state dict or a model next to metadata.
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "model_state", "net",
                "weights", "params")
#: Dict keys that are compared by value: their hash cannot be steered into collisions.
_SAFE_INT = 2**61 - 2


def name_tensors(root: Node) -> list[tuple[str, TensorRef]]:
    """Every tensor under ``root`` with the name ``state_dict()`` would give it."""
    if root.kind == "tensor":
        raise PickleRefused("the pickle holds a single unnamed tensor, not a state dict or model")
    namer = _Namer()
    named = namer.flatten(namer.unwrap(root))
    seen: set[str] = set()
    for name, _ in named:
        if name in seen:
            raise PickleRefused(f"two tensors are both named {name!r}")
        seen.add(name)
    return named


def entries(node: Node) -> dict[object, Node]:
    """A dict node as the dict unpickling would build: later keys win, first position kept.

    Flat keys (strings, bytes, small integers, None, bools) compare by value, a global by name;
    any other key (a tuple, a float, a huge integer, an object) only equals itself, as hashing
    it could recurse or be steered into collisions.
    """
    out: dict[object, Node] = {}
    for k, v in node.pairs:
        out[_key(k)] = v
    return out


def _key(node: Node) -> object:
    value = node.value
    if type(value) is str and node.kind == "const":  # nearly every key: a name
        return value
    flat = isinstance(value, str | bytes | bool) or (
        isinstance(value, int) and -_SAFE_INT < value < _SAFE_INT)
    if node.kind in ("none", "bool") or (node.kind == "const" and flat):
        return value
    if node.kind == "global":
        return ("global", *value)
    return node


class _Namer:
    def __init__(self) -> None:
        self.visits = 0
        self.dicts: dict[int, dict[object, Node]] = {}

    def tick(self, depth: int) -> None:
        self.visits += 1
        if self.visits > MAX_VISITS:
            raise PickleRefused(f"the pickle's structure names more than {MAX_VISITS} objects")
        if depth > MAX_DEPTH:
            raise PickleRefused(f"the pickle nests deeper than {MAX_DEPTH} levels")

    def entries(self, node: Node) -> dict[object, Node]:
        found = self.dicts.get(id(node))
        if found is None:
            found = self.dicts[id(node)] = entries(node)
        return found

    def module_state(self, node: Node) -> dict[object, Node] | None:
        """The BUILD state of an nn.Module (anything with _modules and _parameters), else
        None."""
        if node.kind == "obj" and node.state is not None and node.state.kind == "dict":
            state = self.entries(node.state)
            if "_modules" in state and "_parameters" in state:
                return state
        return None

    def children(self, node: Node) -> Iterator[tuple[str, Node]]:
        """(name, child) pairs in the order ``state_dict()`` emits them."""
        state = self.module_state(node)
        if state is not None:
            yield from self.module_children(state)
        elif node.kind == "dict":
            for k, v in self.entries(node).items():
                if isinstance(k, str | int) and not isinstance(k, bool):
                    yield str(k), v  # only small ints are keys by value, so str() is short
        elif node.kind in ("list", "tuple"):
            for i, v in enumerate(node.items):
                yield str(i), v

    def module_children(self, state: dict[object, Node]) -> Iterator[tuple[str, Node]]:
        """Parameters, then persistent buffers, then submodules, as Module.state_dict orders
        them."""
        params, buffers, modules = (state.get(k) for k in ("_parameters", "_buffers",
                                                           "_modules"))
        skip_node = state.get("_non_persistent_buffers_set")
        skip = {i.value for i in skip_node.items if i.kind == "const"} \
            if skip_node is not None and skip_node.kind == "set" else set()
        for group in (params, buffers):
            if group is None or group.kind != "dict":
                continue
            for k, v in self.entries(group).items():
                if isinstance(k, str) and v.kind == "tensor" and \
                        (group is params or k not in skip):
                    yield k, v
        if modules is not None and modules.kind == "dict":
            for k, v in self.entries(modules).items():
                if isinstance(k, str) and self.module_state(v) is not None:
                    yield k, v

    def flatten(self, root: Node) -> list[tuple[str, TensorRef]]:
        """Every tensor under ``root`` with its dotted path, without recursion."""
        out: list[tuple[str, TensorRef]] = []
        todo: list[tuple[str, Node, int]] = [("", root, 0)]
        while todo:
            name, node, depth = todo.pop()
            self.tick(depth)
            if node.kind == "tensor":
                out.append((name, node.value))
                continue
            kids = [(f"{name}.{k}" if name else k, v, depth + 1) for k, v in self.children(node)]
            todo.extend(reversed(kids))
        return out

    def unwrap(self, root: Node) -> Node:
        """Step into {'model': model, 'tokenizer': ...} or {'state_dict': sd, 'epoch': 3}.

        A dict that holds tensors directly is the state dict itself. Otherwise, when one value
        holds all the tensors and it is a module, sits under a usual wrapper key, or stands next
        to non-tensor metadata, the names are that value's own, as a user would expect.
        """
        while root.kind == "dict":
            items = self.entries(root)
            if any(v.kind == "tensor" for v in items.values()):
                return root
            holders = [(k, v) for k, v in items.items() if self.flatten(v)]
            if len(holders) > 1:
                preferred = [(k, v) for k, v in holders if k in WRAPPER_KEYS]
                holders = preferred if len(preferred) == 1 else holders
            if len(holders) != 1:
                return root
            key, value = holders[0]
            if not (self.module_state(value) is not None or key in WRAPPER_KEYS or
                    len(items) > 1):
                return root
            root = value
        return root
