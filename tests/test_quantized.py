"""Quantized safetensors checkpoints are read at their logical widths with their own scheme
(issue 27): compressed-tensors ``pack-quantized`` and ``float-quantized``, GPTQ, AWQ GEMM,
block FP8, bitsandbytes NF4 and 8-bit, written in tests in each format's documented layout
(tests/quantized_models.py; compressed-tensors packs with its own ``pack_to_int32`` and
unpacks with its own compressor). Through the CLI: sites at the logical widths, parameters
counted logically, the dtype the kernel computes in (text and JSON agreeing), targets judged
with the checkpoint's own quantization (agreeing with ``quant=`` predictions made on the
unquantized model: the issue's "done when"), and refusals, one line and exit 2, of what is not
understood and of repairs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from gac_check.checkpoint.index import open_checkpoint
from tests import helpers
from tests import quantized_models as qm
from tests.helpers import rewrite_safetensors, tree_digest


def run_json(*args: object) -> tuple[int, dict]:
    proc = helpers.gac(*args, "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def refusal(*args: object) -> str:
    proc = helpers.gac(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def dense_shapes(intermediate: int) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in qm.model(intermediate).state_dict().items()}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized")
    return {
        "ct688": qm.compressed_tensors_w4a16(root / "ct688", 688),
        "ct640": qm.compressed_tensors_w4a16(root / "ct640", 640),
        "dense688": qm.dense(root / "dense688", 688),
        "dense640": qm.dense(root / "dense640", 640),
        "gptq688": qm.gptq(root / "gptq688", 688),
        "awq640": qm.awq_gemm(root / "awq640", 640),
        "fp8": qm.compressed_tensors_fp8(root / "fp8", 688),
        "blockfp8": qm.block_fp8(root / "blockfp8", 688),
        "nf4": qm.bnb_nf4(root / "nf4", 688),
        "int8": qm.bnb_int8(root / "int8", 688),
        "mystery": qm.mystery(root / "mystery", 688),
        "gemv640": qm.awq_gemv(root / "gemv640", 640),
        "w8a8": qm.compressed_tensors_w8a8(root / "w8a8", 688),
        "channel": qm.compressed_tensors_w4a16_channel(root / "channel", 688),
        "actorder": qm.gptq(root / "actorder", 688, desc_act=True),
    }


# --- read at the logical widths --------------------------------------------------------------

@pytest.mark.parametrize(("name", "intermediate"), [
    ("ct688", 688), ("ct640", 640), ("gptq688", 688), ("awq640", 640), ("fp8", 688),
    ("blockfp8", 688), ("nf4", 688), ("int8", 688), ("gemv640", 640), ("w8a8", 688),
    ("channel", 688), ("actorder", 688)])
def test_every_linear_is_read_at_its_logical_shape(made, name, intermediate):
    ckpt = open_checkpoint(made[name])
    logical = {n: t.shape for n, t in ckpt.tensors.items() if n not in ckpt.auxiliary}
    assert logical == dense_shapes(intermediate)
    assert ckpt.params == sum(math.prod(s) for s in dense_shapes(intermediate).values())
    q = ckpt.quantization
    assert q is not None and len(q.quantized) == 14  # 7 linears x 2 layers; lm_head dense
    assert set(q.backing) == {m + ".weight" for m in q.quantized}
    with safe_open(str(made[name] / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    # every stored tensor is a logical one, auxiliary, or backs a logical weight
    backing = {p for names in q.backing.values() for p in names}
    assert stored == (set(logical) - set(q.backing)) | set(ckpt.auxiliary) | backing


@pytest.mark.parametrize("intermediate", [688, 640])
def test_pack_quantized_shapes_are_what_compressed_tensors_unpacks(made, intermediate):
    """compressed-tensors' own unpacking turns each packed linear back into integers of exactly
    the logical shape read from the headers and weight_shape; at 640 its compressor also
    dequantizes them to the weights, at 688 it refuses (a 128-group does not divide 688), as
    the check's packing note says."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    root = made[f"ct{intermediate}"]
    ckpt = open_checkpoint(root)
    stored = load_file(str(root / "model.safetensors"))
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**qm.W4A16))
    dense = qm.model(intermediate).state_dict()
    for module in ckpt.quantization.quantized:
        local = {k: stored[f"{module}.{k}"] for k in ("weight_packed", "weight_scale",
                                                         "weight_shape")}
        ints = unpack_from_int32(local["weight_packed"], 4, local["weight_shape"])
        assert tuple(ints.shape) == ckpt.shape(module + ".weight")
        if ckpt.shape(module + ".weight")[1] % 128:
            with pytest.raises(ValueError, match="group_size 128"):
                PackedQuantizationCompressor.decompress(local, scheme)
            assert any(module in n and "group size 128" in n for n in ckpt.quantization.notes)
            continue
        weight = PackedQuantizationCompressor.decompress(local, scheme)["weight"]
        ref = dense[module + ".weight"].float()
        assert (weight.float() - ref).abs().max() <= ref.abs().max() / 7 + 1e-3


def test_gptq_688_reads_ceil_groups_and_notes_the_partial_group(made):
    ckpt = open_checkpoint(made["gptq688"])
    q = ckpt.quantization
    assert (q.method, q.bits, q.group_size, q.strategy) == ("gptq", 4, 128, "group")
    assert ckpt.shape("model.layers.0.mlp.down_proj.weight") == (256, 688)
    assert ckpt.auxiliary["model.layers.0.mlp.down_proj.g_idx"]
    assert ckpt.tensors["model.layers.0.mlp.down_proj.scales"].shape == (6, 256)
    assert any("688 is not a multiple of the group size 128" in n for n in q.notes)


def test_kv_cache_scales_are_auxiliary(made, tmp_path):
    """An FP8 checkpoint with llm-compressor's kv_cache_scheme keeps self_attn.k_scale and
    v_scale: read and accounted for, counted as no parameter."""
    root = tmp_path / "kv"
    root.mkdir()
    tensors = load_file(str(made["fp8"] / "model.safetensors"))
    for layer in (0, 1):
        for kind in ("k_scale", "v_scale"):
            tensors[f"model.layers.{layer}.self_attn.{kind}"] = torch.ones(())
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text((made["fp8"] / "config.json").read_text())
    ckpt = open_checkpoint(root)
    assert ckpt.auxiliary["model.layers.1.self_attn.v_scale"] == "KV-cache quantization scale"
    assert ckpt.params == open_checkpoint(made["fp8"]).params


def test_bnb_nf4_is_dense_not_llm_pruner(made):
    _, doc = run_json(made["nf4"], "--gpu", "h100")
    assert doc["format"] == "dense"
    assert doc["quantization"]["method"] == "bitsandbytes"
    assert doc["quantization"]["format"] == "nf4"
    assert sorted({s["value"] for s in doc["sites"] if s["role"] == "intermediate"}) == [688]
    assert doc["summary"]["params"] == sum(math.prod(s) for s in dense_shapes(688).values())


# --- what the check says -------------------------------------------------------------------

@pytest.mark.parametrize(("name", "base", "quant", "summary"), [
    ("ct688", "dense688", "wna16", "compressed-tensors W4A16"),
    ("ct640", "dense640", "wna16", "compressed-tensors W4A16"),
    ("gptq688", "dense688", "gptq", "gptq W4A16"),
    ("awq640", "dense640", "awq", "awq W4A16")])
def test_w4a16_target_agrees_with_the_prediction_on_the_unquantized_model(made, name, base,
                                                                          quant, summary):
    """The issue's "done when": vllm,tp=2 on the W4A16 checkpoint is judged as that W4A16
    (the pack's quant for the scheme, group 128 from the checkpoint), site by site as
    vllm,tp=2,quant=... judges the unquantized model; at tp=2 both widths put a 128-group
    across the shard: refused for every scheme (vLLM v0.33.0: compressed-tensors raises in
    verify_group_size_divides_partition, GPTQ loads misaligned scales and computes wrong
    outputs, AWQ raises), as the dense reading said (issue 39)."""
    code_q, doc_q = run_json(made[name], "--gpu", "h100", "--target", "vllm,tp=2")
    code_d, doc_d = run_json(made[base], "--gpu", "h100", "--target", f"vllm,tp=2,quant={quant}")
    seen = {s["name"]: [(v["verdict"], v["kernel"], v["fix_to"]) for v in s["targets"]]
            for s in doc_q["sites"]}
    want = {s["name"]: [(v["verdict"], v["kernel"], v["fix_to"]) for v in s["targets"]]
            for s in doc_d["sites"]}
    assert seen == want
    assert doc_q["summary"]["targets"]["vllm,tp=2"]["verdict"] == "refused"
    assert code_q == code_d == 1
    assert doc_q["summary"]["params"] == doc_d["summary"]["params"]
    assert doc_q["summary"]["quantization"] == summary


def test_a_quant_that_contradicts_the_checkpoint_is_refused(made):
    line = refusal(made["ct640"], "--target", "vllm,tp=2,quant=awq")
    assert "already quantized" in line and "quant=wna16" in line
    assert "group 128" in refusal(made["gptq688"], "--target", "vllm,group=64").replace(
        "group is 128", "group 128")
    ok = helpers.gac(made["ct640"], "--target", "vllm,tp=2,quant=gptq")
    assert ok.returncode == 1, ok.stderr


def test_awq_gemm_targets_run_as_awq(made):
    _, doc = run_json(made["awq640"], "--gpu", "h100", "--target", "vllm")
    assert doc["quantization"]["method"] == "awq" and doc["quantization"]["format"] == "gemm"
    mlp = [v for s in doc["sites"] if s["role"] == "intermediate" for v in s["targets"]]
    _, dense = run_json(made["dense640"], "--gpu", "h100", "--target", "vllm,quant=awq")
    want = [v for s in dense["sites"] if s["role"] == "intermediate" for v in s["targets"]]
    assert [v["kernel"] for v in mlp] == [v["kernel"] for v in want]


@pytest.mark.parametrize("name", ["fp8", "blockfp8"])
def test_fp8_text_and_json_judge_the_same_dtype(made, name):
    _, doc = run_json(made[name], "--gpu", "h100")
    text = helpers.gac(made[name], "--gpu", "h100").stdout
    assert doc["hardware"]["dtype"] == "float8_e4m3fn"
    assert doc["hardware"]["dtype_source"] == "quantization_config"
    assert "dtype float8_e4m3fn (from quantization_config)" in text
    assert "FP8" in doc["hardware"]["dtype_note"]


@pytest.mark.parametrize("target", ["vllm", "vllm,tp=2"])
def test_block_fp8_is_deployed_as_block_fp8_and_refused_in_part_blocks(made, target):
    """688 = 5.4 blocks of 128: vLLM's validate_fp8_block_shape refuses gate_up (gate and up
    each a part block) at any TP, as tests/test_targets_vllm_oracle.py saw vLLM do; judged as
    per-tensor FP8 it was a padded CUTLASS fallback."""
    _, doc = run_json(made["blockfp8"], "--gpu", "h100", "--target", target)
    mlp = [v for s in doc["sites"] if s["role"] == "intermediate" for v in s["targets"]]
    assert mlp and all(v["verdict"] == "refused" for v in mlp), mlp
    assert all("block" in v["why"] for v in mlp)
    assert "quant=fp8_block" in helpers.gac(made["blockfp8"], "--gpu", "h100", "--target",
                                           target).stdout


def test_int8_w8a8_is_judged_in_int8_and_deployed_as_int8(made):
    _, doc = run_json(made["w8a8"], "--gpu", "h100", "--target", "vllm,tp=2")
    assert doc["hardware"]["dtype"] == "int8"
    assert doc["quantization"]["scheme"] == "W8A8"
    text = helpers.gac(made["w8a8"], "--gpu", "h100", "--target", "vllm,tp=2").stdout
    assert "quant=int8" in text and "dtype int8 (from quantization_config)" in text


#: 690 (% 16 = 2, % 4 = 2): down_proj's K per rank. FP8 W8A8 pads it for CUTLASS and INT8
#: W8A8 falls to Triton (fallbacks), but FP8 weight-only cannot view its rows as int32 and
#: asymmetric INT8's cutlass_scaled_mm_azp asserts K % 16 (refused); static activation
#: scales judge as the dense rules of their dynamic kin.
@pytest.mark.parametrize(("kind", "activations", "quant", "verdict"), [
    ("float", "none", "fp8_w8a16", "refused"), ("float", "static", "fp8_static", "fallback"),
    ("float", "dynamic", "fp8", "fallback"), ("int", "asymmetric", "int8_asym", "refused"),
    ("int", "static", "int8_static", "fallback"), ("int", "dynamic", "int8_dynamic",
                                                   "fallback")])
def test_the_checkpoints_activation_scheme_names_the_vllm_quant(tmp_path, kind, activations,
                                                                quant, verdict):
    root = qm.compressed_tensors_8bit(tmp_path / "m", 690, kind, activations)
    _, doc = run_json(root, "--gpu", "h100", "--target", "vllm")
    assert doc["quantization"]["activations_dynamic"] == (
        None if activations == "none" else activations != "static")
    down = [v for s in doc["sites"] if s["role"] == "intermediate" for v in s["targets"]]
    assert down and {v["verdict"] for v in down} == {verdict}, down
    assert doc["summary"]["targets"]["vllm"]["quant"] == quant


def test_a_coarse_quant_agrees_with_the_checkpoint_and_a_finer_other_one_is_refused(tmp_path):
    """``quant=int8`` (the coarse name) on an asymmetric INT8 checkpoint is judged as
    ``int8_asym``; ``quant=int8_dynamic`` contradicts it: one line, exit 2."""
    root = qm.compressed_tensors_8bit(tmp_path / "m", 690, "int", "asymmetric")
    _, doc = run_json(root, "--gpu", "h100", "--target", "vllm,quant=int8")
    down = [v for s in doc["sites"] if s["role"] == "intermediate" for v in s["targets"]]
    assert {v["verdict"] for v in down} == {"refused"}, down
    assert doc["summary"]["targets"]["vllm,quant=int8"]["quant"] == "int8_asym"
    line = refusal(root, "--gpu", "h100", "--target", "vllm,quant=int8_dynamic")
    assert "runs as quant=int8_asym" in line


@pytest.mark.parametrize(("name", "strategy", "group", "act_order"), [
    ("channel", "channel", None, False), ("actorder", "group", 128, True),
    ("gemv640", "group", 128, False)])
def test_the_scheme_is_the_checkpoints(made, name, strategy, group, act_order):
    _, doc = run_json(made[name], "--gpu", "h100")
    q = doc["quantization"]
    assert (q["strategy"], q["group_size"], q["act_order"]) == (strategy, group, act_order)


def test_weight_only_schemes_are_judged_in_the_activation_dtype(made):
    _, doc = run_json(made["ct688"], "--gpu", "h100")
    assert doc["hardware"]["dtype"] == "float16"
    assert "weight-only" in doc["hardware"]["dtype_note"]
    text = helpers.gac(made["ct688"], "--gpu", "h100").stdout
    assert "quantized: compressed-tensors pack-quantized W4A16" in text


# --- refusals --------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "target", "says"), [
    ("nf4", "vllm", "bitsandbytes W4A16, which the vllm rule pack does not model"),
    ("gptq688", "transformers", "gptq W4A16, which the transformers rule pack does not model")])
def test_a_scheme_the_pack_does_not_model_is_refused_not_judged_unquantized(made, name, target,
                                                                           says):
    assert says in refusal(made[name], "--target", target)


def test_llama_cpp_keeps_its_own_quant(made):
    proc = helpers.gac(made["gptq688"], "--gpu", "h100", "--target", "llama.cpp,quant=Q4_K_M")
    assert proc.returncode in (0, 1) and "quant=Q4_K_M" in proc.stdout, proc.stderr


def test_a_quant_state_too_long_to_be_one_is_refused(made, tmp_path):
    root = tmp_path / "long"
    root.mkdir()
    tensors = load_file(str(made["nf4"] / "model.safetensors"))
    name = "model.layers.0.mlp.up_proj.weight.quant_state.bitsandbytes__nf4"
    tensors[name] = torch.full((5000,), 32, dtype=torch.uint8)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text((made["nf4"] / "config.json").read_text())
    assert "holds 5000 bytes" in refusal(root)


def test_realign_of_a_quantized_checkpoint_is_refused(made, tmp_path):
    before = tree_digest(made["ct640"])
    line = refusal(made["ct640"], "--realign", tmp_path / "out")
    assert "quantize it again" in line and not (tmp_path / "out").exists()
    assert tree_digest(made["ct640"]) == before


def test_a_method_nobody_knows_is_refused(made):
    line = refusal(made["mystery"])
    assert "'mystery'" in line


def test_packed_tensors_without_a_quantization_config_are_refused(made, tmp_path):
    root = tmp_path / "noconfig"
    root.mkdir()
    (root / "model.safetensors").write_bytes((made["gptq688"] / "model.safetensors").read_bytes())
    cfg = json.loads((made["gptq688"] / "config.json").read_text())
    del cfg["quantization_config"]
    (root / "config.json").write_text(json.dumps(cfg))
    assert "quantization_config" in refusal(root)


def test_an_unknown_tensor_in_a_known_layout_is_refused(made, tmp_path):
    root = tmp_path / "odd"
    root.mkdir()
    tensors = load_file(str(made["gptq688"] / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.qweight_mystery"] = torch.zeros(4, dtype=torch.int32)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text((made["gptq688"] / "config.json").read_text())
    assert "qweight_mystery" in refusal(root)


@pytest.mark.parametrize(("name", "layout"), [
    ("gptq688", "GPTQ's int32 [in * bits / 32, out]"),
    ("awq640", "AWQ GEMM's int32 [in, out * bits / 32]"),
    ("gemv640", "AWQ GEMV's int32 [out, in * bits / 32]")])
def test_a_qweight_that_is_not_packed_int32_is_refused_naming_the_layout(made, tmp_path, name,
                                                                         layout):
    root = tmp_path / "int16"
    root.mkdir()
    tensors = load_file(str(made[name] / "model.safetensors"))
    q = "model.layers.1.mlp.down_proj.qweight"
    tensors[q] = tensors[q].to(torch.int16)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text((made[name] / "config.json").read_text())
    shape = list(tensors[q].shape)
    assert f"{q} is int16 {shape}, not {layout}" in refusal(root)


def test_a_weight_shape_that_contradicts_the_packing_is_refused(made, tmp_path):
    root = tmp_path / "lying"
    root.mkdir()
    tensors = load_file(str(made["ct640"] / "model.safetensors"))
    tensors["model.layers.1.mlp.down_proj.weight_shape"] = torch.tensor([256, 1024])
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text((made["ct640"] / "config.json").read_text())
    assert "weight_shape [256, 1024]" in refusal(root)


def test_a_config_whose_group_the_scales_refute_is_refused(made, tmp_path):
    """config.json says group 64; the scales are one per 128 columns: the scheme is not what
    the config says, so nothing is judged with it."""
    root = tmp_path / "group64"
    root.mkdir()
    (root / "model.safetensors").write_bytes((made["ct640"] / "model.safetensors").read_bytes())
    cfg = json.loads((made["ct640"] / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 64
    (root / "config.json").write_text(json.dumps(cfg))
    assert ("weight_scale is [256, 5]; a group 64 scale of a [256, 640] weight is [256, 10]"
            in refusal(root))


def test_the_html_report_names_the_scheme(made, tmp_path):
    out = tmp_path / "r.html"
    proc = helpers.gac(made["gptq688"], "--gpu", "h100", "--report", out)
    assert proc.returncode in (0, 1), proc.stderr
    assert "quantized gptq W4A16 (gptq)" in out.read_text()


@pytest.mark.parametrize("name", ["ct688", "gptq688", "awq640", "nf4", "int8", "fp8"])
def test_repair_of_a_quantized_checkpoint_is_refused_before_writing(made, name, tmp_path):
    before = tree_digest(made[name])
    out = tmp_path / "out"
    line = refusal(made[name], "--repair", out)
    assert "repair the unquantized model, then quantize it again" in line
    assert "--repair FIXED" in line
    assert not out.exists()
    assert tree_digest(made[name]) == before


# --- on the Hub: the few bytes of weight_shape by range requests -----------------------------

def test_a_hub_w4a16_is_read_like_the_local_copy(made, tmp_path):
    """hf://ORG/NAME of the 640 W4A16: the same JSON as the local check, the weight_shape
    tensors read by one bounded range request, never the weights."""
    import os

    from tests.hub_server import HubServer

    local = helpers.gac(made["ct640"], "--gpu", "h100", "--target", "vllm,tp=2", "--format",
                        "json")
    with HubServer({"org/w4": {"main": made["ct640"]}}) as hub:
        unset = {k: None for k in os.environ if k.startswith("HF_")}
        remote = helpers.gac("hf://org/w4", "--gpu", "h100", "--target", "vllm,tp=2",
                             "--format", "json", process=True,
                             env={**unset, "HF_ENDPOINT": hub.endpoint, "NO_PROXY": "*",
                                  "HF_HOME": str(tmp_path / "hf")})
        ranges = [rng for m, p, rng in hub.log if m == "GET" and p.startswith("/cdn/")]
        sent = hub.bytes_sent
    assert remote.returncode == local.returncode == 1, remote.stderr
    a, b = json.loads(local.stdout), json.loads(remote.stdout)
    assert a["sites"] == b["sites"] and a["quantization"] == b["quantization"]
    # the header, then every weight_shape (14 x 16 bytes, side by side) in one range
    assert len(ranges) == 2, ranges
    start, end = (int(x) for x in ranges[1].removeprefix("bytes=").split("-"))
    assert end + 1 - start == 14 * 16
    assert sent < (made["ct640"] / "model.safetensors").stat().st_size / 10


@pytest.mark.parametrize(("name", "edit", "words"), [
    ("gptq688", lambda qc: qc.update(desc_act=True), "desc_act=True"),
    ("ct640", lambda qc: qc["config_groups"]["group_0"]["weights"].update(actorder="group"),
     "actorder='group'")])
def test_group_activation_ordering_is_refused_by_vllm(made, tmp_path, name, edit, words):
    """Issue 39: a GPTQ checkpoint with desc_act and a group size (most community GPTQ
    checkpoints), or compressed-tensors' actorder: group, is refused by vLLM v0.33.0 at load;
    the same checkpoint without it is judged as before."""
    root = tmp_path / name
    root.mkdir()
    for f in made[name].iterdir():
        (root / f.name).write_bytes(f.read_bytes())
    config = json.loads((root / "config.json").read_text())
    edit(config["quantization_config"])
    (root / "config.json").write_text(json.dumps(config))
    if name == "ct640":  # actorder: group stores each input column's group, as llm-compressor
        def g_idx(tensors: dict) -> None:
            for key in [k for k in tensors if k.endswith(".weight_shape")]:
                columns = int(tensors[key][1])
                tensors[key.replace("weight_shape", "weight_g_idx")] = (
                    torch.arange(columns, dtype=torch.int32) // 128)
        rewrite_safetensors(root, g_idx)
    _, doc = run_json(root, "--gpu", "h100", "--target", "vllm")
    mlp = next(s for s in doc["sites"] if s["role"] == "intermediate")["targets"][0]
    assert mlp["verdict"] == "refused" and words in mlp["why"], mlp["why"]
    _, plain = run_json(made[name], "--gpu", "h100", "--target", "vllm")
    mlp = next(s for s in plain["sites"] if s["role"] == "intermediate")["targets"][0]
    assert "no longer supported" not in (mlp["why"] or "")
