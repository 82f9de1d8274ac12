"""TensorInfo: the record both readers (safetensors headers, the torch zip walker) produce.

It lives apart from the index so that the walker can build records without importing the
index that calls it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: Bytes per element of each torch dtype (by torch's name): what both readers and the checks
#: that count bytes share, kept here so a check needs no pickle reader to know them.
DTYPE_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
}


#: The container a model in memory is reported in (:mod:`gac_check.api.memory` indexes it),
#: beside ``safetensors``, ``torch-zip`` and ``gguf``.
IN_MEMORY = "in-memory"


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
