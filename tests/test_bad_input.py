"""Bad model directories through the real CLI: exit 2, one line naming the file, nothing else.

Each case is a directory a stranger could hand us. The contract (docs/design.md, "Exit
codes"): exit code 2, exactly one line on stderr that names the offending file and the
problem, no traceback, nothing executed, and the directory left exactly as it was.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers import gac, snapshot


def safetensors_file(path: Path) -> None:
    save_file({"model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8),
               "model.layers.0.mlp.up_proj.weight": torch.randn(12, 8)}, path)


def config(path: Path) -> None:
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))


# --- each builder makes a bad model dir and returns (model dir, the file the message must name,
# --- the problem it must state)

def missing_dir(d: Path) -> tuple[Path, Path, str]:
    return d / "no-such-model", d / "no-such-model", "does not exist"


def empty_dir(d: Path) -> tuple[Path, Path, str]:
    return d, d, "holds no checkpoint"


def truncated(d: Path) -> tuple[Path, Path, str]:
    config(d)
    f = d / "model.safetensors"
    safetensors_file(f)
    f.write_bytes(f.read_bytes()[:-100])
    return d, f, "truncated"


def absurd_header(d: Path) -> tuple[Path, Path, str]:
    f = d / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 2**62) + b"{}" + b"\0" * 64)
    return d, f, "header"


def header_not_json(d: Path) -> tuple[Path, Path, str]:
    f = d / "model.safetensors"
    junk = b"this is not json at all"
    f.write_bytes(struct.pack("<Q", len(junk)) + junk + b"\0" * 16)
    return d, f, "not valid JSON"


def broken_config(d: Path) -> tuple[Path, Path, str]:
    safetensors_file(d / "model.safetensors")
    (d / "config.json").write_text('{"hidden_size": 64,')
    return d, d / "config.json", "not valid JSON"


def shard_outside(d: Path) -> tuple[Path, Path, str]:
    model = d / "model"
    model.mkdir()
    safetensors_file(d / "outside.safetensors")  # exists, but is not ours to read
    index = model / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": "../outside.safetensors"}}))
    return model, index, "outside the model directory"


def missing_shard(d: Path) -> tuple[Path, Path, str]:
    config(d)
    safetensors_file(d / "model-00001-of-00002.safetensors")
    index = d / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {
        "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
        "model.layers.0.mlp.up_proj.weight": "model-00002-of-00002.safetensors"}}))
    return d, index, "missing"


def config_not_object(d: Path) -> tuple[Path, Path, str]:
    safetensors_file(d / "model.safetensors")
    (d / "config.json").write_text("[1, 2, 3]")
    return d, d / "config.json", "JSON object"


def symlinked_shard_escapes(d: Path) -> tuple[Path, Path, str]:
    """A shard name that stays inside but is a symlink out of the directory."""
    model = d / "model"
    model.mkdir()
    safetensors_file(d / "secret.safetensors")
    (model / "model-00001.safetensors").symlink_to(d / "secret.safetensors")
    index = model / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": "model-00001.safetensors"}}))
    return model, index, "outside the model directory"


def not_a_transformer(d: Path) -> tuple[Path, Path, str]:
    save_file({"conv.weight": torch.randn(4, 4, 3, 3)}, d / "model.safetensors")
    return d, d, "not a format gac-check recognises"


def file_not_dir(d: Path) -> tuple[Path, Path, str]:
    f = d / "model.safetensors"
    safetensors_file(f)
    return f, f, "not a directory"


def hub_shard_escapes(d: Path) -> tuple[Path, Path, str]:
    """A hub-cache snapshot (shards link into ../../blobs) with one link leaving the cache."""
    repo = d / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    safetensors_file(blobs / "aaaa")
    (snap / "model-00001-of-00002.safetensors").symlink_to("../../blobs/aaaa")
    (snap / "model-00002-of-00002.safetensors").symlink_to("/etc/hostname")
    index = snap / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {
        "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
        "model.layers.0.mlp.up_proj.weight": "model-00002-of-00002.safetensors"}}))
    return snap, index, "'model-00002-of-00002.safetensors', which links outside the model"


def rewrite_header(f: Path, name: str, **changes: object) -> None:
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header[name].update(changes)
    new = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def header_size_mismatch(d: Path) -> tuple[Path, Path, str]:
    """The first tensor claims more rows than its byte range holds; the file is long enough."""
    f = d / "model.safetensors"
    safetensors_file(f)
    name = "model.layers.0.mlp.up_proj.weight"
    rewrite_header(f, name, shape=[16, 8])
    return d, f, f"tensor {name!r} spans 384 bytes, but F32 [16, 8] needs 512"


def unsupported_dtype(d: Path) -> tuple[Path, Path, str]:
    f = d / "model.safetensors"
    safetensors_file(f)
    rewrite_header(f, "model.layers.0.mlp.up_proj.weight", dtype="F4X")
    return d, f, "unsupported dtype 'F4X'"


def tensor_in_two_shards(d: Path) -> tuple[Path, Path, str]:
    config(d)
    safetensors_file(d / "model-00001-of-00002.safetensors")
    safetensors_file(d / "model-00002-of-00002.safetensors")
    return (d, d / "model-00002-of-00002.safetensors",
            "is also in model-00001-of-00002.safetensors")


def config_is_directory(d: Path) -> tuple[Path, Path, str]:
    safetensors_file(d / "model.safetensors")
    (d / "config.json").mkdir()
    return d, d / "config.json", "cannot read: Is a directory"


def asvd_ranks_not_a_map(d: Path) -> tuple[Path, Path, str]:
    save_file({"model.layers.0.self_attn.q_proj.BLinear.weight": torch.randn(2, 8),
               "model.layers.0.self_attn.q_proj.ALinear.weight": torch.randn(8, 2)},
              d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "truncation_ranks": 5}))
    return d, d / "config.json", "truncation_ranks must map module names to ranks"


class RunsCode:
    """What a malicious checkpoint hides: unpickling it calls os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def code_pickle(d: Path) -> tuple[Path, Path, str]:
    model = d / "model"
    model.mkdir()
    f = model / "pytorch_model.bin"
    torch.save({"model.layers.0.mlp.up_proj.weight": torch.randn(4, 4),
                "payload": RunsCode(d / "pwned")}, f)
    return model, f, "os.system"


CASES: dict[str, Callable[[Path], tuple[Path, Path, str]]] = {
    "missing directory": missing_dir,
    "empty directory": empty_dir,
    "truncated safetensors": truncated,
    "absurd header length": absurd_header,
    "header not JSON": header_not_json,
    "broken config.json": broken_config,
    "shard index pointing outside": shard_outside,
    "missing shard": missing_shard,
    "pickle that runs code": code_pickle,
    "config.json not an object": config_not_object,
    "symlinked shard escaping": symlinked_shard_escapes,
    "no transformer layers": not_a_transformer,
    "a file, not a directory": file_not_dir,
    "hub shard linking outside the cache": hub_shard_escapes,
    "byte range not matching shape": header_size_mismatch,
    "unsupported dtype": unsupported_dtype,
    "tensor in two shards": tensor_in_two_shards,
    "config.json is a directory": config_is_directory,
    "truncation_ranks not a map": asvd_ranks_not_a_map,
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, case: str) -> None:
    model_dir, target, problem = CASES[case](tmp_path)
    before = snapshot(tmp_path)
    for fmt in ("text", "json"):
        proc = gac(model_dir, "--format", fmt)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
        assert str(target) in lines[0] and problem in lines[0], lines[0]
    assert snapshot(tmp_path) == before  # nothing written, nothing touched
    assert not (tmp_path / "pwned").exists()  # and nothing executed


def test_malicious_pickle_payload_really_runs_when_unpickled(tmp_path: Path) -> None:
    """The fixture is live: full unpickling does run the payload, so its absence above counts."""
    code_pickle(tmp_path)
    torch.load(tmp_path / "model" / "pytorch_model.bin", weights_only=False)
    assert (tmp_path / "pwned").exists()


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in ([], [tmp_path, "--gpu", "tpu"], [tmp_path, "--fail-on", "sometimes"]):
        proc = gac(*args)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr


def odd_config(d: Path, **fields: object) -> None:
    safetensors_file(d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({"model_type": "llama", **fields}))


ODD_BUT_USABLE: dict[str, Callable[[Path], None]] = {
    "architectures a number": lambda d: odd_config(d, architectures=5),
    "architectures a string": lambda d: odd_config(d, architectures="LlamaForCausalLM"),
    "hidden_size null": lambda d: odd_config(d, hidden_size=None),
    "hidden_size a string": lambda d: odd_config(d, hidden_size="eight"),
    "broken JSON symlink beside the model": lambda d: (
        odd_config(d), (d / "tokenizer.json").symlink_to(d / "gone.json")),
}


@pytest.mark.parametrize("case", ODD_BUT_USABLE)
def test_odd_but_usable_input_gets_a_report(tmp_path: Path, case: str) -> None:
    """Config fields of the wrong type are ignored like missing ones, never a traceback."""
    ODD_BUT_USABLE[case](tmp_path)
    proc = gac(tmp_path, "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr and json.loads(proc.stdout)
