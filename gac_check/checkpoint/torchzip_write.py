"""Write a torch zip checkpoint back in its own layout, with some tensors reshaped: the pickle
stream is edited symbolically, never loaded.

A pickled whole model (LLM-Pruner's ``pytorch_model.bin``, SVD-LLM's ``{'model', 'tokenizer'}``)
must come out as the same pickled object: same classes, same tokenizer, same every other
entry, only the padded tensors and the integers that describe them changed. Unpickling and
re-pickling would do that by running the stranger's code, so instead:

- the one pickle reader (:func:`gac_check.checkpoint.pickled.torchzip.read_archive`) reads
  ``data.pkl`` into nodes that know where the opcode that pushed them starts, judged by the
  same allow-list and refused with the same error as when the checkpoint was listed;
- each padded tensor's rebuild call gets new integers in place (shape, contiguous strides,
  offset 0, and the storage size in its persistent id) and its storage record new bytes;
- module attributes that record a padded size (``nn.Linear.in_features``, an MLP's
  ``intermediate_size``, a pickled config's field) get their integer opcode replaced.

An integer opcode replaced by another integer opcode leaves the unpickler's stack, memo and
every other object exactly as they were; nothing else in the stream moves but byte offsets
(FRAME opcodes, which count bytes, are dropped: framing is optional). The zip is written
with torch's own record layout (stored, data 64-byte aligned) and every other record copied
byte for byte. What cannot be rewritten this way (a padded tensor sharing its storage with
another tensor, a shape tuple the pickle reads twice) is refused before anything is written.
"""
from __future__ import annotations

import math
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gac_check.checkpoint.files import open_regular
from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.pickled.machine import Node, PickleTree, refusals_of
from gac_check.checkpoint.pickled.model import ModuleNode, module_index
from gac_check.checkpoint.pickled.naming import name_tensors
from gac_check.checkpoint.pickled.torchzip import read_archive, read_torch_zip
from gac_check.errors import BadInput

#: torch.save aligns every record's data to this many bytes (mmap loading relies on it).
ALIGNMENT = 64
#: The extra-field id torch's writer pads local headers with ("FB").
PAD_FIELD = 0x4246
COPY_CHUNK = 4 << 20
#: The calls that rebuild a tensor from a storage: the ones whose numbers a rewrite edits.
REBUILD_TENSOR = {("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_tensor_v2"),
                  ("torch._utils", "_rebuild_tensor_v3")}


@dataclass(eq=False)
class TensorCall:
    """A ``_rebuild_tensor*`` call: its storage key and the nodes holding its numbers."""

    call: Node
    key: str
    numel: Node  # the storage size in the persistent id
    offset: Node
    size: Node  # tuple of const ints
    stride: Node


@dataclass(frozen=True)
class IntEdit:
    """One pickled integer to set, found from a module by attribute path.

    ``path`` starts in the module's ``__dict__``: ``("in_features",)``,
    ``("intermediate_size",)``, ``("config", "intermediate_size")``, or with a list index
    ``("ranks", 2)``. It is applied only where the pickle holds exactly ``old`` there (a value
    that records something else is not this site's, as with config.json).
    """

    module: str
    path: tuple[str | int, ...]
    old: int
    new: int

    def describe(self) -> str:
        where = ".".join(str(p) for p in self.path)
        return f"{self.module or '(model)'}.{where}: {self.old} -> {self.new}"


@dataclass
class ArchiveRewrite:
    """One torch zip file's rewrite, planned and checked, not yet written."""

    src: Path
    prefix: str
    pickle: bytes  # the new data.pkl
    storages: dict[str, str]  # archive member -> tensor name whose new bytes it holds
    shapes: dict[str, tuple[int, ...]]  # every tensor of the file as it will be read back
    applied: list[IntEdit] = field(default_factory=list)


def plan_rewrite(ckpt: Checkpoint, new_shapes: dict[str, tuple[int, ...]],
                 edits: list[IntEdit]) -> list[ArchiveRewrite]:
    """Plan every file's rewrite; raises BadInput (nothing written yet) where one is impossible.

    ``new_shapes`` names the tensors whose shape changes (their new bytes, C-contiguous, come
    later, to :func:`write_archive`).
    """
    unknown = sorted(set(new_shapes) - set(ckpt.tensors))
    if unknown:
        raise BadInput(f"has no tensor {unknown[0]!r} to rewrite", ckpt.path)
    return [_plan_file(ckpt, f, new_shapes, edits) for f in ckpt.files]


def _plan_file(ckpt: Checkpoint, path: Path, new_shapes: dict[str, tuple[int, ...]],
               edits: list[IntEdit]) -> ArchiveRewrite:
    archive = read_archive(path)
    prefix, tree = archive.prefix, archive.tree
    with refusals_of(path):
        named = name_tensors(tree.root)
    infos = {n: i for n, i in ckpt.tensors.items() if i.file == path}
    calls = tensor_calls(tree, path)
    users: dict[str, list[str]] = {}
    for name, info in infos.items():
        users.setdefault(str(info.storage), []).append(name)
    spans: dict[int, tuple[int, bytes]] = {}
    storages: dict[str, str] = {}
    for name in (n for n in new_shapes if n in infos):
        member = str(infos[name].storage)
        call = _only_call(path, name, member, prefix, calls, users)
        storages[member] = name
        _set_tensor(spans, call, new_shapes[name], path, name)
    index = module_index(tree.root, named)
    applied = [e for e in edits if _set_int(spans, index, e)]
    shapes = {n: new_shapes.get(n, i.shape) for n, i in infos.items()}
    return ArchiveRewrite(path, prefix, _splice(tree.data, spans, tree.frames), storages,
                          shapes, applied)


def tensor_calls(tree: PickleTree, path: Path) -> dict[str, list[TensorCall]]:
    """Every tensor rebuild in the pickle, by storage key (two calls on one key share data)."""
    out: dict[str, list[TensorCall]] = {}
    for node in tree.pending:
        if node.kind == "tensor" and node.call_of() in REBUILD_TENSOR:
            args = node.items[1].items
            storage = args[0]
            if not storage.items:  # protocol 0: the persistent id is one line of text
                raise BadInput("is a protocol-0 pickle, whose storage sizes are text inside "
                               "each persistent id and cannot be edited in place; re-save it "
                               "with torch.save's default protocol, then repair that", path)
            call = TensorCall(node, storage.value.key, storage.items[0].items[4], *args[1:4])
            out.setdefault(call.key, []).append(call)
    return out


def _only_call(path: Path, name: str, member: str, prefix: str,
               calls: dict[str, list[TensorCall]], users: dict[str, list[str]]) -> TensorCall:
    """The one rebuild call of a tensor that owns its storage, or a refusal saying why not."""
    key = member.removeprefix(f"{prefix}data/")
    found = calls.get(key, [])
    others = [u for u in users.get(member, []) if u != name]
    if others or len(found) != 1 or found[0].call.gets:
        shared = f" with {others[0]!r}" if others else ""
        raise BadInput(f"tensor {name!r} shares its storage{shared} (tied weights or a view); "
                       "padding it in place would change the other, so the pickle cannot be "
                       "rewritten in its own layout", path)
    return found[0]


def _set_tensor(spans: dict[int, tuple[int, bytes]], call: TensorCall,
                shape: tuple[int, ...], path: Path, name: str) -> None:
    """New numbers for a rebuilt tensor: shape, contiguous strides, offset 0, storage size."""
    if len(call.size.items) != len(shape) or len(call.stride.items) != len(shape):
        raise BadInput(f"tensor {name!r} changes rank in the plan", path)
    if call.size.gets or call.stride.gets:
        raise BadInput(f"tensor {name!r}'s shape is a tuple the pickle reads twice; it cannot "
                       "be rewritten for this tensor alone", path)
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    for node, value in [*zip(call.size.items, shape, strict=True),
                        *zip(call.stride.items, strides, strict=True),
                        (call.offset, 0), (call.numel, math.prod(shape))]:
        _replace(spans, node, value, path, name)


def _replace(spans: dict[int, tuple[int, bytes]], node: Node, value: int, path: Path,
             what: str) -> None:
    if node.kind != "const" or type(node.value) is not int or node.end <= node.pos:
        raise BadInput(f"{what}: the pickle holds a size that is not a plain integer", path)
    spans[node.pos] = (node.end, pickle.dumps(value, protocol=2)[2:-1])


def _set_int(spans: dict[int, tuple[int, bytes]], index: dict[str, ModuleNode],
             edit: IntEdit) -> bool:
    """Apply ``edit`` where the pickle holds exactly ``edit.old``; True if it did."""
    mod = index.get(edit.module)
    node: Node | None = mod.node if mod else None
    for step in edit.path:
        node = _child(node, step)
    if node is None or node.kind != "const" or type(node.value) is not int or \
            node.value != edit.old:
        return False
    spans[node.pos] = (node.end, pickle.dumps(edit.new, protocol=2)[2:-1])
    return True


def _child(node: Node | None, step: str | int) -> Node | None:
    if node is None:
        return None
    if node.kind == "obj":
        node = node.state
    if node is None:
        return None
    if isinstance(step, int):
        return node.items[step] if node.kind == "list" and 0 <= step < len(node.items) else None
    return node.get(step) if node.kind == "dict" else None


def _splice(data: bytes, spans: dict[int, tuple[int, bytes]],
            frames: list[tuple[int, int]]) -> bytes:
    """``data`` with each [pos, end) replaced; FRAME opcodes dropped once lengths change."""
    cuts = dict(spans)
    if cuts:
        cuts.update({pos: (end, b"") for pos, end in frames})
    out, last = bytearray(), 0
    for pos in sorted(cuts):
        end, new = cuts[pos]
        if pos < last:
            raise AssertionError("overlapping pickle edits")  # a planning bug, never input
        out += data[last:pos] + new
        last = end
    return bytes(out + data[last:])


# ------------------------------------------------------------------------------- writing
def write_archive(rw: ArchiveRewrite, dst: Path,
                  tensor_bytes: Callable[[str], memoryview],
                  progress: Callable[[int, str], None] | None = None) -> None:
    """Write the rewritten archive to ``dst``: records in the source's order and names, data.pkl
    and the padded tensors' storages new, every other record copied byte for byte; then read
    it back with the walker and check every tensor's shape against the plan."""
    with open_regular(rw.src) as src_fh, zipfile.ZipFile(src_fh) as src, \
            dst.open("wb") as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            if info.filename == f"{rw.prefix}data.pkl":
                _write_record(out, fh, info, [memoryview(rw.pickle)])
            elif info.filename in rw.storages:
                name = rw.storages[info.filename]
                data = tensor_bytes(name)
                _write_record(out, fh, info, [data])
                if progress:
                    progress(len(data), name)
            else:
                _write_record(out, fh, info, _chunks(src, info), info.file_size)
                if progress:
                    progress(info.file_size, info.filename)
    _verify(rw, dst)


def _chunks(src: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[memoryview]:
    with src.open(info) as member:
        while chunk := member.read(COPY_CHUNK):
            yield memoryview(chunk)


def _write_record(out: zipfile.ZipFile, fh, info: zipfile.ZipInfo, pieces,
                  size: int | None = None) -> None:
    """One stored record whose data starts on a 64-byte boundary, as torch's writer lays it."""
    pieces = list(pieces) if size is None else pieces
    if size is None:
        size = sum(len(p) for p in pieces)
    record = zipfile.ZipInfo(info.filename, date_time=info.date_time)
    record.compress_type = zipfile.ZIP_STORED
    record.external_attr = info.external_attr
    record.file_size = size
    zip64 = size * 1.05 > zipfile.ZIP64_LIMIT  # zipfile's own test for a zip64 local header
    start = fh.tell() + 30 + len(info.filename.encode()) + 4 + (20 if zip64 else 0)
    pad = -start % ALIGNMENT
    record.extra = struct.pack("<HH", PAD_FIELD, pad) + bytes(pad)
    with out.open(record, "w", force_zip64=zip64) as dst:
        for piece in pieces:
            dst.write(piece)


def _verify(rw: ArchiveRewrite, dst: Path) -> None:
    """The walker must read the new file as planned: a splice bug is an internal error."""
    got = {n: i.shape for n, i in read_torch_zip(dst).items()}
    if got != rw.shapes:
        wrong = next((n for n in rw.shapes if got.get(n) != rw.shapes[n]), "?")
        raise AssertionError(f"rewritten {dst.name} reads back {wrong!r} as {got.get(wrong)}, "
                             f"planned {rw.shapes.get(wrong)}")
