"""The pickle reader's allow-list: a pass over the machine's tree that judges every call.

:mod:`gac_check.checkpoint.pickled.machine` records calls and object constructions without
making them; this pass visits each one in stream order and either resolves it into what
``torch.save``'s own unpickling would have built, as numbers and names only (a tensor's
storage, offset, shape and stride; an OrderedDict; a set; an object of a class that is never
imported), or refuses the whole file. A call is honoured only when it is on
:data:`ALLOWED_CALLS`, what ``torch.save`` itself emits (tensor and parameter rebuild helpers,
OrderedDict, set, bytes, the copyreg reconstructors); anything else that real unpickling would
*call* is refused as unsafe (:class:`~gac_check.errors.UnsafeCheckpoint`). Object construction
through ``NEWOBJ`` (how every ``nn.Module``, config and tokenizer is pickled) is allowed, so
whole pickled models (LLM-Pruner, SVD-LLM) can be read, except for classes from modules that
run code.

:func:`read_pickle` is the reader's one door: nothing reads a tree this pass has not judged.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gac_check.checkpoint.pickled.machine import (
    MALFORMED,
    Node,
    PickleTree,
    build_tree,
    type_name,
)
from gac_check.checkpoint.tensorinfo import DTYPE_ITEMSIZE
from gac_check.errors import PickleRefused, UnsafeCheckpoint

#: Largest integer a shape, stride or storage size may hold (torch's int64).
MAX_INDEX = 2**63 - 1
#: Protocol 0 writes a persistent id as the text of the tuple torch.save returned.
_TEXT_PERSID = re.compile(
    r"\('storage', <class 'torch\.(\w+)'>, '(\w{1,64})', '([\w:]{1,64})', (\d{1,19})\)")

STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "UntypedStorage": "uint8",
}
#: torch rebuild helpers for tensors that have no plain strided storage to index.
UNINDEXABLE = {
    "_rebuild_qtensor": "a quantized tensor",
    "_rebuild_sparse_tensor": "a sparse tensor",
    "_rebuild_nested_tensor": "a nested tensor",
    "_rebuild_meta_tensor_no_storage": "a meta tensor (no data)",
    "_rebuild_wrapper_subclass": "a tensor subclass without storage",
    "_rebuild_device_tensor_from_numpy": "a numpy-backed device tensor",
    "_rebuild_xla_tensor": "an XLA tensor",
    "_rebuild_mtia_tensor": "an MTIA tensor",
}
#: Modules whose members run code or touch the system; named in refusals as such.
DANGEROUS_MODULES = {
    "os", "posix", "nt", "subprocess", "sys", "builtins", "runpy", "importlib", "pty",
    "shutil", "socket", "ctypes", "pickle", "_pickle", "marshal", "code", "codeop", "pdb",
    "webbrowser", "multiprocessing", "_posixsubprocess", "functools", "operator", "types",
    "io", "pathlib", "tempfile", "threading", "asyncio", "signal", "platform", "commands",
}
#: builtins that NEWOBJ may construct: plain data types whose __new__ runs nothing.
SAFE_BUILTIN_TYPES = {"object", "dict", "list", "set", "frozenset", "tuple", "int", "float",
                      "str", "bytes", "bytearray", "complex", "bool"}
OBJECT = ("builtins", "object")
ORDERED_DICT = ("collections", "OrderedDict")


@dataclass(eq=False)
class Storage:
    """A persistent-id storage record: ``numel`` counts elements of ``dtype``."""

    key: str
    dtype: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_ITEMSIZE[self.dtype]


@dataclass(eq=False)
class TensorRef:
    """What ``_rebuild_tensor_v2`` would have built, as numbers only."""

    storage: Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    @property
    def end_byte(self) -> int:
        """One past the last storage byte the tensor touches (0 for an empty tensor)."""
        if any(d == 0 for d in self.shape):
            return 0
        span = 1 + sum((d - 1) * s for d, s in zip(self.shape, self.stride, strict=True))
        return (self.offset + span) * DTYPE_ITEMSIZE[self.dtype]


def read_pickle(data: bytes) -> PickleTree:
    """The reader's one door: build the tree of ``data`` and judge every call in it.

    Raises :class:`UnsafeCheckpoint` for a pickle that would call anything but what torch.save
    writes, and :class:`PickleRefused` for one that cannot be read this way.
    """
    tree = build_tree(data)
    judge = _Judge()
    try:
        for node in tree.pending:
            judge.resolve(node)
    except MALFORMED as exc:
        raise PickleRefused(f"data.pkl is not a readable pickle ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None
    return tree


def describe(node: Node) -> str:
    """A node in a message: a global by name, anything else by type only."""
    if node.kind == "global":
        module, name = node.value
        return f"{'os' if module in ('posix', 'nt') else module}.{name}"
    return f"a {type_name(node)}"


class _Judge:
    """Resolves pending nodes in stream order, so a call's arguments are resolved before it."""

    def __init__(self) -> None:
        self.storages: dict[str, Storage] = {}

    def resolve(self, node: Node) -> None:
        if node.kind == "persid":
            self.persistent(node)
        elif node.kind == "obj":
            construct(node, node.items[0])
        else:
            func, args = node.items[:2]
            call(node, func, args)
        _check_adds(node)

    def persistent(self, node: Node) -> None:
        pid = node.items[0] if node.value is None else _text_persid(node.value, node.pos)
        if not (pid.kind == "tuple" and len(pid.items) == 5 and
                pid.items[0].kind == "const" and pid.items[0].value == "storage"):
            raise PickleRefused("the pickle refers to a persistent object that is not a storage")
        _, storage_type, key, _location, numel = pid.items
        if storage_type.kind != "global" or storage_type.value[1] not in STORAGE_DTYPES:
            raise PickleRefused(f"unsupported storage type {describe(storage_type)}")
        if key.kind != "const" or not isinstance(key.value, str) or numel.kind != "const" or \
                type(numel.value) is not int or not 0 <= numel.value <= MAX_INDEX:
            raise PickleRefused("a storage record has a malformed key or size")
        dtype = STORAGE_DTYPES[storage_type.value[1]]
        storage = self.storages.setdefault(key.value, Storage(key.value, dtype, numel.value))
        if storage.nbytes != numel.value * DTYPE_ITEMSIZE[dtype]:
            raise PickleRefused(f"storage {key.value} is declared twice with different sizes")
        node.kind, node.value = "storage", storage


def _text_persid(text: object, pos: int) -> Node:
    """Protocol 0: the persistent id is the text of torch's tuple; only that exact form."""
    found = _TEXT_PERSID.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise PickleRefused("the pickle refers to a persistent object that is not a storage")
    storage_type, key, location, numel = found.groups()
    items = [Node("const", pos, value="storage"),
             Node("global", pos, value=("torch", storage_type)), Node("const", pos, value=key),
             Node("const", pos, value=location), Node("const", pos, value=int(numel))]
    return Node("tuple", pos, value=1, items=items)


def _check_adds(node: Node) -> None:
    """APPEND, ADDITEMS and SETITEMS the machine took on trust, now that the node is known."""
    if "append" in node.adds and node.kind != "obj":
        raise PickleRefused(f"the pickle appends to a {type_name(node)}")
    if "additems" in node.adds and node.kind != "set":
        raise PickleRefused(f"the pickle adds set items to a {type_name(node)}")
    if node.pairs and node.kind not in ("dict", "obj"):
        raise PickleRefused(f"the pickle sets items on a {type_name(node)}")
    if node.kind != "obj":
        node.state = None
    node.adds = ()


def _become(node: Node, kind: str, value: object = None, items: list | tuple = ()) -> None:
    node.kind, node.value, node.items = kind, value, items


def construct(node: Node, cls: Node) -> None:
    """NEWOBJ: ``cls.__new__(cls)``; runs no user code for anything but a hostile class."""
    if cls.kind != "global":
        raise UnsafeCheckpoint("the pickle constructs an object from a computed class")
    module, name = cls.value
    root = module.split(".")[0]
    if root == "builtins" and name in SAFE_BUILTIN_TYPES:
        if name == "dict":
            _become(node, "dict")
        else:
            _become(node, "opaque")
        return
    if root in DANGEROUS_MODULES:
        raise UnsafeCheckpoint(f"the pickle constructs {describe(cls)} (it would run code "
                               "when loaded)")
    if cls.value == ORDERED_DICT:
        _become(node, "dict")
        return
    _become(node, "obj", items=[cls])


def call(node: Node, func: Node, args: Node) -> None:
    """REDUCE/INST/OBJ: only what torch.save writes may be called; everything else refused."""
    if func.kind != "global":
        raise UnsafeCheckpoint("the pickle calls a computed object (it would run code when "
                               "loaded)")
    if args.kind != "tuple":
        raise PickleRefused(f"the pickle calls {describe(func)} with non-tuple arguments")
    module, name = func.value
    handler = ALLOWED_CALLS.get((module, name))
    if handler is not None:
        handler(node, *args.items)
        return
    if module == "torch._utils" and name in UNINDEXABLE:
        raise PickleRefused(f"it holds {UNINDEXABLE[name]} ({describe(func)}), which cannot be "
                            "indexed without loading it")
    why = ("it would run code when loaded" if module.split(".")[0] in DANGEROUS_MODULES
           else "only torch's tensor-rebuilding calls are allowed; load it only if you trust it")
    raise UnsafeCheckpoint(f"the pickle calls {describe(func)} ({why})")


def _ints(node: Node, what: str) -> tuple[int, ...]:
    if node.kind != "tuple" or not all(
            n.kind == "const" and type(n.value) is int and 0 <= n.value <= MAX_INDEX
            for n in node.items):
        raise PickleRefused(f"a tensor has a malformed {what}")
    return tuple(n.value for n in node.items)


def _tensor(node: Node, storage: Node, offset: Node, size: Node, stride: Node,
            dtype: str | None = None) -> None:
    if storage.kind != "storage":
        raise PickleRefused("a tensor is rebuilt from something that is not a storage")
    shape = _ints(size, "shape")
    strides = _ints(stride, "stride")
    (start,) = _ints(Node("tuple", offset.pos, items=[offset]), "storage offset")
    if len(shape) != len(strides):
        raise PickleRefused("a tensor's shape and stride disagree in length")
    numel = 1
    for d in shape:
        numel *= d
    if numel > MAX_INDEX:
        raise PickleRefused(f"a tensor's shape {list(shape)} has more elements than int64 holds")
    ref = TensorRef(storage.value, start, shape, strides, dtype or storage.value.dtype)
    node.kind, node.value = "tensor", ref


def _rebuild_tensor_v2(node: Node, storage: Node, offset: Node, size: Node, stride: Node,
                       *_rest: Node) -> None:
    _tensor(node, storage, offset, size, stride)


def _rebuild_tensor_v3(node: Node, storage: Node, offset: Node, size: Node, stride: Node,
                       _grad: Node, _hooks: Node, dtype: Node, *_rest: Node) -> None:
    if dtype.kind != "global" or dtype.value[0] != "torch" or \
            dtype.value[1] not in DTYPE_ITEMSIZE:
        raise PickleRefused(f"a tensor has an unknown dtype {describe(dtype)}")
    _tensor(node, storage, offset, size, stride, dtype.value[1])


def _rebuild_parameter(node: Node, data: Node, *_rest: Node) -> None:
    if data.kind != "tensor":
        raise PickleRefused("a parameter wraps something that is not a tensor")
    node.kind, node.value = "tensor", data.value


def _rebuild_from_type_v2(node: Node, func: Node, new_type: Node, args: Node,
                          _state: Node) -> None:
    if new_type.kind != "global" or new_type.value[0].split(".")[0] != "torch":
        raise UnsafeCheckpoint(f"the pickle rebuilds a tensor as {describe(new_type)} (a "
                               "subclass whose code would run when loaded)")
    call(node, func, args)


def _ordered_dict(node: Node, pairs: Node | None = None) -> None:
    if pairs is not None:  # torch.save writes OrderedDict() and fills it with SETITEMS
        if pairs.kind not in ("list", "tuple") or not all(
                p.kind in ("list", "tuple") and len(p.items) == 2 for p in pairs.items):
            raise PickleRefused("OrderedDict is built from something that is not a list of "
                                "pairs")
        node.pairs = [(p.items[0], p.items[1]) for p in pairs.items] + list(node.pairs)
    _become(node, "dict")


def _set(node: Node, items: Node | None = None) -> None:
    if items is not None and items.kind not in ("list", "tuple", "set"):
        raise PickleRefused("a set is built from something that is not a list")
    members = [] if items is None else list(items.items)
    _become(node, "set", items=members + node.items[2:])


def _encode(node: Node, text: Node, encoding: Node | None = None) -> None:
    """Protocol 2's spelling of bytes: ``_codecs.encode(str, 'latin1')``; no other codec."""
    if text.kind != "const" or not isinstance(text.value, str) or encoding is None or \
            encoding.kind != "const" or encoding.value not in ("latin1", "latin-1"):
        raise UnsafeCheckpoint("the pickle calls _codecs.encode with a codec other than latin1")
    _become(node, "const", text.value.encode("latin1"))


def _getattr(node: Node, obj: Node, name: Node) -> None:
    """Protocol < 4 spells a dotted global as getattr(parent, name): allowed for torch dtypes."""
    if obj.kind == "global" and obj.value[0] == "torch" and name.kind == "const" and \
            isinstance(name.value, str) and name.value in DTYPE_ITEMSIZE:
        _become(node, "global", ("torch", name.value))
        return
    raise UnsafeCheckpoint(f"the pickle calls builtins.getattr on {describe(obj)} (it would run "
                           "code when loaded)")


def _reconstructor(node: Node, cls: Node, base: Node, _state: Node) -> None:
    """Protocol 0/1 object construction; only ``object.__new__`` is harmless."""
    if base.kind != "global" or base.value != OBJECT:
        raise UnsafeCheckpoint(f"the pickle calls copyreg._reconstructor with base "
                               f"{describe(base)} (it would run code when loaded)")
    construct(node, cls)


def _newobj(node: Node, cls: Node, *_args: Node) -> None:
    construct(node, cls)


def _opaque(node: Node, *_args: Node) -> None:
    _become(node, "opaque")


def _size(node: Node, dims: Node | None = None) -> None:
    items = list(dims.items) if dims is not None and dims.kind in ("tuple", "list") else []
    _become(node, "tuple", 1 + max((i.value for i in items if i.kind == "tuple"), default=0),
            items)


ALLOWED_CALLS: dict[tuple[str, str], Callable[..., None]] = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): _size,
    ("torch", "device"): _opaque,
    ("torch.serialization", "_get_layout"): _opaque,
    ORDERED_DICT: _ordered_dict,
    ("builtins", "set"): _set,
    ("builtins", "frozenset"): _set,
    ("builtins", "bytearray"): _opaque,
    ("builtins", "complex"): _opaque,
    ("builtins", "slice"): _opaque,
    ("builtins", "range"): _opaque,
    ("builtins", "getattr"): _getattr,
    ("_codecs", "encode"): _encode,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("copyreg", "__newobj__"): _newobj,
}
