"""A torch zip's ``data.pkl`` as a tree of nodes that know which opcode bytes made them.

:mod:`gac_check.checkpoint.torchzip` decides whether a pickle is safe to index and names its
tensors; this module reads the same stream again, *only after that walk accepted it*, for the two
things the walker's values cannot carry: where in the byte stream each value was written (so a
repair can rewrite a shape, a storage size or ``in_features`` in place, :mod:`torchzip_write`),
and what a whole pickled model says about itself beyond its tensors (attention modules'
``head_dim``, rotary buffers that ``state_dict()`` leaves out, the pickled config).

Nothing is imported or called: every opcode only builds a :class:`Node`. Work is bounded like
the walker's (opcodes, MARK depth), and traversals count their visits.
"""
from __future__ import annotations

import functools
import pickletools
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gac_check.checkpoint.files import open_regular
from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.torchzip import MAX_DEPTH, MAX_OPCODES, MAX_VISITS
from gac_check.errors import BadInput

#: Calls that build a dict (their SETITEMS fill it) or rebuild tensors.
ORDERED_DICT = ("collections", "OrderedDict")
REBUILD_TENSOR = {("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_tensor_v2"),
                  ("torch._utils", "_rebuild_tensor_v3")}
REBUILD_PARAMETER = {("torch._utils", "_rebuild_parameter"),
                     ("torch._utils", "_rebuild_parameter_with_state")}
CONSTANT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT",
                "BINFLOAT", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
                "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "STRING",
                "BINSTRING", "SHORT_BINSTRING"}


@dataclass(eq=False, slots=True)
class Node:
    """One value the pickle builds, and the byte span ``[pos, end)`` of the opcode that made it.

    ``kind`` is const, none, bool, tuple, list, dict, set, global, call, obj or persid.
    ``items`` holds tuple/list/set members, call arguments ``[func, args]``, an object's
    ``[cls]`` or a persistent id's ``[pid]``; ``pairs`` a dict's (key, value) nodes in order;
    ``state`` what BUILD gave an object. ``gets`` counts memo reads: a node read back more
    than once is shared, and editing it would edit every place that reads it. Containers get
    their own lists; every other node shares the empty tuple (a pickle has ~10^5 constants).
    """

    kind: str
    pos: int
    end: int = 0
    value: Any = None
    items: list[Node] | tuple = ()
    pairs: list[tuple[Node, Node]] | tuple = ()
    state: Node | None = None
    gets: int = 0

    @property
    def global_name(self) -> tuple[str, str] | None:
        return self.value if self.kind == "global" else None

    def call_of(self) -> tuple[str, str] | None:
        """``(module, name)`` of the function a call node calls."""
        return self.items[0].global_name if self.kind == "call" else None

    def get(self, key: str) -> Node | None:
        """A dict node's value under a string key (the last one wins, as in a dict)."""
        found = None
        for k, v in self.pairs:
            if k.kind == "const" and k.value == key:
                found = v
        return found

    def dict_items(self) -> Iterator[tuple[str, Node]]:
        for k, v in self.pairs:
            if k.kind == "const" and isinstance(k.value, str):
                yield k.value, v


@dataclass
class PickleTree:
    """The parsed stream: its root node and the opcode spans a rewrite may need."""

    data: bytes
    root: Node
    frames: list[tuple[int, int]]  # FRAME opcodes' spans: dropped when lengths change


def read_data_pkl(path: Path) -> tuple[str, bytes]:
    """The archive's top folder and its data.pkl, from a file the walker already accepted."""
    with open_regular(path) as fh, zipfile.ZipFile(fh) as zf:
        names = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(names) != 1:
            raise BadInput("is not a torch.save archive with one data.pkl", path)
        return names[0][: -len("data.pkl")], zf.read(names[0])


def parse(data: bytes) -> PickleTree:
    """Build the node tree of a pickle stream; raises BadInput on anything malformed."""
    try:
        return _Parser(data).run()
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:
        raise BadInput(f"data.pkl cannot be parsed ({type(exc).__name__}: "
                       f"{str(exc)[:200]})") from None


class _Parser:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.stack: list[Node] = []
        self.marks: list[list[Node]] = []
        self.memo: dict[int, Node] = {}
        self.frames: list[tuple[int, int]] = []
        self.handlers: dict[str, Any] = {}

    def run(self) -> PickleTree:
        last: Node | None = None
        ops = 0
        for op, arg, pos in pickletools.genops(self.data):
            ops += 1
            if ops > MAX_OPCODES:
                raise BadInput(f"data.pkl runs more than {MAX_OPCODES} opcodes")
            if last is not None:
                last.end = pos
                last = None
            if op.name == "STOP":
                return PickleTree(self.data, self.stack.pop(), self.frames)
            if op.name == "FRAME":
                self.frames.append((pos, pos + 9))
                continue
            last = self.step(op.name, arg, pos)
        raise BadInput("data.pkl ends without STOP")

    def push(self, node: Node) -> Node:
        self.stack.append(node)
        return node

    def pop_mark(self) -> list[Node]:
        items, self.stack = self.stack, self.marks.pop()
        return items

    def step(self, name: str, arg: Any, pos: int) -> Node | None:
        """Execute one opcode; returns the node whose span ends at the next opcode."""
        if name in CONSTANT_OPS:
            return self.push(Node("const", pos, value=arg))
        if name in ("PROTO", "MEMOIZE") or name.endswith("PUT"):
            if name != "PROTO":
                self.memo[len(self.memo) if name == "MEMOIZE" else arg] = self.stack[-1]
            return None
        if name.endswith("GET"):
            node = self.memo[arg]
            node.gets += 1
            self.push(node)
            return None
        if name == "MARK":
            if len(self.marks) >= MAX_DEPTH:
                raise BadInput(f"data.pkl nests MARK groups deeper than {MAX_DEPTH}")
            self.marks.append(self.stack)
            self.stack = []
            return None
        handler = self.handlers.get(name)
        if handler is None:
            handler = self.handlers[name] = getattr(self, "op_" + name, None)
        if handler is None:
            raise BadInput(f"data.pkl uses opcode {name}, which torch.save never writes")
        handler(arg, pos)
        return None

    # -- plain values and containers
    def op_NONE(self, arg: None, pos: int) -> None:
        self.push(Node("none", pos))

    def op_NEWTRUE(self, arg: None, pos: int) -> None:
        self.push(Node("bool", pos, value=True))

    def op_NEWFALSE(self, arg: None, pos: int) -> None:
        self.push(Node("bool", pos, value=False))

    def op_EMPTY_LIST(self, arg: None, pos: int) -> None:
        self.push(Node("list", pos, items=[]))

    def op_EMPTY_TUPLE(self, arg: None, pos: int) -> None:
        self.push(Node("tuple", pos, items=[]))

    def op_EMPTY_DICT(self, arg: None, pos: int) -> None:
        self.push(Node("dict", pos, pairs=[]))

    def op_EMPTY_SET(self, arg: None, pos: int) -> None:
        self.push(Node("set", pos, items=[]))

    def op_LIST(self, arg: None, pos: int) -> None:
        self.push(Node("list", pos, items=self.pop_mark()))

    def op_TUPLE(self, arg: None, pos: int) -> None:
        self.push(Node("tuple", pos, items=self.pop_mark()))

    def op_TUPLE1(self, arg: None, pos: int) -> None:
        self.tuple_of(1, pos)

    def op_TUPLE2(self, arg: None, pos: int) -> None:
        self.tuple_of(2, pos)

    def op_TUPLE3(self, arg: None, pos: int) -> None:
        self.tuple_of(3, pos)

    def tuple_of(self, n: int, pos: int) -> None:
        items = self.stack[-n:]
        if len(items) != n:
            raise BadInput(f"data.pkl builds a {n}-tuple from a shorter stack")
        del self.stack[-n:]
        self.push(Node("tuple", pos, items=items))

    def op_FROZENSET(self, arg: None, pos: int) -> None:
        self.push(Node("set", pos, items=self.pop_mark()))

    def op_DICT(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.push(Node("dict", pos, pairs=list(zip(items[::2], items[1::2], strict=True))))

    def op_POP(self, arg: None, pos: int) -> None:
        self.stack.pop()

    def op_POP_MARK(self, arg: None, pos: int) -> None:
        self.pop_mark()

    def op_DUP(self, arg: None, pos: int) -> None:
        self.push(self.stack[-1])

    def op_APPEND(self, arg: None, pos: int) -> None:
        value = self.stack.pop()
        self.stack[-1].items.append(value)

    def op_APPENDS(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.stack[-1].items.extend(items)

    def op_ADDITEMS(self, arg: None, pos: int) -> None:
        self.op_APPENDS(arg, pos)

    def op_SETITEM(self, arg: None, pos: int) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self.stack[-1].pairs.append((key, value))

    def op_SETITEMS(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.stack[-1].pairs.extend(zip(items[::2], items[1::2], strict=True))

    # -- globals, calls, objects
    def op_GLOBAL(self, arg: str, pos: int) -> None:
        module, _, name = arg.partition(" ")
        self.push(Node("global", pos, value=(module, name)))

    def op_STACK_GLOBAL(self, arg: None, pos: int) -> None:
        name = self.stack.pop()
        module = self.stack.pop()
        self.push(Node("global", pos, value=(module.value, name.value)))

    def op_REDUCE(self, arg: None, pos: int) -> None:
        args = self.stack.pop()
        func = self.stack.pop()
        if func.global_name == ORDERED_DICT:
            node = Node("dict", pos, pairs=[])
            for pair in (args.items[0].items if args.items else []):
                node.pairs.append((pair.items[0], pair.items[1]))
            self.push(node)
            return
        self.push(Node("call", pos, items=[func, args], pairs=[]))

    def op_NEWOBJ(self, arg: None, pos: int) -> None:
        self.stack.pop()  # __new__ arguments
        self.push(self.new_object(self.stack.pop(), pos))

    def op_NEWOBJ_EX(self, arg: None, pos: int) -> None:
        del self.stack[-2:]
        self.push(self.new_object(self.stack.pop(), pos))

    def new_object(self, cls: Node, pos: int) -> Node:
        if cls.global_name in (("builtins", "dict"), ORDERED_DICT):
            return Node("dict", pos, pairs=[])
        return Node("obj", pos, items=[cls], pairs=[])

    def op_INST(self, arg: str, pos: int) -> None:
        module, _, name = arg.partition(" ")
        args = Node("tuple", pos, items=self.pop_mark())
        self.push(Node("call", pos, items=[Node("global", pos, value=(module, name)), args],
                       pairs=[]))

    def op_OBJ(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.push(Node("call", pos, items=[items[0], Node("tuple", pos, items=items[1:])],
                       pairs=[]))

    def op_BUILD(self, arg: None, pos: int) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if target.kind == "call" and target.call_of() == ("copyreg", "_reconstructor"):
            target.kind = "obj"
            target.items = [target.items[1].items[0]]
        if target.kind == "obj":
            # (state, slotstate) pairs carry the dict first
            target.state = state.items[0] if state.kind == "tuple" and len(
                state.items) == 2 else state

    def op_PERSID(self, arg: str, pos: int) -> None:
        self.push(Node("persid", pos, value=arg))

    def op_BINPERSID(self, arg: None, pos: int) -> None:
        self.push(Node("persid", pos, items=[self.stack.pop()]))


# ------------------------------------------------------------------------- reading the tree
@dataclass(eq=False)
class TensorCall:
    """A ``_rebuild_tensor*`` call: its storage key and the nodes holding its numbers."""

    call: Node
    key: str
    numel: Node  # the storage size in the persistent id
    offset: Node
    size: Node  # tuple of const ints
    stride: Node


def tensor_call(node: Node) -> TensorCall | None:
    """The rebuild call under a tensor or parameter node, if it is one."""
    if node.call_of() in REBUILD_PARAMETER:
        args = node.items[1]
        node = args.items[0] if args.items else node
    if node.call_of() not in REBUILD_TENSOR:
        return None
    args = node.items[1].items
    if len(args) < 4 or args[0].kind != "persid" or not args[0].items:
        return None
    pid = args[0].items[0]
    if pid.kind != "tuple" or len(pid.items) != 5 or pid.items[2].kind != "const":
        return None
    return TensorCall(node, pid.items[2].value, pid.items[4], args[1], args[2], args[3])


def walk(root: Node) -> Iterator[Node]:
    """Every node reachable from ``root``, each once (memo reads make the tree a DAG)."""
    todo, seen = [root], set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if len(seen) > MAX_VISITS:
            raise BadInput(f"data.pkl builds more than {MAX_VISITS} objects")
        yield node
        todo.extend(node.items)
        for k, v in node.pairs:
            todo += [k, v]
        if node.state is not None:
            todo.append(node.state)


def tensor_calls(root: Node) -> dict[str, list[TensorCall]]:
    """Every tensor rebuild in the pickle, by storage key (two calls on one key share data)."""
    out: dict[str, list[TensorCall]] = {}
    for node in walk(root):
        if node.call_of() in REBUILD_TENSOR:
            call = tensor_call(node)
            if call is not None:
                out.setdefault(call.key, []).append(call)
    return out


def is_module(node: Node) -> bool:
    """An nn.Module's object node: its state dict has _parameters and _modules."""
    return node.kind == "obj" and node.state is not None and node.state.kind == "dict" and \
        node.state.get("_parameters") is not None and node.state.get("_modules") is not None


def class_name(node: Node) -> str:
    cls = node.items[0].global_name if node.kind == "obj" and node.items else None
    return f"{cls[0]}.{cls[1]}" if cls else ""


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


def modules(root: Node) -> list[ModuleNode]:
    """Every module under the outermost modules of the pickle, by path (``model.layers.0``)."""
    tops = _outermost_modules(root)
    out: list[ModuleNode] = []
    visits = 0
    for top in tops:
        todo = [("", top, 0)]
        while todo:
            path, node, depth = todo.pop()
            visits += 1
            if visits > MAX_VISITS or depth > MAX_DEPTH:
                raise BadInput("the pickled module tree is too large or too deep to read")
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


# ------------------------------------------------------------------ what a pickled model says
@dataclass
class PickledModel:
    """What a whole pickled model carries besides its state dict, named as its tensors are.

    ``attributes``: each module's scalar attributes (an attention's ``head_dim``,
    ``num_heads``); ``buffers``: every buffer's shape, non-persistent ones (rotary
    ``inv_freq`` in current transformers) included; ``config``: the scalars of the outermost
    module's pickled ``config`` object, which structured pruners leave at the dense sizes.
    """

    attributes: dict[str, dict[str, Any]]
    buffers: dict[str, tuple[int, ...]]
    config: dict[str, Any]


def pickled_model(ckpt: Checkpoint) -> PickledModel | None:
    """Read the module tree of a torch zip checkpoint (its files already accepted by the
    walker); None for safetensors and for pickles that hold no module (a state dict)."""
    if ckpt.container != "torch-zip":
        return None
    key = tuple((str(f), *_stamp(f)) for f in ckpt.files)
    names = tuple(sorted((str(i.file), i.storage, n) for n, i in ckpt.tensors.items()
                         if i.storage))
    return _pickled_model(key, names)


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _pickled_model(key: tuple, names: tuple) -> PickledModel | None:
    attributes: dict[str, dict[str, Any]] = {}
    buffers: dict[str, tuple[int, ...]] = {}
    config: dict[str, Any] = {}
    found = False
    for file, *_ in key:
        prefix, data = read_data_pkl(Path(file))
        index = module_index(parse(data).root, prefix,
                             {storage: name for f, storage, name in names if f == file})
        if not index:
            continue
        found = True
        outermost = min(index, key=len)
        config = config or object_fields(index[outermost].attribute("config"))
        for path, mod in index.items():
            attributes[path] = object_fields(mod.node)
            for name, node in mod.buffers():
                call = tensor_call(node)
                if call is not None:
                    dims = tuple(scalar(n) for n in call.size.items)
                    buffers[f"{path}.{name}" if path else name] = dims  # type: ignore[assignment]
    return PickledModel(attributes, buffers, config) if found else None


def module_index(root: Node, prefix: str, names: dict[str, str]) -> dict[str, ModuleNode]:
    """Every pickled module by the path its tensors are named under (``model.layers.0.mlp``).

    ``names`` maps archive storage members (``archive/data/3``) to the walker's tensor names;
    a parameter's storage ties the two namings, since the walker may have stepped into a
    wrapper (``{'model': m}``) or not.
    """
    mods = modules(root)
    shift = _name_prefix(mods, prefix, names)
    return {(shift + m.path) if m.path else shift.rstrip("."): m for m in mods}


def _name_prefix(mods: list[ModuleNode], prefix: str, by_storage: dict[str, str]) -> str:
    """What the walker put before module paths (nothing when it unwrapped to the model)."""
    for mod in mods:
        for pname, node in mod.parameters():
            call = tensor_call(node)
            name = by_storage.get(f"{prefix}data/{call.key}") if call else None
            rel = f"{mod.path}.{pname}" if mod.path else pname
            if name and name.endswith(rel):
                return name[: -len(rel)]
    return ""
