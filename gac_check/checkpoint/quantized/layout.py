"""The tensors of one quantized checkpoint as its layout's reader
(:mod:`gac_check.checkpoint.quantized.reader`) sees them: regrouped per module, the logical weights
and auxiliary tensors it records, and the few bounded data reads two layouts need (a local
file through :func:`gac_check.checkpoint.files.open_regular`, a Hub shard by range request).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from gac_check.checkpoint.files import open_regular
from gac_check.checkpoint.quantized.scheme import Quantization
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput

#: The most bytes a data read of one tensor may take: ``weight_shape`` is 2 integers, a
#: bitsandbytes quantization state about 200 bytes of JSON.
MAX_DATA_BYTES = 1024
#: Small tensors this close together in one file are read as one range (on the Hub: one
#: request for a shard's every ``weight_shape``, which safetensors stores side by side), in
#: spans of at most MAX_SPAN bytes.
MAX_GAP = 4096
MAX_SPAN = 1024 * 1024
#: Reads a tensor's bytes (at most MAX_DATA_BYTES, checked before the call).
ByteReader = Callable[[TensorInfo], bytes]


class Indexed(Protocol):
    """What this module needs of :class:`gac_check.checkpoint.index.Checkpoint` (which
    imports this module, so it is named here by its fields)."""

    path: Path
    config: dict
    tensors: dict[str, TensorInfo]
    container: str
    sidecars: dict[str, dict]
    auxiliary: dict[str, str]
    quantization: Quantization | None


Checkpoint = TypeVar("Checkpoint", bound=Indexed)


def local_bytes(info: TensorInfo) -> bytes:
    """A tensor's bytes from its safetensors file, through the one regular-file door."""
    n = info.end - info.begin
    with open_regular(info.file) as fh:
        fh.seek(info.begin)
        data = fh.read(n)
    if len(data) != n:
        raise BadInput(f"tensor {info.name!r} ends past the end of the file", info.file)
    return data


def hub_reader(ranged: Callable[[str, int, int], tuple[bytes, object]],
               snapshot: Path) -> ByteReader:
    """A Hub checkpoint's reader: the shard's copy when the Hub cache holds one, else one
    bounded range request (``ranged(name, start, length)``: the Hub reader's own, which
    counts the bytes and requests against the model's limits)."""
    def read(info: TensorInfo) -> bytes:
        if info.file.is_file():
            return local_bytes(info)
        name = info.file.relative_to(snapshot).as_posix()
        data = ranged(name, info.begin, info.end - info.begin)[0]
        if len(data) != info.end - info.begin:
            raise BadInput(f"{name}: the Hub served {len(data)} bytes of tensor {info.name!r} "
                           f"for {info.end - info.begin}")
        return data
    return read


# --- one checkpoint being read -------------------------------------------------------------

@dataclass
class Layout:
    """The tensors of one checkpoint, regrouped per module as a quantized reader needs them."""

    ckpt: Indexed
    qc: dict
    read: ByteReader
    logical: dict[str, TensorInfo] = field(default_factory=dict)
    auxiliary: dict[str, str] = field(default_factory=dict)
    backing: dict[str, tuple[str, ...]] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    fetched: dict[str, bytes] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.ckpt.path

    def t(self, name: str) -> TensorInfo:
        return self.ckpt.tensors[name]

    def has(self, name: str) -> bool:
        return name in self.ckpt.tensors

    def modules(self, suffix: str) -> list[str]:
        """Every module holding a tensor named ``module + suffix``."""
        return sorted(n[: -len(suffix)] for n in self.ckpt.tensors if n.endswith(suffix))

    def refuse(self, message: str) -> BadInput:
        return BadInput(message, self.path)

    def aux(self, name: str, what: str) -> None:
        if self.has(name):
            self.auxiliary[name] = what

    def replace(self, module: str, shape: tuple[int, int], dtype: str,
                physical: tuple[str, ...]) -> None:
        """Record the logical ``module.weight`` [out, in] backed by ``physical`` tensors."""
        name = module + ".weight"
        first = self.t(physical[0])
        self.logical[name] = TensorInfo(name, shape, dtype, first.file, first.begin, first.end)
        self.backing[name] = physical
        self.removed.update(physical)

    def data(self, name: str) -> bytes:
        """The bytes of a small tensor (read with its neighbours by :meth:`prefetch`)."""
        if name not in self.fetched:
            self.prefetch([name])
        return self.fetched[name]

    def prefetch(self, names: list[str]) -> None:
        """Read small tensors, each bounded before it is asked for, neighbours in one range."""
        infos = sorted((self.t(n) for n in names), key=lambda t: (str(t.file), t.begin))
        spans: list[list[TensorInfo]] = []
        for info in infos:
            if info.end - info.begin > MAX_DATA_BYTES:
                raise self.refuse(f"tensor {info.name!r} holds {info.end - info.begin} bytes "
                                  f"where a quantization record of at most {MAX_DATA_BYTES} is "
                                  "expected")
            last = spans[-1] if spans else None
            if (last and last[0].file == info.file and info.begin - last[-1].end <= MAX_GAP
                    and info.end - last[0].begin <= MAX_SPAN):
                last.append(info)
            else:
                spans.append([info])
        for span in spans:
            start, end = span[0].begin, max(t.end for t in span)
            raw = self.read(TensorInfo(span[0].name, (end - start,), "uint8", span[0].file,
                                       start, end))
            for info in span:
                self.fetched[info.name] = raw[info.begin - start:info.end - start]

    def require(self, name: str, why: str) -> None:
        """Refuse a quantized linear without an auxiliary tensor its dequantization needs,
        naming that tensor: without it the linear would be judged (or loaded) as something it
        is not."""
        if not self.has(name):
            raise self.refuse(f"{name} is missing: {why}; refusing rather than judging that "
                              "linear without it")

    def consistent(self, modules: list[str], suffixes: tuple[str, ...]) -> None:
        """An optional auxiliary tensor that some quantized linears store and one lacks: a
        writer stores it for every linear or for none, so the one without it lost it."""
        for suffix in suffixes:
            holders = [m for m in modules if self.has(m + suffix)]
            if holders and len(holders) < len(modules):
                lost = next(m for m in modules if not self.has(m + suffix))
                raise self.refuse(f"{lost}{suffix} is missing, though {len(holders)} other "
                                  f"quantized linears store their {suffix[1:]}; refusing "
                                  "rather than judging that linear without it")

    def stray_weights(self, modules: list[str], dtypes: tuple[str, ...],
                      missing: str) -> None:
        """A ``.weight`` stored in a quantized dtype that no scale pairs with: read as dense it
        would be judged unquantized (and no engine loads it)."""
        known = set(modules)
        for name, info in sorted(self.ckpt.tensors.items()):
            m = name.removesuffix(".weight")
            if name.endswith(".weight") and info.dtype in dtypes and m not in known:
                raise self.refuse(f"{m}{missing} is missing: {name} is stored as {info.dtype} "
                                  "with no scale to dequantize it; refusing rather than "
                                  "judging that linear as unquantized")

    def unknown_tensors(self, module: str, known: tuple[str, ...]) -> None:
        """Refuse a tensor of a quantized module that its layout does not name."""
        for name in self.ckpt.tensors:
            if name.startswith(module + ".") and "." not in name[len(module) + 1:]:
                rest = name[len(module) + 1:]
                if rest not in known and rest != "bias":
                    raise self.refuse(f"tensor {name!r} is not part of the "
                                      f"{self.qc.get('quant_method')} layout gac-check reads "
                                      f"(known beside it: {', '.join(known)}); refusing rather "
                                      "than guessing what it holds")

    def result(self, quant: Quantization) -> Indexed:
        if not quant.quantized:
            raise self.refuse(f"config.json says it is quantized ({quant.method}) but no tensor "
                              "is stored in that layout")
        quant.backing = self.backing
        tensors = {n: t for n, t in self.ckpt.tensors.items() if n not in self.removed}
        tensors.update(self.logical)
        auxiliary = {**self.ckpt.auxiliary, **self.auxiliary}
        out = dataclasses.replace(self.ckpt, tensors=tensors, auxiliary=auxiliary)
        out.quantization = quant
        return out


def config_int(value: object, what: str, layout: Layout, *,
               allow: tuple[int, ...] = ()) -> int:
    if type(value) is not int or (value < 1 and value not in allow):
        raise layout.refuse(f"config.json's quantization_config {what} is {value!r}, not a "
                            "positive integer")
    return value


def config_bits(value: object, layout: Layout, allowed: tuple[int, ...]) -> int:
    bits = config_int(value, "bits", layout)
    if bits not in allowed:
        raise layout.refuse(f"config.json's quantization_config has {bits}-bit weights; "
                            f"gac-check reads {', '.join(map(str, allowed))}-bit "
                            f"{layout.qc.get('quant_method')} checkpoints")
    return bits


def group_note(quant: Quantization, module: str, width: int, axis: str) -> None:
    g = quant.group_size
    if g and g > 0 and width % g:
        quant.notes.append(f"{module}: {axis} {width} is not a multiple of the group size {g} "
                           f"({math.ceil(width / g)} groups, the last one "
                           f"{width - (width // g) * g} wide); llm-compressor refuses such a "
                           "width, GPTQModel writes a partial last group")


__all__ = ["MAX_DATA_BYTES", "ByteReader", "Checkpoint", "Indexed", "Layout", "config_bits",
           "config_int", "group_note", "hub_reader", "local_bytes"]
