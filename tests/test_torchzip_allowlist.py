"""The torch zip walker's allow-list itself, not only its deny-list.

Every refusal in tests/test_torchzip.py uses a callable from a module that is also on the
deny-list (os, subprocess, builtins), so a walker that merely denied those would pass it. Here
each refused file calls something harmless-looking from a module on neither list (a Counter, a
date, a numpy array, a tensor subclass from a third-party package, a dict subclass pickled at
protocol 0/1), and the positive controls (a plain object at protocol 0/1, a tensor with a
Python attribute, which torch pickles through ``_rebuild_from_type_v2`` as ``torch.Tensor``)
must still be read. Every archive is written by real ``torch.save``; the big-endian one only
has its byte-order record rewritten, as a big-endian machine writes it.

Each test was run against a mutant of pickled/allowlist.py and went red (benchmarks/hand_mutants.py,
group "torchzip").
"""
from __future__ import annotations

import collections
import datetime
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from gac_check.checkpoint.pickled import allowlist
from gac_check.checkpoint.pickled.torchzip import read_tensor, read_torch_zip
from gac_check.errors import BadInput, UnsafeCheckpoint


class Meta(dict):
    """Metadata as a dict subclass: protocol 0/1 rebuild it through copyreg._reconstructor
    with base dict, which would call dict.__init__ on the loaded state."""


class Note:
    """A plain object: protocol 0/1 rebuild it with base object (object.__new__, harmless)."""

    def __init__(self) -> None:
        self.epoch = 3


class Logged(torch.Tensor):
    """A tensor subclass defined outside torch: loading it would run its code."""


@pytest.fixture
def third_party() -> type:
    """A tensor subclass from a package whose name merely starts with "torch"."""
    module = types.ModuleType("torchextras")
    sys.modules["torchextras"] = module

    class Quantish(torch.Tensor):
        pass

    Quantish.__module__ = "torchextras"
    Quantish.__qualname__ = "Quantish"
    module.Quantish = Quantish
    yield Quantish
    del sys.modules["torchextras"]


def save(obj: object, path: Path, protocol: int = 2) -> Path:
    torch.save(obj, path, pickle_protocol=protocol)
    return path


def refused(path: Path, *words: str) -> str:
    with pytest.raises(UnsafeCheckpoint) as exc:
        read_torch_zip(path)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(str(path)), text
    for w in words:
        assert w in text, text
    return text


# ------------------------------------------------------------------------- the allow-list
@pytest.mark.parametrize(("value", "named"), [
    (collections.Counter("abba"), "collections.Counter"),
    (datetime.date(2024, 1, 1), "datetime.date"),
    (np.ones(2), "multiarray._reconstruct"),
])
def test_harmless_looking_calls_off_both_lists_are_refused(tmp_path, value, named):
    module = named.rsplit(".", 1)[0].split(".")[0]
    assert module not in allowlist.DANGEROUS_MODULES  # the allow-list alone must refuse it
    path = save({"w": torch.ones(2), "extra": value}, tmp_path / "m.pt")
    refused(path, named, "only torch's tensor-rebuilding calls are allowed")


@pytest.mark.parametrize(("module", "name"), [
    ("torch.serialization", "load"),  # torch itself: loading a second pickle would unpickle it
    ("torch._utils", "_rebuild_tensor_v2_evil"),
    ("numpy", "load"),
    ("collections", "namedtuple"),
])
def test_calls_outside_the_allow_list_are_refused_whatever_the_module(tmp_path, module, name):
    src = save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    gadget = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R."
    path = rewrite(src, tmp_path / "bad.pt", "data.pkl", gadget)
    refused(path, f"{module}.{name}")


# --------------------------------------------------------------------- tensor subclasses
def test_tensor_subclass_from_outside_torch_is_refused(tmp_path):
    path = save({"w": torch.ones(2).as_subclass(Logged)}, tmp_path / "m.pt")
    refused(path, f"{__name__}.Logged", "subclass")


@pytest.mark.parametrize("protocol", [2, 4])
def test_tensor_subclass_from_a_torch_named_package_is_refused(tmp_path, third_party, protocol):
    path = save({"w": torch.ones(2).as_subclass(third_party)}, tmp_path / "m.pt", protocol)
    refused(path, "torchextras.Quantish")


def test_plain_tensor_with_python_state_is_read(tmp_path):
    """torch pickles a tensor carrying attributes through _rebuild_from_type_v2 with
    torch.Tensor as the type: that one is torch's own and is read."""
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t.note = "calibrated"
    path = save({"w": t, "b": torch.zeros(3)}, tmp_path / "m.pt")
    index = read_torch_zip(path)
    assert list(index) == ["w", "b"] and index["w"].shape == (2, 3)
    assert torch.equal(read_tensor(index["w"]), t.detach().clone())


# ------------------------------------------------------- protocol 0/1 reconstructors
@pytest.mark.parametrize("protocol", [0, 1])
def test_reconstructor_with_a_non_object_base_is_refused(tmp_path, protocol):
    path = save({"w": torch.ones(2), "meta": Meta(lr=0.1)}, tmp_path / "m.pt", protocol)
    refused(path, "copyreg._reconstructor", "builtins.dict")


@pytest.mark.parametrize("protocol", [0, 1])
def test_reconstructor_of_a_plain_object_is_read(tmp_path, protocol):
    path = save({"w": torch.ones(2), "note": Note()}, tmp_path / "m.pt", protocol)
    assert list(read_torch_zip(path)) == ["w"]


@pytest.mark.parametrize("base", [b"collections\nOrderedDict", b"datetime\ndate"])
def test_reconstructor_base_is_checked_even_off_the_deny_list(tmp_path, base):
    src = save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    gadget = (b"\x80\x02ccopyreg\n_reconstructor\n(c" + __name__.encode() + b"\nNote\nc" + base
              + b"\nNtR.")
    path = rewrite(src, tmp_path / "bad.pt", "data.pkl", gadget)
    refused(path, "copyreg._reconstructor", base.decode().replace("\n", "."))


# ------------------------------------------------------------------------- byte order
def test_big_endian_archive_is_refused_by_its_byte_order_record(tmp_path):
    src = save({"w": torch.arange(4, dtype=torch.float32)}, tmp_path / "little.pt")
    path = rewrite(src, tmp_path / "big.pt", "byteorder", b"big")
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    assert "big-endian" in str(exc.value) and not isinstance(exc.value, UnsafeCheckpoint)


def test_little_endian_and_unrecorded_byte_order_are_read(tmp_path):
    src = save({"w": torch.arange(4, dtype=torch.float32)}, tmp_path / "little.pt")
    assert list(read_torch_zip(src)) == ["w"]
    old = rewrite(src, tmp_path / "old.pt", "byteorder", None)  # torch < 1.10 wrote none
    assert torch.equal(read_tensor(read_torch_zip(old)["w"]), torch.arange(4.0))


def rewrite(src: Path, dst: Path, suffix: str, data: bytes | None) -> Path:
    """Copy an archive with the member ending in ``suffix`` replaced (or dropped: None)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            body = data if info.filename.endswith("/" + suffix) else zin.read(info)
            if body is not None:
                zout.writestr(info.filename, body)
    return dst


# --- the numbers a tensor is rebuilt from (issue 42) -------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pkl") / "ok.bin"
    torch.save({"w": torch.arange(4, dtype=torch.float32).reshape(2, 2)}, path)
    return path


@pytest.mark.parametrize("shape, stride, offset, says", [
    ((-2, 2), (2, 1), 0, "malformed shape"),
    ((2, -2), (2, 1), 0, "malformed shape"),
    ((2, 2), (-2, 1), 0, "malformed stride"),
    ((2, 2), (2, -1), 0, "malformed stride"),
    ((2, 2), (2, 1), -1, "malformed storage offset"),
])
def test_negative_shapes_strides_and_offsets_are_refused(saved, tmp_path, shape, stride, offset,
                                                        says):
    """``_rebuild_tensor_v2`` with a negative size, stride or offset (torch.save never writes
    one; torch would index before the storage's start): the allow-list refuses it rather than
    computing a byte range from it. The same stream with the real numbers reads back exactly
    (the positive control, so each refusal is the number's)."""
    from tests.test_pickle_refusals import i, state, tensor, tup, with_pickle

    def stream(shape, stride, offset) -> bytes:
        return state(("w", tensor(offset=i(offset), shape=tup(*map(i, shape)),
                                  stride=tup(*map(i, stride)))))

    good = with_pickle(saved, tmp_path / "good.bin", stream((2, 2), (2, 1), 0))
    assert torch.equal(read_tensor(read_torch_zip(good)["w"]),
                       torch.arange(4, dtype=torch.float32).reshape(2, 2))
    bad = with_pickle(saved, tmp_path / "bad.bin", stream(shape, stride, offset))
    with pytest.raises(BadInput, match=says):
        read_torch_zip(bad)
