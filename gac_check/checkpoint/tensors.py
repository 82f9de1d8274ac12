"""Reading tensor data, for the stages that need it (repair, realign, running a model).

Checking never comes here: it works from headers alone and must not import torch. Everything
that does need data reads it through :func:`read_tensor`, from the byte range or archive
member the header index recorded, so safetensors and torch zip inputs behave the same and no
stage grows its own reader.
"""
from __future__ import annotations

import torch

from gac_check.checkpoint.files import open_regular
from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput


def read_tensor(info: TensorInfo) -> torch.Tensor:
    """One tensor's data: its safetensors byte range, or its torch zip member (never
    unpickled)."""
    if info.storage is not None:
        from gac_check.checkpoint.pickled.torchzip import read_tensor as read_zip_tensor

        return read_zip_tensor(info)
    buf = bytearray(info.end - info.begin)
    with open_regular(info.file) as fh:  # swapped for a FIFO since the check: refused, not hung
        fh.seek(info.begin)
        if fh.readinto(buf) != len(buf):
            raise BadInput(f"is truncated inside tensor {info.name!r}", info.file)
    dtype = getattr(torch, info.dtype)
    if not buf:
        return torch.empty(info.shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).reshape(info.shape)


def tensor(ckpt: Checkpoint, name: str) -> torch.Tensor:
    """The named tensor of a checkpoint, or a one-line BadInput saying it is not there."""
    info = ckpt.tensors.get(name)
    if info is None:
        raise BadInput(f"has no tensor {name!r}", ckpt.path)
    return read_tensor(info)


def read_state(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, by name."""
    return {name: read_tensor(info) for name, info in ckpt.tensors.items()}
