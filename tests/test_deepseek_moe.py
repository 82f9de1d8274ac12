"""DeepSeek-V2/V3 with mixture-of-experts MLPs (issue 30 items 2 and 3): the layout the real
DeepSeek-V2-Lite and V3 ship (dense MLPs in the first ``first_k_dense_replace`` layers, then
routed experts, shared experts and a router), written by transformers' own classes, read with
the MLA sites beside the MoE reader's (gac_check/formats/moe.py's ``deepseek_moe`` layout);
``--repair`` pads the expert widths exactly where one config key records them all."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
)

import gac_check
from tests.helpers import assert_same_routing, gac

#: MLA at toy widths (as tests/test_mla.py's) with 4 routed experts 45 wide (odd on purpose),
#: one shared expert, a dense first layer 44 wide, and two MoE layers after it
MOE = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 44, "num_hidden_layers": 3,
       "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 16,
       "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
       "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1,
       "num_experts_per_tok": 2, "moe_intermediate_size": 45, "n_group": 1, "topk_group": 1,
       "max_position_embeddings": 64}
CLASSES = {"v2": (DeepseekV2Config, DeepseekV2ForCausalLM),
           "v3": (DeepseekV3Config, DeepseekV3ForCausalLM)}


def build(version: str, **overrides: object) -> torch.nn.Module:
    config, model = CLASSES[version]
    torch.manual_seed(0)
    return model(config(**{**MOE, **overrides})).eval()


def save(path: Path, version: str, **overrides: object) -> Path:
    build(version, **overrides).save_pretrained(path)
    return path


def check(path: Path, *args: str) -> dict:
    run = gac(path, "--gpu", "h100", "--format", "json", "--fail-on", "never", *args)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def sites(doc: dict, role: str) -> dict[str, dict]:
    return {s["name"]: s for s in doc["sites"] if s["role"] == role}


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_moe_layers_are_read_beside_the_latent_attention(tmp_path: Path, version: str) -> None:
    """save_pretrained writes one module per expert (transformers fuses them only in memory):
    each is an expert site, each MoE layer has its shared experts' site and an expert-count
    site over the router (and V3's per-expert e_score_correction_bias), layer 0 its dense MLP,
    every layer its MLA sites, and every tensor is read."""
    root = save(tmp_path / "m", version)
    with safe_open(root / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.layers.2.mlp.experts.3.down_proj.weight" in names
    assert ("model.layers.1.mlp.gate.e_score_correction_bias" in names) == (version == "v3")
    doc = check(root)
    assert doc["format"] == "mla"
    tensors = doc["summary"]["tensors"]
    assert tensors["read"] == tensors["in_sites"] == len(names)
    assert {n: s["value"] for n, s in sites(doc, "expert_intermediate").items()} == {
        f"model.layers.{i}.mlp.experts.{e}:intermediate": 45 for i in (1, 2) for e in range(4)}
    assert {n: s["value"] for n, s in sites(doc, "shared_expert_intermediate").items()} == {
        f"model.layers.{i}.mlp.shared_experts:intermediate": 45 for i in (1, 2)}
    assert {n: s["value"] for n, s in sites(doc, "intermediate").items()} == {
        "model.layers.0.mlp:intermediate": 44}
    count = sites(doc, "experts")["model.layers.1.mlp:experts"]
    assert count["value"] == 4 and "zero expert would still be routed" in count["refusal"]
    router = ["model.layers.1.mlp.gate.weight"]
    if version == "v3":
        router.insert(0, "model.layers.1.mlp.gate.e_score_correction_bias")
    assert count["tensors"] == router
    assert {f"model.layers.{i}.self_attn:kv_lora_rank" for i in range(3)} <= set(
        sites(doc, "kv_latent"))


def test_a_pruned_expert_count_is_a_note_with_both_values(tmp_path: Path) -> None:
    """The tensors win: a config.json saying 6 routed experts over 4 is a note on the count."""
    root = save(tmp_path / "m", "v2")
    cfg = json.loads((root / "config.json").read_text())
    cfg["n_routed_experts"] = 6
    (root / "config.json").write_text(json.dumps(cfg))
    count = sites(check(root), "experts")["model.layers.2.mlp:experts"]
    assert count["value"] == 4
    assert "the config says n_routed_experts=6, tensors have 4" in count["notes"]


def test_shared_experts_config_json_contradicts_are_a_note(tmp_path: Path) -> None:
    """Three shared experts (one MLP 135 wide) under a config.json saying two: the note gives
    the product config.json implies and the tensors' width."""
    root = save(tmp_path / "m", "v2", n_shared_experts=3)
    cfg = json.loads((root / "config.json").read_text())
    cfg["n_shared_experts"] = 2
    (root / "config.json").write_text(json.dumps(cfg))
    shared = sites(check(root), "shared_expert_intermediate")
    assert shared["model.layers.2.mlp.shared_experts:intermediate"]["notes"] == [
        "the config says moe_intermediate_size x n_shared_experts = 45 x 2 = 90, tensors "
        "have 135"]


def test_a_routing_bias_not_pruned_with_its_experts_is_refused(tmp_path: Path) -> None:
    """V3: expert 3 dropped from every layer with its router row, but the per-expert
    e_score_correction_bias left at 4: one line, exit 2, naming the tensor."""
    root = save(tmp_path / "m", "v3")
    path = root / "model.safetensors"
    state = load_file(path)
    for i in (1, 2):
        block = f"model.layers.{i}.mlp"
        for w in ("gate_proj", "up_proj", "down_proj"):
            del state[f"{block}.experts.3.{w}.weight"]
        state[f"{block}.gate.weight"] = state[f"{block}.gate.weight"][:3].contiguous()
    save_file(state, path, metadata={"format": "pt"})
    run = gac(root, "--gpu", "h100")
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert ("model.layers.1.mlp.gate.e_score_correction_bias has shape [4], not one value "
            "per expert ([3])") in run.stderr


def test_a_deepseek_with_no_dense_layer_is_read(tmp_path: Path) -> None:
    """first_k_dense_replace 0: no layer has the dense MLP the family names, and the check
    still reads it (the family is matched on the attention alone)."""
    doc = check(save(tmp_path / "m", "v2", first_k_dense_replace=0))
    assert doc["format"] == "mla" and not sites(doc, "intermediate")
    assert len(sites(doc, "expert_intermediate")) == 12
    tensors = doc["summary"]["tensors"]
    assert tensors["read"] == tensors["in_sites"]


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_in_memory_and_on_disk_checks_agree(tmp_path: Path, version: str) -> None:
    """In memory the experts are fused (mlp.experts.gate_up_proj); the module's check finds the
    sites, notes, findings and tensor counts its saved directory has."""
    model = build(version)
    assert "model.layers.1.mlp.experts.gate_up_proj" in model.state_dict()
    model.save_pretrained(tmp_path / "m")
    memory, disk = gac_check.check(model, "h100"), gac_check.check(tmp_path / "m", "h100")

    def seen(result: gac_check.CheckResult) -> list[tuple]:
        return [(s.name, s.role, s.value, s.inexact, tuple(s.notes)) for s in result.sites]

    assert seen(memory) == seen(disk)
    assert any(s.role.value == "expert_intermediate" for s in memory.sites)
    assert [(f.site.name, f.severity) for f in memory.findings] == [
        (f.site.name, f.severity) for f in disk.findings]
    assert memory.accounting.tensors == disk.accounting.tensors


def _routes(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list]:
    """The logits, and every MoE layer's router output (its scores over the experts)."""
    routed: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, out: routed.append(out))
             for layer in model.model.layers if hasattr(layer.mlp, "experts")]
    with torch.no_grad():
        logits = model(ids).logits
    for hook in hooks:
        hook.remove()
    return logits, routed


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_repair_pads_expert_widths_exactly(tmp_path: Path, version: str) -> None:
    """--repair pads every routed expert and the shared experts 45 -> 48 (and the dense layer
    44 -> 48); config.json's moe_intermediate_size records both; the padded rows and columns
    are zero, the router the same bytes, and transformers' class loads OUT with equal logits
    and equal router scores. The original runs with the eager experts: the default grouped
    GEMM refuses a width of 45 ("strides should be multiple of 16 bytes")."""
    src = save(tmp_path / "src", version)
    out = tmp_path / "out"
    run = gac(src, "--gpu", "h100", "--repair", out, "--strategy", "optimal")
    assert run.returncode == 0, run.stdout + run.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["moe_intermediate_size"], cfg["intermediate_size"]) == (48, 48)
    old, new = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    block = "model.layers.2.mlp"
    router = [f"{block}.gate.weight"] + [f"{block}.gate.e_score_correction_bias"] * (
        version == "v3")
    for name in router:
        assert torch.equal(new[name], old[name])
    for expert in ("experts.3", "shared_experts"):
        assert new[f"{block}.{expert}.up_proj.weight"][45:].abs().sum() == 0
        assert new[f"{block}.{expert}.down_proj.weight"][:, 45:].abs().sum() == 0
    cls = CLASSES[version][1]
    before = cls.from_pretrained(src, experts_implementation="eager").eval()
    after = cls.from_pretrained(out).eval()
    ids = torch.randint(0, 96, (3, 16), generator=torch.Generator().manual_seed(1))
    (ref, ref_route), (got, got_route) = _routes(before, ids), _routes(after, ids)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert len(ref_route) == 2
    assert_same_routing(list(ref_route), list(got_route), top_k=2)
    assert {s.value for s in gac_check.check(out, "h100").sites
            if s.role.value in ("expert_intermediate", "shared_expert_intermediate")} == {48}


def test_repair_leaves_experts_that_share_a_key_with_several_shared_experts(
        tmp_path: Path) -> None:
    """n_shared_experts 3: the shared experts are one MLP 3 x 45 = 135 wide, built from the
    same moe_intermediate_size as the routed experts, so no padding keeps both loadable: the
    expert widths are refused, saying why, and OUT (its dense layer padded) loads with equal
    logits."""
    src = save(tmp_path / "src", "v2", n_shared_experts=3)
    doc = check(src)
    shared = sites(doc, "shared_expert_intermediate")["model.layers.1.mlp.shared_experts:"
                                                       "intermediate"]
    assert shared["value"] == 135 and not shared["notes"]
    for site in [shared, *sites(doc, "expert_intermediate").values()]:
        assert site["exact_repair"] is False
        assert "only a checkpoint with n_shared_experts = 1" in site["refusal"]
    out = tmp_path / "out"
    run = gac(src, "--gpu", "h100", "--repair", out, "--strategy", "optimal")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "refused 10 sites" in run.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["moe_intermediate_size"], cfg["intermediate_size"]) == (45, 48)
    before = DeepseekV2ForCausalLM.from_pretrained(src, experts_implementation="eager").eval()
    after = DeepseekV2ForCausalLM.from_pretrained(out, experts_implementation="eager").eval()
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(2))
    ref, got = _routes(before, ids)[0], _routes(after, ids)[0]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def test_moe_sites_are_judged_on_a_target_as_for_mixtral(tmp_path: Path) -> None:
    """DeepSeek's routed experts are vLLM's FusedMoEFactory layer, as Mixtral's are: 45 wide
    they are refused at tp=2 (vllm-moe-tp) and fast on TritonExperts at tp=1; the shared
    experts are DeepseekV2MLP, a dense MLP (vllm-moe-shared-expert): 45 is refused at tp=2 by
    the column-parallel TP rule, fast at tp=1; the expert count is judged as Mixtral's
    (every expert on every rank without ep=). The dense first
    layer is not a per-layer pruned one: vLLM's DeepseekV2DecoderLayer builds it from
    intermediate_size and the MoE layers from moe_intermediate_size, so its site is judged as
    a dense model's MLP is, never refused."""
    doc = check(save(tmp_path / "m", "v2"), "--target", "vllm,tp=2", "--target", "vllm")
    for site in doc["sites"]:
        tp2, tp1 = site["targets"]
        if site["role"] in ("expert_intermediate", "shared_expert_intermediate"):
            assert tp2["verdict"] == "refused", site["name"]
        if site["role"] == "expert_intermediate":
            assert "MoE" in tp2["why"]
            assert (tp1["verdict"], tp1["kernel"]) == ("fast", "TritonExperts (fused_moe_kernel)")
        elif site["role"] == "shared_expert_intermediate":  # DeepseekV2MLP: a dense MLP
            assert "not divisible by the TP size" in tp2["why"], tp2["why"]
            assert (tp1["verdict"], tp1["kernel"]) == (
                "fast", "dense MLP (MergedColumnParallelLinear + RowParallelLinear)")
        elif site["role"] == "experts":
            assert tp1["verdict"] == tp2["verdict"] == "fast", site["name"]
    dense = sites(doc, "intermediate")["model.layers.0.mlp:intermediate"]["targets"][0]
    assert dense["verdict"] != "refused", dense["why"]
    assert doc["summary"]["targets"]["vllm,tp=2"]["verdict"] == "refused"


def test_uniform_refuses_experts_that_share_a_key_with_several_shared_experts(
        tmp_path: Path) -> None:
    """With n_shared_experts 3 no expert width is padded exactly (the one key builds the
    shared MLP too), so experts of different widths cannot be made one: --uniform refuses
    before writing rather than write experts still at two widths."""
    src = save(tmp_path / "src", "v2", n_shared_experts=3)
    path = src / "model.safetensors"
    state = load_file(path)
    expert = "model.layers.1.mlp.experts.1"
    for w in ("gate_proj", "up_proj"):
        state[f"{expert}.{w}.weight"] = state[f"{expert}.{w}.weight"][:40].contiguous()
    state[f"{expert}.down_proj.weight"] = state[f"{expert}.down_proj.weight"][:, :40].contiguous()
    save_file(state, path, metadata={"format": "pt"})
    out = tmp_path / "out"
    run = gac(src, "--gpu", "h100", "--repair", out, "--uniform")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--uniform: model.layers.1.mlp.experts.0:intermediate cannot be padded exactly " \
           "(DeepSeek builds its shared experts" in run.stderr, run.stderr
    assert not out.exists()
