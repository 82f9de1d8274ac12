"""Reading a safetensors header with the same verdict as safetensors itself, without torch.

Checking must stay fast and torch-free, so the header is parsed here rather than by the
safetensors package; but a file safetensors refuses must be refused here too, or ``--repair``
would copy an overlap or a gap out as a normal-looking checkpoint. The rules, from
``Metadata::validate`` and ``read_metadata`` in safetensors' ``tensor.rs``:

* an 8-byte little-endian length, a header of at most 100,000,000 bytes of UTF-8 JSON
  (serde_json: no NaN, no lone surrogates, at most 127 levels deep);
* a JSON object; ``__metadata__`` absent, null, or a map of strings to strings;
* each tensor an object with ``dtype`` (a known name), ``shape`` (unsigned integers) and
  ``data_offsets`` (two unsigned integers), each field once;
* sorted by offsets, the tensors tile the data region exactly: each begins where the one
  before ended, spans ``product(shape) * itemsize`` bytes (computed without overflowing 64
  bits), and the last ends at the end of the file.

Stricter than safetensors, on purpose: a tensor name given twice is refused (safetensors keeps
the last one), an entry written as a JSON array instead of an object is refused, and dtypes
gac-check cannot map to torch (F4, F6_E2M3, F6_E3M2) are refused as unsupported.
tests/test_fuzz.py holds this module to safetensors' own verdict on mutated files.
"""
from __future__ import annotations

import reprlib
import struct
from dataclasses import dataclass
from pathlib import Path

from gac_check.checkpoint.files import check_tree, finite_float, open_regular, parse_json
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput

#: safetensors' own MAX_HEADER_SIZE.
MAX_HEADER_BYTES = 100_000_000
#: usize on the 64-bit machines safetensors runs on.
U64_MAX = 2**64 - 1

#: safetensors dtype name -> (torch dtype name, bytes per element).
SAFETENSORS_TYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2),
    "BF16": ("bfloat16", 2), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1), "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1), "C64": ("complex64", 8),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}
SAFETENSORS_DTYPES = {k: v[0] for k, v in SAFETENSORS_TYPES.items()}
#: Known to safetensors, but sub-byte: torch has no dtype that matches their shapes.
SUB_BYTE_TYPES = ("F4", "F6_E2M3", "F6_E3M2")
FIELDS = ("dtype", "shape", "data_offsets")


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Index one safetensors file from its header; refuse what safetensors refuses."""
    with open_regular(path) as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        n = header_length(fh.read(8), size, path)
        raw = fh.read(n)
    return index_header(raw, size, path)


def header_length(head: bytes, size: int, path: Path) -> int:
    """The header length the first 8 bytes of a ``size``-byte file claim, if it can be true.

    Split from the reading so a header fetched by HTTP range requests
    (:mod:`gac_check.checkpoint.hub.remote`) is held to exactly the same rules.
    """
    if len(head) < 8:
        raise BadInput("is truncated: shorter than the 8-byte header length", path)
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER_BYTES:
        raise BadInput(f"claims a {n}-byte header; safetensors refuses headers above "
                       f"{MAX_HEADER_BYTES} bytes", path)
    if n > size - 8:
        raise BadInput(f"claims a {n}-byte header in a {size}-byte file", path)
    return n


def index_header(raw: bytes, size: int, path: Path) -> dict[str, TensorInfo]:
    """Index the header ``raw`` of a ``size``-byte file whose tensor data follows it."""
    entries = parse_header(raw, path)
    data_start = 8 + len(raw)
    end = _tile(entries, path)
    if data_start + end < size:
        raise BadInput(f"has trailing data ({size - data_start - end} bytes) after its last "
                       "tensor, which the header does not describe; safetensors refuses it", path)
    if data_start + end > size:
        raise BadInput(f"is truncated: its tensors end at byte {data_start + end}, the file "
                       f"has {size}", path)
    return {e.name: TensorInfo(e.name, e.shape, SAFETENSORS_TYPES[e.dtype][0], path,
                               data_start + e.begin, data_start + e.end) for e in entries}


def parse_header(raw: bytes, path: Path) -> list[_Entry]:
    """The header's tensor entries, each checked for types and size (not yet for tiling)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("header is not valid UTF-8", path) from None
    duplicates: list[tuple[dict, str]] = []

    def pairs(items: list[tuple[str, object]]) -> dict:
        obj = dict(items)
        if len(obj) < len(items):
            duplicates.append((obj, _first_repeated([k for k, _ in items])))
        return obj

    # Python's int() reads u64s as serde does, and shapes and offsets are range-checked below;
    # only "-0" (serde: a float) needs the slower per-integer hook.
    hook = _header_int if "-0" in text else None
    header = parse_json(text, path, what="header ", parse_int=hook, object_pairs_hook=pairs,
                        check=False)
    if not isinstance(header, dict):
        raise BadInput("header is not a JSON object", path)
    _check_unschemed(header, text, path)
    for obj, key in duplicates:
        if obj is header:
            raise BadInput(f"header names {key!r} twice", path)
        owner = next((name for name, v in header.items() if v is obj), None)
        if owner is not None and owner != "__metadata__":
            raise BadInput(f"header entry for {owner!r} gives {key!r} twice", path)
    _check_metadata(header.get("__metadata__"), path)
    return [_entry(path, name, value) for name, value in header.items()
            if name != "__metadata__"]


def _check_unschemed(header: dict, text: str, path: Path) -> None:
    """Depth and UTF-8 where the schema does not already bound them.

    Entries, shapes and offsets are checked field by field below, so only extra fields in an
    entry (ignored, as safetensors ignores them) can nest; a lone surrogate can only come from
    a ``\\u`` escape (the bytes were strictly decoded), so without one no string needs a look.
    """
    if "\\u" in text:
        check_tree(header, path, "header ")
    for entry in header.values():
        if isinstance(entry, dict):
            for key, value in entry.items():
                if key not in FIELDS:  # serde reads a big integer here as a float
                    check_tree(value, path, "header ", depth=3, float_range=True)


def _first_repeated(keys: list[str]) -> str:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    return ""


def _header_int(text: str) -> int | float:
    """serde's reading of a JSON integer: u64 if it fits, else a float (so never a shape or
    an offset); a literal too large even for a float is refused, as serde refuses it."""
    if text.startswith("-") or len(text) > 20 or int(text) > U64_MAX:
        return finite_float(text)
    return int(text)


def _check_metadata(meta: object, path: Path) -> None:
    if meta is None:
        return
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise BadInput("header __metadata__ must map strings to strings", path)


def _entry(path: Path, name: str, value: object) -> _Entry:
    if type(value) is not dict:
        raise BadInput(f"header entry for {name!r} is not a JSON object", path)
    try:
        dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    except KeyError as missing:
        raise BadInput(f"header entry for {name!r} has no {missing.args[0]}", path) from None
    if type(dtype) is not str or dtype not in SAFETENSORS_TYPES:
        why = " (sub-byte; gac-check cannot map it to torch)" if dtype in SUB_BYTE_TYPES else ""
        raise BadInput(f"tensor {name!r} has unsupported dtype {_short(dtype)}{why}", path)
    shape = _unsigned(shape, path, name, "shape")
    offsets = _unsigned(offsets, path, name, "data_offsets")
    if len(offsets) != 2:
        raise BadInput(f"header entry for {name!r}: data_offsets must be two integers", path)
    return _Entry(name, dtype, shape, offsets[0], offsets[1])


#: repr for messages: a field here may nest hundreds of levels (nothing but the parser bounds
#: it), so nesting and length are cut short instead of recursed into.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 60, 60
_short = _SHORT.repr


_INT = {int}


def _unsigned(value: object, path: Path, name: str, field: str) -> tuple[int, ...]:
    # set(map(type, ...)) and min/max run in C: this is the per-tensor hot path of a check
    if type(value) is list and set(map(type, value)) <= _INT and (
            not value or (min(value) >= 0 and max(value) <= U64_MAX)):
        return tuple(value)
    raise BadInput(f"header entry for {name!r}: {field} must be a list of non-negative "
                   "integers", path)


def _tile(entries: list[_Entry], path: Path) -> int:
    """Where the data region must end; refuse overlaps, gaps and sizes that do not match."""
    start, previous = 0, None
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.end < e.begin:
            raise BadInput(f"tensor {e.name!r} ends (byte {e.end}) before it begins "
                           f"(byte {e.begin})", path)
        if e.begin < start:
            raise BadInput(f"tensor {e.name!r} (bytes {e.begin}..{e.end}) overlaps tensor "
                           f"{previous!r}; safetensors offsets must not share bytes", path)
        if e.begin > start:
            raise BadInput(f"there is a {e.begin - start}-byte gap before tensor {e.name!r}; "
                           "safetensors offsets must tile the data exactly", path)
        need = _nbytes(e, path)
        if e.end - e.begin != need:
            raise BadInput(f"tensor {e.name!r} spans {e.end - e.begin} bytes, but {e.dtype} "
                           f"{list(e.shape)} needs {need}", path)
        start, previous = e.end, e.name
    return start


def _nbytes(e: _Entry, path: Path) -> int:
    """``product(shape) * itemsize``, refused where safetensors' checked u64 arithmetic
    overflows (it multiplies left to right, so [2**40, 2**40, 0] overflows before the 0)."""
    n = 1
    for d in e.shape:
        n *= d
        if n > U64_MAX:
            break
    n *= SAFETENSORS_TYPES[e.dtype][1] * 8
    if n > U64_MAX:
        raise BadInput(f"tensor {e.name!r} has shape {list(e.shape)}, whose size overflows "
                       "64 bits", path)
    return n // 8
