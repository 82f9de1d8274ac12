"""Open a model directory and index its tensors from headers alone.

Checking a 70B checkpoint must cost what reading its headers costs, so nothing here reads
tensor data: safetensors headers give name, dtype, shape and byte range; torch zip archives are
indexed by the pickle reader (:mod:`gac_check.checkpoint.pickled.torchzip`) without unpickling, and
what a whole pickled model says about itself is kept beside its tensors. Every path the
directory names must be a plain relative name, and every file (followed through symlinks) must
stay inside the directory or, for a Hugging Face hub snapshot, its cache's blobs. Files are
opened only through :mod:`gac_check.checkpoint.files` (regular files, bounded JSON) and
safetensors headers are held to safetensors' own rules
(:mod:`gac_check.checkpoint.safetensors_header`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from fnmatch import fnmatch
from functools import cached_property
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from gac_check.checkpoint.files import MAX_JSON_BYTES, name_problem, os_reason, read_json
from gac_check.checkpoint.quantized.marks import quantization_config, refuse_stray_packed
from gac_check.checkpoint.safetensors_header import (
    MAX_HEADER_BYTES,
    SAFETENSORS_DTYPES,
    read_safetensors_header,
)
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput

if TYPE_CHECKING:  # the pickle, GGUF and quantized readers are imported only where used
    from gac_check.checkpoint.gguf_header import GgufHeader
    from gac_check.checkpoint.pickled.model import PickledModel
    from gac_check.checkpoint.quantized.layout import ByteReader
    from gac_check.checkpoint.quantized.scheme import Quantization

__all__ = ["MAX_HEADER_BYTES", "MAX_JSON_BYTES", "SAFETENSORS_DTYPES", "Checkpoint",
           "inside", "link_target", "open_checkpoint", "read_json", "read_safetensors_header"]
#: Where a checkpoint's config comes from: the file; a whole pickled model's own config where no
#: config.json is beside it (SVD-LLM's saves); in memory, a module's config or the one passed as
#: ``config=``; a GGUF's metadata.
PICKLED_CONFIG = "the pickled config"
CONFIG_SOURCES = ("config.json", PICKLED_CONFIG, "the module's config", "config=",
                  "the GGUF metadata")
#: Sidecar JSON files (slicing configs, rank maps) larger than this are not ours to read.
MAX_SIDECAR_BYTES = 1024 * 1024
TORCH_SUFFIXES = (".bin", ".pt", ".pth")
#: Every tensor of a checkpoint by name, and what its pickled model says (torch zip only).
IndexedTensors = tuple[dict[str, TensorInfo], "PickledModel | None"]
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
    ``pickled_model`` is what a whole pickled model (torch zip only) says beyond its tensors:
    read with them, from the same pass over the pickle; None for a state dict or safetensors.
    """

    path: Path
    config: dict
    tensors: dict[str, TensorInfo]
    container: str  # "safetensors" | "torch-zip" | "gguf" | IN_MEMORY
    files: list[Path] = field(default_factory=list)
    sidecars: dict[str, dict] = field(default_factory=dict)
    pickled_model: PickledModel | None = None
    #: Tensors read and known to carry no dimension a check judges, by name -> what they are
    #: (a quantized layout's scales, zero points and group indices), filled by the reader of
    #: that layout; every other tensor must belong to a site or a kind the format names, or
    #: the check refuses (the accounting, issue 27).
    auxiliary: dict[str, str] = field(default_factory=dict)
    #: A GGUF file's header (container ``gguf``): its metadata, and each tensor's ggml type
    gguf: GgufHeader | None = None
    #: The checkpoint's own quantization scheme (:mod:`gac_check.checkpoint.quantized.reader`),
    #: whose linears ``tensors`` holds at their logical [out, in] shapes; None when not quantized.
    quantization: Quantization | None = None
    #: Where ``config`` was read (:data:`CONFIG_SOURCES`): reported once beside the container,
    #: while every note and dtype source calls it "the config", so the check of a module in
    #: memory and the check of its save say the same words.
    config_source: str = "config.json"

    @property
    def source(self) -> str:
        """How reports name the model: its directory (a Hub model: ``hf://org/name@commit``)."""
        return str(self.path)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape

    @cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Built once: adapters ask for it per module, and a 70B index has thousands of names."""
        return {n: t.shape for n, t in self.tensors.items()}

    @property
    def params(self) -> int:
        """Logical parameters: a quantized linear counts [out, in], its scales nothing."""
        return sum(t.numel for n, t in self.tensors.items() if n not in self.auxiliary)

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
    if not isinstance(name, str) or not name:
        raise BadInput(f"refers to {name!r}, which is not a file name", what)
    problem = name_problem(name)
    if problem:
        raise BadInput(f"refers to {name!r}, whose name {problem}", what)
    pure = PurePath(name)
    if pure.is_absolute() or ".." in pure.parts:
        raise BadInput(f"refers to {name!r}, which is outside the model directory", what)
    path = root / pure
    try:
        path.resolve()
    except (OSError, RuntimeError) as exc:  # Python 3.11 reports a link loop as RuntimeError
        reason = os_reason(exc) if isinstance(exc, OSError) else "is a symlink loop"
        raise BadInput(f"refers to {name!r}, which {reason}", what) from None
    if link_target(root, path) is None:
        raise BadInput(f"refers to {name!r}, which links outside the model directory", what)
    return path


def link_target(root: Path, path: Path) -> Path | None:
    """Where ``path`` really is, or None if that is not somewhere the model directory may point.

    Allowed: inside root itself, or, when root is a hub snapshot (``<cache>/snapshots/<rev>``),
    inside ``<cache>/blobs``, where the hub keeps every file a snapshot links to. Anything else
    (``notes.txt -> ~/.ssh/id_rsa``) must be neither read as a shard nor copied into an output.
    """
    try:
        root = root.resolve()
        target = path.resolve()
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte: it points nowhere
        return None
    allowed = [root]
    if root.parent.name == "snapshots":
        allowed.append((root.parent.parent / "blobs").resolve())
    if any(target == a or a in target.parents for a in allowed):
        return target
    return None


def open_checkpoint(path: Path | str) -> Checkpoint:
    """Index a model directory. Raises BadInput with the file and problem on bad input."""
    root = Path(path)
    if not root.exists():
        raise BadInput("does not exist", root)
    if root.suffix == ".gguf" and not root.is_dir():
        return open_gguf(root)
    if not root.is_dir():
        raise BadInput("is not a directory (gac-check takes a model directory or a .gguf "
                       "file)", root)
    root = root.resolve()
    gguf = _lone_gguf(root)
    if gguf is not None:
        return open_gguf(gguf)
    config_path = root / "config.json"
    present = os.path.lexists(config_path)  # a looping or dangling link is refused, not absent
    config = read_json(inside(root, config_path.name, config_path)) if present else {}
    sidecars = _sidecars(root)
    container, files, (tensors, model) = _index_tensors(root)
    source = "config.json"
    if not present and model is not None and model.config:
        # A whole pickled model's own config serves as config.json where none is beside it:
        # the config the module was built from is what save_pretrained would write, so its
        # sizes, dtype and head_dim are the model's declarations as config.json's are (a
        # pruner's stale dense sizes included, which the tensors win over with a note), and
        # the file is judged as the module in memory is.
        config, source = dict(model.config), PICKLED_CONFIG
    return with_quantization(Checkpoint(root, config, tensors, container, files, sidecars,
                                         model, config_source=source))


def with_quantization(ckpt: Checkpoint, read: ByteReader | None = None) -> Checkpoint:
    """``ckpt`` as :func:`gac_check.checkpoint.quantized.read_quantization` reads it (a
    directory's index; or a quantizer's state dict in memory, whose bytes ``read`` gives);
    that reader and its layouts are imported only for a model whose config says it is
    quantized."""
    if quantization_config(ckpt) is None:
        refuse_stray_packed(ckpt)
        return ckpt
    from gac_check.checkpoint.quantized.reader import read_quantization

    return read_quantization(ckpt, read)


def _lone_gguf(root: Path) -> Path | None:
    """The GGUF file a directory holds instead of a Hugging Face checkpoint: exactly one, or
    the first part of one split set. A directory with safetensors or torch weights is that
    model (a .gguf beside them was made from it); several GGUF files (a repository's Q4_K_M,
    Q8_0, ...) are refused: which one is meant is the user's to say."""
    if any(root.glob("*.safetensors")) or _torch_weight_files(root):
        return None
    found = sorted(p for p in root.glob("*.gguf") if not p.is_dir())
    if not found:
        return None
    from gac_check.checkpoint.gguf_header import split_parts

    sets = {tuple(split_parts(p) or [p]) for p in found}
    if len(sets) > 1:
        names = ", ".join(s[0].name for s in sorted(sets))
        raise BadInput(f"holds {len(sets)} GGUF files ({names}): name the one to check", root)
    first = next(iter(sets))[0]
    return inside(root, first.name, first)


def open_gguf(path: Path) -> Checkpoint:
    """A GGUF file (or split set) as a checkpoint: its tensors in ggml's names with shapes in
    torch's order (``ne`` reversed: [out, in] for a linear, as a safetensors file holds it),
    dtypes as torch names where the type is a float (``F16`` -> ``float16``), else the ggml
    type's name (``Q4_K``); its sizes as config.json would say them
    (:func:`gguf_config`)."""
    from gac_check.checkpoint.gguf_header import read_gguf

    header = read_gguf(path)
    tensors = {n: TensorInfo(n, tuple(reversed(t.ne)), GGUF_FLOATS.get(t.type, t.type), t.file,
                             t.begin, t.end)
               for n, t in header.tensors.items()}
    return Checkpoint(path.resolve(), gguf_config(header), tensors, "gguf", header.files,
                      config_source="the GGUF metadata",
                      gguf=header)


#: ggml's float types by torch's names (the rest keep ggml's: Q4_K, Q8_0, ...).
GGUF_FLOATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
#: config.json's keys for the GGUF metadata keys that say the same (``{arch}.`` + key).
GGUF_CONFIG_KEYS = {"embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
                    "attention.head_count": "num_attention_heads",
                    "attention.head_count_kv": "num_key_value_heads",
                    "attention.key_length": "head_dim", "block_count": "num_hidden_layers",
                    "vocab_size": "vocab_size"}


def gguf_config(header: GgufHeader) -> dict:
    """The metadata's sizes under config.json's keys, so a GGUF's sites are held to what its
    metadata declares as a directory's are to its config.json. Per-layer arrays (a pruned
    model's ``feed_forward_length``) are left out here: the GGUF format notes them per layer."""
    config: dict = {"model_type": header.architecture}
    for key, hf in GGUF_CONFIG_KEYS.items():
        value = header.arch_value(key)
        if isinstance(value, int) and not isinstance(value, bool):
            config[hf] = value
    return config


def _sidecars(root: Path) -> dict[str, dict]:
    """Small JSON files other than config and shard indexes (slicing configs, rank maps)."""
    out: dict[str, dict] = {}
    for p in sorted(root.glob("*.json")):
        if p.name == "config.json" or p.name.endswith(".index.json"):
            continue
        if link_target(root, p) is None:
            continue
        try:
            out[p.name] = read_json(p, MAX_SIDECAR_BYTES)
        except BadInput:
            continue  # FIFOs, broken links, big tokenizer files are not ours to judge
    return out


def _index_tensors(root: Path) -> tuple[str, list[Path], IndexedTensors]:
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
    """``pytorch_model*.bin`` if there are any, else every torch file but the Trainer's state.

    Anything but a directory is a candidate, so a FIFO or a link loop named
    ``pytorch_model.bin`` is refused by name rather than silently skipped.
    """
    candidates = sorted(p for p in root.iterdir() if p.suffix in TORCH_SUFFIXES and not p.is_dir())
    preferred = [p for p in candidates if fnmatch(p.name, "pytorch_model*.bin")]
    return preferred or [p for p in candidates
                         if not any(fnmatch(p.name, pat) for pat in TRAINER_STATE_FILES)]


def _shards_from_index(root: Path, index: Path) -> list[Path]:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise BadInput("has no weight_map", index)
    if not all(isinstance(n, str) for n in weight_map.values()):
        raise BadInput("weight_map values must be shard file names (strings)", index)
    names = set(weight_map.values())
    files: dict[Path, None] = {}  # ordered set: "a" and "./a" are one shard
    for name in sorted(names):
        shard = inside(root, name, index)
        if not os.path.lexists(shard):
            raise BadInput(f"names shard {name!r}, which is missing", index)
        files[shard] = None
    return list(files)


def _read_all(container: str, files: list[Path]) -> IndexedTensors:
    """Merge the files' indexes; a name in two files would make one of them silently win."""
    tensors: dict[str, TensorInfo] = {}
    model: PickledModel | None = None
    for f in files:
        if container == "safetensors":
            found = read_safetensors_header(f)
        else:
            from gac_check.checkpoint.pickled.torchzip import index_torch_zip

            index = index_torch_zip(f)
            found = index.tensors
            if index.model is not None:
                model = index.model if model is None else model.merge(index.model)
        for name, info in found.items():
            if name in tensors:
                raise BadInput(f"tensor {name!r} is also in {tensors[name].file.name}", f)
            tensors[name] = info
    return tensors, model
