"""ggml's and llama.cpp's layout rules for a GGUF header, each at its boundary, on files the
``gguf`` package's own GGUFWriter writes: a tensor name's length (GGML_MAX_NAME, the NUL
included), the data alignment a file chooses for itself (``general.alignment``), and a split
set whose parts must say which part of how many they are and how many tensors the set holds
(llama.cpp's gguf-split). A reader that is off by one on a name, that assumes the default
alignment, or that skips a part's own count would pass files llama.cpp refuses.
"""
from __future__ import annotations

import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from gac_check.checkpoint.gguf_header import MAX_NAME, read_gguf, read_gguf_header
from gac_check.errors import BadInput
from tests.gguf_files import PRUNED
from tests.test_gguf_check import _fill


def _write(path: Path, tensors: dict[str, np.ndarray], alignment: int | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_name_of_63_bytes_is_read_and_one_of_64_is_refused(tmp_path: Path) -> None:
    """GGML_MAX_NAME is 64 bytes with the terminating NUL: 63 characters is the longest name."""
    longest = "n" * (MAX_NAME - 1)
    ok = read_gguf_header(_write(tmp_path / "ok.gguf", {longest: np.zeros(4, np.float32)}))
    assert list(ok.tensors) == [longest]
    with pytest.raises(BadInput, match="name is 64 bytes; ggml allows 63"):
        read_gguf_header(_write(tmp_path / "long.gguf", {"n" * MAX_NAME: np.zeros(4, np.float32)}))


def test_a_file_s_own_alignment_places_every_tensor_where_gguf_reader_does(tmp_path: Path):
    """Tensors of 20, 12 and 36 bytes in a file aligned to 64 (not the default 32): each one
    starts where the gguf package's reader finds it, and the offsets the header declares are
    held to that alignment."""
    arrays = {"a": np.zeros(5, np.float32), "b": np.zeros(3, np.float32),
              "c": np.zeros(9, np.float32)}
    path = _write(tmp_path / "a64.gguf", arrays, alignment=64)
    ours = read_gguf_header(path)
    theirs = gguf.GGUFReader(path)
    assert theirs.alignment == 64
    assert {t.name: (t.data_offset, t.n_bytes) for t in theirs.tensors} == {
        n: (t.begin, t.end - t.begin) for n, t in ours.tensors.items()}
    assert all(t.begin % 64 == 0 for t in ours.tensors.values())


def test_an_alignment_that_is_not_a_power_of_two_is_refused(tmp_path: Path) -> None:
    """The writer refuses 48 itself, so a file aligned to 64 says 48 instead."""
    path = _write(tmp_path / "a48.gguf", {"a": np.zeros(5, np.float32)}, alignment=64)
    data = bytearray(path.read_bytes())
    at = data.index(b"general.alignment") + len(b"general.alignment")
    assert struct.unpack_from("<II", data, at) == (gguf.GGUFValueType.UINT32, 64)
    struct.pack_into("<I", data, at + 4, 48)
    path.write_bytes(bytes(data))
    with pytest.raises(BadInput, match=r"general\.alignment is 48, not a power of two"):
        read_gguf_header(path)


def _split(tmp_path: Path, name: str, per_part: int) -> list[Path]:
    w = gguf.GGUFWriter(tmp_path / f"{name}.gguf", "llama", split_max_tensors=per_part)
    _fill(w, dict(PRUNED))
    return sorted(tmp_path.glob(f"{name}-*-of-*.gguf"))


def test_a_part_from_another_split_set_is_refused(tmp_path: Path) -> None:
    """Part 2 of a 3-part set replaced by part 2 of a 2-part set of the same model: its own
    split.count says 2, its name says 3."""
    three = _split(tmp_path, "s", 8)
    (tmp_path / "other").mkdir()
    two = _split(tmp_path / "other", "s", 11)
    assert len(three) == 3 and len(two) == 2
    assert len(read_gguf(three[0]).tensors) == 21
    shutil.copyfile(two[1], three[1])
    with pytest.raises(BadInput, match=r"says it is split part 1 of 2, its name part 1 of 3"):
        read_gguf(three[0])


def test_a_split_set_whose_count_of_tensors_disagrees_is_refused(tmp_path: Path) -> None:
    parts = _split(tmp_path, "s", 8)
    data = bytearray(parts[0].read_bytes())
    key = b"split.tensors.count"
    at = data.index(key) + len(key)
    vtype, value = struct.unpack_from("<Ii", data, at)
    assert (vtype, value) == (gguf.GGUFValueType.INT32, 21)
    struct.pack_into("<i", data, at + 4, 20)
    parts[0].write_bytes(bytes(data))
    with pytest.raises(BadInput, match="says its split set holds 20 tensors; its parts hold 21"):
        read_gguf(parts[1])
