"""The one pickle reader's opcode machine: ``data.pkl`` bytes in, a tree of :class:`Node` out.

A pickle runs code when it is loaded and checkpoints come from strangers, so ``pickle.load`` and
``torch.load`` are never called on one, and no library that unpickles stands in for this
module: it *is* the safety boundary. The stream is decoded opcode by opcode
(:func:`pickletools.genops`) and every opcode only builds a node: a global is recorded as
``(module, name)`` and never imported, a call (REDUCE, INST, OBJ) or object construction
(NEWOBJ) is recorded with its arguments and never made. Whether each call is allowed is the
next pass's question (:mod:`gac_check.checkpoint.pickled.allowlist`); the tree is then read for
tensor names (:mod:`~gac_check.checkpoint.pickled.naming`), for what a whole pickled model says
about itself (:mod:`~gac_check.checkpoint.pickled.model`), and for the byte spans a rewrite edits
in place (:mod:`~gac_check.checkpoint.torchzip_write`).

Work is bounded here, not only bytes (docs/security.md): at most :data:`MAX_OPCODES` opcodes,
tuples and MARK groups nested at most :data:`MAX_DEPTH` levels, and nothing the pickle built is
hashed (a dict's pairs stay a list), so no crafted key can recurse or collide.

Every refusal of the reader is a :class:`~gac_check.errors.PickleRefused` (an
:class:`~gac_check.errors.UnsafeCheckpoint` when loading would run code);
:func:`refusals_of` names the file once, at the door.
"""
from __future__ import annotations

import _compat_pickle
import gc
import pickletools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gac_check.errors import PickleRefused

#: Opcodes executed before the stream is refused: a state dict needs ~30 per tensor and a whole
#: pickled model with a slow tokenizer's vocabulary a few million; 250 MiB of one-byte opcodes
#: compresses into a 250 KB archive and would otherwise run for minutes.
MAX_OPCODES = 10_000_000
#: Deeper nesting than any module tree or state dict has; refuse rather than loop on cycles.
MAX_DEPTH = 1000
#: What genops raises on bytes that are not a pickle, and what a stack or memo underflow raises.
MALFORMED = (ValueError, IndexError, KeyError, TypeError, AttributeError)
#: Opcodes whose argument is the value they push.
CONSTANT_OPS = ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT",
                "BINFLOAT", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
                "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "STRING", "BINSTRING",
                "SHORT_BINSTRING")
#: Node kinds a call or construction may still become once the allow-list has judged it.
PENDING = ("call", "obj", "persid")


class Node:
    """One value the pickle builds, and where in the stream the opcode that built it starts.

    ``kind`` as the machine builds it: const, none, bool, tuple, list, dict, set, global, call
    (``items`` = ``[func, args, *appended]``), obj (NEWOBJ: ``[cls, *appended]``) or persid
    (``value`` the protocol-0 text, or ``items`` = ``[pid]``). The allow-list pass turns every
    call, obj and persid into what it builds: tensor (``value`` a TensorRef, ``items`` kept:
    the rebuild call's func and args), storage, dict, set, tuple, obj (``items`` = ``[cls]``),
    global, const or opaque.

    ``end`` closes a constant's byte span ``[pos, end)``, which a rewrite may replace. ``pairs``
    holds a dict's (key, value) nodes in stream order (later keys win, as in a dict);
    ``state`` what BUILD gave an object; ``gets`` counts memo reads (a node read back is
    shared, and editing it would edit every place that reads it); ``adds`` the APPEND/ADDITEMS
    a call or obj received before the allow-list knew what it builds. Containers get their own
    lists; every other node shares the empty tuple (a pickle has ~10^5 constants). A plain
    class with slots, not a dataclass: its keyword-free ``__init__`` halves the cost of the
    ~10^5 nodes a whole pickled model makes.
    """

    __slots__ = ("adds", "end", "gets", "items", "kind", "pairs", "pos", "state", "value")

    def __init__(self, kind: str, pos: int, value: Any = None, items: list[Node] | tuple = (),
                 pairs: list[tuple[Node, Node]] | tuple = ()) -> None:
        self.kind = kind
        self.pos = pos
        self.value = value
        self.items = items
        self.pairs = pairs
        self.end = 0
        self.state: Node | None = None
        self.gets = 0
        self.adds: tuple[str, ...] = ()

    @property
    def global_name(self) -> tuple[str, str] | None:
        return self.value if self.kind == "global" else None

    def call_of(self) -> tuple[str, str] | None:
        """``(module, name)`` of the function a call (or a tensor it rebuilt) calls."""
        return self.items[0].global_name if self.kind in ("call", "tensor") else None

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
    """A parsed stream: its root, its FRAME opcodes' spans (a rewrite drops them when lengths
    change) and every call, construction and persistent id in stream order, for the
    allow-list."""

    data: bytes
    root: Node
    frames: list[tuple[int, int]]
    pending: list[Node] = field(default_factory=list)


@contextmanager
def refusals_of(path: Path) -> Iterator[None]:
    """Name ``path`` in a refusal of the reader, keeping its type (unsafe or not)."""
    try:
        yield
    except PickleRefused as exc:
        raise type(exc)(f"refuses to read: {exc}", path) from None


def build_tree(data: bytes) -> PickleTree:
    """Run the opcode machine over ``data``; raises PickleRefused for anything malformed or
    out of bounds. The tree is not yet judged: use ``allowlist.read_pickle``."""
    try:
        with collector_paused():
            return _Machine(data).run()
    except MALFORMED as exc:
        raise PickleRefused(f"data.pkl is not a readable pickle ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None


@contextmanager
def collector_paused() -> Iterator[None]:
    """The machine allocates about one node per opcode, all of them kept, and the passes over
    the tree a few objects per node; CPython's cyclic collector would scan the growing tree
    again and again (half the time of reading a whole pickled model), and there is no garbage
    to find until the reading is done."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def global_node(module: object, name: object, pos: int) -> Node:
    """A GLOBAL as ``pickle.Unpickler(fix_imports=True)`` would resolve it, without importing."""
    if not isinstance(module, str) or not isinstance(name, str):
        raise PickleRefused("the pickle computes a global name (not how torch.save writes)")
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return Node("global", pos, value=(module, name))


def type_name(node: Node) -> str:
    """How a refusal names what a node is (never its value: that could be megabytes)."""
    if node.kind == "const":
        return type(node.value).__name__
    return {"none": "NoneType", "global": "Global", "obj": "Obj", "tensor": "TensorRef",
            "storage": "Storage", "opaque": "Opaque"}.get(node.kind, node.kind)


def _pairs(items: list[Node]) -> list[tuple[Node, Node]]:
    if len(items) % 2:
        raise PickleRefused("the pickle builds a dict from an odd number of items")
    return list(zip(items[::2], items[1::2], strict=True))


def _tuple(items: list[Node], pos: int) -> Node:
    """A tuple node; its ``value`` is how deeply tuples nest inside it (1 for a flat one)."""
    depth = 1
    for item in items:
        if item.kind == "tuple" and item.value >= depth:
            depth = item.value + 1
    if depth > MAX_DEPTH:
        raise PickleRefused(f"the pickle nests tuples deeper than {MAX_DEPTH} levels")
    return Node("tuple", pos, depth, items)


class _Machine:
    """Executes pickle opcodes on nodes; never imports, never calls."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.stack: list[Node] = []
        self.marks: list[list[Node]] = []
        self.memo: dict[int, Node] = {}
        self.frames: list[tuple[int, int]] = []
        self.pending: list[Node] = []
        self.handlers: dict[pickletools.OpcodeInfo, Callable[[Any, int], Node | None]] = {
            op: self.op_constant for op in pickletools.opcodes if op.name in CONSTANT_OPS}

    def run(self) -> PickleTree:
        handlers = self.handlers
        last: Node | None = None
        for ops, (op, arg, pos) in enumerate(pickletools.genops(self.data), 1):
            if ops > MAX_OPCODES:
                raise PickleRefused(f"data.pkl runs more than {MAX_OPCODES} opcodes; torch.save "
                                    "writes far fewer (a pickle bomb?)")
            if last is not None:
                last.end = pos
            handler = handlers.get(op)
            if handler is None:
                if op.name == "STOP":
                    return PickleTree(self.data, self.stack.pop(), self.frames, self.pending)
                handler = handlers[op] = self.handler(op.name)
            last = handler(arg, pos)
        raise PickleRefused("data.pkl ends without STOP")

    def handler(self, name: str) -> Callable[[Any, int], Node | None]:
        found = getattr(self, "op_" + name, None)
        if found is None:
            raise PickleRefused(f"the pickle uses opcode {name}, which torch.save never writes")
        return found

    # -- stack plumbing
    def pending_push(self, node: Node) -> None:
        self.pending.append(node)
        self.stack.append(node)

    def pop_mark(self) -> list[Node]:
        """The items since the last MARK; ``self.stack`` is another list afterwards, so push
        only after calling it (``self.stack.append(f(self.pop_mark()))`` would push into the
        discarded list)."""
        items, self.stack = self.stack, self.marks.pop()
        return items

    def op_PROTO(self, arg: int, pos: int) -> None:
        pass

    def op_FRAME(self, arg: int, pos: int) -> None:
        self.frames.append((pos, pos + 9))

    def op_MARK(self, arg: None, pos: int) -> None:
        if len(self.marks) >= MAX_DEPTH:
            raise PickleRefused(f"the pickle nests MARK groups deeper than {MAX_DEPTH} levels")
        self.marks.append(self.stack)
        self.stack = []

    def op_POP(self, arg: None, pos: int) -> None:
        self.stack.pop()

    def op_POP_MARK(self, arg: None, pos: int) -> None:
        self.pop_mark()

    def op_DUP(self, arg: None, pos: int) -> None:
        self.stack.append(self.stack[-1])

    # -- memo
    def op_PUT(self, arg: int, pos: int) -> None:
        self.memo[arg] = self.stack[-1]

    op_BINPUT = op_LONG_BINPUT = op_PUT

    def op_MEMOIZE(self, arg: None, pos: int) -> None:
        self.memo[len(self.memo)] = self.stack[-1]

    def op_GET(self, arg: int, pos: int) -> None:
        node = self.memo[arg]
        node.gets += 1
        self.stack.append(node)

    op_BINGET = op_LONG_BINGET = op_GET

    # -- constants
    def op_constant(self, arg: object, pos: int) -> Node:
        node = Node("const", pos, arg)
        self.stack.append(node)
        return node

    def op_NONE(self, arg: None, pos: int) -> None:
        self.stack.append(Node("none", pos))

    def op_NEWTRUE(self, arg: None, pos: int) -> None:
        self.stack.append(Node("bool", pos, True))

    def op_NEWFALSE(self, arg: None, pos: int) -> None:
        self.stack.append(Node("bool", pos, False))

    # -- containers
    def op_EMPTY_LIST(self, arg: None, pos: int) -> None:
        self.stack.append(Node("list", pos, None, []))

    def op_EMPTY_TUPLE(self, arg: None, pos: int) -> None:
        self.stack.append(Node("tuple", pos, 1, []))

    def op_EMPTY_DICT(self, arg: None, pos: int) -> None:
        self.stack.append(Node("dict", pos, None, (), []))

    def op_EMPTY_SET(self, arg: None, pos: int) -> None:
        self.stack.append(Node("set", pos, items=[]))

    def op_LIST(self, arg: None, pos: int) -> None:
        node = Node("list", pos, items=self.pop_mark())
        self.stack.append(node)

    def op_TUPLE(self, arg: None, pos: int) -> None:
        node = _tuple(self.pop_mark(), pos)
        self.stack.append(node)

    def op_TUPLE1(self, arg: None, pos: int) -> None:
        self.tuple_of(1, pos)

    def op_TUPLE2(self, arg: None, pos: int) -> None:
        self.tuple_of(2, pos)

    def op_TUPLE3(self, arg: None, pos: int) -> None:
        self.tuple_of(3, pos)

    def tuple_of(self, n: int, pos: int) -> None:
        if len(self.stack) < n:
            raise PickleRefused(f"the pickle builds a {n}-tuple from a shorter stack")
        items = self.stack[-n:]
        del self.stack[-n:]
        self.stack.append(_tuple(items, pos))

    def op_FROZENSET(self, arg: None, pos: int) -> None:
        node = Node("set", pos, items=self.pop_mark())
        self.stack.append(node)

    def op_DICT(self, arg: None, pos: int) -> None:
        node = Node("dict", pos, pairs=_pairs(self.pop_mark()))
        self.stack.append(node)

    def op_APPEND(self, arg: None, pos: int) -> None:
        value = self.stack.pop()
        self.extend(self.stack[-1], [value], "append", "appends to")

    def op_APPENDS(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.extend(self.stack[-1], items, "append", "appends to")

    def op_ADDITEMS(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.extend(self.stack[-1], items, "additems", "adds set items to")

    def extend(self, target: Node, items: list[Node], op: str, verb: str) -> None:
        """Lists take APPEND and sets ADDITEMS; a call or object may turn out to be either,
        so it records the op for the allow-list to judge once it knows."""
        if target.kind == ("list" if op == "append" else "set"):
            target.items.extend(items)
        elif target.kind in ("call", "obj"):
            target.items.extend(items)
            if op not in target.adds:
                target.adds += (op,)
        else:
            raise PickleRefused(f"the pickle {verb} a {type_name(target)}")

    def op_SETITEM(self, arg: None, pos: int) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self.set_items(self.stack[-1], [key, value])

    def op_SETITEMS(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.set_items(self.stack[-1], items)

    def set_items(self, target: Node, items: list[Node]) -> None:
        pairs = _pairs(items)
        if target.kind not in ("dict", "call", "obj"):
            raise PickleRefused(f"the pickle sets items on a {type_name(target)}")
        target.pairs.extend(pairs)

    # -- globals, calls, objects
    def op_GLOBAL(self, arg: str, pos: int) -> None:
        module, _, name = arg.partition(" ")
        self.stack.append(global_node(module, name, pos))

    def op_STACK_GLOBAL(self, arg: None, pos: int) -> None:
        name = self.stack.pop()
        module = self.stack.pop()
        if module.kind != "const" or name.kind != "const":
            raise PickleRefused("the pickle computes a global name (not how torch.save writes)")
        self.stack.append(global_node(module.value, name.value, pos))

    def op_REDUCE(self, arg: None, pos: int) -> None:
        args = self.stack.pop()
        func = self.stack.pop()
        self.pending_push(Node("call", pos, None, [func, args], []))

    def op_INST(self, arg: str, pos: int) -> None:
        module, _, name = arg.partition(" ")
        args = Node("tuple", pos, value=1, items=self.pop_mark())
        self.pending_push(Node("call", pos, items=[global_node(module, name, pos), args],
                               pairs=[]))

    def op_OBJ(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        args = Node("tuple", pos, value=1, items=items[1:])
        self.pending_push(Node("call", pos, items=[items[0], args], pairs=[]))

    def op_NEWOBJ(self, arg: None, pos: int) -> None:
        self.stack.pop()  # __new__ arguments: never evaluated
        self.pending_push(Node("obj", pos, items=[self.stack.pop()], pairs=[]))

    def op_NEWOBJ_EX(self, arg: None, pos: int) -> None:
        del self.stack[-2:]
        self.pending_push(Node("obj", pos, items=[self.stack.pop()], pairs=[]))

    def op_BUILD(self, arg: None, pos: int) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if target.kind in ("call", "obj"):
            # (state, slotstate) pairs carry the dict first
            target.state = state.items[0] if state.kind == "tuple" and len(
                state.items) == 2 else state
        # BUILD on a dict (OrderedDict._metadata), tensor or opaque value: nothing to name.

    def op_PERSID(self, arg: str, pos: int) -> None:
        self.pending_push(Node("persid", pos, value=arg))

    def op_BINPERSID(self, arg: None, pos: int) -> None:
        self.pending_push(Node("persid", pos, items=[self.stack.pop()]))
