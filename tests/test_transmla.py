"""TransMLA's conversions (github.com/fxmeng/TransMLA), read from what its own code writes.

TransMLA is scripts, not a package: tests/data/transmla_llama.json records what its
``partial_rope`` + ``low_rank_qkv`` + ``modify_config`` wrote for a tiny Llama (the run is
described in the file); :func:`build` writes real safetensors of those names and shapes with
the recorded config.json, and the first test holds it to the recording."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests import helpers

RECORDING = json.loads((Path(__file__).parent / "data" / "transmla_llama.json").read_text())
RUNS = sorted(RECORDING["runs"])


def build(root: Path, run: str) -> Path:
    """A checkpoint of the recorded run's tensor names and shapes and its config.json."""
    rec = RECORDING["runs"][run]
    root.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(shape, generator=gen) for name, shape in rec["tensors"].items()}
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(rec["config"]))
    return root


def check(model: Path, *args: str) -> dict:
    run = helpers.gac(model, "--gpu", "h100", "--dtype", "float16", "--format", "json", *args)
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("run", RUNS)
def test_builder_writes_what_transmla_wrote(tmp_path, run):
    rec = RECORDING["runs"][run]
    model = build(tmp_path / "m", run)
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert shapes == rec["tensors"]
    assert json.loads((model / "config.json").read_text()) == rec["config"]


@pytest.mark.parametrize("run", RUNS)
def test_transmla_conversion_is_read_as_mla(tmp_path, run):
    rec = RECORDING["runs"][run]
    cfg = rec["config"]
    doc = check(build(tmp_path / "m", run))
    assert doc["format"] == "mla"
    sites = {s["name"]: s for s in doc["sites"]}
    for layer in range(cfg["num_hidden_layers"]):
        module = f"model.layers.{layer}.self_attn"
        assert sites[f"{module}:kv_lora_rank"]["value"] == cfg["kv_lora_rank"] == 100
        assert not sites[f"{module}:kv_lora_rank"]["aligned"]
        assert sites[f"{module}:v_head_dim"]["value"] == cfg["v_head_dim"]
        assert sites[f"{module}:qk_head_dim"]["value"] == (cfg["qk_nope_head_dim"]
                                                           + cfg["qk_rope_head_dim"])
        assert sites[f"{module}:heads"]["value"] == cfg["num_attention_heads"]
        q_rank = sites.get(f"{module}:q_lora_rank")
        assert (q_rank and q_rank["value"]) == cfg["q_lora_rank"] or (
            q_rank is None and cfg["q_lora_rank"] is None)
    # the tensors agree with every size config.json declares: no contradiction noted
    assert not [n for s in doc["sites"] for n in s.get("notes", []) if "config.json" in n]
