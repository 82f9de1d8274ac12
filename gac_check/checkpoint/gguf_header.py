"""GGUF headers (llama.cpp's files), read with bounded work: metadata and tensor infos, never
tensor data.

The format's definitions (magic, value types, every ggml type's block and byte size, the
ftype names) are the ``gguf`` package's (llama.cpp's gguf-py). Its reader is not used:
``gguf.GGUFReader`` memory-maps the whole file, builds a numpy view over every tensor's data
and one array per metadata element, and trusts the lengths it reads: an array whose length
runs past the end of the file loops on empty reads (a 2**62-element array never ends), and a
file whose data was cut off fails with a numpy reshape error. Here every count and length is
held to the bytes that remain before the first is used, the header as a whole to
:data:`MAX_HEADER_BYTES`, and every tensor's byte range to the file's size and to llama.cpp's
own layout rule (each tensor starts where the previous one's aligned data ends,
``gguf_init_from_file_impl`` in ``ggml/src/gguf.cpp``), so a truncated or lying file is one
:class:`~gac_check.errors.BadInput` line. tests/test_gguf_check.py holds this reader to
``GGUFReader`` on files the ``gguf`` package writes.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gac_check.checkpoint.files import open_regular, regular_size
from gac_check.errors import BadInput

#: The metadata and tensor infos together; a 256k-token vocabulary with its merges is ~10 MB.
MAX_HEADER_BYTES = 256 * 1024 * 1024
#: Arrays up to this length are kept (per-layer widths); longer ones (the tokenizer's tables)
#: are walked and counted, never held.
MAX_KEPT_ARRAY = 4096
#: ggml's GGML_MAX_DIMS and GGML_MAX_NAME (ggml/include/ggml.h).
MAX_DIMS = 4
MAX_NAME = 64
DEFAULT_ALIGNMENT = 32
#: The split files llama.cpp's gguf-split writes (``llama_split_path``: ``%s-%05d-of-%05d.gguf``).
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# GGUF value types (gguf.GGUFValueType): struct format and size of the fixed-size ones.
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_U64 = struct.Struct("<Q")
_MIN_KV = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_INFO = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one ne, type, offset


@dataclass(frozen=True)
class GgufArray:
    """A metadata array: its item type, its length and, when short, its values."""

    item_type: int
    length: int
    values: tuple | None = None


@dataclass(frozen=True)
class GgufTensor:
    """One tensor info: ``ne`` in ggml's order (``ne[0]`` is the row length, a linear's input
    features), its stored ggml type by name, and its absolute byte range in ``file``."""

    name: str
    ne: tuple[int, ...]
    type: str
    file: Path
    begin: int
    end: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


@dataclass
class GgufHeader:
    """What a GGUF file (or a split set, merged) says about itself, read from its header."""

    path: Path
    version: int
    metadata: dict[str, object]
    tensors: dict[str, GgufTensor]
    files: list[Path] = field(default_factory=list)

    def get(self, key: str, default: object = None) -> object:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def arch_value(self, key: str) -> object:
        """``{arch}.{key}`` (``llama.embedding_length``)."""
        return self.metadata.get(f"{self.architecture}.{key}")


def ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block size, bytes per block), from the gguf package."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType
            if t in GGML_QUANT_SIZES}


class _Cursor:
    """Sequential reads from the header, each held to the file's size and the header bound,
    through a buffer filled a chunk at a time (a 256k-token vocabulary is a million reads)."""

    CHUNK = 1 << 20

    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self.f, self.path, self.size, self.pos = f, path, size, 0
        self.limit = min(size, MAX_HEADER_BYTES)
        self.buf, self.off = b"", 0

    @property
    def left(self) -> int:
        return self.limit - self.pos

    def need(self, n: int, what: str) -> None:
        if n <= self.left:
            return
        if self.limit < self.size:
            raise BadInput(f"its GGUF header is larger than {MAX_HEADER_BYTES:,} bytes "
                           f"({what} at byte {self.pos:,})", self.path)
        raise BadInput(f"is truncated: {what} at byte {self.pos:,} needs {n:,} bytes, the "
                       f"file has {self.size - self.pos:,} more", self.path)

    def _fill(self, n: int, what: str) -> None:
        """At least ``n`` bytes buffered from ``pos`` (``need`` has bounded ``n``)."""
        have = len(self.buf) - self.off
        if have >= n:
            return
        more = self.f.read(max(self.CHUNK, n - have))
        if len(more) < n - have:  # the file shrank under us
            raise BadInput(f"is truncated: {what} at byte {self.pos:,}", self.path)
        self.buf, self.off = self.buf[self.off:] + more, 0

    def read(self, n: int, what: str) -> bytes:
        self.need(n, what)
        self._fill(n, what)
        data = self.buf[self.off:self.off + n]
        self.off += n
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        have = len(self.buf) - self.off
        if n <= have:
            self.off += n
        else:
            self.f.seek(n - have, 1)
            self.buf, self.off = b"", 0
        self.pos += n

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        self._fill(n, what)
        value = struct.unpack_from(fmt, self.buf, self.off)[0]
        self.off += n
        self.pos += n
        return value

    def skip_strings(self, count: int, what: str) -> None:
        """Walk ``count`` strings, those whole in the buffer without a call each."""
        length = _U64.unpack_from
        done = 0
        while done < count:
            buf, off, end = self.buf, self.off, len(self.buf)
            while done < count and off + 8 <= end:
                n = length(buf, off)[0]
                if off + 8 + n > end:
                    break
                off += 8 + n
                done += 1
            walked = off - self.off
            if walked > self.left:  # raises: past the header bound or the file's end
                self.need(walked, f"{what} up to [{done}]")
            self.pos += walked
            self.off = off
            if done < count:  # one string across the buffer's end: refill through the checks
                self.string(f"{what}[{done}]", keep=False)
                done += 1

    def string(self, what: str, keep: bool = True) -> str | None:
        n = self.unpack("<Q", f"{what}'s length")
        if not keep:
            self.skip(n, what)
            return None
        raw = self.read(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInput(f"{what} at byte {self.pos - n:,} is not UTF-8", self.path) from None


def read_gguf_header(path: Path) -> GgufHeader:
    """One GGUF file's header; BadInput (one line) for anything llama.cpp would refuse."""
    size = regular_size(path)
    with open_regular(path) as f:
        cur = _Cursor(f, path, size)
        if cur.read(4, "the magic") != b"GGUF":
            raise BadInput("is not a GGUF file (no GGUF magic)", path)
        version = cur.unpack("<I", "the version")
        if version & 0xFFFF == 0 and version:
            raise BadInput("is a big-endian GGUF file; gac-check reads little-endian GGUF "
                           "only", path)
        if version not in (2, 3):
            raise BadInput(f"is GGUF version {version}; gac-check reads versions 2 and 3",
                           path)
        n_tensors = cur.unpack("<Q", "the tensor count")
        n_kv = cur.unpack("<Q", "the metadata count")
        if n_kv * _MIN_KV > cur.left:
            raise BadInput(f"says it holds {n_kv:,} metadata entries, more than its "
                           f"{size:,} bytes can", path)
        metadata = _metadata(cur, n_kv)
        if n_tensors * _MIN_TENSOR_INFO > cur.left:
            raise BadInput(f"says it holds {n_tensors:,} tensors, more than its {size:,} "
                           "bytes can", path)
        infos = [_tensor_info(cur, i) for i in range(n_tensors)]
        tensors = _place(path, size, cur.pos, metadata, infos)
    return GgufHeader(path, version, metadata, tensors, [path])


def _metadata(cur: _Cursor, count: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for i in range(count):
        key = cur.string(f"metadata key {i}")
        assert key is not None
        if key in out:
            raise BadInput(f"holds metadata key {key!r} twice", cur.path)
        vtype = cur.unpack("<I", f"{key}'s type")
        out[key] = _value(cur, vtype, key)
    return out


def _value(cur: _Cursor, vtype: int, key: str) -> object:
    if vtype in _SCALARS:
        return cur.unpack(_SCALARS[vtype], key)
    if vtype == _STRING:
        return cur.string(key)
    if vtype != _ARRAY:
        raise BadInput(f"metadata {key!r} has unknown value type {vtype}", cur.path)
    itype = cur.unpack("<I", f"{key}'s item type")
    length = cur.unpack("<Q", f"{key}'s length")
    if itype in _SCALARS:
        item = struct.calcsize(_SCALARS[itype])
        cur.need(length * item, f"{key} ({length:,} items)")
        if length > MAX_KEPT_ARRAY:
            cur.skip(length * item, key)
            return GgufArray(itype, length)
        raw = cur.read(length * item, key)
        values = struct.unpack(f"<{length}{_SCALARS[itype][1]}", raw)
        return GgufArray(itype, length, values)
    if itype == _STRING:
        cur.need(length * 8, f"{key} ({length:,} strings)")
        cur.skip_strings(length, key)
        return GgufArray(itype, length)
    raise BadInput(f"metadata {key!r} is an array of type {itype}, which GGUF does not allow "
                   "(nested arrays included)", cur.path)


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
    name_len = cur.unpack("<Q", f"tensor {i}'s name length")
    if name_len >= MAX_NAME:
        raise BadInput(f"tensor {i}'s name is {name_len:,} bytes; ggml allows {MAX_NAME - 1}",
                       cur.path)
    try:
        name = cur.read(name_len, f"tensor {i}'s name").decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"tensor {i}'s name is not UTF-8", cur.path) from None
    n_dims = cur.unpack("<I", f"{name}'s dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise BadInput(f"tensor {name!r} has {n_dims} dimensions; ggml allows 1 to {MAX_DIMS}",
                       cur.path)
    ne = struct.unpack(f"<{n_dims}q", cur.read(8 * n_dims, f"{name}'s shape"))
    if any(d < 0 for d in ne):
        raise BadInput(f"tensor {name!r} has a negative dimension {ne}", cur.path)
    gtype = cur.unpack("<I", f"{name}'s type")
    offset = cur.unpack("<Q", f"{name}'s offset")
    return name, ne, gtype, offset


def _place(path: Path, size: int, header_end: int, metadata: dict[str, object],
           infos: list[tuple[str, tuple[int, ...], int, int]]) -> dict[str, GgufTensor]:
    """Types, byte sizes and ranges: each tensor where llama.cpp's layout puts it, inside the
    file."""
    types = ggml_types()
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise BadInput(f"general.alignment is {align!r}, not a power of two", path)
    data_start = -(-header_end // align) * align
    expected = 0
    out: dict[str, GgufTensor] = {}
    for name, ne, gtype, offset in infos:
        if name in out:
            raise BadInput(f"holds tensor {name!r} twice", path)
        if gtype not in types:
            raise BadInput(f"tensor {name!r} has ggml type {gtype}, which the gguf package "
                           "does not know", path)
        tname, block, block_bytes = types[gtype]
        if ne[0] % block:
            raise BadInput(f"tensor {name!r} has rows of {ne[0]}, not a multiple of "
                           f"{tname}'s block {block} (llama.cpp refuses it)", path)
        numel = 1
        for d in ne:
            numel *= d
        nbytes = numel // block * block_bytes
        if offset != expected:
            raise BadInput(f"tensor {name!r} starts at data offset {offset:,}, where "
                           f"llama.cpp expects {expected:,}", path)
        begin = data_start + offset
        if begin + nbytes > size:
            raise BadInput(f"is truncated: tensor {name!r}'s data ends at byte "
                           f"{begin + nbytes:,}, the file has {size:,}", path)
        out[name] = GgufTensor(name, tuple(ne), tname, path, begin, begin + nbytes)
        expected += -(-nbytes // align) * align
    return out


def split_parts(path: Path) -> list[Path] | None:
    """Every file of the split set ``path`` belongs to (by llama.cpp's names), or None."""
    m = SPLIT_NAME.match(path.name)
    if not m:
        return None
    count = int(m["count"])
    return [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf")
            for i in range(1, count + 1)]


def read_gguf(path: Path) -> GgufHeader:
    """A GGUF file, or the whole split set it is a part of, merged: the first part's metadata,
    every part's tensors; every part must be present and say it is that part."""
    parts = split_parts(path)
    if not parts or len(parts) == 1:
        return read_gguf_header(path)
    headers = []
    for i, part in enumerate(parts):
        if not part.exists():
            raise BadInput(f"is part of a {len(parts)}-file split GGUF whose part {part.name} "
                           "is missing", path)
        h = read_gguf_header(part)
        if h.metadata.get("split.no") != i or h.metadata.get("split.count") != len(parts):
            raise BadInput(f"says it is split part {h.metadata.get('split.no')!r} of "
                           f"{h.metadata.get('split.count')!r}, its name part {i} of "
                           f"{len(parts)}", part)
        headers.append(h)
    first = headers[0]
    tensors: dict[str, GgufTensor] = {}
    for h in headers:
        for name, t in h.tensors.items():
            if name in tensors:
                raise BadInput(f"holds tensor {name!r}, also in {tensors[name].file.name}",
                               h.path)
            tensors[name] = t
    total = first.metadata.get("split.tensors.count")
    if total != len(tensors):
        raise BadInput(f"says its split set holds {total!r} tensors; its parts hold "
                       f"{len(tensors)}", first.path)
    return GgufHeader(first.path, first.version, first.metadata, tensors, parts)
