"""The torch.save zip container: index its tensors through the one pickle reader, read their bytes.

A pickle runs code when it is loaded and checkpoints come from strangers, so ``torch.load`` is
never called. The archive's ``data.pkl`` goes through the pickle reader
(:mod:`~gac_check.checkpoint.pickled.machine` builds the tree,
:mod:`~gac_check.checkpoint.pickled.allowlist` judges every call in it,
:mod:`~gac_check.checkpoint.pickled.naming` names the tensors,
:mod:`~gac_check.checkpoint.pickled.model` reads what a whole pickled model says about itself);
this module only opens the zip, holds its records to torch's layout, and checks that every
tensor's storage record is there and long enough. Tensor data is read from the storage member's
byte range (:func:`read_tensor`), still without unpickling anything.

Importing torch costs more than reading a checkpoint's headers, so only :func:`read_tensor`
imports it.
"""
from __future__ import annotations

import lzma
import struct
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gac_check.checkpoint.files import open_regular
from gac_check.checkpoint.pickled.allowlist import DTYPE_ITEMSIZE, Storage, TensorRef, read_pickle
from gac_check.checkpoint.pickled.machine import PickleTree, collector_paused, refusals_of
from gac_check.checkpoint.pickled.model import PickledModel, describe_model
from gac_check.checkpoint.pickled.naming import name_tensors
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput

#: data.pkl holds names and small objects only (a whole pickled model with a slow tokenizer's
#: vocabulary: tens of MB); a larger one is refused before it is inflated, which bounds memory
#: (zipfile briefly holds it twice: about 130 MiB at the cap).
MAX_PICKLE_BYTES = 64 * 1024 * 1024


@dataclass
class TorchArchive:
    """A torch.save zip's pickle, judged by the reader, and the records it names."""

    path: Path
    prefix: str  # the archive's top folder (torch names it after the file, or 'archive/')
    infos: dict[str, zipfile.ZipInfo]
    tree: PickleTree


@dataclass
class TorchIndex:
    """One archive's tensors, and what its pickled model (if it holds one) says about itself."""

    tensors: dict[str, TensorInfo]
    model: PickledModel | None


def read_archive(path: Path) -> TorchArchive:
    """Open a torch.save zip and read its ``data.pkl`` through the pickle reader.

    Raises :class:`~gac_check.errors.UnsafeCheckpoint` for a pickle that would call anything
    but torch's own rebuild helpers, :class:`~gac_check.errors.PickleRefused` for one the
    reader cannot read, and :class:`BadInput` for a container that is not torch.save's.
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
    with refusals_of(path):
        return TorchArchive(path, prefix, infos, read_pickle(data))


def index_torch_zip(path: Path) -> TorchIndex:
    """Index a torch.save zip archive: name -> shape, dtype and storage location, plus what a
    pickled model says about itself (one read of the pickle serves both)."""
    with collector_paused():
        archive = read_archive(path)
        with refusals_of(archive.path):
            named = name_tensors(archive.tree.root)
            model = describe_model(archive.tree.root, named)
    if not named:
        raise BadInput(
            "holds no tensors in a layout gac-check recognises (a state dict, a model, or a "
            "dict wrapping one)", archive.path)
    tensors = {name: _tensor_info(archive, name, ref) for name, ref in named}
    return TorchIndex(tensors, model)


def read_torch_zip(path: Path) -> dict[str, TensorInfo]:
    """Index a torch.save zip archive: name -> shape, dtype and storage location."""
    return index_torch_zip(path).tensors


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


def _tensor_info(archive: TorchArchive, name: str, ref: TensorRef) -> TensorInfo:
    path = archive.path
    member = f"{archive.prefix}data/{ref.storage.key}"
    record = archive.infos.get(member)
    if record is None:
        raise BadInput(f"tensor {name!r}: storage record {member} is missing", path)
    if record.file_size < max(ref.storage.nbytes, ref.end_byte):
        need = max(ref.storage.nbytes, ref.end_byte)
        raise BadInput(
            f"is truncated: tensor {name!r} needs {need} bytes of {member}, which holds "
            f"{record.file_size}", path)
    return TensorInfo(name, ref.shape, ref.dtype, path, storage=member,
                      storage_offset=ref.offset, stride=ref.stride)
