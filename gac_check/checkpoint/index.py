"""Open a model directory and index its tensors from headers alone.

Checking a 70B checkpoint must cost what reading its headers costs, so nothing here reads
tensor data: safetensors headers give name, dtype, shape and byte range; torch zip archives are
indexed by walking their pickle opcodes (:mod:`gac_check.checkpoint.torchzip`) without
unpickling. Every path the directory names must be a plain relative name, and every file
(followed through symlinks) must stay inside the directory or, for a Hugging Face hub
snapshot, its cache's blobs.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from fnmatch import fnmatch
from functools import cached_property
from pathlib import Path, PurePath

from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.checkpoint.torchzip import read_torch_zip
from gac_check.errors import BadInput

#: safetensors' own reader refuses headers above 100 MB; a larger claim is a corrupt file.
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: config.json and sidecar JSON files larger than this are not configs.
MAX_JSON_BYTES = 64 * 1024 * 1024

#: safetensors dtype name -> (torch dtype name, bytes per element).
_SAFETENSORS_TYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2),
    "BF16": ("bfloat16", 2), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}
SAFETENSORS_DTYPES = {k: v[0] for k, v in _SAFETENSORS_TYPES.items()}
TORCH_SUFFIXES = (".bin", ".pt", ".pth")
#: What the HF Trainer and accelerate save next to the weights in a checkpoint-N folder. They
#: are torch files too, but optimizer moments are not weights, and training_args.bin pickles a
#: class the walker rightly refuses; without a pytorch_model*.bin they are skipped by name.
TRAINER_STATE_FILES = ("training_args.bin", "optimizer.pt", "optimizer.bin", "scheduler.pt",
                       "scheduler.bin", "scaler.pt", "rng_state*.pth")


@dataclass
class Checkpoint:
    """A model directory: its config, its tensor index, and any JSON sidecars.

    ``sidecars`` holds other small JSON files (SliceGPT's slicing config, rank maps) by file
    name, so format adapters can recognise them without touching the filesystem again.
    """

    path: Path
    config: dict
    tensors: dict[str, TensorInfo]
    container: str  # "safetensors" | "torch-zip"
    files: list[Path] = field(default_factory=list)
    sidecars: dict[str, dict] = field(default_factory=dict)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape

    @cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Built once: adapters ask for it per module, and a 70B index has thousands of names."""
        return {n: t.shape for n, t in self.tensors.items()}

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    def dtype(self) -> str:
        """The dtype the model is meant to run in: the config's, else the weights' majority."""
        declared = self.config.get("dtype") or self.config.get("torch_dtype")
        if isinstance(declared, str) and declared not in ("auto", ""):
            return declared.removeprefix("torch.")
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            if t.dtype.startswith(("float", "bfloat")):
                counts[t.dtype] = counts.get(t.dtype, 0) + t.numel
        return max(counts, key=counts.__getitem__) if counts else "float32"


def inside(root: Path, name: str, what: Path) -> Path:
    """``root / name``, refused (naming ``what``) if the name or the file it leads to leaves root.

    The name is checked lexically (relative, no ``..``) and the file through its symlinks
    (:func:`link_target`). The unresolved path is returned: a hub snapshot's shards resolve to
    blobs named by hash, and callers name output files after the input's.
    """
    pure = PurePath(name)
    if pure.is_absolute() or ".." in pure.parts:
        raise BadInput(f"refers to {name!r}, which is outside the model directory", what)
    path = root / pure
    if link_target(root, path) is None:
        raise BadInput(f"refers to {name!r}, which links outside the model directory", what)
    return path


def link_target(root: Path, path: Path) -> Path | None:
    """Where ``path`` really is, or None if that is not somewhere the model directory may point.

    Allowed: inside root itself, or, when root is a hub snapshot (``<cache>/snapshots/<rev>``),
    inside ``<cache>/blobs``, where the hub keeps every file a snapshot links to. Anything else
    (``notes.txt -> ~/.ssh/id_rsa``) must be neither read as a shard nor copied into an output.
    """
    root = root.resolve()
    target = path.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":
        allowed.append((root.parent.parent / "blobs").resolve())
    if any(target == a or a in target.parents for a in allowed):
        return target
    return None


def read_json(path: Path) -> dict:
    """Read a small JSON object or raise a one-line BadInput naming the file."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path) from None
    if size > MAX_JSON_BYTES:
        raise BadInput(f"is {size} bytes, too large for a JSON config", path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:  # a directory named config.json, an unreadable file
        raise BadInput(f"cannot read: {exc.strerror}", path) from None
    except UnicodeDecodeError:
        raise BadInput("is not UTF-8 text", path) from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"is not valid JSON (line {exc.lineno}: {exc.msg})", path) from None
    if not isinstance(data, dict):
        raise BadInput("must hold a JSON object", path)
    return data


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Index one safetensors file from its header, validating every byte range."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise BadInput("is truncated: shorter than the 8-byte header length", path)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise BadInput(f"claims a {n}-byte header in a {size}-byte file", path)
            raw = fh.read(n)
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path) from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadInput("header is not valid JSON", path) from None
    if not isinstance(header, dict):
        raise BadInput("header is not a JSON object", path)
    data_start = 8 + n
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _safetensors_entry(path, name, entry, data_start, size)
    return out


def _safetensors_entry(path: Path, name: str, entry: object, start: int, size: int) -> TensorInfo:
    try:
        st_dtype = entry["dtype"]  # type: ignore[index]
        shape = tuple(int(d) for d in entry["shape"])  # type: ignore[index]
        begin, end = (int(x) for x in entry["data_offsets"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        raise BadInput(f"header entry for {name!r} is malformed", path) from None
    if not isinstance(st_dtype, str) or st_dtype not in _SAFETENSORS_TYPES:
        raise BadInput(f"tensor {name!r} has unsupported dtype {st_dtype!r}", path)
    dtype, itemsize = _SAFETENSORS_TYPES[st_dtype]
    if any(d < 0 for d in shape) or not 0 <= begin <= end:
        raise BadInput(f"header entry for {name!r} has negative sizes", path)
    info = TensorInfo(name, shape, dtype, path, start + begin, start + end)
    if end - begin != info.numel * itemsize:
        raise BadInput(f"tensor {name!r} spans {end - begin} bytes, but {st_dtype} {list(shape)} "
                       f"needs {info.numel * itemsize}", path)
    if start + end > size:
        raise BadInput(
            f"is truncated: tensor {name!r} ends at byte {start + end}, file has {size}", path
        )
    return info


def open_checkpoint(path: Path | str) -> Checkpoint:
    """Index a model directory. Raises BadInput with the file and problem on bad input."""
    root = Path(path)
    if not root.exists():
        raise BadInput("does not exist", root)
    if not root.is_dir():
        raise BadInput("is not a directory (gac-check takes a model directory)", root)
    root = root.resolve()
    config_path = root / "config.json"
    config = read_json(inside(root, config_path.name, config_path)) if config_path.exists() else {}
    sidecars = _sidecars(root)
    container, files, tensors = _index_tensors(root)
    return Checkpoint(root, config, tensors, container, files, sidecars)


def _sidecars(root: Path) -> dict[str, dict]:
    """Small JSON files other than config and shard indexes (slicing configs, rank maps)."""
    out: dict[str, dict] = {}
    for p in sorted(root.glob("*.json")):
        if p.name == "config.json" or p.name.endswith(".index.json"):
            continue
        if link_target(root, p) is None:
            continue
        try:
            if p.stat().st_size <= 1024 * 1024:
                out[p.name] = read_json(p)
        except (OSError, BadInput):
            continue  # broken links, tokenizer files and the like are not ours to judge
    return out


def _index_tensors(root: Path) -> tuple[str, list[Path], dict[str, TensorInfo]]:
    for index_name, container in (
        ("model.safetensors.index.json", "safetensors"),
        ("pytorch_model.bin.index.json", "torch-zip"),
    ):
        index = root / index_name
        if index.exists():
            files = _shards_from_index(root, index)
            return container, files, _read_all(container, files)
    safetensors = [inside(root, p.name, p) for p in sorted(root.glob("*.safetensors"))]
    if safetensors:
        return "safetensors", safetensors, _read_all("safetensors", safetensors)
    torch_files = [inside(root, p.name, p) for p in _torch_weight_files(root)]
    if torch_files:
        return "torch-zip", torch_files, _read_all("torch-zip", torch_files)
    raise BadInput("holds no checkpoint (no *.safetensors, pytorch_model.bin or *.pt)", root)


def _torch_weight_files(root: Path) -> list[Path]:
    """``pytorch_model*.bin`` if there are any, else every torch file but the Trainer's state."""
    candidates = sorted(p for p in root.iterdir() if p.suffix in TORCH_SUFFIXES and p.is_file())
    preferred = [p for p in candidates if fnmatch(p.name, "pytorch_model*.bin")]
    return preferred or [p for p in candidates
                         if not any(fnmatch(p.name, pat) for pat in TRAINER_STATE_FILES)]


def _shards_from_index(root: Path, index: Path) -> list[Path]:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise BadInput("has no weight_map", index)
    files: dict[Path, None] = {}  # ordered set: "a" and "./a" are one shard
    for name in sorted(set(map(str, weight_map.values()))):
        shard = inside(root, name, index)
        if not shard.is_file():
            raise BadInput(f"names shard {name!r}, which is missing", index)
        files[shard] = None
    return list(files)


def _read_all(container: str, files: list[Path]) -> dict[str, TensorInfo]:
    """Merge the files' indexes; a name in two files would make one of them silently win."""
    tensors: dict[str, TensorInfo] = {}
    read = read_safetensors_header if container == "safetensors" else read_torch_zip
    for f in files:
        for name, info in read(f).items():
            if name in tensors:
                raise BadInput(f"tensor {name!r} is also in {tensors[name].file.name}", f)
            tensors[name] = info
    return tensors
