"""Mixture-of-experts checkpoints (gac_check/formats/moe.py): Mixtral and Qwen2-MoE as
transformers' own classes save them, read expert by expert; expert pruning and expert-width
pruning made on those real tensors; ``--repair`` pads expert widths and OUT loads in
transformers' class with equal logits and equal routing."""
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
from gac_check.formats import detect
from tests import helpers, quantized_models
from tests.helpers import (
    assert_same_routing,
    check_json,
    rewrite_safetensors,
    save_pretrained,
    sites_by_role,
)

MIXTRAL_BLOCK = "model.layers.{}.block_sparse_moe"
QWEN_BLOCK = "model.layers.{}.mlp"


def _mixtral(width: int = 45, experts: int = 3,
             hidden: int = 32) -> transformers.MixtralForCausalLM:
    cfg = transformers.MixtralConfig(vocab_size=96, hidden_size=hidden, intermediate_size=width,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     num_key_value_heads=1, num_local_experts=experts,
                                     num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg).eval()


def _qwen2_moe(width: int = 45, shared: int = 44,
               dense_layers: tuple[int, ...] = ()) -> transformers.Qwen2MoeForCausalLM:
    """``dense_layers``: Qwen2-MoE's ``mlp_only_layers``, a dense MLP (60 wide) there."""
    cfg = transformers.Qwen2MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=60,
                                      mlp_only_layers=list(dense_layers),
                                      moe_intermediate_size=width,
                                      shared_expert_intermediate_size=shared,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, num_experts=3,
                                      num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(cfg).eval()


# ----------------------------------------------------------------------------- reading

def test_mixtral_experts_are_read_one_site_each(tmp_path: Path) -> None:
    """save_pretrained writes block_sparse_moe.experts.N.w1/w2/w3 and the router gate: each
    expert is an expert_intermediate site over its w1/w3 rows and w2 columns, each layer an
    experts site over the router's rows, and every tensor is read (none refused)."""
    root = save_pretrained(_mixtral(), tmp_path / "mixtral")
    with safe_open(root / "model.safetensors", "pt") as f:
        assert f.get_slice("model.layers.1.block_sparse_moe.experts.2.w2.weight").get_shape() \
            == [32, 45]
    doc = check_json(root)
    assert doc["summary"]["tensors"]["in_sites"] == doc["summary"]["tensors"]["read"]
    experts = sites_by_role(doc, "expert_intermediate")
    assert experts == {f"{MIXTRAL_BLOCK.format(i)}.experts.{e}:intermediate": 45
                       for i in range(2) for e in range(3)}
    assert sites_by_role(doc, "experts") == {f"{MIXTRAL_BLOCK.format(i)}:experts": 3
                                             for i in range(2)}
    site = next(s for s in doc["sites"] if s["name"].endswith("layers.0.block_sparse_moe."
                                                              "experts.1:intermediate"))
    assert site["tensors"] == sorted(f"model.layers.0.block_sparse_moe.experts.1.{w}.weight"
                                     for w in ("w1", "w2", "w3"))
    assert site["severity"] == "error" and site["repair_to"] == 48
    count = next(s for s in doc["sites"] if s["role"] == "experts")
    assert count["tensors"] == ["model.layers.0.block_sparse_moe.gate.weight"]
    assert count["refusal"] and "zero expert would still be routed" in count["refusal"]
    hidden = next(s for s in doc["sites"] if s["name"] == "hidden")
    assert {"model.layers.1.block_sparse_moe.gate.weight",
            "model.layers.1.block_sparse_moe.experts.2.w2.weight"} <= set(hidden["tensors"])


def test_qwen2_moe_experts_shared_expert_and_gates_are_read(tmp_path: Path) -> None:
    """Qwen2-MoE: mlp.experts.N.gate/up/down_proj, mlp.gate, the shared expert (its own
    width, 44: a warning) and its one-row gate, which sits on the hidden site."""
    root = save_pretrained(_qwen2_moe(), tmp_path / "qwen")
    doc = check_json(root)
    assert doc["summary"]["tensors"]["in_sites"] == doc["summary"]["tensors"]["read"]
    assert set(sites_by_role(doc, "expert_intermediate").values()) == {45}
    assert len(sites_by_role(doc, "expert_intermediate")) == 6
    assert sites_by_role(doc, "shared_expert_intermediate") == {
        f"{QWEN_BLOCK.format(i)}.shared_expert:intermediate": 44 for i in range(2)}
    hidden = next(s for s in doc["sites"] if s["name"] == "hidden")
    assert "model.layers.1.mlp.shared_expert_gate.weight" in hidden["tensors"]


PRUNED_EXPERT = "model.layers.0.block_sparse_moe.experts.1"


def _one_expert_pruned(root: Path) -> Path:
    """A Mixtral whose experts are 48 wide but expert 1 of layer 0, pruned to 40 (its real
    rows and columns kept)."""
    root = save_pretrained(_mixtral(48), root)

    def prune(state: dict) -> None:
        b = PRUNED_EXPERT
        for w in ("w1", "w3"):
            state[f"{b}.{w}.weight"] = state[f"{b}.{w}.weight"][:40].contiguous()
        state[f"{b}.w2.weight"] = state[f"{b}.w2.weight"][:, :40].contiguous()

    rewrite_safetensors(root, prune)
    return root


def test_expert_width_pruning_gives_each_expert_its_own_site(tmp_path: Path) -> None:
    """Experts pruned to different widths: each expert's site has its own value, and
    config.json's one width is a note on the expert it does not describe."""
    block = PRUNED_EXPERT
    doc = check_json(_one_expert_pruned(tmp_path / "mixtral"))
    experts = sites_by_role(doc, "expert_intermediate")
    assert experts[f"{block}:intermediate"] == 40
    assert sorted(experts.values()) == [40] + [48] * 5
    site = next(s for s in doc["sites"] if s["name"] == f"{block}:intermediate")
    assert "the config says intermediate_size=48, tensors have 40" in site["notes"]


def test_experts_of_different_widths_load_on_no_fused_moe_class(tmp_path: Path) -> None:
    """A fused-MoE layer holds its experts as one tensor of one width (vLLM v0.33.0 and
    SGLang v0.5.23 UnquantizedFusedMoEMethod.create_weights, transformers v5.24.0
    MixtralExperts), so an expert pruned to its own width loads nowhere; before, each expert
    was judged alone and vLLM said the model loads."""
    doc = check_json(_one_expert_pruned(tmp_path / "mixtral"), "--gpu", "h100",
                "--target", "vllm", "--target", "sglang", "--target", "transformers")
    loads = {spec: t["load"] for spec, t in doc["summary"]["targets"].items()}
    files = {"vllm": "vllm/model_executor/layers/fused_moe/unquantized_fused_moe_method.py",
             "sglang": "python/sglang/srt/layers/quantization/unquant.py",
             "transformers": "src/transformers/models/mixtral/modeling_mixtral.py"}
    for spec, load in loads.items():
        assert not load["loads"] and load["blocker"] == "layers", (spec, load)
        assert load["why"].startswith(
            "the routed experts differ in width (layer 0: 48, 40; layer 1: 48)")
        assert load["source"]["file"] == files[spec]
        assert load["remedy"].startswith("pad every routed expert of every layer to the widest "
                                         "(--repair OUT --uniform"), load["remedy"]


def test_expert_pruning_the_same_in_every_layer_is_read_with_a_note(tmp_path: Path) -> None:
    """REAP-style pruning drops expert 2 of every layer and its router row; a config.json
    left at 3 is a note with both values: the tensors win."""
    root = save_pretrained(_mixtral(48), tmp_path / "mixtral")

    def drop_last_expert(state: dict) -> None:
        for i in range(2):
            block = MIXTRAL_BLOCK.format(i)
            for w in ("w1", "w2", "w3"):
                del state[f"{block}.experts.2.{w}.weight"]
            state[f"{block}.gate.weight"] = state[f"{block}.gate.weight"][:2].contiguous()

    rewrite_safetensors(root, drop_last_expert)
    doc = check_json(root)
    counts = [s for s in doc["sites"] if s["role"] == "experts"]
    assert [s["value"] for s in counts] == [2, 2]
    assert "the config says num_local_experts=3, tensors have 2" in counts[0]["notes"]


@pytest.mark.parametrize("damage, message", [
    ("layer 1 keeps 2", "the MoE layers keep different expert counts (layer 0: 3, layer 1: 2)"),
    ("router", "model.layers.0.block_sparse_moe.gate routes to 2 experts but the layer has 3"),
    ("gap", "model.layers.1.block_sparse_moe has experts [0, 2]: the indices must run 0..E-1"),
])
def test_an_expert_count_no_moe_class_loads_is_refused(tmp_path: Path, damage: str,
                                                       message: str) -> None:
    """Layers with different expert counts, a router whose rows were not pruned with its
    experts, or expert indices with a gap: one line, exit 2, naming the layer."""
    root = save_pretrained(_mixtral(48), tmp_path / "mixtral")

    def edit(state: dict) -> None:
        if damage == "router":
            name = "model.layers.0.block_sparse_moe.gate.weight"
            state[name] = state[name][:2].contiguous()
            return
        block = MIXTRAL_BLOCK.format(1)
        gone = 2 if damage == "layer 1 keeps 2" else 1
        for w in ("w1", "w2", "w3"):
            del state[f"{block}.experts.{gone}.{w}.weight"]
        state[f"{block}.gate.weight"] = state[f"{block}.gate.weight"][:2].contiguous()

    rewrite_safetensors(root, edit)
    run = helpers.gac(root, "--gpu", "h100")
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    assert message in run.stderr and "\n" not in run.stderr.strip(), run.stderr


def test_a_model_in_memory_is_checked_as_its_saved_directory(tmp_path: Path) -> None:
    """transformers holds the experts fused (experts.gate_up_proj [E, 2I, H]); the check of
    the module indexes them under the names save_pretrained writes, so it finds the sites
    its saved directory has."""
    model = _qwen2_moe()
    assert "model.layers.0.mlp.experts.gate_up_proj" in model.state_dict()
    in_memory = api.check(model, "h100")
    on_disk = api.check(save_pretrained(model, tmp_path / "qwen"), "h100")
    assert ([(s.name, s.role, s.value) for s in in_memory.sites]
            == [(s.name, s.role, s.value) for s in on_disk.sites])
    assert in_memory.accounting.tensors == on_disk.accounting.tensors
    assert set(from_module(model).tensors) == set(open_checkpoint(tmp_path / "qwen").tensors)


def test_fused_experts_on_disk_are_still_refused(tmp_path: Path) -> None:
    """Mixtral's 3-D fused expert tensors written as transformers holds them
    (experts.gate_up_proj [E, 2I, H], gate and up concatenated, routed by mlp.gate) are a
    layout this reader does not know: refused as unread, never passed (gpt-oss's own fused
    layout, with mlp.router, is read: tests/test_gpt_oss.py)."""
    model = _mixtral(48)
    root = tmp_path / "fused"
    root.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    model.config.to_json_file(root / "config.json")
    run = helpers.gac(root, "--gpu", "h100")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "gac-check did not read, first model.layers.0.mlp.experts.down_proj" in run.stderr


def test_the_text_output_folds_experts_of_one_width_into_one_row(tmp_path: Path) -> None:
    """Six expert sites of width 45 over two layers are one row of the table (a 64-expert
    model would otherwise print 64 rows a layer)."""
    run = helpers.gac(save_pretrained(_qwen2_moe(), tmp_path / "qwen"), "--gpu", "h100")
    assert run.returncode == 1, run.stderr
    rows = [line for line in run.stdout.splitlines() if "experts.*:intermediate" in line]
    assert len(rows) == 1 and " 0-1 " in rows[0] and " 45 " in rows[0], run.stdout


# ----------------------------------------------------------------------------- targets

def test_targets_refuse_moe_sites_as_not_judged(tmp_path: Path) -> None:
    """Where no pack rule models the fused-MoE kernels (SGLang v0.4.6.post5; vLLM with INT8),
    every MoE site is refused on the target, saying so, and the model's verdict is refused,
    never fast; on unquantized vLLM the expert count is judged (every expert on every
    rank)."""
    root = save_pretrained(_mixtral(48), tmp_path / "mixtral")
    doc = check_json(root, "--target", "sglang@v0.4.6.post5,tp=2,quant=awq", "--target",
                "vllm,tp=2,quant=int8", "--target", "vllm,tp=2")
    for site in doc["sites"]:
        sglang, fp8, vllm = site["targets"]
        if site["role"] in ("expert_intermediate", "experts"):
            for verdict, engine in ((sglang, "sglang"), (fp8, "vllm")):
                assert verdict["verdict"] == "refused"
                assert verdict["why"].startswith(f"not judged for MoE: {engine}'s fused-MoE")
        else:
            assert sglang["verdict"] != "refused" or "MoE" not in sglang["why"]
        if site["role"] == "experts":
            assert (vllm["verdict"], vllm["kernel"]) == (
                "fast", "even expert map (experts / ep per rank)")
    for spec in ("sglang@v0.4.6.post5,tp=2,quant=awq", "vllm,tp=2,quant=int8"):
        assert doc["summary"]["targets"][spec]["verdict"] == "refused"
    assert doc["summary"]["targets"]["vllm,tp=2"]["verdict"] == "fast"
    out = tmp_path / "out"
    run = helpers.gac(root, "--gpu", "h100", "--repair", out, "--target", "vllm,tp=2,quant=int8")
    assert run.returncode == 2 and not out.exists(), run.stdout + run.stderr
    assert "vllm,tp=2,quant=int8 would still refuse OUT" in run.stderr
    assert "not judged for MoE" in run.stderr


def test_sglang_runs_unquantized_experts_on_triton(tmp_path: Path) -> None:
    """SGLang v0.5.23: FusedMoE.__init__ asserts intermediate_size % moe_tp_size == 0, so 45
    is refused at tp=2 (fix_to 46) and loads at tp=3; UnquantizedFusedMoEMethod runs the
    Triton fused_moe_kernel on sm80/sm90, which masks K and N: fast at any width that loads.
    Every expert on every rank (the count is fast); v0.4.6.post5 was not read: not judged."""
    root = save_pretrained(_mixtral(45), tmp_path / "mixtral")
    specs = ("sglang", "sglang,tp=2", "sglang,tp=3", "sglang@v0.4.6.post5")
    doc = check_json(root, *[a for s in specs for a in ("--target", s)])
    width = {s: _verdict(doc, "expert_intermediate", s) for s in specs}
    for spec in ("sglang", "sglang,tp=3"):
        assert (width[spec]["verdict"], width[spec]["kernel"]) == (
            "fast", "fused_moe_kernel (Triton)"), width[spec]
        assert width[spec]["source"]["ref"] == "v0.5.23"
    refused = width["sglang,tp=2"]
    assert refused["verdict"] == "refused" and refused["fix_to"] == 46
    assert "FusedMoE asserts intermediate_size % moe_tp_size == 0" in refused["why"]
    assert refused["source"]["file"] == "python/sglang/srt/layers/moe/fused_moe_triton/layer.py"
    assert width["sglang@v0.4.6.post5"]["why"].startswith("not judged for MoE")
    assert _verdict(doc, "experts", "sglang,tp=2")["verdict"] == "fast"


def test_vllm_refuses_an_expert_width_tp_does_not_divide(tmp_path: Path) -> None:
    """vLLM v0.33.0's FusedMoEConfig asserts intermediate_size % tp_size == 0 (the pack's
    vllm-moe-tp, cited): experts 45 wide are refused at tp=2 with that reason and source, and
    46 (the smallest width tp=2 divides, which the Triton kernel runs) is the fix; on v0.30.0
    (a release neither rule was read for) they are refused only as not judged."""
    root = save_pretrained(_mixtral(45), tmp_path / "mixtral")
    doc = check_json(root, "--target", "vllm,tp=2", "--target", "vllm@v0.30.0,tp=2")
    expert = next(s for s in doc["sites"] if s["role"] == "expert_intermediate")
    tp2, old = expert["targets"]
    assert tp2["verdict"] == "refused"
    assert "FusedMoEConfig asserts intermediate_size % tp_size == 0" in tp2["why"]
    assert tp2["source"]["function"] == "FusedMoEConfig.__post_init__"
    assert tp2["source"]["ref"] == "v0.33.0"
    assert [u["rule"] for u in tp2["uses"] if u["verdict"] == "refused"] == ["vllm-moe-tp"]
    assert tp2["fix_to"] == 46
    assert old["verdict"] == "refused" and old["why"].startswith("not judged for MoE")


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_vllm_runs_unquantized_experts_on_triton(tmp_path: Path, family: str) -> None:
    """vLLM v0.33.0 picks TritonExperts for an unquantized MoE layer on sm80 and sm90
    (select_unquantized_moe_backend: FlashInfer's kernels need sm100, or sm90 where they are
    moved behind Triton), and fused_moe_kernel masks K and N, so an expert width of 45 is
    fast there at tp=1 and 3 (45 / 3 = 15 per rank), with the rule's source and its caveat
    (tuned block sizes not modelled). With no GPU, nothing read runs it: refused. Qwen2-MoE's
    shared expert is Qwen2MoeMLP, a dense MLP (vllm-moe-shared-expert): 44 is fast at tp=1 and
    refused at tp=3 by the column-parallel TP rule; the expert count (no expert parallelism:
    every expert on every rank) is fast."""
    make = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe}[family]
    root = save_pretrained(make(45), tmp_path / family)
    doc = check_json(root, "--target", "vllm", "--target", "vllm,tp=3")
    expert = next(s for s in doc["sites"] if s["role"] == "expert_intermediate")
    for verdict in expert["targets"]:
        assert verdict["verdict"] == "fast", verdict
        assert verdict["kernel"] == "TritonExperts (fused_moe_kernel)"
        assert verdict["source"] == {
            "repo": "vllm-project/vllm", "ref": "v0.33.0",
            "file": "vllm/model_executor/layers/fused_moe/oracle/unquantized.py",
            "function": "select_unquantized_moe_backend"}
        assert any("tuned file" in u for u in verdict["uncertain"])
    for site in doc["sites"]:
        if site["role"] == "shared_expert_intermediate":  # Qwen2MoeMLP: a dense MLP of 44
            tp1, tp3 = site["targets"]
            assert (tp1["verdict"], tp1["kernel"]) == (
                "fast", "dense MLP (MergedColumnParallelLinear + RowParallelLinear)"), tp1
            assert tp3["verdict"] == "refused" and "TP size" in tp3["why"], tp3
        if site["role"] == "experts":
            assert site["targets"][0]["verdict"] == "fast", site["name"]
    a100 = helpers.gac(root, "--gpu", "a100", "--format", "json", "--target", "vllm")
    sites = json.loads(a100.stdout)["sites"]
    on_a100 = next(s for s in sites if s["role"] == "expert_intermediate")["targets"][0]
    assert (on_a100["verdict"], on_a100["kernel"]) == ("fast", verdict["kernel"])
    cpu = helpers.gac(root, "--gpu", "cpu", "--format", "json", "--target", "vllm")
    sites = json.loads(cpu.stdout)["sites"]
    on_cpu = next(s for s in sites if s["role"] == "expert_intermediate")["targets"][0]
    assert on_cpu["verdict"] == "refused" and "read for sm80 and sm90 only" in on_cpu["why"]


def _verdict(doc: dict, role: str, spec: str) -> dict:
    """The first ``role`` site's verdict on ``spec``."""
    site = next(s for s in doc["sites"] if s["role"] == role)
    return next(t for t in site["targets"] if t["target"] == spec)


def test_expert_parallel_holds_whole_experts_and_divides_the_count(tmp_path: Path) -> None:
    """vLLM v0.33.0 with --enable-expert-parallel (ep=): FusedMoEParallelConfig.make sets the
    MoE layer's tp_size to 1, so experts 45 wide, refused at tp=2, load whole on each of the 2
    ranks (TritonExperts); determine_expert_map spreads 4 experts evenly over 2 ranks (fast)
    and unevenly over 3 (the first rank holds 2: a fallback, with why and the EPLB caveat)."""
    root = save_pretrained(_mixtral(45, experts=4), tmp_path / "mixtral")
    doc = check_json(root, "--target", "vllm,tp=2", "--target", "vllm,tp=2,ep=2",
                "--target", "vllm,ep=3")
    width = {spec: _verdict(doc, "expert_intermediate", spec)
             for spec in ("vllm,tp=2", "vllm,tp=2,ep=2", "vllm,ep=3")}
    assert width["vllm,tp=2"]["verdict"] == "refused"
    for spec in ("vllm,tp=2,ep=2", "vllm,ep=3"):
        assert (width[spec]["verdict"], width[spec]["kernel"]) == (
            "fast", "TritonExperts (fused_moe_kernel)"), width[spec]
        assert width[spec]["uses"][0]["expert_shard"] == 45
    count = {spec: _verdict(doc, "experts", spec) for spec in width}
    assert count["vllm,tp=2,ep=2"]["verdict"] == "fast"
    assert count["vllm,tp=2,ep=2"]["uses"][0]["ep"] == 2
    uneven = count["vllm,ep=3"]
    assert (uneven["verdict"], uneven["kernel"]) == ("fallback", "expert map, uneven")
    assert "experts % ep == 0 (experts = 4)" in uneven["why"]
    assert "EPLB" in uneven["why"] and uneven["fix_to"] is None
    assert uneven["source"]["function"] == "determine_expert_map"
    resolved = doc["summary"]["targets"]["vllm,tp=2,ep=2"]
    assert (resolved["tp"], resolved["ep"]) == (2, 2)


def test_sglang_awq_and_gptq_moe_kernels(tmp_path: Path) -> None:
    """SGLang v0.5.23 quantized experts (group 128, h100): AWQ goes to the Marlin MoE kernel
    where check_moe_marlin_supports_layer holds (width % max(64, group)), else falls back to
    MoeWNA16Method, whose group halving asserts group >= 32 (width 48: refused); GPTQ always
    goes to GPTQMarlinMoEMethod (no fallback), whose repack asserts the down K % 16."""
    specs = ("sglang,quant=awq", "sglang,quant=gptq")
    verdicts = {}
    for width in (128, 96, 48, 40):
        doc = check_json(save_pretrained(_mixtral(width, experts=4), tmp_path / str(width)),
                    *[a for s in specs for a in ("--target", s)])
        for spec in specs:
            verdicts[width, spec] = _verdict(doc, "expert_intermediate", spec)
            count = _verdict(doc, "experts", spec)
            assert (count["verdict"], count["kernel"]) == ("fast", "every expert on every rank")
    short = {k: (v["verdict"], v["kernel"], v["fix_to"]) for k, v in verdicts.items()}
    assert short == {
        (128, "sglang,quant=awq"): ("fast", "fused_marlin_moe (AWQ Marlin MoE)", 128),
        (128, "sglang,quant=gptq"): ("fast", "fused_marlin_moe (GPTQ Marlin MoE)", 128),
        (96, "sglang,quant=awq"): ("fallback", "MoeWNA16Method (Triton fused_moe_kernel, int4)",
                                   128),
        (96, "sglang,quant=gptq"): ("refused", None, 128),
        (48, "sglang,quant=awq"): ("refused", None, 128),
        (48, "sglang,quant=gptq"): ("refused", None, 128),
        (40, "sglang,quant=awq"): ("refused", None, 128),
        (40, "sglang,quant=gptq"): ("refused", None, 128)}
    assert "group_size >= 32" in verdicts[48, "sglang,quant=awq"]["why"]
    # at group 64 the Marlin MoE tile (64) is what 96 misses, not the group
    g64 = _verdict(check_json(tmp_path / "96", "--target", "sglang,quant=awq,group=64"),
                   "expert_intermediate", "sglang,quant=awq,group=64")
    assert (g64["verdict"], g64["fix_to"]) == ("fallback", 128)
    assert "expert_shard % 64 == 0 (expert_shard = 96)" in g64["why"]
    assert verdicts[96, "sglang,quant=awq"]["source"]["function"].startswith(
        "AWQMarlinConfig.get_quant_method")
    def rules(width: int) -> set[str]:  # the rules that refuse it: the repack gate at 40 only
        return {u["rule"] for u in verdicts[width, "sglang,quant=gptq"]["uses"]
                if u["verdict"] == "refused"}

    assert rules(40) == {"sglang-moe-gptq-load", "sglang-moe-gptq"}
    assert rules(48) == {"sglang-moe-gptq"}


def test_sglang_expert_parallel_splits_the_tp_ranks(tmp_path: Path) -> None:
    """SGLang v0.5.23's --ep-size splits the TP ranks into ep groups (derive_parallel_widths:
    moe_tp_size = tp / ep), unlike vLLM's: experts 45 wide load at tp=2,ep=2 and tp=4,ep=4
    (moe_tp 1) but not at tp=4,ep=2 (moe_tp 2: FusedMoE's assertion); the expert count must
    divide by ep (FusedMoE asserts it: refused, no uneven map as in vLLM)."""
    specs = ("sglang,tp=2,ep=2", "sglang,tp=4,ep=4", "sglang,tp=4,ep=2")
    doc = check_json(save_pretrained(_mixtral(45, experts=4), tmp_path / "four"),
                *[a for s in specs for a in ("--target", s)])
    for spec in specs[:2]:
        width = _verdict(doc, "expert_intermediate", spec)
        assert (width["verdict"], width["kernel"]) == ("fast", "fused_moe_kernel (Triton)"), width
        count = _verdict(doc, "experts", spec)
        assert (count["verdict"], count["kernel"]) == ("fast", "experts / ep per rank"), count
    split = _verdict(doc, "expert_intermediate", "sglang,tp=4,ep=2")
    assert split["verdict"] == "refused" and "moe_tp_size" in split["why"], split
    assert split["fix_to"] == 46  # 46 / moe_tp 2; at moe_tp 1 (vLLM's ep) 45 would load
    assert doc["summary"]["targets"]["sglang,tp=4,ep=2"]["ep"] == 2
    three = check_json(save_pretrained(_mixtral(48, experts=3), tmp_path / "three"),
                  "--target", "sglang,tp=2,ep=2")
    count = _verdict(three, "experts", "sglang,tp=2,ep=2")
    assert count["verdict"] == "refused" and "num_experts % ep_size" in count["why"], count
    assert count["source"]["function"].startswith("FusedMoE.__init__")


@pytest.mark.parametrize(("spec", "said"), [
    ("vllm,tp=2,ep=3", "ep=3 is not a multiple of tp=2"),
    ("sglang,tp=4,ep=3", "ep=3 does not divide tp=4"),
    ("sglang,ep=2", "ep=2 does not divide tp=1"),
    ("transformers,ep=2", "transformers has no expert parallelism in its rule pack"),
    ("vllm,ep=0", "ep= must be a positive integer"),
])
def test_an_expert_parallel_size_no_engine_runs_is_bad_input(tmp_path: Path, spec: str,
                                                              said: str) -> None:
    """ep is tp x the data-parallel size in vLLM and a divisor of tp in SGLang; an engine whose
    pack has no expert parallelism takes no ep=: one line, exit 2."""
    root = save_pretrained(_mixtral(48), tmp_path / "mixtral")
    run = helpers.gac(root, "--target", spec)
    assert run.returncode == 2, run.stdout + run.stderr
    assert said in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_a_shared_expert_no_moe_rule_judges_is_refused(tmp_path: Path) -> None:
    """SGLang's pack judges Qwen2-MoE's shared expert nowhere (no rule says it is a dense MLP
    there): with AWQ its dense linear rules would speak (a kernel for gate_up and down), but a
    dense rule alone does not make an MoE site judged: refused as not judged; on vLLM the
    shared-expert rule makes the same linears' verdict its verdict."""
    root = save_pretrained(_qwen2_moe(width=128, shared=128), tmp_path / "qwen")
    doc = check_json(root, "--target", "sglang,quant=awq", "--target", "vllm,quant=awq")
    sglang = _verdict(doc, "shared_expert_intermediate", "sglang,quant=awq")
    assert sglang["verdict"] == "refused", sglang
    assert sglang["why"].startswith("not judged for MoE: sglang's fused-MoE"), sglang["why"]
    vllm = _verdict(doc, "shared_expert_intermediate", "vllm,quant=awq")
    assert (vllm["verdict"], vllm["kernel"]) == (
        "fast", "machete+dense MLP (MergedColumnParallelLinear + RowParallelLinear)"), vllm


#: width -> (group -> (a100 verdict, kernel)): AWQ/GPTQ MoE on vLLM v0.33.0 at tp=1
WNA16_A100 = {
    128: {32: ("fast", "MarlinExperts"), 64: ("fast", "MarlinExperts")},
    96: {32: ("fallback", "MarlinExperts (tile-padded)"),
         64: ("fallback", "TritonWNA16Experts (MoeWNA16Method)")},
    80: {32: ("refused", None), 64: ("refused", None)},
}


@pytest.mark.parametrize("width", sorted(WNA16_A100))
def test_vllm_judges_awq_and_gptq_experts_on_marlin_moe(tmp_path: Path, width: int) -> None:
    """quant=gptq / awq MoE on vLLM v0.33.0: check_moe_marlin_supports_layer (with tile
    padding) takes a group that divides the width per rank, and MarlinExperts (sm80) runs it,
    fast where the width is a multiple of 64, else tile-padded (marlin_moe_padded_intermediate);
    a straddled group goes to MoeWNA16Method (Triton), whose create_weights halves the group
    and asserts >= 32: 80 is refused (fix_to the smallest fast width, 128)."""
    root = save_pretrained(_mixtral(width, experts=4, hidden=128), tmp_path / "mixtral")
    specs = [f"vllm,quant={q},group={g}" for q in ("gptq", "awq") for g in (32, 64)]
    run = helpers.gac(root, "--gpu", "a100", "--format", "json",
                      *[a for s in specs for a in ("--target", s)])
    assert run.returncode in (0, 1), run.stderr
    doc = json.loads(run.stdout)
    for spec in specs:
        got = _verdict(doc, "expert_intermediate", spec)
        want = WNA16_A100[width][int(spec.rsplit("=", 1)[1])]
        assert (got["verdict"], got["kernel"]) == want, (spec, got)
        if want[0] == "refused":
            assert got["why"].startswith("MoeWNA16Method.create_weights refuses it "
                                         "(AssertionError")
            assert got["fix_to"] == 128
        if want[1] == "MarlinExperts (tile-padded)":
            assert "it pads expert_shard 96 -> 128" in got["why"]


def test_hopper_runs_wna16_experts_on_humming(tmp_path: Path) -> None:
    """prioritize_humming moves Humming ahead of Marlin on sm90, in the MoE backend list too
    (select_wna16_moe_backend): on an H100 the Marlin MoE route runs HummingExperts, fast at a
    width per rank % 64 (128), else a fallback (32 per rank at tp=4; Humming's own limits
    marked uncertain), and so does MoeWNA16Method where the group straddles (64 at tp=4)."""
    root = save_pretrained(_mixtral(128, experts=4, hidden=128), tmp_path / "mixtral")
    specs = ("vllm,quant=gptq,group=32", "vllm,quant=gptq,group=32,tp=4",
             "vllm,quant=gptq,group=64,tp=4")
    doc = check_json(root, *[a for s in specs for a in ("--target", s)])
    got = [_verdict(doc, "expert_intermediate", s) for s in specs]
    assert [(g["verdict"], g["kernel"]) for g in got] == [
        ("fast", "HummingExperts"), ("fallback", "HummingExperts"),
        ("fallback", "HummingExperts (MoeWNA16Method)")], got
    assert any("Humming's own limits" in u for u in got[1]["uncertain"])
    assert got[0]["source"]["function"].startswith("prioritize_humming")


@pytest.mark.parametrize(("scheme", "quant", "group", "whole"), [
    ("gptq", "gptq", 64, "TritonWNA16Experts (MoeWNA16Method)"),
    ("ct_w4a16", "wna16", 64, None),  # whole experts of 96: the group 64 still straddles
    ("awq", "awq", 32, "MarlinExperts (tile-padded)"),
])
def test_a_quantized_moe_checkpoint_is_judged_with_its_own_scheme(
        tmp_path: Path, scheme: str, quant: str, group: int, whole: str | None) -> None:
    """A Mixtral quantized as GPTQModel, AutoAWQ or llm-compressor (pack-quantized W4A16)
    write an MoE (experts and attention packed, router dense) is read at its logical widths
    and judged as vLLM deploys it (its scheme, its group), never as unquantized nor refused
    as unread: 96 at tp=2 leaves 48 per rank, which the group (64; AWQ, which needs whole
    groups, 32) straddles and MoeWNA16's halved group does not divide either: refused,
    exactly as the prediction for the unquantized model says; with ep=2 each rank holds
    whole experts (96: Triton after a straddled Marlin route at group 64, Marlin padding its
    tiles at 32)."""
    src = save_pretrained(_mixtral(96, experts=4, hidden=128), tmp_path / "src")
    root = quantized_models.quantized_moe(tmp_path / scheme, src, scheme, group=group)
    doc = check_json(root, "--gpu", "a100", "--target", "vllm,tp=2", "--target", "vllm,tp=2,ep=2")
    assert doc["summary"]["targets"]["vllm,tp=2"]["quant"] == quant
    assert doc["summary"]["targets"]["vllm,tp=2"]["group"] == group
    experts = [s for s in doc["sites"] if s["role"] == "expert_intermediate"]
    assert len(experts) == 8 and {s["value"] for s in experts} == {96}
    tp2 = _verdict(doc, "expert_intermediate", "vllm,tp=2")
    # compressed-tensors' own WNA16 MoE method checks the group per rank itself (vLLM
    # v0.33.0 CompressedTensorsWNA16MoEMethod); GPTQ and AWQ fall to MoeWNA16Method's assert
    refuser = "CompressedTensors WNA16 MoE" if quant == "wna16" else "MoeWNA16Method"
    assert tp2["verdict"] == "refused" and refuser in tp2["why"], tp2["why"]
    assert tp2["fix_to"] == 128
    ep2 = _verdict(doc, "expert_intermediate", "vllm,tp=2,ep=2")
    assert (ep2["verdict"], ep2["kernel"]) == (("fallback", whole) if whole else ("refused", None))
    spec = f"vllm,tp=2,quant={quant},group={group}"
    predicted = _verdict(check_json(src, "--gpu", "a100", "--target", spec), "expert_intermediate",
                         spec)
    assert (predicted["verdict"], predicted["why"]) == (tp2["verdict"], tp2["why"])


#: an FP8 Mixtral (experts 128 wide) on vLLM v0.33.0, per GPU and target, as
#: tests/test_targets_vllm_oracle.py's FP8 MoE grid found vLLM's own code choosing:
#: per-tensor/channel FP8 runs weight-only on MarlinExperts below sm89 (tile-padding a width
#: per rank that 64 does not divide) and on TritonExperts on sm90; 128x128 block FP8 loads
#: only whole blocks per rank (validate_fp8_block_shape_moe) and, under expert parallelism on
#: sm90, runs FlashInfer CUTLASS
FP8_MOE = {
    "ct_fp8": {
        "a100": {"vllm": ("fast", "MarlinExperts (FP8 weight-only)"),
                 "vllm,tp=4": ("fallback", "MarlinExperts (FP8 weight-only, tile-padded)"),
                 "vllm,tp=2,ep=2": ("fast", "MarlinExperts (FP8 weight-only)")},
        "h100": {"vllm": ("fast", "TritonExperts (fused_moe_kernel)"),
                 "vllm,tp=4": ("fast", "TritonExperts (fused_moe_kernel)"),
                 "vllm,tp=2,ep=2": ("fast", "TritonExperts (fused_moe_kernel)")}},
    "fp8_block": {
        "a100": {"vllm": ("fast", "MarlinExperts (FP8 weight-only)"),
                 "vllm,tp=4": ("refused", None),
                 "vllm,tp=2,ep=2": ("fast", "MarlinExperts (FP8 weight-only)")},
        # vLLM's own block FP8 refines its scale blocks to gcd(128, 32, 128) = 32 on sm89+
        # (refine_fp8_moe_block_shape) and runs them on TritonExperts
        "h100": {"vllm": ("fast", "TritonExperts (fused_moe_kernel)"),
                 "vllm,tp=4": ("fast", "TritonExperts (fused_moe_kernel)"),
                 "vllm,tp=2,ep=2": ("fast", "FlashInferExperts (FlashInfer CUTLASS)")}},
}


@pytest.mark.parametrize(("scheme", "quant"), [("ct_fp8", "fp8"), ("fp8_block", "fp8_block")])
@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_an_fp8_moe_checkpoint_is_judged_with_its_own_scheme(
        tmp_path: Path, scheme: str, quant: str, gpu: str) -> None:
    """A Mixtral quantized as llm-compressor's FP8_DYNAMIC (float8 experts, a scale per
    channel) or as DeepSeek's 128x128 block FP8 writes it is judged as vLLM deploys that
    scheme, never refused as not judged: its kernel per GPU, and for block FP8 the refusal of
    a width per rank (32 at tp=4) that holds no whole 128 block, fixed at 512."""
    src = save_pretrained(_mixtral(128, experts=4, hidden=128), tmp_path / "src")
    root = quantized_models.quantized_moe(tmp_path / scheme, src, scheme)
    specs = FP8_MOE[scheme][gpu]
    doc = check_json(root, "--gpu", gpu, *[a for s in specs for a in ("--target", s)])
    assert doc["summary"]["targets"]["vllm"]["quant"] == quant
    for spec, want in specs.items():
        got = _verdict(doc, "expert_intermediate", spec)
        assert (got["verdict"], got["kernel"]) == want, (spec, got)
        assert not got["why"].startswith("not judged"), got
        if want[0] == "refused":
            assert got["why"].startswith("ValueError: The output_size of gate's and up's")
            assert got["fix_to"] == 512
        if want[0] == "fallback":
            assert "it pads expert_shard 32 -> 64" in got["why"], got["why"]
        count = _verdict(doc, "experts", spec)
        assert (count["verdict"], count["kernel"]) == ("fast", "even expert map (experts / "
                                                       "ep per rank)"), count


# ----------------------------------------------------------------------------- repair

def _logits(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list]:
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    return out.logits, list(out.router_logits)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen2_moe-dense-layer-0"])
def test_repair_pads_expert_widths_exactly(tmp_path: Path, family: str) -> None:
    """CLI --repair --strategy optimal pads every expert (and Qwen's shared expert) from 45
    (44) to 48, and a dense layer's MLP (Qwen's mlp_only_layers) from 60 to 64 beside them:
    the padded rows of gate/up and columns of down are zero, the router is the
    same bytes, and transformers' own class loads OUT with logits and router logits equal to
    the original's. The original runs with the eager experts: transformers' default grouped
    GEMM refuses an expert width of 45 ("strides should be multiple of 16 bytes")."""
    make = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe,
            "qwen2_moe-dense-layer-0": lambda: _qwen2_moe(dense_layers=(0,))}[family]
    src = save_pretrained(make(), tmp_path / "src")
    out = tmp_path / "out"
    run = helpers.gac(src, "--gpu", "h100", "--repair", out, "--strategy", "optimal")
    assert run.returncode == 0, run.stdout + run.stderr
    cls = type(make())
    before = cls.from_pretrained(src, experts_implementation="eager").eval()
    after = cls.from_pretrained(out).eval()
    key = "intermediate_size" if family == "mixtral" else "moe_intermediate_size"
    assert getattr(after.config, key) == 48
    if family != "mixtral":
        assert after.config.shared_expert_intermediate_size == 48
        assert after.config.intermediate_size == (64 if "dense" in family else 60)
    old, new = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    block = "model.layers.1.block_sparse_moe" if family == "mixtral" else "model.layers.1.mlp"
    gate, down = (("w1", "w2") if family == "mixtral" else ("gate_proj", "down_proj"))
    assert torch.equal(new[f"{block}.gate.weight"], old[f"{block}.gate.weight"])
    assert new[f"{block}.experts.2.{gate}.weight"][45:].abs().sum() == 0
    assert new[f"{block}.experts.2.{down}.weight"][:, 45:].abs().sum() == 0
    ids = torch.randint(0, 96, (3, 16), generator=torch.Generator().manual_seed(1))
    (ref, ref_route), (got, got_route) = _logits(before, ids), _logits(after, ids)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert_same_routing(list(ref_route), list(got_route), top_k=2)
    recheck = api.check(out, "h100")
    assert {s.value for s in recheck.sites if s.role.value == "expert_intermediate"} == {48}
    assert detect(open_checkpoint(out)).name == "dense"


#: (layer, expert, width kept) per family: experts of one layer, and layers, at different widths
UNEVEN = ((0, 1, 40), (1, 2, 37))


def _unevenly_pruned(family: str, root: Path) -> tuple[torch.nn.Module, Path]:
    """A model (experts 45 wide) whose UNEVEN experts are pruned to their own widths, saved
    with their kept rows and columns only, and the reference it is measured against: the
    same model in memory with the pruned rows of gate/up and columns of down set to zero,
    which computes what the pruned checkpoint does (a dropped unit's act(0) · 0 = 0 added
    nothing) and which transformers' own fused class runs (eager: 45 is no grouped-GEMM
    width)."""
    model = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe}[family]()
    block = MIXTRAL_BLOCK if family == "mixtral" else QWEN_BLOCK
    gate, up, down = ("w1", "w3", "w2") if family == "mixtral" else (
        "gate_proj", "up_proj", "down_proj")
    save_pretrained(model, root)
    reference = type(model).from_pretrained(root, experts_implementation="eager").eval()
    state = reference.state_dict()  # fused in memory: mlp.experts.gate_up_proj [E, 2I, H]
    with torch.no_grad():
        for layer, expert, kept in UNEVEN:
            experts = f"{QWEN_BLOCK.format(layer)}.experts"
            gate_up, down_proj = state[f"{experts}.gate_up_proj"], state[f"{experts}.down_proj"]
            width = down_proj.shape[-1]
            gate_up[expert, kept:width] = 0
            gate_up[expert, width + kept:] = 0
            down_proj[expert, :, kept:] = 0

    def prune(saved: dict) -> None:
        for layer, expert, kept in UNEVEN:
            name = f"{block.format(layer)}.experts.{expert}"
            for w in (gate, up):
                saved[f"{name}.{w}.weight"] = saved[f"{name}.{w}.weight"][:kept].contiguous()
            saved[f"{name}.{down}.weight"] = saved[f"{name}.{down}.weight"][:, :kept].contiguous()

    rewrite_safetensors(root, prune)
    return reference, root


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_uniform_pads_experts_of_different_widths_to_one(tmp_path: Path, family: str) -> None:
    """Experts pruned to 40 and 37 beside experts of 45 load on no fused-MoE class; CLI
    --repair --uniform --target vllm pads every routed expert of every layer to 48 (the
    widest, aligned) with zero gate/up rows and down columns, leaves the router the same
    bytes and records 48 in config.json's expert width, so transformers' own class loads OUT
    from_pretrained with logits and router logits equal to the pruned model's."""
    reference, src = _unevenly_pruned(family, tmp_path / "src")
    out = tmp_path / "out"
    run = helpers.gac(src, "--gpu", "h100", "--target", "vllm", "--repair", out, "--uniform")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "every routed expert padded to 48" in run.stdout
    cls = type(reference)
    with pytest.raises(RuntimeError, match="automatic conversion of the weights"):
        cls.from_pretrained(src)  # one tensor per layer cannot stack experts of three widths
    after = cls.from_pretrained(out).eval()
    key = "intermediate_size" if family == "mixtral" else "moe_intermediate_size"
    assert getattr(after.config, key) == 48
    old, new = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    block = MIXTRAL_BLOCK if family == "mixtral" else QWEN_BLOCK
    gate, down = ("w1", "w2") if family == "mixtral" else ("gate_proj", "down_proj")
    for layer, expert, kept in UNEVEN:
        name = f"{block.format(layer)}.experts.{expert}"
        assert new[f"{name}.{gate}.weight"].shape[0] == 48
        assert torch.equal(new[f"{name}.{gate}.weight"][:kept], old[f"{name}.{gate}.weight"])
        assert new[f"{name}.{gate}.weight"][kept:].abs().sum() == 0
        assert new[f"{name}.{down}.weight"][:, kept:].abs().sum() == 0
        router = f"{block.format(layer)}.gate.weight"
        assert torch.equal(new[router], old[router])
    ids = torch.randint(0, 96, (3, 16), generator=torch.Generator().manual_seed(1))
    (ref, ref_route), (got, got_route) = _logits(reference, ids), _logits(after, ids)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert_same_routing(list(ref_route), list(got_route), top_k=2)
    doc = check_json(out, "--target", "vllm")
    assert doc["summary"]["targets"]["vllm"]["load"]["loads"]
    assert set(sites_by_role(doc, "expert_intermediate").values()) == {48}


def test_repair_for_a_fused_moe_target_offers_uniform_with_its_cost(tmp_path: Path) -> None:
    """Without --uniform, --repair --target vllm of experts at different widths is refused
    before anything is written, pointing at --uniform and what it adds: every expert of both
    layers to 48 (4 experts from 45, one from 40, one from 37; 3 · 32 parameters a unit)."""
    _, src = _unevenly_pruned("mixtral", tmp_path / "src")
    out = tmp_path / "out"
    run = helpers.gac(src, "--gpu", "h100", "--target", "vllm", "--repair", out)
    assert run.returncode == 2, run.stdout + run.stderr
    added = (4 * 3 + 8 + 11) * 3 * 32
    assert f"add --uniform to pad every routed expert of every layer to the widest (to 48: " \
           f"+{added:,} parameters" in run.stderr, run.stderr
    assert not out.exists()


def test_vllm_int8_and_static_fp8_moe_are_judged_by_their_scheme_names(tmp_path: Path) -> None:
    """Planned without a checkpoint: dynamic per-token INT8 experts run on TritonExperts,
    static per-tensor INT8 has no MoE method in vLLM v0.33.0 (refused), and compressed-tensors
    FP8 with static activation scales runs FlashInfer CUTLASS on an H100; ``quant=int8`` alone
    stays not judged."""
    root = save_pretrained(_mixtral(48), tmp_path / "mixtral")
    specs = ("vllm,tp=2,quant=int8_dynamic", "vllm,tp=2,quant=int8_static",
             "vllm,tp=2,quant=fp8_static", "vllm,tp=2,quant=int8")
    doc = check_json(root, *(a for s in specs for a in ("--target", s)))
    widths = [s for s in doc["sites"] if s["role"] == "expert_intermediate"]
    assert widths
    for site in widths:
        dynamic, static, fp8, coarse = site["targets"]
        assert (dynamic["verdict"], dynamic["kernel"]) == (
            "fast", "TritonExperts (fused_moe_kernel, INT8 W8A8)")
        assert static["verdict"] == "refused" and "Unsupported FusedMoe scheme" in static["why"]
        assert fp8["kernel"] == "FlashInferExperts (FlashInfer CUTLASS)", fp8
        assert coarse["verdict"] == "refused" and coarse["why"].startswith("not judged for MoE")
