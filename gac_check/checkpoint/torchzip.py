"""Index torch.save zip checkpoints without unpickling them.

A pickle runs code when it is loaded, and checkpoints come from strangers, so ``torch.load`` is
never called. Instead the archive's ``data.pkl`` is walked opcode by opcode
(:func:`pickletools.genops`) by a small symbolic stack machine: globals are only recorded as
``(module, name)``, nothing is imported, and a call is honoured only when it is on an allowlist
of what ``torch.save`` itself emits (tensor and parameter rebuild helpers, OrderedDict, set,
bytes). Anything else that real unpickling would *call* is refused as unsafe. Object
construction through ``NEWOBJ`` (how every ``nn.Module``, config and tokenizer is pickled) is
allowed so whole pickled models (LLM-Pruner, SVD-LLM) can be indexed: their parameter names
are rebuilt from the module tree exactly as ``model.state_dict()`` would name them.

Work is bounded, not only bytes (docs/security.md): at most :data:`MAX_OPCODES` opcodes are
executed, tuples and MARK groups nest at most :data:`MAX_DEPTH` levels, and nothing the pickle
built is ever hashed unless it is a flat value (a string, a small integer), recursed into, or
printed: a 580-byte archive holding a dict key nested 200,000 tuples deep used to crash the
interpreter in ``hash()``.

Importing torch costs more than reading a checkpoint's headers, so only :func:`read_tensor`
imports it.
"""
from __future__ import annotations

import _compat_pickle
import lzma
import pickletools
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from gac_check.checkpoint.files import open_regular
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput, GacError, UnsafeCheckpoint

#: data.pkl holds names and small objects only (a whole pickled model with a slow tokenizer's
#: vocabulary: tens of MB); a larger one is refused before it is inflated, which bounds memory
#: (zipfile briefly holds it twice: about 130 MiB at the cap).
MAX_PICKLE_BYTES = 64 * 1024 * 1024
#: Opcodes executed before the walk is refused: a state dict needs ~30 per tensor and a whole
#: pickled model with a slow tokenizer's vocabulary a few million; 250 MiB of one-byte opcodes
#: compresses into a 250 KB archive and would otherwise run for minutes.
MAX_OPCODES = 10_000_000
#: Nodes visited while naming tensors; bounds DAG blow-ups (a list referencing itself twice,
#: sixty levels deep) that would otherwise name 2**60 paths.
MAX_VISITS = 1_000_000
#: Deeper nesting than any module tree or state dict has; refuse rather than loop on cycles.
MAX_DEPTH = 1000
#: Largest integer a shape, stride or storage size may hold (torch's int64).
MAX_INDEX = 2**63 - 1
#: Dict keys that are hashed as they are: their hash cannot be steered into collisions.
_SAFE_INT = 2**61 - 2
#: Protocol 0 writes a persistent id as the text of the tuple torch.save returned.
_TEXT_PERSID = re.compile(
    r"\('storage', <class 'torch\.(\w+)'>, '(\w{1,64})', '([\w:]{1,64})', (\d{1,19})\)")

DTYPE_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
}
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
#: Keys under which people wrap a state dict or a model next to metadata.
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "model_state", "net",
                "weights", "params")


@dataclass(frozen=True)
class Global:
    """A GLOBAL reference, recorded by name and never imported."""

    module: str
    name: str

    def __str__(self) -> str:
        module = "os" if self.module in ("posix", "nt") else self.module
        return f"{module}.{self.name}"


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


@dataclass(eq=False)
class Obj:
    """An instance of a class that is never imported: its class name and pickled state."""

    cls: Global
    state: Any = None
    items: dict = field(default_factory=dict)
    list_items: list = field(default_factory=list)


class Opaque:
    """The result of an allowed call whose value naming tensors never needs."""


class _Key:
    """Identity wrapper for a dict key that is not hashable (a list, a symbolic object)."""

    def __init__(self, value: object) -> None:
        self.value = value


class _Refused(GacError):
    """Raised inside the walker; turned into a BadInput naming the file."""

    def __init__(self, message: str, unsafe: bool = False) -> None:
        super().__init__(message)
        self.unsafe = unsafe


def read_torch_zip(path: Path) -> dict[str, TensorInfo]:
    """Index a torch.save zip archive: name -> shape, dtype and storage location.

    Raises :class:`UnsafeCheckpoint` for a pickle that would call anything but torch's own
    rebuild helpers, and :class:`BadInput` for anything that cannot be indexed this way.
    """
    path = Path(path)
    with open_regular(path) as fh, _open_zip(path, fh) as zf, _zip_errors(path):
        infos = {i.filename: i for i in zf.infolist()}
        prefix = _archive_prefix(path, infos)
        _check_byteorder(path, zf, infos, prefix)
        pkl = infos[prefix + "data.pkl"]
        if pkl.file_size > MAX_PICKLE_BYTES:
            raise BadInput(f"data.pkl is {pkl.file_size} bytes, too large to walk", path)
        data = zf.read(pkl)  # zipfile stops at the declared size: no inflating past the cap
    try:
        root = _Walker(data).run()
        named = _name_tensors(root)
    except _Refused as exc:
        cls = UnsafeCheckpoint if exc.unsafe else BadInput
        raise cls(f"refuses to read: {exc}", path) from None
    if not named:
        raise BadInput(
            "holds no tensors in a layout gac-check recognises (a state dict, a model, or a "
            "dict wrapping one)", path)
    return {name: _tensor_info(path, prefix, infos, name, ref) for name, ref in named}


def read_tensor(info: TensorInfo) -> Any:
    """Read one tensor's data from its archive member, without unpickling anything.

    Only the bytes the tensor spans are read, so a repair can stream a large checkpoint one
    tensor at a time.
    """
    import torch

    if info.storage is None or info.stride is None:
        raise BadInput(f"tensor {info.name!r} is not stored in a torch zip archive", info.file)
    itemsize = DTYPE_ITEMSIZE[info.dtype]
    probe = TensorRef(Storage("", info.dtype, 0), 0, info.shape, info.stride, info.dtype)
    nbytes = probe.end_byte
    dtype = getattr(torch, info.dtype)
    if nbytes == 0:
        return torch.empty(info.shape, dtype=dtype)
    start = info.storage_offset * itemsize
    with open_regular(info.file) as fh, _open_zip(info.file, fh) as zf, _zip_errors(info.file):
        member = zf.getinfo(info.storage)
        if member.compress_type != zipfile.ZIP_STORED:
            raise BadInput(f"{info.storage} is compressed; torch.save stores it raw", info.file)
        fh.seek(member.header_offset)
        local = fh.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise BadInput(f"local header of {info.storage} is corrupt", info.file)
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        fh.seek(member.header_offset + 30 + name_len + extra_len + start)
        raw = bytearray(fh.read(nbytes))
    if len(raw) != nbytes:
        raise BadInput(f"is truncated inside {info.storage}", info.file)
    flat = torch.frombuffer(raw, dtype=dtype)
    return torch.as_strided(flat, info.shape, info.stride, 0)


#: What zipfile raises on a corrupt or unusual archive (a bad local header, an encrypted or
#: unknown-method member, a broken deflate stream, an offset past the end).
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, lzma.LZMAError,
              NotImplementedError, RuntimeError, ValueError, KeyError, struct.error)


@contextmanager
def _zip_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except ZIP_ERRORS as exc:
        raise BadInput(f"is a corrupt zip archive ({type(exc).__name__}: {str(exc)[:200]})",
                       path) from None


def _open_zip(path: Path, fh: BinaryIO) -> zipfile.ZipFile:
    magic = fh.read(4)
    fh.seek(0)
    try:
        return zipfile.ZipFile(fh)
    except ZIP_ERRORS:
        if magic[:1] == b"\x80":
            raise BadInput(
                "is a legacy (non-zip) torch.save file, which cannot be read without "
                "unpickling; re-save it with torch.save (torch>=1.6) or as safetensors",
                path) from None
        if magic == b"PK\x03\x04":
            raise BadInput("is a truncated or corrupt zip archive (no central directory)",
                           path) from None
        raise BadInput("is not a torch.save zip archive", path) from None


def _archive_prefix(path: Path, infos: dict[str, zipfile.ZipInfo]) -> str:
    """The archive's top folder (torch names it after the file, or 'archive/')."""
    pickles = [n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1]
    if not pickles:
        raise BadInput("is a zip archive without data.pkl, not a torch.save checkpoint", path)
    if len(pickles) > 1:
        raise BadInput(f"holds {len(pickles)} data.pkl records; expected one", path)
    prefix = pickles[0][: -len("data.pkl")]
    if prefix + "constants.pkl" in infos or any(n.startswith(prefix + "code/") for n in infos):
        raise BadInput("is a TorchScript archive (torch.jit.save), not a torch.save checkpoint",
                       path)
    return prefix


def _check_byteorder(path: Path, zf: zipfile.ZipFile, infos: dict, prefix: str) -> None:
    record = infos.get(prefix + "byteorder")
    if record is not None and record.file_size <= 16 and zf.read(record) == b"big":
        raise BadInput("was saved on a big-endian machine; gac-check reads little-endian", path)


def _tensor_info(path: Path, prefix: str, infos: dict[str, zipfile.ZipInfo], name: str,
                 ref: TensorRef) -> TensorInfo:
    member = f"{prefix}data/{ref.storage.key}"
    record = infos.get(member)
    if record is None:
        raise BadInput(f"tensor {name!r}: storage record {member} is missing", path)
    if record.file_size < max(ref.storage.nbytes, ref.end_byte):
        need = max(ref.storage.nbytes, ref.end_byte)
        raise BadInput(
            f"is truncated: tensor {name!r} needs {need} bytes of {member}, which holds "
            f"{record.file_size}", path)
    return TensorInfo(name, ref.shape, ref.dtype, path, storage=member,
                      storage_offset=ref.offset, stride=ref.stride)


# --------------------------------------------------------------------------- the stack machine

def _global(module: object, name: object) -> Global:
    """A GLOBAL as ``pickle.Unpickler(fix_imports=True)`` would resolve it, without importing."""
    if not isinstance(module, str) or not isinstance(name, str):
        raise _Refused("the pickle computes a global name (not how torch.save writes)")
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return Global(module, name)


def _pairs(items: list) -> dict:
    if len(items) % 2:
        raise _Refused("the pickle builds a dict from an odd number of items")
    return {_key(k): v for k, v in zip(items[::2], items[1::2], strict=True)}


def _key(value: object) -> object:
    """A dict key or set item the walker may hash: flat values as they are, anything else
    (a tuple, a float, a huge integer) wrapped by identity. Hashing a tuple recurses in C with
    no depth check, and crafted integers or floats collide into quadratic dict inserts."""
    if isinstance(value, str | bytes | Global | Obj | Opaque | Storage | TensorRef | _Key) or \
            value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and -_SAFE_INT < value < _SAFE_INT:
        return value
    return _Key(value)


class _Tuple(tuple):
    """A tuple the walker built, knowing how deeply tuples nest inside it."""

    depth = 1


def _tuple(items: list | tuple) -> tuple:
    depth = 1 + max((i.depth for i in items if isinstance(i, _Tuple)), default=0)
    if depth > MAX_DEPTH:
        raise _Refused(f"the pickle nests tuples deeper than {MAX_DEPTH} levels")
    out = _Tuple(items)
    if depth > 1:
        out.depth = depth
    return out


def _describe(value: object) -> str:
    """A pickled value in a message: a global by name, anything else by type only (its repr
    could be megabytes long or nested past the recursion limit)."""
    return str(value) if isinstance(value, Global) else f"a {type(value).__name__}"


class _Walker:
    """Executes pickle opcodes on symbolic values; never imports, never calls."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.opcodes = 0
        self.stack: list = []
        self.metastack: list[list] = []
        self.memo: dict[int, object] = {}
        self.storages: dict[str, Storage] = {}

    def run(self) -> object:
        try:
            handlers: dict[str, Callable[[Any], None]] = {}
            for op, arg, _pos in pickletools.genops(self.data):
                self.opcodes += 1
                if self.opcodes > MAX_OPCODES:
                    raise _Refused(f"data.pkl runs more than {MAX_OPCODES} opcodes; torch.save "
                                   "writes far fewer (a pickle bomb?)")
                handler = handlers.get(op.name)
                if handler is None:
                    if op.name == "STOP":
                        return self.stack.pop()
                    handler = handlers[op.name] = self.handler(op.name)
                handler(arg)
        except _Refused:
            raise
        except (ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:
            raise _Refused(
                f"data.pkl is not a readable pickle ({type(exc).__name__}: {str(exc)[:200]})"
            ) from None
        raise _Refused("data.pkl ends without STOP")

    def handler(self, name: str) -> Callable[[Any], None]:
        found = getattr(self, "op_" + name, None)
        if found is None:
            raise _Refused(f"the pickle uses opcode {name}, which torch.save never writes")
        return found

    # -- stack plumbing
    def pop_mark(self) -> list:
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def push(self, value: object) -> None:
        self.stack.append(value)

    def op_PROTO(self, arg: int) -> None:
        pass

    op_FRAME = op_PROTO

    def op_MARK(self, arg: None) -> None:
        if len(self.metastack) >= MAX_DEPTH:
            raise _Refused(f"the pickle nests MARK groups deeper than {MAX_DEPTH} levels")
        self.metastack.append(self.stack)
        self.stack = []

    def op_POP(self, arg: None) -> None:
        self.stack.pop()

    def op_POP_MARK(self, arg: None) -> None:
        self.pop_mark()

    def op_DUP(self, arg: None) -> None:
        self.push(self.stack[-1])

    # -- constants
    def op_NONE(self, arg: None) -> None:
        self.push(None)

    def op_NEWTRUE(self, arg: None) -> None:
        self.push(True)

    def op_NEWFALSE(self, arg: None) -> None:
        self.push(False)

    def op_constant(self, arg: object) -> None:
        self.push(arg)

    op_INT = op_BININT = op_BININT1 = op_BININT2 = op_LONG = op_LONG1 = op_LONG4 = op_constant
    op_FLOAT = op_BINFLOAT = op_constant
    op_UNICODE = op_BINUNICODE = op_SHORT_BINUNICODE = op_BINUNICODE8 = op_constant
    op_BINBYTES = op_SHORT_BINBYTES = op_BINBYTES8 = op_BYTEARRAY8 = op_constant
    op_STRING = op_BINSTRING = op_SHORT_BINSTRING = op_constant

    # -- containers
    def op_EMPTY_LIST(self, arg: None) -> None:
        self.push([])

    def op_EMPTY_TUPLE(self, arg: None) -> None:
        self.push(_tuple(()))

    def op_EMPTY_DICT(self, arg: None) -> None:
        self.push({})

    def op_EMPTY_SET(self, arg: None) -> None:
        self.push(set())

    def op_LIST(self, arg: None) -> None:
        self.push(self.pop_mark())

    def op_TUPLE(self, arg: None) -> None:
        self.push(_tuple(self.pop_mark()))

    def op_TUPLE1(self, arg: None) -> None:
        self.tuple_of(1)

    def op_TUPLE2(self, arg: None) -> None:
        self.tuple_of(2)

    def op_TUPLE3(self, arg: None) -> None:
        self.tuple_of(3)

    def tuple_of(self, n: int) -> None:
        if len(self.stack) < n:
            raise _Refused(f"the pickle builds a {n}-tuple from a shorter stack")
        self.stack[-n:] = [_tuple(self.stack[-n:])]

    def op_FROZENSET(self, arg: None) -> None:
        self.push(frozenset(_key(v) for v in self.pop_mark()))

    def op_DICT(self, arg: None) -> None:
        items = self.pop_mark()
        self.push(_pairs(items))

    def op_APPEND(self, arg: None) -> None:
        value = self.stack.pop()
        self.extend(self.stack[-1], [value])

    def op_APPENDS(self, arg: None) -> None:
        items = self.pop_mark()
        self.extend(self.stack[-1], items)

    def extend(self, target: object, items: list) -> None:
        if isinstance(target, list):
            target.extend(items)
        elif isinstance(target, Obj):
            target.list_items.extend(items)
        else:
            raise _Refused(f"the pickle appends to a {type(target).__name__}")

    def op_SETITEM(self, arg: None) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self.set_items(self.stack[-1], [key, value])

    def op_SETITEMS(self, arg: None) -> None:
        items = self.pop_mark()
        self.set_items(self.stack[-1], items)

    def set_items(self, target: object, items: list) -> None:
        pairs = _pairs(items)
        if isinstance(target, dict):
            target.update(pairs)
        elif isinstance(target, Obj):
            target.items.update(pairs)
        else:
            raise _Refused(f"the pickle sets items on a {type(target).__name__}")

    def op_ADDITEMS(self, arg: None) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if not isinstance(target, set):
            raise _Refused(f"the pickle adds set items to a {type(target).__name__}")
        target.update(_key(v) for v in items)

    # -- memo
    def op_PUT(self, arg: int) -> None:
        self.memo[arg] = self.stack[-1]

    op_BINPUT = op_LONG_BINPUT = op_PUT

    def op_MEMOIZE(self, arg: None) -> None:
        self.memo[len(self.memo)] = self.stack[-1]

    def op_GET(self, arg: int) -> None:
        self.push(self.memo[arg])

    op_BINGET = op_LONG_BINGET = op_GET

    # -- globals and objects
    def op_GLOBAL(self, arg: str) -> None:
        module, _, name = arg.partition(" ")
        self.push(_global(module, name))

    def op_STACK_GLOBAL(self, arg: None) -> None:
        name = self.stack.pop()
        module = self.stack.pop()
        self.push(_global(module, name))

    def op_REDUCE(self, arg: None) -> None:
        args = self.stack.pop()
        func = self.stack.pop()
        self.push(_call(func, args))

    def op_NEWOBJ(self, arg: None) -> None:
        self.stack.pop()  # __new__ arguments: never evaluated
        cls = self.stack.pop()
        self.push(_construct(cls))

    def op_NEWOBJ_EX(self, arg: None) -> None:
        del self.stack[-2:]
        self.push(_construct(self.stack.pop()))

    def op_INST(self, arg: str) -> None:
        module, _, name = arg.partition(" ")
        self.push(_call(_global(module, name), tuple(self.pop_mark())))

    def op_OBJ(self, arg: None) -> None:
        items = self.pop_mark()
        self.push(_call(items[0], tuple(items[1:])))

    def op_BUILD(self, arg: None) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if isinstance(target, Obj):
            target.state = state[0] if isinstance(state, tuple) and len(state) == 2 else state
        # BUILD on a dict (OrderedDict._metadata), tensor or opaque value: nothing to name.

    def op_PERSID(self, arg: str) -> None:
        """Protocol 0: the persistent id is the text of torch's tuple; only that exact form."""
        found = _TEXT_PERSID.fullmatch(arg) if isinstance(arg, str) else None
        if found is None:
            raise _Refused("the pickle refers to a persistent object that is not a storage")
        storage_type, key, location, numel = found.groups()
        self.persistent(("storage", Global("torch", storage_type), key, location, int(numel)))

    def op_BINPERSID(self, arg: None) -> None:
        self.persistent(self.stack.pop())

    def persistent(self, pid: object) -> None:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Refused("the pickle refers to a persistent object that is not a storage")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, Global) or storage_type.name not in STORAGE_DTYPES:
            raise _Refused(f"unsupported storage type {_describe(storage_type)}")
        if not isinstance(key, str) or type(numel) is not int or not 0 <= numel <= MAX_INDEX:
            raise _Refused("a storage record has a malformed key or size")
        storage = self.storages.setdefault(key, Storage(key, STORAGE_DTYPES[storage_type.name],
                                                        numel))
        if storage.nbytes != numel * DTYPE_ITEMSIZE[STORAGE_DTYPES[storage_type.name]]:
            raise _Refused(f"storage {key} is declared twice with different sizes")
        self.push(storage)


# --------------------------------------------------------------------------- the allowlist

def _construct(cls: object) -> object:
    """NEWOBJ: ``cls.__new__(cls)``; runs no user code for anything but a hostile class."""
    if not isinstance(cls, Global):
        raise _Refused("the pickle constructs an object from a computed class", unsafe=True)
    root = cls.module.split(".")[0]
    if root == "builtins" and cls.name in SAFE_BUILTIN_TYPES:
        return {} if cls.name == "dict" else Opaque()
    if root in DANGEROUS_MODULES:
        raise _Refused(f"the pickle constructs {cls} (it would run code when loaded)",
                       unsafe=True)
    if (cls.module, cls.name) == ("collections", "OrderedDict"):
        return {}
    return Obj(cls)


def _call(func: object, args: object) -> object:
    """REDUCE/INST/OBJ: only what torch.save writes may be called; everything else refused."""
    if not isinstance(func, Global):
        raise _Refused("the pickle calls a computed object (it would run code when loaded)",
                       unsafe=True)
    if not isinstance(args, tuple):
        raise _Refused(f"the pickle calls {func} with non-tuple arguments")
    handler = ALLOWED_CALLS.get((func.module, func.name))
    if handler is not None:
        return handler(*args)
    if func.module == "torch._utils" and func.name in UNINDEXABLE:
        raise _Refused(f"it holds {UNINDEXABLE[func.name]} ({func}), which cannot be indexed "
                       "without loading it")
    why = ("it would run code when loaded" if func.module.split(".")[0] in DANGEROUS_MODULES
           else "only torch's tensor-rebuilding calls are allowed; load it only if you trust it")
    raise _Refused(f"the pickle calls {func} ({why})", unsafe=True)


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(
            type(v) is int and 0 <= v <= MAX_INDEX for v in value):
        raise _Refused(f"a tensor has a malformed {what}")
    return tuple(value)


def _tensor(storage: object, offset: object, size: object, stride: object,
            dtype: str | None = None) -> TensorRef:
    if not isinstance(storage, Storage):
        raise _Refused("a tensor is rebuilt from something that is not a storage")
    shape = _ints(size, "shape")
    strides = _ints(stride, "stride")
    (start,) = _ints((offset,), "storage offset")
    if len(shape) != len(strides):
        raise _Refused("a tensor's shape and stride disagree in length")
    numel = 1
    for d in shape:
        numel *= d
    if numel > MAX_INDEX:
        raise _Refused(f"a tensor's shape {list(shape)} has more elements than int64 holds")
    return TensorRef(storage, start, shape, strides, dtype or storage.dtype)


def _rebuild_tensor_v2(storage: object, offset: object, size: object, stride: object,
                       *_rest: object) -> TensorRef:
    return _tensor(storage, offset, size, stride)


def _rebuild_tensor_v3(storage: object, offset: object, size: object, stride: object,
                       _grad: object, _hooks: object, dtype: object, *_rest: object) -> TensorRef:
    if not isinstance(dtype, Global) or dtype.module != "torch" or \
            dtype.name not in DTYPE_ITEMSIZE:
        raise _Refused(f"a tensor has an unknown dtype {_describe(dtype)}")
    return _tensor(storage, offset, size, stride, dtype.name)


def _rebuild_parameter(data: object, *_rest: object) -> TensorRef:
    if not isinstance(data, TensorRef):
        raise _Refused("a parameter wraps something that is not a tensor")
    return data


def _rebuild_from_type_v2(func: object, new_type: object, args: object, _state: object) -> object:
    if not isinstance(new_type, Global) or new_type.module.split(".")[0] != "torch":
        raise _Refused(f"the pickle rebuilds a tensor as {_describe(new_type)} (a subclass "
                       "whose code would run when loaded)", unsafe=True)
    return _call(func, args)


def _ordered_dict(pairs: object = ()) -> dict:
    if not isinstance(pairs, list | tuple):
        raise _Refused("OrderedDict is built from something that is not a list of pairs")
    return {_key(k): v for k, v in pairs}


def _set(items: object = ()) -> set:
    if not isinstance(items, list | tuple | set | frozenset):
        raise _Refused("a set is built from something that is not a list")
    return {_key(v) for v in items}


def _encode(text: object, encoding: object = "utf-8") -> bytes:
    """Protocol 2's spelling of bytes: ``_codecs.encode(str, 'latin1')``; no other codec."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused("the pickle calls _codecs.encode with a codec other than latin1",
                       unsafe=True)
    return text.encode("latin1")


def _getattr(obj: object, name: object) -> Global:
    """Protocol < 4 spells a dotted global as getattr(parent, name): allowed for torch dtypes."""
    if isinstance(obj, Global) and obj.module == "torch" and isinstance(name, str) and \
            name in DTYPE_ITEMSIZE:
        return Global("torch", name)
    raise _Refused(f"the pickle calls builtins.getattr on {_describe(obj)} (it would run code "
                   "when loaded)",
                   unsafe=True)


def _reconstructor(cls: object, base: object, _state: object) -> object:
    """Protocol 0/1 object construction; only ``object.__new__`` is harmless."""
    if base != Global("builtins", "object"):
        raise _Refused(f"the pickle calls copyreg._reconstructor with base {_describe(base)} "
                       "(it would run code when loaded)", unsafe=True)
    return _construct(cls)


def _newobj(cls: object, *_args: object) -> object:
    return _construct(cls)


def _opaque(*_args: object) -> Opaque:
    return Opaque()


def _size(dims: object = ()) -> tuple:
    return tuple(dims) if isinstance(dims, tuple | list) else ()


ALLOWED_CALLS: dict[tuple[str, str], Callable[..., object]] = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): _size,
    ("torch", "device"): _opaque,
    ("torch.serialization", "_get_layout"): _opaque,
    ("collections", "OrderedDict"): _ordered_dict,
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


# --------------------------------------------------------------------------- naming tensors

class _Budget:
    def __init__(self) -> None:
        self.visits = 0

    def tick(self, depth: int) -> None:
        self.visits += 1
        if self.visits > MAX_VISITS:
            raise _Refused(f"the pickle's structure names more than {MAX_VISITS} objects")
        if depth > MAX_DEPTH:
            raise _Refused(f"the pickle nests deeper than {MAX_DEPTH} levels")


def _module_state(value: object) -> dict | None:
    """The BUILD state of an nn.Module (anything with _modules and _parameters), else None."""
    if isinstance(value, Obj) and isinstance(value.state, dict) and \
            "_modules" in value.state and "_parameters" in value.state:
        return value.state
    return None


def _children(value: object) -> Iterator[tuple[str, object]]:
    """(name, child) pairs in the order ``state_dict()`` emits them."""
    state = _module_state(value)
    if state is not None:
        yield from _module_children(state)
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str | int) and not isinstance(k, bool):
                yield str(k), v  # _key keeps only small ints, so str() is always short
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield str(i), v


def _module_children(state: dict) -> Iterator[tuple[str, object]]:
    """Parameters, then persistent buffers, then submodules, as Module.state_dict orders them."""
    params, buffers, modules = (state.get(k) for k in ("_parameters", "_buffers", "_modules"))
    skip = state.get("_non_persistent_buffers_set")
    skip = skip if isinstance(skip, set) else set()
    for group in (params, buffers):
        for k, v in (group.items() if isinstance(group, dict) else ()):
            if isinstance(k, str) and isinstance(v, TensorRef) and \
                    (group is params or k not in skip):
                yield k, v
    for k, v in (modules.items() if isinstance(modules, dict) else ()):
        if isinstance(k, str) and _module_state(v) is not None:
            yield k, v


def _flatten(root: object, budget: _Budget) -> list[tuple[str, TensorRef]]:
    """Every tensor under ``root`` with its dotted path, without recursion."""
    out: list[tuple[str, TensorRef]] = []
    todo: list[tuple[str, object, int]] = [("", root, 0)]
    while todo:
        name, value, depth = todo.pop()
        budget.tick(depth)
        if isinstance(value, TensorRef):
            out.append((name, value))
            continue
        kids = [(f"{name}.{k}" if name else k, v, depth + 1) for k, v in _children(value)]
        todo.extend(reversed(kids))
    return out


def _unwrap(root: object, budget: _Budget) -> object:
    """Step into {'model': model, 'tokenizer': ...} or {'state_dict': sd, 'epoch': 3}.

    A dict that holds tensors directly is the state dict itself. Otherwise, when one value
    holds all the tensors and it is a module, sits under a usual wrapper key, or stands next to
    non-tensor metadata, the names are that value's own, as a user would expect.
    """
    while isinstance(root, dict) and _module_state(root) is None:
        if any(isinstance(v, TensorRef) for v in root.values()):
            return root
        holders = [(k, v) for k, v in root.items() if _flatten(v, budget)]
        if len(holders) > 1:
            preferred = [(k, v) for k, v in holders if k in WRAPPER_KEYS]
            holders = preferred if len(preferred) == 1 else holders
        if len(holders) != 1:
            return root
        key, value = holders[0]
        if not (_module_state(value) is not None or key in WRAPPER_KEYS or len(root) > 1):
            return root
        root = value
    return root


def _name_tensors(root: object) -> list[tuple[str, TensorRef]]:
    budget = _Budget()
    if isinstance(root, TensorRef):
        raise _Refused("the pickle holds a single unnamed tensor, not a state dict or model")
    named = _flatten(_unwrap(root, budget), budget)
    seen: set[str] = set()
    for name, _ in named:
        if name in seen:
            raise _Refused(f"two tensors are both named {name!r}")
        seen.add(name)
    return named
