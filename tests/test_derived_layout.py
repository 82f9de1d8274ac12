"""The layout table derived from transformers' own classes, read on real tiny checkpoints.

Each model is built by its own class with random weights (every MLP / expert width 173),
written by ``save_pretrained`` (safetensors) and checked from its headers, as a user would.
These are the families the hand-written table refused (issue 38).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import gac_check
from gac_check.errors import BadInput
from gac_check.formats.derive_table import derive
from gac_check.formats.derived import table
from gac_check.sites import AxisKind, Role
from gac_check.testing.zoo import build_tiny

#: once refused ("no transformer layers found", an unread tensor), now judged
FAMILIES = ["gpt2", "gpt_neox", "falcon", "gptj", "bloom", "mpt", "codegen", "starcoder2",
            "olmo2", "olmoe", "llama4_text", "granitemoe", "glm4_moe", "ernie4_5_moe",
            "hunyuan_v1_moe", "apertus"]
MLP_ROLES = (Role.INTERMEDIATE, Role.EXPERT, Role.SHARED_EXPERT)


#: BLOOM and MPT build the MLP 4 x hidden (no width key): misaligned by their heads instead
HEAD_ONLY = ("bloom", "mpt")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_once_refused_family_is_judged(model_type: str, tmp_path: Path) -> None:
    variant = "hd20" if model_type in HEAD_ONLY else "mlp173"
    build_tiny(model_type, variant, tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and result.accounting.unknown == []
    roles, value = ((Role.HEAD_DIM,), 20) if variant == "hd20" else (MLP_ROLES, 173)
    widths = {s.value for s in result.sites if s.role in roles}
    assert value in widths, sorted((s.name, s.value) for s in result.sites)
    assert result.verdict() == "fail"
    assert any(s.role is Role.HEAD_DIM for s in result.sites)
    if model_type == "apertus":  # act_fn.alpha_n/alpha_p/beta/eps: no config width
        assert "fixed by the class" in result.accounting.kinds.values()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gac_check.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


def test_gpt2_conv1d_layout_through_the_cli(tmp_path: Path) -> None:
    """GPT-2's Conv1D keeps [in, out]: c_fc's columns and c_proj's rows carry the MLP width."""
    build_tiny("gpt2", "mlp173", tmp_path / "m")
    done = _cli(str(tmp_path / "m"), "--gpu", "h100", "--dtype", "bfloat16",
                "--format", "json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["format"] == "derived"
    assert any(s["name"] == "transformer.h.0.mlp:intermediate" and s["value"] == 173
               for s in doc["sites"])
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    mlp = next(s for s in result.sites if s.name == "transformer.h.0.mlp:intermediate")
    axes = {(a.tensor, a.axis, a.kind) for a in mlp.axes}
    assert ("transformer.h.0.mlp.c_fc.weight", 1, AxisKind.PRODUCER) in axes
    assert ("transformer.h.0.mlp.c_proj.weight", 0, AxisKind.CONSUMER) in axes
    assert ("transformer.h.0.mlp.c_fc.bias", 0, AxisKind.BIAS) in axes


def test_a_tensor_that_contradicts_the_class_is_refused(tmp_path: Path) -> None:
    build_tiny("gpt2", "mlp173", tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    weights["transformer.h.0.mlp.c_proj.weight"] = torch.zeros(176, 64)
    save_file(weights, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BadInput, match="mlp width disagrees across its tensors"):
        gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")


def test_the_tensor_that_disagrees_is_named(tmp_path: Path) -> None:
    """Among a hidden width's dozens of tensors, the refusal names the one that differs."""
    build_tiny("gpt2", "aligned", tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    weights["transformer.ln_f.weight"] = torch.ones(72)
    save_file(weights, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BadInput, match=r"transformer\.ln_f\.weight: 72"):
        gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")


@pytest.mark.parametrize("model_type, torn", [
    ("gpt2", "transformer.h.1.attn.c_proj.weight"),  # one linear of an attention it has
    ("gpt2", "transformer.h.0.mlp.c_fc.bias"),  # a bias beside its weight
    ("mixtral", "model.layers.1.mlp.gate.weight"),  # a router beside its experts
    ("mixtral", "model.layers.0.mlp.experts.1.down_proj.weight"),  # one expert's down
])
def test_a_checkpoint_with_a_part_torn_out_is_refused(model_type: str, torn: str,
                                                      tmp_path: Path) -> None:
    """The table reads what is there and refuses what its class builds and the checkpoint
    lacks: judged by what is left, a torn model passed (a Mixtral without one router: exit 0
    with 0 findings), though its own class cannot load it as saved."""
    build_tiny(model_type, "aligned", tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    if torn not in weights:  # transformers' own names for this class (Mixtral: w1/w2/w3)
        torn = next(k for k in weights if k.replace("block_sparse_moe", "mlp")
                    .replace(".w2.", ".down_proj.") == torn)
    del weights[torn]
    save_file(weights, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BadInput, match=rf"{torn.replace('.', '[.]')} is missing"):
        gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")


def test_a_width_the_table_cannot_name_is_refused_with_its_layer_kind(
        tmp_path: Path, monkeypatch) -> None:
    """Mamba is read (tests/test_hybrid_ssm.py); an axis the table leaves ``?`` still is not."""
    from gac_check.formats import derived

    build_tiny("mamba", "aligned", tmp_path / "m")
    mamba = table()["types"]["mamba"]
    x_proj = "backbone.layers.{i}.mixer.x_proj.weight"
    tensors = {**mamba["tensors"], x_proj: {**mamba["tensors"][x_proj], "axes": ["?", "?"]}}
    unnamed = {**table(), "types": {**table()["types"], "mamba": {**mamba, "tensors": tensors}}}
    monkeypatch.setattr(derived, "table", lambda: unnamed)
    with pytest.raises(BadInput, match=r"x_proj\.weight axis 0 .* MambaForCausalLM's mixer"):
        gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")


@pytest.mark.parametrize(("model_type", "why"), [
    ("bart", "config derives head_dim from hidden_size / num_attention_heads"),
    ("albert", "config derives head_dim from hidden_size / num_attention_heads"),
    ("apertus", "under RoPE")])  # and derived: both reasons are said
def test_a_head_dim_is_refused_for_its_own_classs_reason(model_type: str, why: str,
                                                          tmp_path: Path) -> None:
    """BART and ALBERT have no RoPE: their head_dim is refused because the class derives it
    from hidden_size / heads (no key records a padded one), never "under RoPE"; a class
    with RoPE (Apertus) is refused for the rotary frequencies too."""
    build_tiny(model_type, "hd20", tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    reasons = {s.inexact for s in result.sites if s.role is Role.HEAD_DIM and s.value == 20}
    assert reasons and all(why in r for r in reasons), reasons
    if "RoPE" not in why:
        assert not any("RoPE" in r for r in reasons), reasons


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertLMHeadModel"])
def test_bert_lm_head_gets_a_vocab_site(head: str, tmp_path: Path) -> None:
    import transformers

    config = transformers.BertConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                     intermediate_size=128, vocab_size=517, pad_token_id=0,
                                     is_decoder=head == "BertLMHeadModel")
    getattr(transformers, head)(config).save_pretrained(tmp_path / "m")
    done = _cli(str(tmp_path / "m"), "--gpu", "h100", "--format", "json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["format"] == "dense"  # the hand-written BERT family, not the table's fallback
    vocab = next(s for s in doc["sites"] if s["role"] == "vocab")
    assert vocab["value"] == 517
    assert "cls.predictions.bias" in vocab["tensors"]


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neox", "olmo2", "llama4_text", "bert",
                                        "roberta-prelayernorm", "ctrl", "git"])
def test_shipped_table_matches_the_installed_classes(model_type: str) -> None:
    """Stale after a transformers upgrade: rerun python -m gac_check.formats.derive_table."""
    import transformers

    assert table()["transformers"] == transformers.__version__
    assert table()["types"][model_type] == derive(model_type)


def test_a_type_the_table_lacks_is_derived_at_run_time(tmp_path: Path, monkeypatch) -> None:
    """A transformers newer than the shipped table: the class is built on the meta device."""
    from gac_check.formats import derived

    older = {**table(), "types": {k: v for k, v in table()["types"].items() if k != "gpt2"}}
    monkeypatch.setattr(derived, "table", lambda: older)
    derived.derive_now.cache_clear()
    build_tiny("gpt2", "mlp173", tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    assert result.format.name == "derived"
    assert any(s.value == 173 for s in result.sites if s.role is Role.INTERMEDIATE)
