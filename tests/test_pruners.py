"""Torch-Pruning's and FLAP's outputs (tests/pruners.py: how each is written, and what of
their own code runs here), checked, judged for vLLM and repaired through the real CLI, the
repaired model loaded the way it loads and compared with the pruned model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from tests import compressors as C
from tests import helpers
from tests import pruners as P


def check(model: Path, *args: str) -> dict:
    run = helpers.gac(model, "--gpu", "h100", "--dtype", "float16", "--format", "json", *args)
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)


def repair(model: Path, out: Path, *args: str) -> dict:
    run = helpers.gac(model, "--repair", out, "--gpu", "h100", "--dtype", "float16",
                      "--format", "json", *args, timeout=300)
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)


def notes(doc: dict) -> list[str]:
    return [n for s in doc["sites"] for n in s.get("notes", [])]


@pytest.fixture
def torch_pruned(tmp_path) -> C.Built:
    pytest.importorskip("torch_pruning", reason="the test extra's torch-pruning")
    return P.build_torch_pruning(tmp_path / "tp")


def test_torch_pruning_builder_writes_what_the_real_run_wrote(torch_pruned):
    """Every tensor's shape and config.json's sizes as torch-pruning 1.6.1's own pruner
    wrote them (recorded under transformers 4.48.3, where it runs)."""
    recorded = json.loads(P.RECORDED.read_text())
    with safe_open(torch_pruned.path / "model.safetensors", "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
    assert shapes == recorded["shapes"]
    config = json.loads((torch_pruned.path / "config.json").read_text())
    assert {k: config[k] for k in recorded["config"]} == recorded["config"]
    assert "head_dim" not in config and not recorded["head_dim_in_config"]
    # VainF/Torch-Pruning#495: the class built from config.json has head_dim 88 // 4 = 22
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForCausalLM.from_pretrained(torch_pruned.path)


def test_torch_pruning_check_reads_head_dim_from_the_tensors(torch_pruned):
    doc = check(torch_pruned.path, "--target", "vllm")
    dims = {s["value"] for s in doc["sites"] if s["role"] == "head_dim"}
    assert dims == {16}
    said = " ".join(notes(doc))
    assert "hidden_size=88 / num_attention_heads=4 = 22" in said, said
    assert "head_dim 16 from q's width 64" in said
    load = doc["summary"]["targets"]["vllm"]["load"]
    assert (load["loads"], load["blocker"]) == (False, "config")
    assert "builds head_dim 22; the tensors have head_dim 16" in load["why"]
    assert load["source"]["file"] == "vllm/model_executor/models/qwen2.py"


def test_torch_pruning_repair_records_head_dim_and_loads_equal(torch_pruned, tmp_path):
    out = tmp_path / "out"
    doc = repair(torch_pruned.path, out, "--target", "vllm")
    config = json.loads((out / "config.json").read_text())
    assert config["head_dim"] == 16 and config["intermediate_size"] == 248
    assert {"file": "config.json", "field": ["head_dim"], "index": None, "from": None,
            "to": 16} in doc["config_changes"]
    C.assert_loads_same(torch_pruned, out)
    assert check(out, "--target", "vllm")["summary"]["targets"]["vllm"]["load"]["loads"]


def test_flap_sites_per_layer_and_vllm_refuses(tmp_path):
    src = P.build_flap(tmp_path / "flap")
    doc = check(src, "--target", "vllm")
    assert doc["format"] == "flap"
    by = {(s["role"], s.get("layer")): s["value"] for s in doc["sites"]}
    assert by[("heads", 0)] == 3 and by[("heads", 1)] == 2
    assert by[("intermediate", 0)] == 517 and by[("intermediate", 1)] == 600
    assert {s["value"] for s in doc["sites"] if s["role"] == "head_dim"} == {128}
    load = doc["summary"]["targets"]["vllm"]["load"]
    assert (load["loads"], load["blocker"]) == (False, "layers")
    assert "different head counts" in load["why"]
    assert (load["source"]["file"], load["source"]["function"]) == (
        "vllm/model_executor/models/llama.py", "LlamaDecoderLayer.__init__ / LlamaMLP")
    assert "the config says num_attention_heads=4, tensors have 3" in " ".join(notes(doc))


def _resaved(src: Path, root: Path, edit) -> Path:
    """FLAP's directory with its state dict edited (and its config.json as it was)."""
    root.mkdir()
    state = torch.load(src / "pytorch_model.bin", weights_only=True)
    torch.save(edit(state), root / "pytorch_model.bin")
    (root / "config.json").write_text((src / "config.json").read_text())
    return root


def test_flap_is_told_from_llm_pruner_by_its_bias_compensation(tmp_path):
    """o_proj and down_proj biased, q_proj and gate_proj not, in every layer: FLAP. Without
    the compensation, or with a bias on every projection (a Llama with attention_bias), the
    same per-layer widths are LLM-Pruner's layout."""
    src = P.build_flap(tmp_path / "flap")
    flap = check(src)
    assert flap["format"] == "flap"
    assert "--channel_wise" not in json.dumps(flap)  # FLAP never narrows the hidden size
    unbiased = _resaved(src, tmp_path / "unbiased", lambda sd: {
        k: v for k, v in sd.items() if not k.endswith(("o_proj.bias", "down_proj.bias"))})
    one_layer = _resaved(src, tmp_path / "one-layer", lambda sd: {
        k: v for k, v in sd.items() if k != "model.layers.1.mlp.down_proj.bias"})
    all_biased = _resaved(src, tmp_path / "all-biased", lambda sd: sd | {
        k.replace(".weight", ".bias"): torch.zeros(v.shape[0], dtype=v.dtype)
        for k, v in sd.items() if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))})
    for other in (unbiased, one_layer, all_biased):
        doc = check(other)
        assert doc["format"] == "llm-pruner", other.name
        assert "--channel_wise" in json.dumps(doc)


def test_flap_repair_pads_the_mlp_exactly(tmp_path):
    src = P.build_flap(tmp_path / "flap")
    out = tmp_path / "out"
    doc = repair(src, out)
    assert {r["from"]: r["to"] for r in doc["repaired"]} == {517: 520}
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, got = (P.load_flap(p)(input_ids=ids).logits for p in (src, out))
    assert torch.equal(ref, got)


def test_flap_repair_with_vllm_target_is_refused(tmp_path):
    src = P.build_flap(tmp_path / "flap")
    run = helpers.gac(src, "--repair", tmp_path / "out", "--gpu", "h100", "--target", "vllm")
    assert run.returncode == 2
    assert "head count" in run.stderr and not (tmp_path / "out").exists()
    # head counts cannot be padded: no --uniform is offered as if padding could serve it
    assert "no padding changes that" in run.stderr and "--uniform" not in run.stderr
