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
        assert sites[f"{module}:kv_lora_rank"]["value"] == cfg["kv_lora_rank"]
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


@pytest.mark.parametrize("run", RUNS)
def test_the_latent_refusal_names_the_norm_the_conversion_has(tmp_path, run):
    """Without --use-qkv-norm TransMLA writes no kv_a_layernorm: the refusal says so rather
    than blaming a norm the checkpoint does not have."""
    normed = RECORDING["runs"][run]["config"]["qk_latent_layernorm"]
    site = {s["name"]: s for s in check(build(tmp_path / "m", run))["sites"]}[
        "model.layers.0.self_attn:kv_lora_rank"]
    assert site["exact_repair"] is False
    assert ("would undo that only with eps 0" in site["refusal"]) is normed
    assert ("has no kv_a_layernorm" in site["refusal"]) is not normed


def test_repair_pads_v_head_dim_to_what_transmla_modeling_reads(tmp_path):
    """v_head_dim 44 -> 48: kv_b_proj's per-head v rows and o_proj's input grow, config.json's
    v_head_dim follows (TransMLA's mla.py sizes both from it) and its modeling files travel
    with the repair. That its modeling code then gives equal logits was seen once outside
    this suite (the recording's repair_check: it is TransMLA's code, not importable here)."""
    run = RECORDING["repair_check"]["run"]
    src = build(tmp_path / "m", run)
    for name in RECORDING["runs"][run]["files"]:
        if name.endswith(".py"):  # stand-ins named as TransMLA's modeling files, not its code
            (src / name).write_text(f"# {name}\n")
    out = tmp_path / "out"
    run_ = helpers.gac(src, "--gpu", "h100", "--dtype", "float16", "--repair", out)
    assert run_.returncode in (0, 1), run_.stderr
    cfg = json.loads((out / "config.json").read_text())
    before = RECORDING["runs"][run]["config"]
    assert cfg["v_head_dim"] == 48
    assert {k: cfg[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank")} == {
        k: before[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank")}
    heads = before["num_attention_heads"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        kv_b = f.get_tensor("model.layers.0.self_attn.kv_b_proj.weight")
        o = f.get_tensor("model.layers.0.self_attn.o_proj.weight")
    nope = before["qk_nope_head_dim"]
    assert kv_b.shape[0] == heads * (nope + 48) and o.shape[1] == heads * 48
    per_head = kv_b.view(heads, nope + 48, -1)
    assert torch.count_nonzero(per_head[:, nope + 44:]) == 0
    assert torch.count_nonzero(o.view(o.shape[0], heads, 48)[..., 44:]) == 0
    assert {p.name for p in out.glob("*.py")} == {
        n for n in RECORDING["runs"][run]["files"] if n.endswith(".py")}


MHA2MLA = json.loads((Path(__file__).parent / "data" / "mha2mla_llama.json").read_text())


def build_mha2mla(root: Path) -> Path:
    """A checkpoint of MHA2MLA's recorded tensor names and shapes and its config.json."""
    root.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    save_file({n: torch.randn(s, generator=gen) for n, s in MHA2MLA["tensors"].items()},
              str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(MHA2MLA["config"]))
    return root


def test_mha2mla_builder_writes_what_mha2mla_wrote(tmp_path):
    model = build_mha2mla(tmp_path / "m")
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert shapes == MHA2MLA["tensors"]
    assert json.loads((model / "config.json").read_text()) == MHA2MLA["config"]


def test_mha2mla_conversion_is_refused_not_read_as_llama(tmp_path):
    """MHA2MLA keeps model_type llama and saves no modeling code: its k_r_proj and
    kv_proj.{down_kv,up_k,up_v} are no layout gac-check reads, so the check is a one-line
    refusal, never a Llama verdict on the tensors it happened to understand."""
    run = helpers.gac(build_mha2mla(tmp_path / "m"), "--gpu", "h100", "--dtype", "float16")
    assert run.returncode == 2, run.stdout
    lines = run.stderr.strip().splitlines()
    # the hand-written Llama leaves k_r_proj unread; the class table then finds the tensors
    # LlamaForCausalLM builds that MHA2MLA replaced: refused either way, in one line
    assert len(lines) == 1 and ("did not read" in lines[0] or "is missing" in lines[0]), lines
