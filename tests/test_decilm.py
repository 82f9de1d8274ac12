"""DeciLM / Nemotron-NAS ``block_configs`` checkpoints (issue 30, item 1): each layer's sites
from its own tensors, no-op and linear-replacement blocks accounted, tensors over config, the
engines' DeciLM classes judged per layer, everything not understood refused.

The checkpoints are written by tests/decilm_models.py: real safetensors with random weights
(tiny) or a header and a hole (realistic widths, header-only checks). The block semantics they
follow are vLLM v0.33.0's vllm/model_executor/models/nemotron_nas.py (DeciLMDecoderLayer,
_ffn_mult_to_intermediate_size) and the HF checkpoint keys of the linear replacements
(``self_attn.linear_attn``, ``mlp.linear_mlp``).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gac_check
from gac_check.sites import Role
from gac_check.targets.blocks import ffn_mult_for, ffn_width
from tests.decilm_models import (
    LINEAR,
    NO_OP,
    attention,
    block,
    decilm_model,
    explicit_ffn,
    ffn,
    modelopt_attention,
    write_decilm,
)
from tests.helpers import assert_padding_exact, gac, tree_digest

#: One of each kind of layer: full/full, no-op attention, linear FFN, linear attention with no
#: FFN, and a layer with no tensors at all.
MIXED = [block(attention(2), ffn(2.0)), block(NO_OP, ffn(1.3)), block(attention(4), LINEAR),
         block(LINEAR, NO_OP), block(NO_OP, NO_OP)]


def _sites(result) -> dict[str, object]:
    return {s.name: s for s in result.sites}


def test_ffn_width_is_the_engines_rounding() -> None:
    # int(2 * ffn_mult * hidden / 3) rounded up to 256: Nemotron-Super-49B's hidden 8192 at
    # ffn_mult 2.625 builds 14336; 1.3 at 256 builds int(221.86) = 221 -> 256
    assert ffn_width(2.625, 8192) == 14336
    assert ffn_width(1.3, 256) == 256
    assert ffn_width(5.25, 6144) == 21504
    assert ffn_width(0.95, 4096) == 2816  # int(2593.8) = 2593: up to 2816, not 128's 2688
    # the hub's config class keeps round(ffn_mult, 6): 0.0000964 is read as 0.000096, which
    # builds 256 at hidden 4,000,000 (0.0000964 itself would build int(257.07) -> 512)
    assert ffn_width(0.0000964, 4_000_000) == 256


def test_each_layer_has_its_own_sites_and_every_tensor_is_read(tmp_path: Path) -> None:
    """Per-layer MLP widths and KV heads from each layer's tensors; no site for a no-op
    block; the linear replacements' hidden x hidden weights on the hidden site's axes."""
    root = write_decilm(tmp_path / "m", MIXED)
    result = gac_check.check(root, gpu="h100")
    sites = _sites(result)
    assert result.format.name == "decilm"
    inter = {s.layer: s.value for s in result.sites if s.role is Role.INTERMEDIATE}
    assert inter == {0: 512, 1: 256}  # ffn_mult 2.0 and 1.3 at hidden 256
    kv = {s.layer: s.attrs["kv_heads"] for s in result.sites if s.role is Role.HEADS}
    assert kv == {0: 2, 2: 1}  # 4 heads // n_heads_in_group 2 and 4
    hidden = sites["hidden"]
    for name in ("model.layers.2.mlp.linear_mlp.weight",
                 "model.layers.3.self_attn.linear_attn.weight"):
        assert {(a.tensor, a.axis) for a in hidden.axes} >= {(name, 0), (name, 1)}
    tally = result.accounting.tensors
    assert tally.read == tally.in_sites == 25
    assert not any(n.startswith("model.layers.4.") for n in result.checkpoint.tensors)
    assert not hidden.notes  # config and tensors agree: nothing to note


def test_block_configs_are_parsed_once_per_check(tmp_path: Path) -> None:
    """The targets' blocks are the ones read with the sites, not a second parse; another
    checkpoint gets its own."""
    result = gac_check.check(write_decilm(tmp_path / "m", MIXED, sparse=True), gpu="h100")
    fmt, ckpt = result.format, result.checkpoint
    assert fmt.blocks(ckpt) is fmt.blocks(ckpt)
    other = gac_check.check(write_decilm(tmp_path / "n", MIXED[:2], sparse=True), gpu="h100")
    assert len(fmt.blocks(other.checkpoint)) == 2 and len(fmt.blocks(ckpt)) == 5


def test_tensors_win_and_a_contradiction_is_a_note_with_both_values(tmp_path: Path) -> None:
    blocks = [block(attention(2), ffn(2.0)), block(NO_OP, ffn(1.3)), block(NO_OP, NO_OP)]
    root = write_decilm(tmp_path / "m", blocks, widths={0: {"intermediate": 300, "kv_heads": 4}})
    result = gac_check.check(root, gpu="h100", target=["vllm"])
    sites = _sites(result)
    mlp, heads = sites["model.layers.0.mlp:intermediate"], sites["model.layers.0.self_attn:heads"]
    assert mlp.value == 300 and heads.attrs["kv_heads"] == 4
    assert mlp.notes == ["layer 0 ffn: block_configs' ffn_mult=2 builds an MLP of 512, the "
                         "tensors have 300"]
    assert heads.notes == ["layer 0 attention: block_configs' n_heads_in_group gives 2 KV "
                           "heads, the tensors have 4"]
    load = result.contract.targets.loads["vllm"]
    assert not load.loads and "ffn_mult=2 builds an MLP of 512" in load.why


# ModelOpt's Puzzletron writes the width itself: FFNConfig.intermediate_size
# (modelopt/torch/puzzletron/decilm/deci_lm_hf_code/block_config.py), no ffn_mult. vLLM v0.33.0's
# DeciLMDecoderLayer builds it as given (the else of ``hasattr(block_config.ffn, "ffn_mult")``),
# never rounded up to 256.
EXPLICIT = [block(attention(2), explicit_ffn(300)), block(NO_OP, explicit_ffn(512, 2.0)),
            {**block(attention(4), explicit_ffn(304)), "parallel_blocks": None}]


def test_an_explicit_intermediate_size_is_the_width_vllm_builds(tmp_path: Path) -> None:
    root = write_decilm(tmp_path / "m", EXPLICIT)
    result = gac_check.check(root, gpu="h100", target=["vllm"])
    mlp = {s.layer: s for s in result.sites if s.role is Role.INTERMEDIATE}
    assert {i: s.value for i, s in mlp.items()} == {0: 300, 1: 512, 2: 304}
    assert not any(s.notes for s in mlp.values())
    load = result.contract.targets.loads["vllm"]
    assert load.loads and load.why.endswith(
        "layer 0: attention with 2 KV heads, MLP 300 (intermediate_size); layer 1: no "
        "attention, MLP 512 (ffn_mult 2); layer 2: attention with 1 KV head, MLP 304 "
        "(intermediate_size)")
    # SGLang v0.5.23's DeciLMDecoderLayer reads block_config.ffn.ffn_mult for every full FFN;
    # vLLM before v0.33.0 was not read for it
    result = gac_check.check(root, gpu="h100", target=["sglang", "vllm@v0.30.0"])
    loads = result.contract.targets.loads
    assert not loads["sglang"].loads and loads["sglang"].why == (
        "the FFN of layer 0, layer 2 is recorded by intermediate_size alone (ModelOpt "
        "Puzzletron's FFNConfig), and sglang v0.5.23's DeciLMForCausalLM builds every full FFN "
        "from its ffn_mult, never from intermediate_size: building the layer fails")
    assert not loads["vllm@v0.30.0"].loads
    assert "was not read to build a full FFN from intermediate_size (read at v0.33.0)" in loads[
        "vllm@v0.30.0"].why
    before = tree_digest(root)
    run = gac(root, "--gpu", "h100", "--repair", tmp_path / "out", "--target", "sglang")
    assert run.returncode == 2 and "sglang would still refuse OUT" in run.stderr
    assert not (tmp_path / "out").exists() and tree_digest(root) == before


def test_an_intermediate_size_the_tensors_contradict_is_a_note_with_both_values(
        tmp_path: Path) -> None:
    root = write_decilm(tmp_path / "m", EXPLICIT, widths={0: {"intermediate": 320},
                                                         1: {"intermediate": 512}},
                        config=lambda c: {**c, "block_configs": [
                            c["block_configs"][0],
                            block(NO_OP, explicit_ffn(512, 1.0)), c["block_configs"][2]]})
    result = gac_check.check(root, gpu="h100", target=["vllm"])
    mlp = {s.layer: s for s in result.sites if s.role is Role.INTERMEDIATE}
    assert mlp[0].value == 320 and mlp[0].notes == [
        "layer 0 ffn: block_configs' intermediate_size=300, the tensors have 320"]
    # ffn_mult 1.0 builds 256 while its intermediate_size says 512, the tensors' width
    assert mlp[1].notes == ["layer 1 ffn: block_configs' ffn_mult=1 builds an MLP of 256, the "
                            "tensors have 512"]
    load = result.contract.targets.loads["vllm"]
    assert not load.loads and "intermediate_size=300, the tensors have 320" in load.why


def test_repair_writes_the_padded_width_into_intermediate_size(tmp_path: Path) -> None:
    """Layer 0's 300 (its intermediate_size says 300) is padded to the contract's width, not
    to a multiple of 256 (vLLM builds an intermediate_size as given); layer 1's entry has both,
    ffn_mult 1.0 building 256 under tensors of 200: padded to 256, intermediate_size 200 -> 256
    and ffn_mult kept; the model built from OUT's block_configs alone computes the same."""
    blocks = [block(attention(2), explicit_ffn(300)), block(NO_OP, explicit_ffn(200, 1.0)),
              block(attention(4), explicit_ffn(256))]
    root = write_decilm(tmp_path / "m", blocks, widths={1: {"intermediate": 200}})
    before = tree_digest(root)
    out = tmp_path / "out"
    run = gac(root, "--gpu", "h100", "--repair", out, "--target", "vllm")
    assert run.returncode == 0, run.stderr
    assert tree_digest(root) == before
    report = json.loads((out / "gac-repair.json").read_text())
    padded = {r["name"]: (r["from"], r["to"]) for r in report["repaired"]}
    to = 304  # the contract's width (--gpu h100, minimal), not rounded up to 512
    assert padded == {"model.layers.0.mlp:intermediate": (300, to),
                      "model.layers.1.mlp:intermediate": (200, 256)}
    assert sorted((c["field"], c["from"], c["to"]) for c in report["config_changes"]) == [
        (["block_configs", 0, "ffn", "intermediate_size"], 300, to),
        (["block_configs", 1, "ffn", "intermediate_size"], 200, 256)]
    cfg = json.loads((out / "config.json").read_text())
    assert [b["ffn"]["intermediate_size"] for b in cfg["block_configs"]] == [to, 256, 256]
    assert cfg["block_configs"][1]["ffn"]["ffn_mult"] == 1.0
    ids = torch.randint(0, 512, (2, 11), generator=torch.Generator().manual_seed(30))
    with torch.no_grad():
        want = decilm_model(root, {1: 200})(ids)
        got = decilm_model(out)(ids)  # widths from OUT's block_configs only
    assert_padding_exact(got, want)
    load = _json(out, "--gpu", "h100", "--target", "vllm")["summary"]["targets"]["vllm"]["load"]
    assert load["loads"], load


#: Blocks as ModelOpt's Puzzletron writes them (every dataclass field, parallel_blocks null).
MODELOPT = [{**block(modelopt_attention(2), explicit_ffn(300)), "parallel_blocks": None},
            {**block(modelopt_attention(None, no_op=True), explicit_ffn(256)),
             "parallel_blocks": None}]


def test_a_modelopt_entry_is_read_but_no_engine_builds_its_attention(tmp_path: Path) -> None:
    """ModelOpt's AttentionConfig records num_key_value_heads, no n_heads_in_group, which is
    what vLLM v0.33.0's and SGLang v0.5.23's DeciLMDecoderLayer divide by: both refuse; the
    check reads the layer's KV heads, and a contradiction is a note with both values; --repair
    pads the MLP and the model built from OUT's config computes the same."""
    root = write_decilm(tmp_path / "m", MODELOPT)
    result = gac_check.check(root, gpu="h100", target=["vllm", "sglang"])
    sites = _sites(result)
    assert sites["model.layers.0.self_attn:heads"].attrs["kv_heads"] == 2
    assert not any(n for s in result.sites for n in s.notes)
    for engine in ("vllm", "sglang"):
        load = result.contract.targets.loads[engine]
        assert not load.loads and load.why.startswith(
            "the attention of layer 0 is recorded by num_key_value_heads alone")
    other = write_decilm(tmp_path / "n", MODELOPT, widths={0: {"kv_heads": 4}})
    assert _sites(gac_check.check(other, gpu="h100"))["model.layers.0.self_attn:heads"].notes == [
        "layer 0 attention: block_configs' num_key_value_heads=2, the tensors have 4"]
    run = gac(root, "--gpu", "h100", "--repair", tmp_path / "vllm", "--target", "vllm")
    assert run.returncode == 2 and "vllm would still refuse OUT" in run.stderr
    assert not (tmp_path / "vllm").exists()
    run = gac(root, "--gpu", "h100", "--repair", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["block_configs"][0]["ffn"]["intermediate_size"] == 304
    assert cfg["block_configs"][0]["attention"] == MODELOPT[0]["attention"]
    ids = torch.randint(0, 512, (2, 11), generator=torch.Generator().manual_seed(30))
    with torch.no_grad():
        assert_padding_exact(decilm_model(tmp_path / "out")(ids), decilm_model(root)(ids))


def test_a_block_the_tensors_contradict_is_read_from_the_tensors(tmp_path: Path) -> None:
    """block_configs says layer 1's attention is a no-op; its tensors are a full attention."""
    blocks = [block(attention(2), ffn(2.0)), block(NO_OP, ffn(2.0))]
    full = [block(attention(2), ffn(2.0))] * 2
    root = write_decilm(tmp_path / "m", full, config=lambda c: {**c, "block_configs": blocks})
    result = gac_check.check(root, gpu="h100", target=["vllm"])
    sites = _sites(result)
    assert "model.layers.1.self_attn:heads" in sites
    assert sites["hidden"].notes == ["layer 1 attention: block_configs says no_op, the tensors "
                                     "have full"]
    assert "says no_op, the tensors have full" in result.contract.targets.loads["vllm"].why


def test_a_norm_in_a_no_op_block_is_a_contradiction(tmp_path: Path) -> None:
    """vLLM builds no norm for a no-op block, so a stored one names no parameter."""
    blocks = [block(attention(2), ffn(2.0)), block(NO_OP, ffn(2.0))]
    root = write_decilm(tmp_path / "m", blocks, tensors=lambda s: {
        **s, "model.layers.1.input_layernorm.weight": [256]})
    result = gac_check.check(root, gpu="h100", target=["vllm"])
    assert result.accounting.tensors.read == result.accounting.tensors.in_sites
    assert _sites(result)["hidden"].notes == [
        "layer 1 attention: block_configs says no_op, the tensors have its input_layernorm"]
    assert not result.contract.targets.loads["vllm"].loads


def _json(*args: object) -> dict:
    run = gac(*args, "--format", "json", "--fail-on", "never")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


#: Realistic widths (hidden 6144, 48 heads of 128): layer 0 groups 8 heads per KV head (6 KV
#: heads), layer 2 groups 16 (3 KV heads); MLPs 8192, 5376 and 21504 from ffn_mult.
WIDE = [block(attention(8), ffn(2.0)), block(NO_OP, ffn(1.3)), block(attention(16), ffn(5.25)),
        block(NO_OP, NO_OP)]


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_decilm(tmp_path_factory.mktemp("decilm") / "wide", WIDE, hidden=6144,
                        heads=48, vocab=128256, sparse=True)


def test_vllm_loads_per_layer_widths_and_judges_each_layers_kv_heads(wide: Path) -> None:
    """vLLM's DeciLM class builds each layer from its block config: different MLP widths
    load; at tp=8 layer 0's 6 and layer 2's 3 KV heads are refused, each for its own count,
    and at tp=2 layer 2's 3 KV heads alone."""
    doc = _json(wide, "--gpu", "h100", "--target", "vllm,tp=2", "--target", "sglang")
    load = doc["summary"]["targets"]["vllm,tp=2"]["load"]
    assert load["loads"] and load["source"]["file"] == "vllm/model_executor/models/nemotron_nas.py"
    assert load["why"] == (
        "vllm's DeciLMForCausalLM builds each layer from its own block config: layer 0: "
        "attention with 6 KV heads, MLP 8192 (ffn_mult 2); layer 1: no attention, MLP 5376 "
        "(ffn_mult 1.3); layer 2: attention with 3 KV heads, MLP 21504 (ffn_mult 5.25); "
        "layer 3: no attention, no MLP")
    verdict = {(s["name"], t["target"]): t["verdict"] for s in doc["sites"] for t in s["targets"]}
    assert verdict[("model.layers.0.self_attn:heads", "vllm,tp=2")] == "fast"
    assert verdict[("model.layers.2.self_attn:heads", "vllm,tp=2")] == "refused"
    for layer in (0, 1, 2):  # per-layer MLP widths load on both classes
        for target in ("vllm,tp=2", "sglang"):
            assert verdict[(f"model.layers.{layer}.mlp:intermediate", target)] == "fast"
    doc = _json(wide, "--gpu", "h100", "--target", "vllm,tp=8")
    refused = {s["layer"] for s in doc["sites"] if s["role"] == "heads"
               and s["targets"][0]["verdict"] == "refused"}
    assert refused == {0, 2}


def test_a_super_49b_shaped_model_checks_from_its_headers(tmp_path: Path) -> None:
    """80 layers at hidden 8192 (a header and a hole, ~100 GB of holes): the targets block
    says what vLLM builds once per distinct layer, with the layers that have it."""
    blocks = ([block(attention(8), ffn(2.625))] * 40 + [block(NO_OP, ffn(1.3))] * 20
              + [block(attention(64), ffn(5.25))] * 19 + [block(NO_OP, NO_OP)])
    root = write_decilm(tmp_path / "m", blocks, hidden=8192, heads=64, vocab=128256,
                        sparse=True)
    doc = _json(root, "--gpu", "h100", "--target", "vllm,tp=8")
    assert doc["summary"]["misaligned"] == 0
    assert doc["summary"]["targets"]["vllm,tp=8"]["load"]["why"].endswith(
        "layers 0-39: attention with 8 KV heads, MLP 14336 (ffn_mult 2.625); layers 40-59: no "
        "attention, MLP 7168 (ffn_mult 1.3); layers 60-78: attention with 1 KV head, MLP "
        "28672 (ffn_mult 5.25); layer 79: no attention, no MLP")
    assert doc["summary"]["targets"]["vllm,tp=8"]["verdict"] == "fast"


def test_engines_without_a_block_configs_class_refuse_it(wide: Path) -> None:
    doc = _json(wide, "--gpu", "h100", "--target", "vllm@v0.6.3.post1", "--target",
                "transformers", "--target", "sglang@v0.4.6.post5")
    loads = {spec: t["load"] for spec, t in doc["summary"]["targets"].items()}
    assert all(not load["loads"] and load["blocker"] == "architecture"
               for load in loads.values())
    assert loads["vllm@v0.6.3.post1"]["source"]["file"] == "vllm/model_executor/models/decilm.py"
    assert "no model class for block_configs" in loads["transformers"]["why"]


@pytest.mark.parametrize("target", ["tensorrt-llm", "llama.cpp,quant=Q4_K_M"])
def test_an_engine_whose_deci_support_was_not_read_is_not_judged(wide: Path,
                                                                 target: str) -> None:
    run = gac(wide, "--gpu", "h100", "--target", target)
    assert run.returncode == 2 and not run.stdout
    assert "cannot say whether it loads this block_configs" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_linear_replacement_does_not_load_on_vllm(tmp_path: Path) -> None:
    root = write_decilm(tmp_path / "m", MIXED)
    doc = _json(root, "--gpu", "h100", "--target", "vllm", "--target", "sglang")
    for spec in ("vllm", "sglang"):
        load = doc["summary"]["targets"][spec]["load"]
        assert not load["loads"] and load["blocker"] == "layers"
        assert "not the linear replacement of layer 2 ffn, layer 3 attention" in load["why"]


def test_per_layer_widths_under_a_llama_class_are_still_refused(tmp_path: Path) -> None:
    """The same per-layer widths without block_configs: vLLM's Llama needs one width."""
    root = write_decilm(tmp_path / "m", WIDE[:3], hidden=6144, heads=48, vocab=1024,
                        sparse=True, tensors=lambda s: s,
                        config=lambda c: {**{k: v for k, v in c.items() if k != "block_configs"},
                                          "architectures": ["LlamaForCausalLM"],
                                          "model_type": "llama", "intermediate_size": 8192,
                                          "num_key_value_heads": 6})
    doc = _json(root, "--gpu", "h100", "--target", "vllm")
    assert doc["format"] != "decilm"
    assert doc["summary"]["targets"]["vllm"]["load"]["blocker"] == "layers"


def test_repair_refuses_for_vllm_a_linear_replacement_and_writes_nothing(tmp_path: Path) -> None:
    """vLLM builds no linear replacement: no padding makes it load, so nothing is written."""
    root = write_decilm(tmp_path / "m", MIXED, widths={0: {"intermediate": 300}})
    before = tree_digest(root)
    run = gac(root, "--gpu", "h100", "--repair", tmp_path / "out", "--target", "vllm")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "not the linear replacement of layer 2 ffn, layer 3 attention" in run.stderr
    assert not (tmp_path / "out").exists() and tree_digest(root) == before


#: Every kind of block, and MLP widths the config does not build: 300, 200 and 304 (the
#: contract's error, a width under 256, an aligned width no ffn_mult builds) and 384 (aligned
#: for the contract, a multiple of 128, still no width an ffn_mult builds).
PADDED = [block(attention(2), ffn(2.0)), block(NO_OP, ffn(1.3)), block(attention(4), ffn(1.0)),
          block(attention(1), LINEAR), block(LINEAR, ffn(2.0)), block(NO_OP, NO_OP)]
PADDED_WIDTHS = {0: 300, 1: 200, 2: 304, 4: 384}


def test_repair_pads_each_layer_and_the_model_built_from_out_computes_the_same(
        tmp_path: Path) -> None:
    """Each MLP is padded to the width an ffn_mult builds (a multiple of 256) and its
    ffn_mult rewritten only where the old one builds another width; the model built per
    layer from OUT's config.json alone (transformers' Llama modules, strict load) gives the
    original's logits, equal in float64. No-op and linear blocks are untouched."""
    root = write_decilm(tmp_path / "m", PADDED, widths={
        i: {"intermediate": w} for i, w in PADDED_WIDTHS.items()})
    before = tree_digest(root)
    promised = {s["layer"]: s["repair_to"] for s in _json(root, "--gpu", "h100")["sites"]
                if s["role"] == "intermediate" and s["repair_to"]}
    assert promised == {0: 512, 1: 256}  # the check promises what --repair writes
    out = tmp_path / "out"
    run = gac(root, "--gpu", "h100", "--repair", out)
    assert run.returncode == 0, run.stderr
    assert tree_digest(root) == before
    report = json.loads((out / "gac-repair.json").read_text())
    assert {r["name"]: (r["from"], r["to"]) for r in report["repaired"]} == {
        f"model.layers.{i}.mlp:intermediate": (w, 256 if w <= 256 else 512)
        for i, w in PADDED_WIDTHS.items()}
    # layer 0's 2.0 and layer 4's 2.0 build 512 at hidden 256, layer 1's 1.3 builds 256:
    # kept; layer 2's 1.0 builds 256, not 512: rewritten
    assert report["config_changes"] == [{"file": "config.json", "index": None, "from": 1.0,
                                         "to": 3.0,
                                         "field": ["block_configs", 2, "ffn", "ffn_mult"]}]
    cfg = json.loads((out / "config.json").read_text())
    assert [b["ffn"].get("ffn_mult") for b in cfg["block_configs"]] == [2.0, 1.3, 3.0, None,
                                                                         2.0, None]
    assert [b["attention"] for b in cfg["block_configs"]] == [b["attention"] for b in PADDED]
    ids = torch.randint(0, 512, (2, 11), generator=torch.Generator().manual_seed(30))
    with torch.no_grad():
        want = decilm_model(root, PADDED_WIDTHS)(ids)
        got = decilm_model(out)(ids)  # widths from OUT's block_configs only
    assert_padding_exact(got, want)
    recheck = gac_check.check(out, gpu="h100")
    assert not recheck.findings and not any(b.conflicts for b in recheck.format.blocks(
        recheck.checkpoint))


def test_repair_for_vllm_makes_a_contradicted_model_load(tmp_path: Path) -> None:
    """vLLM refuses the model (block_configs contradicts the MLP widths); --repair --target
    vllm pads them and writes the ffn_mult that builds each, and OUT loads on vLLM. Layer 1's
    768 needs no padding, only the ffn_mult that builds it (1.3 builds 256)."""
    blocks = [b for b in PADDED if LINEAR not in b.values()]
    root = write_decilm(tmp_path / "m", blocks, widths={0: {"intermediate": 300},
                                                        1: {"intermediate": 768},
                                                        2: {"intermediate": 304}})
    assert not _json(root, "--gpu", "h100", "--target", "vllm")["summary"]["targets"][
        "vllm"]["load"]["loads"]
    run = gac(root, "--gpu", "h100", "--repair", tmp_path / "out", "--target", "vllm")
    assert run.returncode == 0, run.stderr
    load = _json(tmp_path / "out", "--gpu", "h100", "--target", "vllm")["summary"][
        "targets"]["vllm"]["load"]
    assert load["loads"], load
    assert "layer 0: attention with 2 KV heads, MLP 512 (ffn_mult 2)" in load["why"]
    assert "layer 2: attention with 1 KV head, MLP 512 (ffn_mult 3)" in load["why"]
    assert "layer 1: no attention, MLP 768 (ffn_mult 4.5)" in load["why"]


def test_an_mlp_whose_block_config_is_no_mlp_is_not_padded(tmp_path: Path) -> None:
    """Layer 1's config says its FFN is a no-op, its tensors hold an MLP of 300: no ffn_mult
    records that width, so the site is refused with why, and the rest is repaired."""
    blocks = [block(attention(2), ffn(2.0)), block(NO_OP, NO_OP)]
    full = [block(attention(2), ffn(2.0)), block(NO_OP, ffn(2.0))]
    root = write_decilm(tmp_path / "m", full, widths={1: {"intermediate": 300}},
                        config=lambda c: {**c, "block_configs": blocks})
    run = gac(root, "--gpu", "h100", "--repair", tmp_path / "out", "--fail-on", "never")
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "out" / "gac-repair.json").read_text())
    assert not report["repaired"] and report["config_changes"] == []
    assert [r["reason"] for r in report["refused"]] == [
        "block_configs[1].ffn is no full MLP, so no ffn_mult or intermediate_size records this "
        "width: not padded"]


def test_ffn_mult_for_builds_exactly_the_width() -> None:
    """Every multiple of 256 gets an ffn_mult of at most 6 decimals (what the hub's config
    class keeps) that the engines' formula turns into that width; a width no ffn_mult builds
    gets none; an ffn_mult that already builds the width is kept."""
    rnd = random.Random(30)
    for _ in range(5000):
        hidden = rnd.choice((256, 2048, 4096, 5120, 6144, 8192, 16384, rnd.randint(1, 20000)))
        width = 256 * rnd.randint(1, 400)
        mult = ffn_mult_for(width, hidden)
        assert mult is not None and round(mult, 6) == mult
        assert ffn_width(mult, hidden) == width, (width, hidden, mult)
    assert ffn_mult_for(300, 256) is None and ffn_mult_for(304, 256) is None
    assert ffn_mult_for(512, 256, 2.0) == 2.0 and ffn_mult_for(512, 256, 1.0) == 3.0
    assert ffn_mult_for(14336, 8192) == 2.625  # Nemotron-Super-49B's own


def test_realign_sends_to_repair(tmp_path: Path) -> None:
    root = write_decilm(tmp_path / "m", MIXED, sparse=True)
    run = gac(root, "--gpu", "h100", "--realign", tmp_path / "out", "--base", root)
    assert run.returncode == 2 and not (tmp_path / "out").exists()
    assert "no low-rank factors to re-select; run --repair OUT" in run.stderr


def _attn(i: int, **change: object):
    def edit(cfg: dict) -> dict:
        blocks = json.loads(json.dumps(cfg["block_configs"]))
        blocks[i]["attention"].update(change)
        return {**cfg, "block_configs": blocks}
    return edit


REFUSED = {
    "unknown key": (dict(config=_attn(0, mystery=1)), "'mystery', which gac-check does not read"),
    "sliding window": (dict(config=_attn(0, window_length=4096)),
                       "window_length is 4096: gac-check models only window_length=None"),
    "group not a divisor": (dict(config=_attn(0, n_heads_in_group=3)),
                            "n_heads_in_group is 3: a full attention block needs a positive "
                            "divisor of num_attention_heads=4"),
    "no_op and linear": (dict(config=_attn(0, no_op=True, replace_with_linear=True)),
                         "no_op=True, replace_with_linear=True"),
    "ffn_mult missing": (dict(config=lambda c: {**c, "block_configs": [
        {**c["block_configs"][0], "ffn": {"no_op": False}}, *c["block_configs"][1:]]}),
        "block_configs[0].ffn.ffn_mult is None"),
    "intermediate_size not a count": (dict(config=lambda c: {**c, "block_configs": [
        {**c["block_configs"][0], "ffn": explicit_ffn("512")}, *c["block_configs"][1:]]}),
        "block_configs[0].ffn.intermediate_size is '512': a full FFN block's width is a "
        "positive integer"),
    "a MoE FFN": (dict(config=lambda c: {**c, "block_configs": [
        {**c["block_configs"][0], "ffn": {**explicit_ffn(512), "moe": {"num_local_experts": 8}}},
        *c["block_configs"][1:]]}), "ffn.moe is {'num_local_experts': 8}: gac-check models "
        "only moe=None"),
    "parallel blocks": (dict(config=lambda c: {**c, "block_configs": [
        {**c["block_configs"][0], "parallel_blocks": [c["block_configs"][0]]},
        *c["block_configs"][1:]]}), "block_configs[0] has 'parallel_blocks', which gac-check "
        "does not read"),
    "ffn_mult overflows": (dict(config=lambda c: {**c, "block_configs": [
        {**c["block_configs"][0], "ffn": ffn(1e308)}, *c["block_configs"][1:]]}),
        "ffn_mult is 1e+308: the width it builds is no finite number"),
    "layer count": (dict(config=lambda c: {**c, "num_hidden_layers": 6}),
                    "block_configs has 5 entries, num_hidden_layers is 6"),
    "no block_configs": (dict(config=lambda c: {k: v for k, v in c.items()
                                                if k != "block_configs"}),
                         "without a block_configs list"),
    "another architecture": (dict(config=lambda c: {**c,
                                                    "architectures": ["NemotronHForCausalLM"]}),
                             "reads block_configs only as DeciLM / Nemotron-NAS writes them"),
    "linear not hidden x hidden": (dict(tensors=lambda s: {
        **s, "model.layers.3.self_attn.linear_attn.weight": [128, 256]}),
        "is [128x256]: a linear replacement is hidden x hidden (256 x 256)"),
    "full and linear": (dict(tensors=lambda s: {
        **s, "model.layers.2.mlp.up_proj.weight": [512, 256]}),
        "layer 2 has both mlp.linear_mlp and mlp.up_proj"),
    "layer past block_configs": (dict(tensors=lambda s: {
        **s, "model.layers.5.input_layernorm.weight": [256]}),
        "has tensors of layer 5, but block_configs describes 5 layers"),
    "unread tensor in a block": (dict(tensors=lambda s: {
        **s, "model.layers.1.self_attn.sink.weight": [4, 64]}),
        "1 tensor gac-check did not read, first model.layers.1.self_attn.sink.weight"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_is_not_understood_is_refused(tmp_path: Path, case: str) -> None:
    edits, message = REFUSED[case]
    root = write_decilm(tmp_path / "m", MIXED, sparse=True, **edits)
    run = gac(root, "--gpu", "h100")
    assert run.returncode == 2, run.stdout
    assert message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


ORACLE = Path(__file__).resolve().parents[1] / ".cache" / "vllm-oracle" / "src"
RUNNER = Path(__file__).with_name("vllm_oracle.py")


@pytest.mark.slow
def test_vllm_builds_the_width_each_written_ffn_mult_records(tmp_path: Path) -> None:
    """vLLM's own ``_ffn_mult_to_intermediate_size`` (v0.33.0 nemotron_nas.py, run in a
    subprocess from ``make vllm-oracle``'s cached wheel) turns every ffn_mult the repair
    writes into exactly the padded width: a seeded grid of widths and hidden sizes, and the
    ffn_mults of a repaired checkpoint's config.json."""
    if not (ORACLE / "vllm").is_dir():
        message = "vLLM's wheel is not cached: run `make vllm-oracle` (CI does)"
        if os.environ.get("GAC_REQUIRE_ENGINE_SOURCES"):
            pytest.fail(message)
        pytest.skip(message)
    rnd = random.Random(30)
    cases = []
    for _ in range(600):
        hidden = rnd.choice((2048, 4096, 5120, 6144, 8192, 16384, rnd.randint(64, 20000)))
        width = 256 * rnd.randint(1, 400)
        cases.append({"ffn_mult": ffn_mult_for(width, hidden), "hidden": hidden,
                      "want": width})
    root = write_decilm(tmp_path / "m", PADDED, sparse=True, widths={
        i: {"intermediate": w} for i, w in PADDED_WIDTHS.items()})
    assert gac(root, "--gpu", "h100", "--repair", tmp_path / "out").returncode == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())["block_configs"]
    cases += [{"ffn_mult": b["ffn"]["ffn_mult"], "hidden": 256, "want": 256 if w <= 256 else 512}
              for b, w in ((written[i], w) for i, w in PADDED_WIDTHS.items())]
    proc = subprocess.run([sys.executable, str(RUNNER), "--ffn-widths", str(ORACLE)],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == len(cases)
    wrong = [a for a in answers if a["width"] != a["want"]]
    assert not wrong, wrong[:5]


def _pickle(root: Path) -> Path:
    """``root``'s weights as ``save_pretrained(safe_serialization=False)`` writes them: the
    state dict through ``torch.save``, as ``pytorch_model.bin``, and no safetensors."""
    from safetensors.torch import load_file

    st = root / "model.safetensors"
    torch.save(load_file(str(st)), root / "pytorch_model.bin")
    st.unlink()
    return root


def _no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way to unpickle fails the test: the checkpoint is read by walking its opcodes."""
    import pickle

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unpickled")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)


def test_a_pickled_decilm_checks_and_repairs_like_its_safetensors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same contradicted checkpoint as a pickled state dict: the same sites, notes and
    verdicts, and --repair writes the same widths and config changes back into a
    pytorch_model.bin, never unpickling it; the model built from OUT's config computes the
    same as the original."""
    widths = {i: {"intermediate": w} for i, w in PADDED_WIDTHS.items()}
    st = write_decilm(tmp_path / "st", PADDED, widths=widths)
    pk = _pickle(write_decilm(tmp_path / "pk", PADDED, widths=widths))
    ids = torch.randint(0, 512, (2, 11), generator=torch.Generator().manual_seed(30))
    with torch.no_grad():
        want = decilm_model(st, PADDED_WIDTHS)(ids)
    _no_unpickling(monkeypatch)

    def seen(root: Path) -> tuple:
        doc = _json(root, "--gpu", "h100", "--target", "vllm")
        return doc["format"], doc["sites"], doc["summary"]["targets"]
    assert seen(pk) == seen(st) and seen(pk)[0] == "decilm"
    reports = {}
    for name, root in (("st", st), ("pk", pk)):
        run = gac(root, "--gpu", "h100", "--repair", tmp_path / f"{name}-out")
        assert run.returncode == 0, run.stderr
        report = json.loads((tmp_path / f"{name}-out" / "gac-repair.json").read_text())
        reports[name] = (report["repaired"], report["config_changes"])
    assert reports["pk"] == reports["st"] and reports["pk"][0]
    out = tmp_path / "pk-out"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "gac-repair.json", "pytorch_model.bin"]
    monkeypatch.undo()
    with torch.no_grad():
        got = decilm_model(out)(ids)  # OUT's pickle, loaded strictly into OUT's config
    assert_padding_exact(got, want)
