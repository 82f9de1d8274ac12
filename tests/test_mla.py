"""Multi-head latent attention (issue 30 item 3): DeepSeek-V2/V3 checkpoints written by
transformers' own classes, read from their safetensors; vLLM's MLA backend verdicts; the exact
v_head_dim repair proven on the real module, and the refusals (latents, q/k head). DeepSeek's
mixture-of-experts layers: tests/test_deepseek_moe.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
)

from tests.helpers import gac

#: a DeepSeek-V2-shaped layer at toy widths, odd on purpose (kv latent 40, q latent 24,
#: nope 12 + rope 8, v 14), dense MLPs in every layer
TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 40,
        "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 12, "v_head_dim": 14,
        "first_k_dense_replace": 2, "max_position_embeddings": 64}
#: DeepSeek-V2-Lite's MLA sizes (kv latent 512, no q latent, 128 + 64, v 128) at 2 heads
LITE = {**TINY, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "num_attention_heads": 2,
        "num_key_value_heads": 2}


def save(path: Path, overrides: dict, v3: bool = False) -> Path:
    torch.manual_seed(0)
    config, model = ((DeepseekV3Config, DeepseekV3ForCausalLM) if v3
                     else (DeepseekV2Config, DeepseekV2ForCausalLM))
    model(config(**overrides)).save_pretrained(path)
    return path


def check(path: Path, *args: str) -> dict:
    run = gac(path, "--format", "json", "--fail-on", "never", *args)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def by_name(doc: dict, layer: int = 0) -> dict[str, dict]:
    prefix = f"model.layers.{layer}.self_attn:"
    return {s["name"].removeprefix(prefix): s for s in doc["sites"]
            if s["name"].startswith(prefix)}


@pytest.mark.parametrize("v3", [False, True], ids=["deepseek_v2", "deepseek_v3"])
def test_sizes_read_from_the_tensors_and_every_tensor_read(tmp_path: Path, v3: bool) -> None:
    doc = check(save(tmp_path / "m", TINY, v3))
    assert doc["format"] == "mla"
    tensors = doc["summary"]["tensors"]
    assert tensors["read"] == tensors["in_sites"] == 27
    sites = by_name(doc)
    values = {k: (s["role"], s["value"]) for k, s in sites.items()}
    assert values == {"kv_lora_rank": ("kv_latent", 40), "q_lora_rank": ("rank", 24),
                      "qk_head_dim": ("head_dim", 20), "v_head_dim": ("head_dim", 14),
                      "heads": ("heads", 4)}
    assert not any(s["notes"] for s in sites.values())


def test_v2_lite_shape_without_a_q_latent(tmp_path: Path) -> None:
    sites = by_name(check(save(tmp_path / "m", LITE)))
    assert "q_lora_rank" not in sites
    assert sites["kv_lora_rank"]["value"] == 512 and sites["qk_head_dim"]["value"] == 192
    assert "model.layers.0.self_attn.q_proj.weight" in sites["qk_head_dim"]["tensors"]


def test_a_config_the_tensors_contradict_is_a_note_with_both_values(tmp_path: Path) -> None:
    path = save(tmp_path / "m", TINY)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(kv_lora_rank=48, v_head_dim=16, qk_rope_head_dim=4)
    (path / "config.json").write_text(json.dumps(cfg))
    sites = by_name(check(path))
    assert sites["kv_lora_rank"]["value"] == 40
    assert "the config says kv_lora_rank=48, tensors have 40" in sites["kv_lora_rank"]["notes"]
    assert "the config says v_head_dim=16, tensors have 14" in sites["v_head_dim"]["notes"]
    assert ("the config says qk_rope_head_dim=4, tensors have 8"
            in sites["qk_head_dim"]["notes"])


def _verdicts(doc: dict, site: str) -> dict:
    return by_name(doc)[site]["targets"][0]


def test_vllm_mla_backends_per_layer(tmp_path: Path) -> None:
    lite = save(tmp_path / "lite", LITE)
    h100 = check(lite, "--target", "vllm", "--gpu", "h100")
    decode = _verdicts(h100, "kv_lora_rank")
    assert (decode["verdict"], decode["kernel"]) == ("fast", "FLASH_ATTN_MLA")
    assert _verdicts(h100, "qk_head_dim")["verdict"] == "fast"
    # the backends read the latent plus the rope part: 448 + 64 = 512 is one of their sizes
    narrow = check(save(tmp_path / "narrow", {**LITE, "kv_lora_rank": 448}), "--target",
                   "vllm", "--gpu", "h100")
    assert _verdicts(narrow, "kv_lora_rank")["kernel"] == "FLASH_ATTN_MLA"
    a100 = check(lite, "--target", "vllm", "--gpu", "a100")
    assert _verdicts(a100, "kv_lora_rank")["kernel"] == "TRITON_MLA"
    assert _verdicts(a100, "kv_lora_rank")["verdict"] == "fast"
    tiny = check(save(tmp_path / "tiny", TINY), "--target", "vllm", "--gpu", "h100")
    latent = _verdicts(tiny, "kv_lora_rank")
    assert (latent["verdict"], latent["kernel"]) == ("fallback", "TRITON_MLA")
    assert "kv_lora_rank + qk_rope_head_dim" in latent["why"]
    assert latent["fix_to"] is None and "RMSNorm" in latent["cannot_pad"]
    prefill = _verdicts(tiny, "qk_head_dim")
    assert prefill["verdict"] == "refused"
    assert "No valid MLA prefill backend" in prefill["why"]
    assert prefill["source"]["ref"] == "v0.33.0"


def test_a_pruned_nope_width_does_not_load_in_vllm(tmp_path: Path) -> None:
    doc = check(save(tmp_path / "m", {**LITE, "qk_nope_head_dim": 96}), "--target", "vllm",
                "--gpu", "h100")
    qk = _verdicts(doc, "qk_head_dim")
    assert qk["verdict"] == "refused" and qk["fix_to"] is None
    assert qk["cannot_pad"].startswith("fast at 192, but the MLA q/k head size")
    assert _verdicts(doc, "kv_lora_rank")["verdict"] == "fast"


def test_repair_pads_v_head_dim_exactly_and_refuses_the_rest(tmp_path: Path) -> None:
    src = save(tmp_path / "m", TINY)
    out = tmp_path / "out"
    run = gac(src, "--repair", out, "--format", "json")
    assert run.returncode == 0, run.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["v_head_dim"], cfg["qk_nope_head_dim"], cfg["kv_lora_rank"]) == (16, 12, 40)
    a = AutoModelForCausalLM.from_pretrained(src).eval()
    b = AutoModelForCausalLM.from_pretrained(out).eval()
    assert b.model.layers[0].self_attn.o_proj.in_features == 4 * 16
    ids = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x, y = a(ids).logits, b(ids).logits
    assert torch.allclose(x, y, rtol=0, atol=1e-5 * x.abs().max().item())


def test_repair_refuses_the_latents_and_the_qk_head(tmp_path: Path) -> None:
    src = save(tmp_path / "m", TINY)
    sites = by_name(check(src))
    assert sites["kv_lora_rank"]["exact_repair"] is False
    assert "kv_a_layernorm" in sites["kv_lora_rank"]["refusal"]
    assert "would undo that only with eps 0" in sites["kv_lora_rank"]["refusal"]
    assert "q_a_layernorm" in sites["q_lora_rank"]["refusal"]
    assert "rotary" in sites["qk_head_dim"]["refusal"]
    assert sites["v_head_dim"]["exact_repair"] is True


def test_in_memory_and_on_disk_checks_agree(tmp_path: Path) -> None:
    import gac_check

    torch.manual_seed(0)
    model = DeepseekV2ForCausalLM(DeepseekV2Config(**TINY))
    model.save_pretrained(tmp_path / "m")
    memory, disk = gac_check.check(model), gac_check.check(tmp_path / "m")
    assert memory.format.name == disk.format.name == "mla"

    def seen(result: object) -> list[tuple]:
        return [(s.name, s.role, s.value, s.inexact, tuple(s.notes)) for s in result.sites]

    assert seen(memory) == seen(disk)
    assert [(f.site.name, f.severity) for f in memory.findings] == [
        (f.site.name, f.severity) for f in disk.findings]


def test_repair_for_vllm_pads_a_pruned_v_head_to_a_triple_vllm_loads(tmp_path: Path) -> None:
    """v pruned to 120 leaves (128, 64, 120), which no vLLM prefill backend takes; zero padding
    v to 128 is exact and gives DeepSeek-V2's own (128, 64, 128)."""
    src = save(tmp_path / "m", {**LITE, "v_head_dim": 120})
    before = check(src, "--target", "vllm", "--gpu", "h100")
    assert _verdicts(before, "qk_head_dim")["verdict"] == "fast"
    v = _verdicts(before, "v_head_dim")
    assert (v["verdict"], v["fix_to"]) == ("refused", 128)
    out = tmp_path / "out"
    run = gac(src, "--target", "vllm", "--gpu", "h100", "--repair", out)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "config.json").read_text())["v_head_dim"] == 128
    after = check(out, "--target", "vllm", "--gpu", "h100")
    assert _verdicts(after, "v_head_dim")["verdict"] == "fast"
    a = AutoModelForCausalLM.from_pretrained(src).eval()
    b = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        x, y = a(ids).logits, b(ids).logits
    assert torch.allclose(x, y, rtol=0, atol=1e-5 * x.abs().max().item())


def test_layers_of_different_latent_ranks_do_not_load_in_vllm(tmp_path: Path) -> None:
    """DeepSeek's classes build every layer from one kv_lora_rank: a checkpoint whose layer 1
    was cut to another latent rank is read, and refused by vLLM at that layer's sites."""
    from safetensors.torch import load_file, save_file

    wide, narrow = save(tmp_path / "wide", LITE), save(tmp_path / "narrow",
                                                       {**LITE, "kv_lora_rank": 448})
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    state = load_file(wide / "model.safetensors")
    state |= {n: t for n, t in load_file(narrow / "model.safetensors").items()
              if n.startswith("model.layers.1.")}
    save_file(state, mixed / "model.safetensors", metadata={"format": "pt"})
    (mixed / "config.json").write_text((wide / "config.json").read_text())
    doc = check(mixed, "--target", "vllm", "--gpu", "h100")
    assert by_name(doc, 1)["kv_lora_rank"]["value"] == 448
    latent = by_name(doc, 1)["kv_lora_rank"]["targets"][0]
    assert latent["verdict"] == "refused" and "one intermediate_size" in latent["why"]
    uniform = check(wide, "--target", "vllm", "--gpu", "h100")
    assert _verdicts(uniform, "kv_lora_rank")["verdict"] == "fast"


def test_engines_whose_mla_backends_are_not_read_refuse_the_latent_sites(tmp_path: Path) -> None:
    """SGLang before v0.5.23, TensorRT-LLM and vLLM before v0.30.0 have no MLA rule in their
    packs: the latent rank and the q/k and v head sizes are refused as not judged (a gate never
    passes what it did not read), not passed as fast; q_lora_rank, a plain low-rank pair of
    linears, is judged as one."""
    doc = check(save(tmp_path / "m", TINY), "--target", "sglang@v0.4.6.post5", "--target",
                "tensorrt-llm", "--target", "vllm@v0.17.0", "--target", "vllm")
    sites = by_name(doc)
    for dim in ("kv_lora_rank", "qk_head_dim", "v_head_dim"):
        *unread, vllm = sites[dim]["targets"]
        for verdict in unread:
            assert verdict["verdict"] == "refused", (dim, verdict)
            assert verdict["why"].startswith("not judged for MLA: "), verdict["why"]
        assert not vllm["why"].startswith("not judged"), vllm
    assert all(t["verdict"] == "fast" for t in sites["q_lora_rank"]["targets"])
    assert doc["summary"]["targets"]["sglang@v0.4.6.post5"]["verdict"] == "refused"


def _kernels(doc: dict) -> dict[str, tuple[str, str | None]]:
    return {dim: (_verdicts(doc, dim)["verdict"], _verdicts(doc, dim)["kernel"])
            for dim in ("kv_lora_rank", "qk_head_dim", "v_head_dim")}


def test_sglang_mla_backends_fa3_on_hopper_triton_below(tmp_path: Path) -> None:
    """SGLang v0.5.23 picks fa3 for an MLA model on Hopper and triton below it
    (get_default_attn_backend); DeepSeek-V2-Lite's sizes fill both backends' tiles."""
    lite = save(tmp_path / "lite", LITE)
    h100 = check(lite, "--target", "sglang", "--gpu", "h100")
    assert _kernels(h100) == {"kv_lora_rank": ("fast", "fa3 (absorbed MLA)"),
                              "qk_head_dim": ("fast", "fa3 (MHA prefill)"),
                              "v_head_dim": ("fast", "fa3 (MHA prefill)")}
    source = _verdicts(h100, "kv_lora_rank")["source"]
    assert (source["repo"], source["ref"]) == ("sgl-project/sglang", "v0.5.23")
    assert source["function"].startswith("FlashAttentionBackend.forward_decode")
    a100 = check(lite, "--target", "sglang", "--gpu", "a100")
    assert _kernels(a100) == {"kv_lora_rank": ("fast", "decode_attention (Triton)"),
                              "qk_head_dim": ("fast", "extend_attention (Triton)"),
                              "v_head_dim": ("fast", "extend_attention (Triton)")}


def test_sglang_mla_a_narrower_latent_runs_in_a_padded_tile(tmp_path: Path) -> None:
    """A latent of 448 loads on both backends but in a tile padded to 512: FA3's V tile
    (round_up_headdimv) and the Triton decode's next_power_of_2(kv_lora_rank)."""
    narrow = save(tmp_path / "narrow", {**LITE, "kv_lora_rank": 448})
    h100 = _verdicts(check(narrow, "--target", "sglang", "--gpu", "h100"), "kv_lora_rank")
    assert (h100["verdict"], h100["kernel"]) == ("fallback", "fa3 (absorbed MLA, padded tile)")
    assert "kv_lora_rank in {256, 512}" in h100["why"]
    a100 = _verdicts(check(narrow, "--target", "sglang", "--gpu", "a100"), "kv_lora_rank")
    assert (a100["verdict"], a100["kernel"]) == ("fallback",
                                                 "decode_attention (Triton, padded tile)")


def test_sglang_mla_sizes_fa3_does_not_take_are_refused_on_hopper(tmp_path: Path) -> None:
    """FA3's absorbed decode needs a latent of 256-512 (q_v: hdim_v >= 256) and its prefill
    q/k heads that are multiples of 8: the toy (40, 12 + 8, 14) layer does not run on Hopper,
    and SGLang has no other backend to fall back on; below Hopper Triton runs it, padded."""
    tiny = save(tmp_path / "tiny", TINY)
    h100 = check(tiny, "--target", "sglang", "--gpu", "h100")
    latent = _verdicts(h100, "kv_lora_rank")
    assert latent["verdict"] == "refused" and "hdim_v >= 256" in latent["why"]
    assert latent["fix_to"] is None
    assert _verdicts(h100, "qk_head_dim")["verdict"] == "refused"
    assert "multiple of 8" in _verdicts(h100, "qk_head_dim")["why"]
    a100 = check(tiny, "--target", "sglang", "--gpu", "a100")
    assert {v for v, _ in _kernels(a100).values()} == {"fallback"}


def test_repair_for_sglang_pads_a_pruned_v_head_to_fa3s_tile(tmp_path: Path) -> None:
    """(128 + 64, v 120) loads on FA3 (q/k in (128, 192], V in (96, 128]) in a V tile padded to
    128; --repair OUT --target sglang pads v to 128 exactly, and the re-check is fast."""
    src = save(tmp_path / "m", {**LITE, "v_head_dim": 120})
    v = _verdicts(check(src, "--target", "sglang", "--gpu", "h100"), "v_head_dim")
    assert (v["verdict"], v["kernel"], v["fix_to"]) == (
        "fallback", "fa3 (MHA prefill, padded tile)", 128)
    out = tmp_path / "out"
    run = gac(src, "--target", "sglang", "--gpu", "h100", "--repair", out)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "config.json").read_text())["v_head_dim"] == 128
    after = check(out, "--target", "sglang", "--gpu", "h100")
    assert _kernels(after)["v_head_dim"] == ("fast", "fa3 (MHA prefill)")


def test_a_query_and_key_nope_width_that_disagree_name_each_from_its_tensor(
        tmp_path: Path) -> None:
    """Issue 38's arithmetic bug: with q_b_proj one row per head wider than qk_nope 12 +
    rope 8, the refusal said "kv_b_proj makes 26 rows per head, not qk_nope_head_dim +
    v_head_dim = 13 + 14", calling q's 13 the nope width; kv_b_proj's own is 26 - 14 = 12
    (the config's). Each width is now named from the tensor it is read from."""
    from tests.helpers import rewrite_safetensors

    src = save(tmp_path / "m", {**TINY, "num_hidden_layers": 1, "first_k_dense_replace": 1})

    def widen_q(state: dict) -> None:
        name = "model.layers.0.self_attn.q_b_proj.weight"
        state[name] = torch.cat([state[name], state[name][:4]])  # 80 -> 84 rows: 21 a head

    rewrite_safetensors(src, widen_q)
    run = gac(src, "--format", "json", "--fail-on", "never")
    assert run.returncode == 2, run.stdout
    line = run.stderr.strip()
    assert "q_proj makes 21 rows per head, so qk_nope_head_dim = 21 - qk_rope_head_dim 8 = 13" \
        in line, line
    assert "kv_b_proj makes 26 per head, so qk_nope_head_dim = 26 - v_head_dim 14" in line
    assert "= 12: the query and key nope widths disagree" in line
