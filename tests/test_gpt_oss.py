"""gpt-oss mixture of experts (gac_check/formats/gpt_oss.py): the fused experts transformers'
GptOssForCausalLM saves (gate and up interleaved in gate_up_proj), read one expert-width site
per layer and the expert count on the router; expert pruning and expert-width pruning made
on those real tensors; ``--repair`` pads the interleaved width and OUT loads in transformers'
class with equal logits; the released MXFP4 layout (experts as ``_blocks``/``_scales``) read
at its logical shapes, which transformers itself loads, and refused for --repair and vLLM."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from gac_check import api
from gac_check.api.memory import from_module
from gac_check.checkpoint.index import open_checkpoint
from tests import helpers
from tests.helpers import (
    assert_same_routing,
    check_json,
    rewrite_safetensors,
    save_pretrained,
    sites_by_role,
)

BLOCK = "model.layers.{}.mlp"
MODULES_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                         "model.embed_tokens", "lm_head"]


def _gpt_oss(width: int = 45, hidden: int = 32, experts: int = 4) -> transformers.GptOssForCausalLM:
    """A real tiny gpt-oss, every parameter drawn at a scale where the clamped SwiGLU, the
    biases and the attention sinks all matter (its own init zeroes the expert biases)."""
    cfg = transformers.GptOssConfig(vocab_size=96, hidden_size=hidden, intermediate_size=width,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8,
                                    num_local_experts=experts, num_experts_per_tok=2,
                                    max_position_embeddings=64, sliding_window=8)
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.3)
    return model


# ----------------------------------------------------------------------------- reading

def test_fused_experts_are_read_one_width_site_per_layer(tmp_path: Path) -> None:
    """save_pretrained writes gate_up_proj [E, hidden, 2I] (interleaved), its bias, down_proj
    [E, I, hidden], its bias and the router: one expert-width site per layer over gate_up's
    last axis (2 columns a unit), its bias and down's rows; the count over the router and the
    experts' leading axis; the attention sinks on the heads site; every tensor read."""
    root = save_pretrained(_gpt_oss(), tmp_path / "gpt-oss")
    with safe_open(root / "model.safetensors", "pt") as f:
        assert f.get_slice("model.layers.0.mlp.experts.gate_up_proj").get_shape() == [4, 32, 90]
        assert f.get_slice("model.layers.0.mlp.experts.down_proj").get_shape() == [4, 45, 32]
    doc = check_json(root)
    assert doc["summary"]["tensors"]["in_sites"] == doc["summary"]["tensors"]["read"] == 37
    assert sites_by_role(doc, "expert_intermediate") == {
        f"{BLOCK.format(i)}.experts:intermediate": 45 for i in range(2)}
    assert sites_by_role(doc, "experts") == {f"{BLOCK.format(i)}:experts": 4 for i in range(2)}
    site = next(s for s in doc["sites"] if s["role"] == "expert_intermediate")
    assert site["tensors"] == [f"model.layers.0.mlp.experts.{t}" for t in
                               ("down_proj", "gate_up_proj", "gate_up_proj_bias")]
    assert site["repair_to"] == 48 and not site["refusal"]
    count = next(s for s in doc["sites"] if s["role"] == "experts")
    assert "model.layers.0.mlp.router.weight" in count["tensors"]
    assert "zero expert would still be routed" in count["refusal"]
    heads = next(s for s in doc["sites"] if s["role"] == "heads")
    assert heads["tensors"] == ["model.layers.0.self_attn.sinks"]
    hidden = next(s for s in doc["sites"] if s["name"] == "hidden")
    assert {"model.layers.1.mlp.router.weight", "model.layers.1.mlp.experts.down_proj_bias",
            "model.layers.1.mlp.experts.gate_up_proj"} <= set(hidden["tensors"])


def _prune_experts(state: dict, keep: int) -> None:
    """REAP-style: the first ``keep`` experts of every layer, the router's rows with them."""
    for name in list(state):
        if ".mlp.experts." in name or ".mlp.router." in name:
            state[name] = state[name][:keep].contiguous()


def _prune_width(state: dict, layer: int, keep: int) -> None:
    """The first ``keep`` units of every expert of one layer: gate/up column pairs (2 per
    unit, interleaved), their biases, down's rows."""
    block = f"{BLOCK.format(layer)}.experts"
    state[f"{block}.gate_up_proj"] = state[f"{block}.gate_up_proj"][..., :2 * keep].contiguous()
    bias = f"{block}.gate_up_proj_bias"
    state[bias] = state[bias][:, :2 * keep].contiguous()
    state[f"{block}.down_proj"] = state[f"{block}.down_proj"][:, :keep].contiguous()


def test_expert_pruning_is_read_with_a_note(tmp_path: Path) -> None:
    """Expert 3 dropped from every layer with its router row: count 3, and config.json's 4
    a note with both values."""
    root = save_pretrained(_gpt_oss(48), tmp_path / "gpt-oss")
    rewrite_safetensors(root, lambda s: _prune_experts(s, 3))
    doc = check_json(root)
    counts = [s for s in doc["sites"] if s["role"] == "experts"]
    assert [s["value"] for s in counts] == [3, 3]
    assert "the config says num_local_experts=4, tensors have 3" in counts[0]["notes"]


def test_expert_width_pruning_gives_each_layer_its_width(tmp_path: Path) -> None:
    """Layer 0's experts cut from 48 to 40 units (interleaved pairs kept together): its site
    is 40, layer 1's 48, and config.json's one width a note on layer 0."""
    root = save_pretrained(_gpt_oss(48), tmp_path / "gpt-oss")
    rewrite_safetensors(root, lambda s: _prune_width(s, 0, 40))
    doc = check_json(root)
    widths = sites_by_role(doc, "expert_intermediate")
    assert widths == {f"{BLOCK.format(0)}.experts:intermediate": 40,
                      f"{BLOCK.format(1)}.experts:intermediate": 48}
    site = next(s for s in doc["sites"] if s["name"] == f"{BLOCK.format(0)}.experts:intermediate")
    assert "the config says intermediate_size=48, tensors have 40" in site["notes"]


@pytest.mark.parametrize("damage, message", [
    ("router", "model.layers.0.mlp.router routes to 4 experts over 32 inputs (bias [4]) but "
               "the layer has 3 experts"),
    ("layer 1 keeps 3", "the MoE layers keep different expert counts (layer 0: 4, layer 1: 3)"),
    ("odd gate_up", "has 89 gate/up columns, an odd number"),
    ("down", "model.layers.0.mlp.experts.down_proj is [4, 44, 32], but"),
    ("hidden", "model.layers.0.mlp.experts.gate_up_proj reads 30 inputs but the hidden size "
               "is 32"),
])
def test_a_layer_no_class_loads_is_refused(tmp_path: Path, damage: str, message: str) -> None:
    """Experts pruned without their router rows, layers of different counts, an odd fused
    gate/up, a down_proj whose width disagrees, experts reading another hidden size than
    the model's: one line, exit 2."""
    root = save_pretrained(_gpt_oss(), tmp_path / "gpt-oss")

    def edit(state: dict) -> None:
        block = f"{BLOCK.format(0)}.experts"
        if damage == "router":
            for name in [n for n in state if n.startswith(block + ".")]:
                state[name] = state[name][:3].contiguous()
        elif damage == "layer 1 keeps 3":
            for name in [n for n in state if n.startswith(BLOCK.format(1) + ".")]:
                state[name] = state[name][:3].contiguous()
        elif damage == "hidden":  # a layer's experts and router consistent, at 30 inputs
            for t in ("gate_up_proj", "down_proj", "down_proj_bias"):
                axis = {"gate_up_proj": 1, "down_proj": 2, "down_proj_bias": 1}[t]
                state[f"{block}.{t}"] = state[f"{block}.{t}"].narrow(axis, 0, 30).contiguous()
            router = f"{BLOCK.format(0)}.router.weight"
            state[router] = state[router][:, :30].contiguous()
        elif damage == "odd gate_up":
            state[f"{block}.gate_up_proj"] = state[f"{block}.gate_up_proj"][..., :89].contiguous()
        else:
            state[f"{block}.down_proj"] = state[f"{block}.down_proj"][:, :44].contiguous()

    rewrite_safetensors(root, edit)
    run = helpers.gac(root, "--gpu", "h100")
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    assert message in run.stderr and "\n" not in run.stderr.strip(), run.stderr


def test_a_model_in_memory_is_checked_as_its_saved_directory(tmp_path: Path) -> None:
    """transformers holds gpt-oss's experts as it saves them: the module's check finds the
    sites and reads the tensors its saved directory's check does."""
    model = _gpt_oss()
    in_memory = api.check(model, "h100")
    on_disk = api.check(save_pretrained(model, tmp_path / "gpt-oss"), "h100")
    assert ([(s.name, s.role, s.value) for s in in_memory.sites]
            == [(s.name, s.role, s.value) for s in on_disk.sites])
    assert in_memory.accounting.tensors == on_disk.accounting.tensors
    assert set(from_module(model).tensors) == set(open_checkpoint(tmp_path / "gpt-oss").tensors)
    assert in_memory.family == on_disk.family == "gpt_oss"


# ----------------------------------------------------------------------------- targets

def test_vllm_judges_the_bf16_expert_width_as_every_layout_s(tmp_path: Path) -> None:
    """vLLM v0.33.0 runs gpt-oss's unquantized experts (swigluoai: FlashInfer moved behind
    Triton) on TritonExperts: 45 is fast at tp=1 on sm90, refused at tp=2 by FusedMoEConfig's
    intermediate_size % tp_size (fix 46); the expert count, with no expert parallelism, is
    every expert on every rank (an even map)."""
    doc = check_json(save_pretrained(_gpt_oss(), tmp_path / "gpt-oss"), "--target", "vllm",
                "--target", "vllm,tp=2")
    width = next(s for s in doc["sites"] if s["role"] == "expert_intermediate")
    tp1, tp2 = width["targets"]
    assert (tp1["verdict"], tp1["kernel"]) == ("fast", "TritonExperts (fused_moe_kernel)")
    assert tp2["verdict"] == "refused" and "FusedMoEConfig asserts" in tp2["why"]
    assert tp2["fix_to"] == 46
    count = next(s for s in doc["sites"] if s["role"] == "experts")
    assert [(t["verdict"], t["kernel"]) for t in count["targets"]] == [
        ("fast", "even expert map (experts / ep per rank)")] * 2


# ----------------------------------------------------------------------------- repair

def test_padded_units_of_the_clamped_swiglu_contribute_nothing() -> None:
    """What the repair's exactness rests on, asked of transformers' own GptOssExperts: a unit
    whose gate and up columns and biases are zero gives (clamp(0) + 1) * 0 * sigmoid(0) = 0,
    at any input."""
    experts = _gpt_oss().model.layers[0].mlp.experts
    gate_up = torch.zeros(5, 6)
    gate_up[:, :2] = torch.randn(5, 2) * 10  # a real unit beside two zero (gate, up) pairs
    out = experts._apply_gate(gate_up)
    assert out[:, 1:].abs().sum() == 0 and out[:, 0].abs().sum() > 0


@pytest.mark.parametrize("pruned", [False, True])
def test_repair_pads_the_interleaved_expert_width_exactly(tmp_path: Path, pruned: bool) -> None:
    """CLI --repair --strategy optimal pads every layer's experts from 45 to 48 (with
    ``pruned``: a 48-wide model cut to 45 on disk, config.json left at 48, as a pruner leaves
    it): two zero columns per added unit at the end of gate_up_proj (gate and up stay paired),
    zero biases, zero down rows, the router the same bytes, intermediate_size 48; transformers'
    GptOssForCausalLM loads OUT with logits and router logits equal to the original's."""
    if pruned:
        src = save_pretrained(_gpt_oss(48), tmp_path / "src")
        rewrite_safetensors(src, lambda s: [_prune_width(s, i, 45) for i in range(2)])
        cfg = json.loads((src / "config.json").read_text())
        cfg["intermediate_size"] = 45  # what transformers needs to load the pruned original
        (src / "config.json").write_text(json.dumps(cfg))
    else:
        src = save_pretrained(_gpt_oss(), tmp_path / "src")
    out = tmp_path / "out"
    run = helpers.gac(src, "--gpu", "h100", "--repair", out, "--strategy", "optimal")
    assert run.returncode == 0, run.stdout + run.stderr
    before = transformers.GptOssForCausalLM.from_pretrained(
        src, experts_implementation="eager").eval()
    after = transformers.GptOssForCausalLM.from_pretrained(out).eval()
    assert after.config.intermediate_size == 48
    old, new = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    block = "model.layers.1.mlp"
    assert torch.equal(new[f"{block}.router.weight"], old[f"{block}.router.weight"])
    assert torch.equal(new[f"{block}.experts.gate_up_proj"][..., :90],
                       old[f"{block}.experts.gate_up_proj"])
    assert new[f"{block}.experts.gate_up_proj"][..., 90:].abs().sum() == 0
    assert new[f"{block}.experts.gate_up_proj_bias"][:, 90:].abs().sum() == 0
    assert new[f"{block}.experts.down_proj"][:, 45:].abs().sum() == 0
    ids = torch.randint(0, 96, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = before(ids, output_router_logits=True)
        got = after(ids, output_router_logits=True)
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-5,
                               atol=1e-5 * ref.logits.abs().max().item())
    assert_same_routing(list(ref.router_logits), list(got.router_logits), top_k=2)
    recheck = api.check(out, "h100")
    assert {s.value for s in recheck.sites if s.role.value == "expert_intermediate"} == {48}


# ----------------------------------------------------------------------------- MXFP4

def _mxfp4(src: Path, dst: Path) -> Path:
    """``src`` with its experts in the released MXFP4 layout: each X [E, K, N] stored as
    ``X_blocks`` uint8 [E, N, K/32, 16] and ``X_scales`` [E, N, K/32] (random FP4 codes and
    exponents near 1), and config.json's quantization_config as openai/gpt-oss-20b has it."""
    dst.mkdir()
    state = load_file(src / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, k, n = state.pop(name).shape
        state[name + "_blocks"] = torch.randint(0, 256, (e, n, k // 32, 16), dtype=torch.uint8,
                                                generator=gen)
        state[name + "_scales"] = torch.randint(122, 128, (e, n, k // 32), dtype=torch.uint8,
                                                generator=gen)
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4",
                                  "modules_to_not_convert": MODULES_NOT_CONVERTED}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_mxfp4_experts_are_read_at_the_shapes_transformers_loads(tmp_path: Path) -> None:
    """The released layout: transformers' GptOssForCausalLM loads it (dequantized on this
    CPU) with gate_up_proj [E, hidden, 2I]; gac-check reads the same sites, values and
    tensors as from the bf16 model, with the scales auxiliary and the scheme MXFP4."""
    bf16 = save_pretrained(_gpt_oss(96, hidden=64), tmp_path / "bf16")
    root = _mxfp4(bf16, tmp_path / "mxfp4")
    loaded = transformers.GptOssForCausalLM.from_pretrained(
        root, quantization_config=transformers.Mxfp4Config(dequantize=True))
    assert tuple(loaded.model.layers[0].mlp.experts.gate_up_proj.shape) == (4, 64, 192)
    assert tuple(loaded.model.layers[0].mlp.experts.down_proj.shape) == (4, 96, 64)
    doc, ref = check_json(root), check_json(bf16)
    assert ([(s["name"], s["value"], s["tensors"]) for s in doc["sites"]]
            == [(s["name"], s["value"], s["tensors"]) for s in ref["sites"]])
    tally = doc["summary"]["tensors"]
    assert (tally["read"], tally["in_sites"], tally["auxiliary"]) == (41, 37, 4)
    assert doc["quantization"]["method"] == "mxfp4"


#: the MXFP4 experts (96 wide) on vLLM v0.33.0, per GPU: the backend vLLM's own selection
#: takes (tests/test_targets_vllm_oracle.py's MXFP4 grid) and the width it pads each rank's
#: share to itself, so every width loads and a padded one is a fallback fixed at the next
#: width vLLM would not pad; gpt-oss's MLPBlock refuses a width the ep ranks do not divide
MXFP4_VLLM = {
    "h100": {"vllm": ("fallback", "OAI Triton MXFP4 experts (triton_kernels, padded by vLLM)",
                      128),
             "vllm,tp=3": ("fallback",
                           "OAI Triton MXFP4 experts (triton_kernels, padded by vLLM)", 192),
             "vllm,ep=5": ("refused", None, 320)},
    "a100": {"vllm": ("fallback", "MarlinExperts (MXFP4, padded by vLLM)", 128),
             "vllm,tp=3": ("fallback", "MarlinExperts (MXFP4, padded by vLLM)", 384),
             "vllm,ep=5": ("refused", None, 640)},
}


def test_mxfp4_is_refused_by_repair(tmp_path: Path) -> None:
    """--repair does not rewrite packed FP4 blocks (exit 2, nothing written)."""
    bf16 = save_pretrained(_gpt_oss(96, hidden=64), tmp_path / "bf16")
    root = _mxfp4(bf16, tmp_path / "mxfp4")
    out = tmp_path / "out"
    run = helpers.gac(root, "--gpu", "h100", "--repair", out)
    assert run.returncode == 2 and not out.exists(), run.stdout + run.stderr
    assert "mxfp4" in run.stderr and "does not rewrite packed weights" in run.stderr
    assert "quantization_config=Mxfp4Config()" in run.stderr


@pytest.mark.parametrize("gpu", sorted(MXFP4_VLLM))
def test_vllm_judges_mxfp4_experts_as_its_backend_pads_them(tmp_path: Path, gpu: str) -> None:
    """--target vllm judges an MXFP4 checkpoint as quant=mxfp4 (vllm-moe-mxfp4): the OAI
    Triton backend on an H100 pads each rank's width to 64, Marlin on an A100 to 128, so 96
    loads as a fallback (vLLM computes the zero padding on every step); with ep=5 gpt-oss's
    MLPBlock asserts intermediate_size % world_size. SGLang's pack has no MXFP4: refused as
    not judged, naming the engine."""
    bf16 = save_pretrained(_gpt_oss(96, hidden=64), tmp_path / "bf16")
    root = _mxfp4(bf16, tmp_path / "mxfp4")
    specs = MXFP4_VLLM[gpu]
    doc = check_json(root, "--gpu", gpu, *[a for s in specs for a in ("--target", s)])
    assert doc["summary"]["targets"]["vllm"]["quant"] == "mxfp4"
    site = next(s for s in doc["sites"] if s["role"] == "expert_intermediate")
    got = {t["target"]: t for t in site["targets"]}
    for spec, (verdict, kernel, fix_to) in specs.items():
        assert (got[spec]["verdict"], got[spec]["kernel"], got[spec]["fix_to"]) == (
            verdict, kernel, fix_to), (spec, got[spec])
        if verdict == "refused":
            assert got[spec]["why"].startswith("AssertionError: gpt-oss's MLPBlock")
            assert got[spec]["source"]["file"] == "vllm/model_executor/models/gpt_oss.py"
        else:
            assert got[spec]["source"]["function"].startswith(
                "mxfp4_round_up_hidden_size_and_intermediate_size")
    run = helpers.gac(root, "--gpu", gpu, "--target", "sglang")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "which the sglang rule pack does not model: not judged" in run.stderr


@pytest.mark.parametrize("damage, message", [
    ("scales", "model.layers.0.mlp.experts.down_proj_scales is uint8 [4, 64, 2]; "
               "model.layers.0.mlp.experts.down_proj_blocks [4, 64, 3, 16] needs"),
    ("bytes", "model.layers.0.mlp.experts.down_proj_blocks is uint8 [4, 64, 3, 8], not"),
    ("orphan", "model.layers.0.mlp.experts.down_proj_scales has no "
               "model.layers.0.mlp.experts.down_proj_blocks"),
    ("missing", "model.layers.0.mlp.experts.down_proj_scales is missing"),
])
def test_a_misshapen_mxfp4_layout_is_refused(tmp_path: Path, damage: str, message: str) -> None:
    bf16 = save_pretrained(_gpt_oss(96, hidden=64), tmp_path / "bf16")
    root = _mxfp4(bf16, tmp_path / "mxfp4")
    name = "model.layers.0.mlp.experts.down_proj"

    def edit(state: dict) -> None:
        if damage == "scales":
            state[name + "_scales"] = state[name + "_scales"][..., :2].contiguous()
        elif damage == "bytes":
            state[name + "_blocks"] = state[name + "_blocks"][..., :8].contiguous()
        elif damage == "missing":
            del state[name + "_scales"]
        else:
            del state[name + "_blocks"]

    rewrite_safetensors(root, edit)
    run = helpers.gac(root, "--gpu", "h100")
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    assert message in run.stderr, run.stderr


def test_uniform_pads_layers_of_different_expert_widths_to_one(tmp_path: Path) -> None:
    """gpt-oss's fused experts hold one width per layer, but layers can differ: layer 0 cut
    from 45 to 40 units loads on no class (GptOssForCausalLM builds every layer from one
    intermediate_size). CLI --repair --uniform --target vllm pads both layers to 48 (zero
    gate/up column pairs, biases and down rows; the router the same bytes) and
    transformers' class loads OUT with logits and router logits equal to the reference: the
    original in memory with layer 0's cut units zeroed, which computes what the cut
    checkpoint does (a unit whose down row is zero adds nothing)."""
    src = save_pretrained(_gpt_oss(), tmp_path / "src")
    reference = transformers.GptOssForCausalLM.from_pretrained(
        src, experts_implementation="eager").eval()
    experts = reference.model.layers[0].mlp.experts
    with torch.no_grad():
        experts.gate_up_proj[..., 80:] = 0
        experts.gate_up_proj_bias[:, 80:] = 0
        experts.down_proj[:, 40:] = 0
    rewrite_safetensors(src, lambda s: _prune_width(s, 0, 40))
    out = tmp_path / "out"
    run = helpers.gac(src, "--gpu", "h100", "--target", "vllm", "--repair", out, "--uniform")
    assert run.returncode == 0, run.stdout + run.stderr
    after = transformers.GptOssForCausalLM.from_pretrained(out).eval()
    assert after.config.intermediate_size == 48
    old, new = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    block = f"{BLOCK.format(0)}"
    assert torch.equal(new[f"{block}.router.weight"], old[f"{block}.router.weight"])
    assert new[f"{block}.experts.gate_up_proj"].shape[-1] == 96
    assert new[f"{block}.experts.gate_up_proj"][..., 80:].abs().sum() == 0
    assert new[f"{block}.experts.down_proj"][:, 40:].abs().sum() == 0
    ids = torch.randint(0, 96, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = reference(ids, output_router_logits=True)
        got = after(ids, output_router_logits=True)
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-5,
                               atol=1e-5 * ref.logits.abs().max().item())
    assert_same_routing(list(ref.router_logits), list(got.router_logits), top_k=2)
