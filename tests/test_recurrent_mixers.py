"""Recurrent mixers and hybrid blocks beyond Mamba, read through their own classes.

Zamba's shared transformer block (its attention reads concat(hidden, embeddings), 2 x hidden),
RecurrentGemma (RG-LRU blocks; its MLP is intermediate_size // 2 wide), xLSTM (mLSTM blocks;
the feed-forward width from ``ffn_proj_factor``) and Bailing-hybrid (linear-attention layers
saved under other names than their modules'), Kimi-Linear (delta attention beside MoE,
recognised by its widths as LLM-Pruner's layout) and Inkling (a router over routed and shared
experts). Each is built tiny by transformers' own class
(the zoo's build, gac_check/testing/zoo.py), written with ``save_pretrained`` and checked from
its headers: every tensor accounted, each width on the site its class gives it.
docs/formats.md "Hybrid and SSM models".
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import gac_check
from gac_check.errors import BadInput
from gac_check.formats.derive_table import derive
from gac_check.formats.derived import table
from gac_check.sites import Role
from gac_check.testing.zoo import build_tiny

TYPES = ("zamba", "zamba2", "recurrent_gemma", "xlstm", "bailing_hybrid", "kimi_linear",
         "inkling_text")


def _check(model_type: str, variant: str, tmp_path: Path):
    build_tiny(model_type, variant, tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and result.accounting.unknown == []
    return result


def _on(result, role: Role) -> dict[tuple[str, int], int]:
    return {(a.tensor, a.axis): s.value for s in result.sites if s.role is role
            for a in s.axes}


@pytest.mark.parametrize("model_type", ["zamba", "zamba2"])
def test_zamba_shared_block_reads_twice_the_hidden_size(model_type: str,
                                                        tmp_path: Path) -> None:
    """q/k/v's columns and the block's input norm are two hidden-wide halves of the hidden
    site (Zamba's attention_hidden_size = 2 x hidden_size)."""
    result = _check(model_type, "aligned", tmp_path)
    hidden = next(s for s in result.sites if s.role is Role.HIDDEN)
    block = "shared_transf" if model_type == "zamba" else "shared_transformer"
    q = next(a for a in hidden.axes if a.tensor.endswith(f"{block}.self_attn.q_proj.weight"))
    halves = sorted(a.start for a in hidden.axes if a.tensor == q.tensor)
    assert q.axis == 1 and halves == [0, 64]
    assert result.verdict() == "pass"


def test_recurrent_gemma_mlp_is_half_the_config_width(tmp_path: Path) -> None:
    """intermediate_size 173 builds an MLP 86 wide: judged as the MLP site, and repaired to
    88 with config.json's intermediate_size 176, the class's own key at twice the width
    (OUT strict, logits equal)."""
    import torch

    from tests import family_models

    result = _check("recurrent_gemma", "mlp173", tmp_path)
    mlp = _on(result, Role.INTERMEDIATE)
    assert mlp[("model.layers.0.mlp_block.down_proj.weight", 1)] == 86
    assert any(f.site.value == 86 for f in result.findings)
    # RG-LRU's gates and recurrence parameter: the recurrent mixer's own, accounted
    kinds = result.accounting.kinds
    assert kinds["model.layers.0.temporal_block.rg_lru.recurrent_param"] == "SSM parameter"
    gac_check.repair(tmp_path / "m", tmp_path / "out", gpu="h100", dtype="bfloat16",
                     progress=False)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["intermediate_size"] == 176
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 64]])
    with torch.no_grad():
        before = family_models.load(tmp_path / "m")(ids, use_cache=False).logits
        after = family_models.load(tmp_path / "out")(ids, use_cache=False).logits
    assert (after - before).abs().max().item() <= 1e-5  # fp32; only summation order moves


def test_xlstm_ffn_width_and_mlstm_gemms(tmp_path: Path) -> None:
    """The feed-forward width round_up(64 x 2.667, 64) = 192 is the MLP site; mLSTM's q/k
    rows (hidden x qk_dim_factor) are GEMM widths of the recurrent mixer."""
    result = _check("xlstm", "aligned", tmp_path)
    mlp = _on(result, Role.INTERMEDIATE)
    assert mlp[("backbone.blocks.0.ffn.proj_down.weight", 1)] == 192
    assert mlp[("backbone.blocks.0.ffn.proj_up_gate.weight", 0)] == 192
    ssm = _on(result, Role.SSM)
    assert ssm[("backbone.blocks.0.mlstm_layer.q.weight", 0)] == 32
    ffn = next(s for s in result.sites if s.name == "backbone.blocks.0.ffn:intermediate")
    assert "does not record as itself" in (ffn.inexact or "")  # no key holds it: not padded


def test_bailing_linear_attention_read_under_its_saved_names(tmp_path: Path) -> None:
    """Saved as ``attention.dense`` / ``attention.A_log`` from modules named
    ``self_attn.o_proj`` / ``self_attn.forget_gate``: still the linear-attention mixer, its
    projections GEMM sites, its decay, conv and group norm accounted."""
    result = _check("bailing_hybrid", "aligned", tmp_path)
    ssm = _on(result, Role.SSM)
    assert ssm[("model.layers.0.attention.dense.weight", 1)] == 64
    assert ssm[("model.layers.0.attention.q_proj.weight", 0)] == 64
    kinds = result.accounting.kinds
    assert kinds["model.layers.0.attention.o_norm.weight"] == "SSM parameter"
    assert kinds["model.layers.0.attention.A_log"] == "SSM parameter"
    # the q/k/v short convolutions' taps: one conv-width site (causal-conv1d takes 2-4)
    conv = next(s for s in result.sites if s.name == "model.layers.0.attention:ssm_conv")
    assert conv.value == 4 and conv.role is Role.SSM_CONV
    assert {(a.tensor.rsplit(".", 2)[1], a.axis) for a in conv.axes} == {
        ("q_conv1d", 2), ("k_conv1d", 2), ("v_conv1d", 2)}


def test_kimi_linear_read_by_the_table_where_llm_pruner_leaves_tensors(tmp_path: Path) -> None:
    """Its delta-attention q_proj (4096) disagrees with heads x head_dim, so LLM-Pruner's
    layout matches and leaves the MoE unread; the class table reads every tensor: the
    delta attention's projections as GEMM sites, the experts at 173."""
    result = _check("kimi_linear", "mlp173", tmp_path)
    assert result.format.name == "derived"
    ssm = _on(result, Role.SSM)
    assert ssm[("model.layers.0.self_attn.q_proj.weight", 0)] == 4096
    experts = _on(result, Role.EXPERT)
    assert experts[("model.layers.1.block_sparse_moe.experts.0.w2.weight", 1)] == 173
    assert result.accounting.kinds["model.layers.0.self_attn.A_log"] == "SSM parameter"
    conv = next(s for s in result.sites if s.name == "model.layers.0.self_attn:ssm_conv")
    assert conv.value == 4


def test_inkling_router_scores_routed_and_shared_experts(tmp_path: Path) -> None:
    """The router's rows are n_routed_experts + n_shared_experts (256 + 2): a site of their
    own beside the experts' count."""
    result = _check("inkling_text", "mlp173", tmp_path)
    router = next(s for s in result.sites if s.name == "model.layers.0.mlp:router_experts")
    assert router.value == 258 and router.role is Role.EXPERTS
    assert any(f.site.value == 173 for f in result.findings)


def test_a_delta_attention_conv_wider_than_4_taps_is_an_error(tmp_path: Path) -> None:
    """causal-conv1d (and vLLM's Triton port, which Kimi-Linear's delta attention calls)
    takes 2 to 4 taps: Bailing-hybrid built with short_conv_kernel_size 5 breaks that rule."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("bailing_hybrid", hidden_size=64, num_attention_heads=4,
                               num_key_value_heads=4, head_dim=16, intermediate_size=128,
                               num_hidden_layers=2, vocab_size=512, short_conv_kernel_size=5,
                               pad_token_id=0, bos_token_id=0, eos_token_id=0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    broken = {(f.site.name, r.id) for f in result.findings for r in f.rules}
    assert ("model.layers.0.attention:ssm_conv", "ssm-conv-width") in broken


@pytest.mark.parametrize("model_type", TYPES)
def test_shipped_table_matches_the_recurrent_classes(model_type: str) -> None:
    """Stale after a transformers upgrade: rerun python -m gac_check.formats.derive_table."""
    assert table()["types"][model_type] == derive(model_type)


@pytest.mark.parametrize(("model_type", "pattern", "axis"), [
    ("phi4_multimodal", "model.layers.{i}.self_attn.qkv_proj.weight", 0),  # (n + 2k) d = 2h
    ("moshi", "model.layers.{i}.mlp.fc2.weight", 1),  # a gated MLP's ffn_dim // 2
])
def test_formula_widths_are_not_matched_by_size_elsewhere(model_type: str, pattern: str,
                                                          axis: int) -> None:
    """2 x hidden and intermediate_size // 2 are labels only where the config says so
    (Zamba's attention_hidden_size, RecurrentGemma): a fused qkv that happens to be 2 x
    hidden is no concatenated input, Moshi's fc1 writes the full ffn_dim."""
    derived = derive(model_type)
    assert derived["tensors"][pattern]["axes"][axis] not in ("hidden2", "inter_half")
    assert table()["types"][model_type] == derived


def test_an_ssm_warning_alone_leaves_the_minimal_repair_of_the_mlp(tmp_path: Path) -> None:
    """Zamba2's fused in_proj (392 rows) is only a warning: a minimal repair leaves it, as it
    leaves every warning, and pads the shared block's MLP 173 -> 176 (OUT strict, logits
    equal); an optimal repair would pad the in_proj too and is refused naming it."""
    import torch

    from tests import family_models

    build_tiny("zamba2", "mlp173", tmp_path / "m")
    with pytest.raises(BadInput, match=r"mamba\.in_proj:ssm_out = 392 is an SSM mixer"):
        gac_check.repair(tmp_path / "m", tmp_path / "opt", gpu="h100", dtype="bfloat16",
                         strategy="optimal", progress=False)
    assert not (tmp_path / "opt").exists()
    fixed = gac_check.repair(tmp_path / "m", tmp_path / "out", gpu="h100", dtype="bfloat16",
                             progress=False)
    assert {(s.value, s.role) for s in fixed.after.sites if s.value == 176} == {
        (176, Role.INTERMEDIATE)}
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 64]])
    with torch.no_grad():
        before = family_models.load(tmp_path / "m")(ids, use_cache=False).logits
        after = family_models.load(tmp_path / "out")(ids, use_cache=False).logits
    assert (after - before).abs().max().item() <= 1e-5  # fp32; only summation order moves


def test_a_mamba_config_with_an_infinite_time_step_limit_is_held_to_its_class(
        tmp_path: Path) -> None:
    """Bamba's config.json stores time_step_limit (0, inf) as {"__float__": "Infinity"}: the
    repair's class proof reads it as transformers does, so the MLP beside the Mamba layers
    is padded 173 -> 176 rather than refused as a config its class cannot build."""
    build_tiny("bamba", "mlp173", tmp_path / "m")
    assert "__float__" in (tmp_path / "m" / "config.json").read_text()
    gac_check.repair(tmp_path / "m", tmp_path / "out", gpu="h100", dtype="bfloat16",
                     progress=False)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["intermediate_size"] == 176
