"""The safetensors header's arithmetic and length edges, held to safetensors' own verdict
(issue 22, "tests that bite"). Each file is built byte by byte; ``safetensors.safe_open`` says
whether it accepts it, and gac-check's reader must say the same (and the table pins which).

Each test fails on one of the "safetensors" mutants in benchmarks/hand_mutants.py.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from gac_check.checkpoint.safetensors_header import MAX_HEADER_BYTES, read_safetensors_header
from gac_check.errors import BadInput

U64 = 2**64


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def raw(header: dict | str | bytes, data: bytes = b"", length: int | None = None,
        pad: bool = True) -> bytes:
    if isinstance(header, bytes):
        blob = header
    else:
        blob = (header if isinstance(header, str) else json.dumps(header)).encode()
    if pad:
        blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob) if length is None else length) + blob + data


def theirs(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="np") as f:
            f.keys()
    except Exception:  # any refusal is safetensors' verdict
        return False
    return True


def ours(path: Path) -> str | None:
    try:
        read_safetensors_header(path)
    except BadInput as exc:
        return str(exc)
    return None


#: (id, file bytes, accepted, a phrase of gac-check's refusal)
CASES = [
    # ------------------------------------------------------------------ the length prefix
    ("empty file", b"", False, "truncated"),
    ("7-byte length", b"\x02" + b"\x00" * 6, False, "truncated"),
    ("zero-length header", struct.pack("<Q", 0), False, "header"),
    ("header fills the file exactly", raw({}), True, None),
    ("header unpadded, fills the file", raw("{}", pad=False), True, None),
    ("length one past the file", raw({}, length=9), False, "claims a 9-byte header"),
    ("length one short of the header", raw("{} ", length=2, pad=False), False, "trailing"),
    ("length past the limit", raw({}, length=MAX_HEADER_BYTES + 1), False, "refuses headers"),
    ("length near 2**64", raw({}, length=U64 - 1), False, "refuses headers"),
    ("one trailing byte", raw({}, b"\x00"), False, "trailing data (1 bytes)"),
    # ------------------------------------------------------------ sizes and offsets
    ("scalar F32", raw({"t": entry("F32", [], 0, 4)}, b"\0" * 4), True, None),
    ("empty tensor", raw({"t": entry("F32", [0], 0, 0)}), True, None),
    ("empty tensor with a width", raw({"t": entry("F16", [0, 4096], 0, 0)}), True, None),
    ("2x3 F16, exact", raw({"t": entry("F16", [2, 3], 0, 12)}, b"\0" * 12), True, None),
    ("2x3 F16, a byte short", raw({"t": entry("F16", [2, 3], 0, 11)}, b"\0" * 11), False,
     "spans 11 bytes, but F16 [2, 3] needs 12"),
    ("2x3 F16, a byte long", raw({"t": entry("F16", [2, 3], 0, 13)}, b"\0" * 13), False,
     "needs 12"),
    ("F64 itemsize", raw({"t": entry("F64", [3], 0, 24)}, b"\0" * 24), True, None),
    ("C64 itemsize", raw({"t": entry("C64", [3], 0, 24)}, b"\0" * 24), True, None),
    ("BOOL itemsize", raw({"t": entry("BOOL", [3], 0, 3)}, b"\0" * 3), True, None),
    ("data short of the last tensor", raw({"t": entry("U8", [4], 0, 4)}, b"\0" * 3), False,
     "truncated"),
    ("begin after end", raw({"t": entry("U8", [0], 4, 0)}, b"\0" * 4), False, "before it"),
    # ------------------------------------------------------------------------ tiling
    ("two tensors tile", raw({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 4, 8)},
                             b"\0" * 8), True, None),
    ("listed out of order", raw({"b": entry("U8", [4], 4, 8), "a": entry("U8", [4], 0, 4)},
                                b"\0" * 8), True, None),
    ("a one-byte gap", raw({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 5, 9)},
                           b"\0" * 9), False, "1-byte gap"),
    ("a gap before the first", raw({"a": entry("U8", [4], 1, 5)}, b"\0" * 5), False,
     "1-byte gap"),
    ("a one-byte overlap", raw({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 3, 7)},
                               b"\0" * 7), False, "overlaps"),
    ("an empty tensor between two", raw({"a": entry("U8", [4], 0, 4),
                                         "e": entry("U8", [0], 4, 4),
                                         "b": entry("U8", [4], 4, 8)}, b"\0" * 8), True, None),
    ("an empty tensor listed after one at its offset",
     raw({"a": entry("U8", [4], 0, 4), "e": entry("U8", [0], 0, 0)}, b"\0" * 4), True, None),
    ("an empty tensor at the very end", raw({"a": entry("U8", [4], 0, 4),
                                             "e": entry("U8", [0], 4, 4)}, b"\0" * 4), True,
     None),
    ("two empty tensors at one offset", raw({"e": entry("U8", [0], 0, 0),
                                             "f": entry("U8", [0], 0, 0)}), True, None),
    # ------------------------------------------------------------- 64-bit arithmetic
    ("elements overflow", raw({"t": entry("U8", [2**32, 2**32], 0, 0)}), False, "overflows"),
    ("bits overflow, elements do not", raw({"t": entry("U8", [2**61], 0, 0)}), False,
     "overflows"),
    ("bits just fit", raw({"t": entry("U8", [2**60], 0, 0)}), False, "needs 1152921504606846976"),
    ("overflow before a zero", raw({"t": entry("U8", [2**40, 2**40, 0], 0, 0)}), False,
     "overflows"),
    ("a zero before the overflow", raw({"t": entry("U8", [0, 2**40, 2**40], 0, 0)}), True,
     None),
    ("F32 bits overflow", raw({"t": entry("F32", [2**59], 0, 0)}), False, "overflows"),
    ("largest u64 dimension", raw({"t": entry("U8", [U64 - 1, 0], 0, 0)}), True, None),
    ("a dimension of 2**64", raw({"t": entry("U8", [U64, 0], 0, 0)}), False,
     "non-negative integers"),
    ("an offset of 2**64", raw({"t": entry("U8", [0], U64, U64)}), False,
     "non-negative integers"),
    ("a negative offset", raw({"t": entry("U8", [0], -1, 0)}), False, "non-negative"),
    ("an offset of -0 (serde reads a float)",
     raw('{"t": {"dtype": "U8", "shape": [0], "data_offsets": [-0, 0]}}'), False,
     "non-negative"),
    # a "-0" anywhere makes integers go through serde's reading (u64, else a float)
    ("u64's largest dimension beside a -0", raw(
        '{"__metadata__": {"k": "-0"}, "t": {"dtype": "U8", "shape": [18446744073709551615, 0],'
        ' "data_offsets": [0, 0]}}'), True, None),
    ("2**64 beside a -0", raw(
        '{"__metadata__": {"k": "-0"}, "t": {"dtype": "U8", "shape": [18446744073709551616, 0],'
        ' "data_offsets": [0, 0]}}'), False, "non-negative integers"),
    # ------------------------------------------------------------ the rest of the schema
    ("metadata of strings", raw({"__metadata__": {"format": "pt"}}), True, None),
    ("metadata null", raw({"__metadata__": None}), True, None),
    ("metadata with a number", raw({"__metadata__": {"n": 1}}), False, "strings to strings"),
    ("metadata as a list", raw({"__metadata__": ["pt"]}), False, "strings to strings"),
    ("a metadata key twice (the last wins)",
     raw('{"__metadata__": {"a": "1", "a": "2"}}'), True, None),
    ("an entry's field twice",
     raw('{"t": {"shape": [0], "dtype": "U8", "dtype": "U8", "data_offsets": [0, 0]}}'),
     False, "gives 'dtype' twice"),
    ("an extra field, ignored", raw({"t": {**entry("U8", [0], 0, 0), "x": [1, {"y": 2}]}}),
     True, None),
    ("an extra field past a float's range",
     raw('{"t": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0], "x": 1e400}}'), False,
     None),
    ("an extra field nested 130 deep",
     raw('{"t": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0], "x": '
         + "[" * 130 + "]" * 130 + "}}"), False, None),
    ("a lone surrogate in a name", raw('{"\\ud800": {"dtype": "U8", "shape": [0], '
                                       '"data_offsets": [0, 0]}}'), False, None),
    ("a name that is not UTF-8", raw(b'{"\xff": {"dtype": "U8", "shape": [0], '
                                     b'"data_offsets": [0, 0]}}'), False, "not valid UTF-8"),
]


@pytest.mark.parametrize(("data", "accepted", "why"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_gac_check_agrees_with_safetensors(tmp_path, data, accepted, why):
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    assert theirs(path) is accepted, "the table is wrong about safetensors"
    verdict = ours(path)
    assert (verdict is None) is accepted, verdict
    if why is not None:
        assert why in verdict


def test_an_accepted_file_is_indexed_where_safetensors_reads_it(tmp_path):
    """Offsets are absolute in the file: the data starts after the 8-byte length and the
    (padded) header; each tensor's range, shape and dtype are those safetensors reads."""
    data = bytes(range(4)) + bytes(range(100, 112))
    path = tmp_path / "model.safetensors"
    path.write_bytes(raw({"a": entry("U8", [4], 0, 4), "e": entry("F32", [0], 4, 4),
                          "b": entry("F16", [2, 3], 4, 16)}, data))
    index = read_safetensors_header(path)
    start = path.stat().st_size - len(data)
    got = {n: (t.begin - start, t.end - start, t.shape, t.dtype) for n, t in index.items()}
    assert got == {"a": (0, 4, (4,), "uint8"), "e": (4, 4, (0,), "float32"),
                   "b": (4, 16, (2, 3), "float16")}
    with safe_open(str(path), framework="np") as f:
        for name, t in index.items():
            blob = path.read_bytes()[t.begin:t.end]
            assert f.get_tensor(name).tobytes() == blob


def test_a_header_of_exactly_the_limit(tmp_path):
    """100,000,000 bytes of header (an empty object and spaces) is the largest safetensors
    reads; one byte more is refused before it is read (the file's bytes do not matter)."""
    path = tmp_path / "model.safetensors"
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", MAX_HEADER_BYTES) + b"{}")
        fh.write(b" " * (MAX_HEADER_BYTES - 2))
    assert theirs(path) and ours(path) is None
    with path.open("r+b") as fh:
        fh.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        fh.seek(0, 2)
        fh.write(b" ")
    assert not theirs(path)
    assert "refuses headers above 100000000 bytes" in ours(path)


def test_sub_byte_dtypes_are_refused_on_purpose(tmp_path):
    """safetensors reads F4; gac-check cannot map it to a torch dtype and says so."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(raw({"t": entry("F4", [0], 0, 0)}))
    assert theirs(path)
    assert "unsupported dtype 'F4' (sub-byte; gac-check cannot map it to torch)" in ours(path)
    path.write_bytes(raw({"t": entry("F3", [0], 0, 0)}))
    assert not theirs(path)
    assert ours(path).endswith("has unsupported dtype 'F3'")
