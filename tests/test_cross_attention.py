"""Encoder-decoder decoders that transformers ships as *ForCausalLM, read with their
cross-attention: built tiny by their own classes (random weights), saved, checked.

BART-style decoders (BartForCausalLM, MarianForCausalLM) carry an ``encoder_attn`` per layer
whose q/k/v/out projections are heads of the same head_dim as the self-attention; TrOCR's
reads an encoder of another width (``cross_attention_hidden_size``), a GEMM K of its own.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import gac_check
from gac_check.sites import Role
from gac_check.testing.zoo import build_tiny


@pytest.mark.parametrize("model_type", ["bart", "marian"])
def test_cross_attention_heads_are_judged(model_type: str, tmp_path: Path) -> None:
    build_tiny(model_type, "hd20", tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and result.accounting.unknown == []
    layer = "model.decoder.layers.1.encoder_attn"
    site = next(s for s in result.sites if s.name == f"{layer}:head_dim")
    assert site.value == 20
    assert {a.tensor for a in site.axes} == {f"{layer}.{p}_proj.{w}" for p in "qkv"
                                             for w in ("weight", "bias")} | {
        f"{layer}.out_proj.weight"}
    assert any(f.site is site and f.severity == "error" for f in result.findings)
    hidden = next(s for s in result.sites if s.name == "hidden")
    assert {(f"{layer}.k_proj.weight", 1), (f"{layer}.v_proj.weight", 1)} <= {
        (a.tensor, a.axis) for a in hidden.axes}


def _trocr(out: Path, cross: int | None) -> None:
    from transformers import TrOCRConfig, TrOCRForCausalLM

    config = TrOCRConfig(d_model=64, decoder_attention_heads=4, decoder_ffn_dim=128,
                         decoder_layers=2, vocab_size=512, cross_attention_hidden_size=cross,
                         pad_token_id=0, bos_token_id=0, eos_token_id=0,
                         decoder_start_token_id=0)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        TrOCRForCausalLM(config).save_pretrained(out)


@pytest.mark.parametrize(("cross", "verdict"), [(48, "pass"), (44, "fail")])
def test_an_encoder_of_another_width_is_its_own_site(cross: int, verdict: str,
                                                     tmp_path: Path) -> None:
    """TrOCR-small's decoder (d_model 256) reads a 384-wide encoder: it was refused as a
    hidden width its class would not load; the encoder's width is judged as the K it is."""
    _trocr(tmp_path / "m", cross)
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    site = next(s for s in result.sites if s.name == "cross_hidden")
    assert site.role is Role.HIDDEN and site.value == cross
    assert site.config_field == ("cross_attention_hidden_size",)
    assert {(a.tensor, a.axis) for a in site.axes} == {
        (f"model.decoder.layers.{i}.encoder_attn.{p}_proj.weight", 1)
        for i in (0, 1) for p in "kv"}
    assert result.verdict() == verdict
    assert [f.site.name for f in result.findings if f.severity == "error"] == (
        ["cross_hidden"] if verdict == "fail" else [])


def test_shipped_table_labels_the_encoder_width() -> None:
    """Stale after a transformers upgrade: rerun python -m gac_check.formats.derive_table."""
    from gac_check.formats.derive_table import derive
    from gac_check.formats.derived import table

    entry = table()["types"]["trocr"]
    assert entry == derive("trocr")
    assert entry["tensors"]["model.decoder.layers.{i}.encoder_attn.k_proj.weight"]["axes"] \
        == ["q", "cross"]
