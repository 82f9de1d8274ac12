"""The one pickle reader's refusals, one malformed stream per branch.

Each stream is assembled opcode by opcode (the way an attacker edits ``data.pkl``) into a real
``torch.save`` archive whose one storage record holds four float32s, then read: each must be
refused by its own branch, in one line naming the file, and nothing run. A positive control
(the same assembler, well formed) reads back exactly, so every refusal below is the branch it
names and not an assembler mistake.
"""
from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest
import torch

from gac_check.checkpoint.pickled.torchzip import read_torch_zip
from gac_check.errors import BadInput, PickleRefused

# --- a small pickle assembler (protocol 2, the opcodes torch.save writes) --------------------

def s(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def i(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)  # BININT: a signed 4-byte integer


def g(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode()  # GLOBAL


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


def storage(key: bytes = s("0"), size: bytes = i(4), kind: str = "storage",
            cls: str = "FloatStorage") -> bytes:
    return tup(s(kind), g("torch", cls), key, s("cpu"), size) + b"Q"  # BINPERSID


def tensor(store: bytes | None = None, offset: bytes = i(0), shape: bytes = tup(i(2), i(2)),
           stride: bytes = tup(i(2), i(1))) -> bytes:
    args = tup(store or storage(), offset, shape, stride, b"\x89",
               g("collections", "OrderedDict") + b")R")
    return g("torch._utils", "_rebuild_tensor_v2") + args + b"R"  # REDUCE


def state(*pairs: tuple[str, bytes]) -> bytes:
    """A state dict: ``{name: value, ...}``."""
    return b"\x80\x02}(" + b"".join(s(k) + v for k, v in pairs) + b"u."  # SETITEMS, STOP


def nested(outer: str, inner: bytes) -> bytes:
    """``{outer: <dict built by inner's items>}`` without the header and STOP."""
    return b"}(" + inner + b"u"


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pkl") / "ok.bin"
    torch.save({"w": torch.arange(4, dtype=torch.float32).reshape(2, 2)}, path)
    return path


def with_pickle(src: Path, dst: Path, data: bytes) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, data if info.filename.endswith("/data.pkl")
                          else zin.read(info))
    return dst


def test_the_assembler_writes_what_torch_save_writes(archive, tmp_path) -> None:
    path = with_pickle(archive, tmp_path / "m.bin", state(("w", tensor()),
                                                           ("v", tensor(shape=tup(i(3)),
                                                                        stride=tup(i(1)),
                                                                        offset=i(1)))))
    index = read_torch_zip(path)
    assert (index["w"].shape, index["w"].stride, index["w"].storage_offset) == ((2, 2), (2, 1), 0)
    assert (index["v"].shape, index["v"].stride, index["v"].storage_offset) == ((3,), (1,), 1)
    assert torch.load(path, weights_only=True)["v"].tolist() == [1.0, 2.0, 3.0]


CASES = {
    # integers in shapes, strides and offsets (pickled.allowlist._ints, _tensor)
    "negative dim": (state(("w", tensor(shape=tup(i(-2), i(2))))), "malformed shape"),
    "negative stride": (state(("w", tensor(stride=tup(i(-2), i(1))))), "malformed stride"),
    "negative offset": (state(("w", tensor(offset=i(-1)))), "malformed storage offset"),
    "float dim": (state(("w", tensor(shape=tup(b"G" + struct.pack(">d", 2.0), i(2))))),
                  "malformed shape"),
    "text stride": (state(("w", tensor(stride=tup(s("2"), i(1))))), "malformed stride"),
    "bool offset": (state(("w", tensor(offset=b"I01\n"))), "malformed storage offset"),  # True
    "shape a list": (state(("w", tensor(shape=b"(" + i(2) + i(2) + b"l"))), "malformed shape"),
    "dim past int64": (state(("w", tensor(shape=tup(b"\x8a\x09" + b"\xff" * 8 + b"\x00",
                                                     i(2))))), "malformed shape"),
    "lengths disagree": (state(("w", tensor(stride=tup(i(1))))), "shape and stride disagree"),
    "elements past int64": (state(("w", tensor(shape=tup(*[i(2 ** 30)] * 3),
                                               stride=tup(i(1), i(1), i(1))))),
                            "more elements than int64 holds"),
    "past its storage": (state(("w", tensor(offset=i(3)))), "is truncated: tensor 'w' needs"),
    "stride past storage": (state(("w", tensor(stride=tup(i(9), i(1))))), "is truncated"),
    # storage records (pickled.allowlist: persistent ids)
    "storage key an int": (state(("w", tensor(storage(key=i(0))))), "malformed key or size"),
    "storage size negative": (state(("w", tensor(storage(size=i(-4))))),
                              "malformed key or size"),
    "storage twice, two sizes": (state(("w", tensor()), ("v", tensor(storage(size=i(8))))),
                                 "declared twice with different sizes"),
    "not a storage": (state(("w", tensor(storage(kind="module")))), "not a storage"),
    "storage type unknown": (state(("w", tensor(storage(cls="FooStorage")))),
                             "unsupported storage type"),
    "storage record missing": (state(("w", tensor(storage(key=s("7"))))),
                               "storage record ok/data/7 is missing"),
    # names (pickled.naming)
    "two tensors, one name": (state(("a.b", tensor()), ("a", nested("a", s("b") + tensor()))),
                              "two tensors are both named 'a.b'"),
    "one unnamed tensor": (b"\x80\x02" + tensor() + b".", "single unnamed tensor"),
    # the stream itself (pickled.machine)
    "no STOP": (state(("w", tensor()))[:-1], "not a readable pickle (ValueError: pickle "
                                            "exhausted before seeing STOP)"),
    "odd dict items": (b"\x80\x02}(" + s("w") + b"u.", "odd number of items"),
    "opcode torch never writes": (b"\x80\x02\x82\x01.", "opcode EXT1"),
    "truncated opcode": (b"\x80\x02X\xff\xff\x00\x00ab", "not a readable pickle"),
    "tuple from a short stack": (b"\x80\x02" + i(1) + b"\x87.", "3-tuple from a shorter stack"),
    "computed global": (b"\x80\x02" + i(1) + s("load") + b"\x93.", "computes a global"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_malformed_stream_is_refused_by_its_own_branch(archive, tmp_path, case) -> None:
    data, words = CASES[case]
    path = with_pickle(archive, tmp_path / "bad.bin", data)
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(str(path)), text
    assert words in text, text


@pytest.mark.parametrize("case", ["negative dim", "two tensors, one name", "no STOP"])
def test_a_refusal_of_the_reader_is_a_pickle_refusal(archive, tmp_path, case) -> None:
    path = with_pickle(archive, tmp_path / "bad.bin", CASES[case][0])
    with pytest.raises(PickleRefused):
        read_torch_zip(path)
