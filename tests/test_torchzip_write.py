"""The symbolic pickle rewrite on the layouts torch.save can produce: protocol 4 (FRAME
opcodes, which count bytes), tensors that are views at an offset into a larger storage, and
storages two tensors share where neither is padded. Each repaired file is loaded back with
``torch.load`` (files this test wrote) and compared value by value. The rewrite reads the pickle
through the same reader as the listing, so a refusal reads the same on both paths."""
from __future__ import annotations

import json
import pickletools
import zipfile
from pathlib import Path

import pytest
import torch

from gac_check.api import repair
from gac_check.checkpoint.index import open_checkpoint
from gac_check.checkpoint.pickled.torchzip import read_torch_zip
from gac_check.checkpoint.torchzip_write import plan_rewrite
from gac_check.errors import BadInput, PickleRefused, UnsafeCheckpoint
from tests.compressors import tiny_llama


def data_pkl(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith("/data.pkl")))


def write(root: Path, protocol: int, view: bool, tie: bool) -> dict[str, torch.Tensor]:
    model = tiny_llama(2, intermediate_size=37, tie_word_embeddings=tie)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if view:  # up_proj lives at an offset inside a storage no other tensor uses
        w = state["model.layers.0.mlp.up_proj.weight"]
        big = torch.cat([torch.randn(100), w.reshape(-1), torch.randn(7)])
        state["model.layers.0.mlp.up_proj.weight"] = big[100:100 + w.numel()].view(w.shape)
    if tie:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    root.mkdir()
    (root / "config.json").write_text(json.dumps(model.config.to_dict()))
    torch.save(state, root / "pytorch_model.bin", pickle_protocol=protocol)
    return state


def padded_equal(before: torch.Tensor, after: torch.Tensor) -> bool:
    """``after`` holds ``before`` in its leading corner and zeros elsewhere."""
    corner = tuple(slice(0, n) for n in before.shape)
    rest = after.clone()
    rest[corner] = 0
    return torch.equal(after[corner], before) and not rest.any()


def test_protocol_4_views_and_shared_storage(tmp_path):
    state = write(tmp_path / "src", protocol=4, view=True, tie=True)
    assert any(op.name == "FRAME" for op, _, _ in pickletools.genops(
        data_pkl(tmp_path / "src" / "pytorch_model.bin")))
    repair(tmp_path / "src", tmp_path / "out", "gpu", dtype="float16")
    # torch's weights-only unpickler lacks protocol 4's MEMOIZE; this test wrote the input
    got = torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=False)
    assert list(got) == list(state)
    for name, before in state.items():
        after = got[name]
        if "mlp" in name:
            assert after.shape != before.shape and 40 in after.shape, name
        assert padded_equal(before, after), name
    up = got["model.layers.0.mlp.up_proj.weight"]
    assert up.storage_offset() == 0 and up.untyped_storage().nbytes() == up.numel() * 4
    assert got["lm_head.weight"].data_ptr() == got["model.embed_tokens.weight"].data_ptr()
    assert not any(op.name == "FRAME" for op, _, _ in pickletools.genops(
        data_pkl(tmp_path / "out" / "pytorch_model.bin")))


def test_a_protocol_0_pickle_is_refused_as_one_and_nothing_is_written(tmp_path):
    """Protocol 0 writes each storage's size as text in its persistent id: the refusal says
    that (not "shares its storage", as it once did), and a default-protocol save repairs."""
    write(tmp_path / "src", protocol=0, view=False, tie=False)
    with pytest.raises(BadInput, match="protocol-0 pickle") as refused:
        repair(tmp_path / "src", tmp_path / "out", "gpu", dtype="float16")
    assert "shares its storage" not in str(refused.value)
    assert not (tmp_path / "out").exists()
    write(tmp_path / "again", protocol=2, view=False, tie=False)
    repair(tmp_path / "again", tmp_path / "out", "gpu", dtype="float16")


def test_untouched_tensors_keep_their_bytes(tmp_path):
    """Every record but data.pkl and the padded tensors' storages is copied byte for byte."""
    write(tmp_path / "src", protocol=2, view=False, tie=False)
    repair(tmp_path / "src", tmp_path / "out", "gpu", dtype="float16")
    with zipfile.ZipFile(tmp_path / "src" / "pytorch_model.bin") as a, \
            zipfile.ZipFile(tmp_path / "out" / "pytorch_model.bin") as b:
        assert a.namelist() == b.namelist()
        changed = [n for n in a.namelist() if a.read(n) != b.read(n)]
    assert len(changed) == 7 and changed[0].endswith("/data.pkl")  # + gate/up/down x 2 layers
    assert all("/data/" in n for n in changed[1:])


@pytest.mark.parametrize(("pickle", "kind", "says"), [
    (b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00true\x85R.", UnsafeCheckpoint,
     "the pickle calls os.system (it would run code when loaded)"),
    (b"\x80\x02\x82\x01.", PickleRefused,
     "the pickle uses opcode EXT1, which torch.save never writes"),
])
def test_a_refusal_is_the_same_when_listing_and_when_rewriting(tmp_path, pickle, kind, says):
    """A file swapped after it was checked (or a checkpoint whose index came from elsewhere)
    reaches the rewrite with a pickle the listing never saw: it is refused there by the same
    reader, with the same error type and the same line."""
    write(tmp_path / "m", 2, view=False, tie=False)
    ckpt = open_checkpoint(tmp_path / "m")
    path = ckpt.files[0]
    with zipfile.ZipFile(path) as zf:
        records = [(i.filename, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in records:
            zf.writestr(name, pickle if name.endswith("/data.pkl") else data)
    with pytest.raises(PickleRefused) as listed:
        read_torch_zip(path)
    name = "model.layers.0.mlp.up_proj.weight"
    with pytest.raises(PickleRefused) as planned:
        plan_rewrite(ckpt, {name: (40, ckpt.shape(name)[1])}, [])
    assert type(listed.value) is type(planned.value) is kind
    assert str(listed.value) == str(planned.value) == f"{path}: refuses to read: {says}"
