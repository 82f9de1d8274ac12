"""Checkpoint reading on directories found in the wild: hub-cache snapshots, Trainer folders,
headers that lie about sizes, and files that are not what their names say.

Every fixture is real: a tiny transformers model saved with ``save_pretrained``, laid out the
way ``huggingface_hub`` lays out its cache (content-addressed blobs, relative symlinks from
``snapshots/<rev>/``), Trainer state written with ``torch.save`` of real optimizer and
scheduler state, and safetensors headers edited byte by byte. (TrainingArguments itself needs
accelerate, which the venv lacks; an argparse.Namespace stands in: it pickles a class too.)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from gac_check.checkpoint.index import open_checkpoint, read_json
from gac_check.checkpoint.outdir import copy_side_files
from gac_check.errors import BadInput
from tests.helpers import gac, save_torch_state, tiny_llama

OUTSIDE = Path("/etc/hostname")  # a real file no model directory owns


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same tiny model saved sharded and as one file, each with a tokenizer-like side file."""
    out = {}
    for kind, shard in (("sharded", "150KB"), ("single", "10GB")):
        d = tmp_path_factory.mktemp(kind)
        tiny_llama().save_pretrained(d, max_shard_size=shard)
        (d / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
        out[kind] = d
    assert len(list(out["sharded"].glob("*.safetensors"))) > 1
    assert [p.name for p in out["single"].glob("*.safetensors")] == ["model.safetensors"]
    return out


def hub_snapshot(cache: Path, src: Path, repo: str = "models--org--tiny") -> Path:
    """Lay ``src`` out as huggingface_hub does: blobs named by hash, relative links to them."""
    blobs, snap = cache / repo / "blobs", cache / repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    return snap


# ------------------------------------------------------------------------ hub-cache snapshots

@pytest.mark.parametrize("kind", ["sharded", "single"])
def test_hub_snapshot_reads_like_the_plain_directory(tmp_path: Path, saved: dict[str, Path],
                                                     kind: str) -> None:
    snap = hub_snapshot(tmp_path / "hub", saved[kind])
    assert (snap / "config.json").is_symlink()
    plain, hub = open_checkpoint(saved[kind]), open_checkpoint(snap)
    assert hub.shapes == plain.shapes and hub.config == plain.config
    # files keep the snapshot's names: outputs are named after them, never after blob hashes
    assert [f.name for f in hub.files] == [f.name for f in plain.files]
    assert all(f.parent == snap for f in hub.files)
    proc = gac(snap, "--format", "json")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)


def test_hub_shard_linking_outside_the_cache_is_refused(tmp_path: Path,
                                                        saved: dict[str, Path]) -> None:
    snap = hub_snapshot(tmp_path / "hub", saved["sharded"])
    victim = sorted(snap.glob("*.safetensors"))[0]
    victim.unlink()
    victim.symlink_to(OUTSIDE)
    with pytest.raises(BadInput, match=rf"{victim.name}.*links outside the model directory"):
        open_checkpoint(snap)


def test_hub_shard_linking_into_another_repos_blobs_is_refused(tmp_path: Path,
                                                               saved: dict[str, Path]) -> None:
    """Only this snapshot's own cache entry is trusted, not every repo in the hub cache."""
    other = hub_snapshot(tmp_path / "hub", saved["single"], repo="models--org--other")
    snap = hub_snapshot(tmp_path / "hub", saved["single"])
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to(
        os.path.relpath((other / "model.safetensors").resolve(), snap))
    with pytest.raises(BadInput, match="links outside the model directory"):
        open_checkpoint(snap)


def test_blobs_are_trusted_only_under_a_snapshots_folder(tmp_path: Path,
                                                         saved: dict[str, Path]) -> None:
    """A plain directory whose grandparent happens to hold blobs/ gets no exemption."""
    snap = hub_snapshot(tmp_path / "hub", saved["single"])
    lookalike = snap.parent.parent / "not-snapshots" / "rev"
    shutil.copytree(snap, lookalike, symlinks=True)
    with pytest.raises(BadInput, match="links outside the model directory"):
        open_checkpoint(lookalike)


def test_index_names_are_checked_lexically(tmp_path: Path, saved: dict[str, Path]) -> None:
    """'sub/../model.safetensors' resolves inside, but a name with '..' is refused as written."""
    for f in saved["single"].iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "sub").mkdir()
    names = {n: "sub/../model.safetensors" for n in open_checkpoint(tmp_path).tensors}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": names}))
    with pytest.raises(BadInput, match="outside the model directory"):
        open_checkpoint(tmp_path)
    index.write_text(json.dumps({"weight_map": {n: "./model.safetensors" for n in names}}))
    assert [f.name for f in open_checkpoint(tmp_path).files] == ["model.safetensors"]


# ------------------------------------------------------------------------------- side files

def test_side_files_from_a_hub_snapshot_are_copied_as_files(tmp_path: Path,
                                                            saved: dict[str, Path]) -> None:
    snap = hub_snapshot(tmp_path / "hub", saved["single"])
    out = tmp_path / "out"
    out.mkdir()
    copy_side_files(snap, out, skip={"model.safetensors", "config.json"})
    assert sorted(p.name for p in out.iterdir()) == ["generation_config.json", "tokenizer.json"]
    assert not (out / "tokenizer.json").is_symlink()
    original = saved["single"] / "tokenizer.json"
    assert (out / "tokenizer.json").read_bytes() == original.read_bytes()


@pytest.mark.parametrize("hub", [False, True], ids=["plain", "hub"])
def test_side_file_links_leaving_the_model_are_not_copied(tmp_path: Path, saved: dict[str, Path],
                                                          hub: bool) -> None:
    if hub:
        model = hub_snapshot(tmp_path / "hub", saved["single"])
    else:
        model = tmp_path / "model"
        shutil.copytree(saved["single"], model)
    (model / "notes.txt").symlink_to(OUTSIDE)
    (model / "extras").mkdir()
    (model / "extras" / "readme.md").write_text("kept")
    (model / "extras" / "key").symlink_to(OUTSIDE)
    (model / "extras" / "dangling").symlink_to(model / "gone")
    (model / "linked-dir").symlink_to(OUTSIDE.parent)
    out = tmp_path / "out"
    out.mkdir()
    copy_side_files(model, out, skip={"model.safetensors", "config.json"})
    assert not (out / "notes.txt").exists() and not (out / "linked-dir").exists()
    assert sorted(p.name for p in (out / "extras").iterdir()) == ["readme.md"]
    assert (out / "tokenizer.json").is_file()


# ------------------------------------------------------------------- Trainer checkpoint folders

def training_args(d: Path) -> argparse.Namespace:
    return argparse.Namespace(output_dir=str(d), learning_rate=1e-3, num_train_epochs=1)


def trainer_state(d: Path, model: torch.nn.Module) -> None:
    """What transformers.Trainer writes next to the weights in checkpoint-N/."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LinearLR(opt)
    torch.save(opt.state_dict(), d / "optimizer.pt")
    torch.save(sched.state_dict(), d / "scheduler.pt")
    torch.save({"cpu": torch.get_rng_state(), "python": (3, (1, 2), None)}, d / "rng_state.pth")
    torch.save({"scale": 65536.0, "growth_factor": 2.0}, d / "scaler.pt")
    torch.save(training_args(d), d / "training_args.bin")


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "model.pt"])
def test_trainer_folder_indexes_only_the_weights(tmp_path: Path, weights: str) -> None:
    model = tiny_llama()
    save_torch_state(model, tmp_path, weights)
    trainer_state(tmp_path, model)
    ckpt = open_checkpoint(tmp_path)
    assert [f.name for f in ckpt.files] == [weights]
    assert ckpt.shapes == {n: tuple(t.shape) for n, t in model.state_dict().items()}
    proc = gac(tmp_path, "--format", "json")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr


def test_training_args_really_is_refused_by_the_walker(tmp_path: Path) -> None:
    """Why it is skipped by name: indexing it on its own is an unsafe-pickle refusal."""
    torch.save(training_args(tmp_path), tmp_path / "weights.pt")
    with pytest.raises(BadInput):
        open_checkpoint(tmp_path)


# ------------------------------------------------------------------------ safetensors headers

def edit_header(path: Path, edit: Callable[[dict], None]) -> None:
    """Rewrite a real file's JSON header in place, keeping its data bytes."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def two_tensor_file(path: Path) -> None:
    save_file({"a.weight": torch.zeros(8, 8), "b.weight": torch.zeros(4, 8)}, path)


@pytest.mark.parametrize("shape", [[4, 8], [16, 8], [8]])
def test_byte_range_must_match_shape_and_dtype(tmp_path: Path, shape: list[int]) -> None:
    """[16, 8] is the dangerous one: the file is long enough, so only the size check sees it."""
    f = tmp_path / "model.safetensors"
    two_tensor_file(f)
    edit_header(f, lambda h: h["a.weight"].update(shape=shape))
    with pytest.raises(BadInput, match=r"'a.weight' spans 256 bytes, but F32 .* needs"):
        open_checkpoint(tmp_path)


def test_byte_range_checks_itemsize(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    two_tensor_file(f)
    edit_header(f, lambda h: h["a.weight"].update(dtype="F16"))
    with pytest.raises(BadInput, match=r"'a.weight' spans 256 bytes, but F16 .* needs 128"):
        open_checkpoint(tmp_path)


def test_unsigned_and_e8m0_dtypes_are_read(tmp_path: Path) -> None:
    save_file({"u16": torch.zeros(3, dtype=torch.uint16), "u32": torch.zeros(2, dtype=torch.uint32),
               "u64": torch.zeros(2, dtype=torch.uint64),
               "e8m0": torch.zeros(4, dtype=torch.float8_e8m0fnu)}, tmp_path / "m.safetensors")
    ckpt = open_checkpoint(tmp_path)
    assert {n: t.dtype for n, t in ckpt.tensors.items()} == {
        "u16": "uint16", "u32": "uint32", "u64": "uint64", "e8m0": "float8_e8m0fnu"}
    assert all(getattr(torch, t.dtype) for t in ckpt.tensors.values())


@pytest.mark.parametrize("dtype", ["X9", ["F32"], None])
def test_unknown_dtype_is_named(tmp_path: Path, dtype: object) -> None:
    f = tmp_path / "model.safetensors"
    two_tensor_file(f)
    edit_header(f, lambda h: h["b.weight"].update(dtype=dtype))
    with pytest.raises(BadInput, match=re.escape(f"'b.weight' has unsupported dtype {dtype!r}")):
        open_checkpoint(tmp_path)


def test_tensor_in_two_shards_is_refused(tmp_path: Path) -> None:
    two_tensor_file(tmp_path / "model-00001-of-00002.safetensors")
    save_file({"b.weight": torch.ones(4, 8)}, tmp_path / "model-00002-of-00002.safetensors")
    with pytest.raises(BadInput, match=r"'b\.weight' is also in model-00001-of-00002"):
        open_checkpoint(tmp_path)
    index = {"weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                            "b.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(BadInput, match=r"'b\.weight' is also in"):
        open_checkpoint(tmp_path)


# ------------------------------------------------------------------------------ JSON files

def test_config_json_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").mkdir()
    two_tensor_file(tmp_path / "model.safetensors")
    with pytest.raises(BadInput, match=r"config\.json: cannot read"):
        open_checkpoint(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_json(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text("{}")
    f.chmod(0)
    with pytest.raises(BadInput, match="cannot read: Permission denied"):
        read_json(f)


def test_broken_and_escaping_json_sidecars_are_skipped(tmp_path: Path) -> None:
    two_tensor_file(tmp_path / "model.safetensors")
    (tmp_path / "broken.json").symlink_to(tmp_path / "gone.json")
    outside = tmp_path.parent / f"{tmp_path.name}-secret.json"
    outside.write_text('{"secret": 1}')
    (tmp_path / "linked.json").symlink_to(outside)
    (tmp_path / "ranks.json").write_text('{"r": 4}')
    assert open_checkpoint(tmp_path).sidecars == {"ranks.json": {"r": 4}}
