"""TensorInfo: the record both readers (safetensors headers, the torch zip walker) produce.

It lives apart from the index so that the walker can build records without importing the
index that calls it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lives and what shape it has; never its data.

    For safetensors ``begin``/``end`` are absolute byte offsets in ``file``. For torch zip
    archives ``storage`` names the archive member and ``storage_offset``/``stride`` locate the
    tensor inside it (in elements), so its data can be read later without unpickling.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    file: Path
    begin: int = 0
    end: int = 0
    storage: str | None = None
    storage_offset: int = 0
    stride: tuple[int, ...] | None = None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n
