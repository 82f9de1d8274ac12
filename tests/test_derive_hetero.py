"""Classes whose layers are not all alike, read from the class table (issue 38): each was
refused in every zoo variant ("no transformer layers found", a width the table could not
name, a tensor missing or unread) although transformers builds it."""
from __future__ import annotations

from pathlib import Path

import pytest

import gac_check
from gac_check.errors import BadInput
from gac_check.formats.derived import table
from gac_check.sites import Role
from gac_check.testing.zoo import _build as build


def _judged(path: Path):
    result = gac_check.check(path, gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and result.accounting.unknown == []
    return result


@pytest.mark.parametrize("model_type", ["qwen4_exp", "qwen4_exp_text"])
def test_qwen4_exp_is_in_the_table_and_judged(model_type: str, tmp_path: Path) -> None:
    """Qwen4-Exp's config refused the table's build (top-k 10 of 5 experts; its indexed
    attention needs the QSA indexer's widths), so the table lacked it and a tiny Qwen4-Exp
    was "not a format gac-check recognises". Its hyper-connections' streams x hidden axes
    are read as the hidden width, once per stream."""
    assert "qwen4_exp_text" in table()["types"]
    _, misaligned = build(model_type, "mlp173", tmp_path / "m")
    assert misaligned
    result = _judged(tmp_path / "m")
    assert result.verdict() == "fail"
    assert 173 in {s.value for s in result.sites if s.role is Role.EXPERT}
    hidden = next(s for s in result.sites if s.role is Role.HIDDEN and s.layer is None)
    streams = [a for a in hidden.axes if a.tensor.endswith("hc_norm.weight")]
    assert len(streams) == 4 * 5  # hc_count streams: the mixer, two residuals in two layers


def _save(model_type: str, path: Path, **config) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
    model.save_pretrained(path)


def test_moshi_gated_mlp_is_read_at_its_half_width(tmp_path: Path) -> None:
    """Moshi's fc1 makes ffn_dim rows (gate and up fused), fc2 reads ffn_dim // 2, and its
    embedding has vocab + 1 rows: the table named neither, so Moshi was refused in every
    variant. The MLP's GEMM width is the half (173 of ffn_dim 346), fc1 two halves of it."""
    _save("moshi", tmp_path / "m", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
          head_dim=16, num_hidden_layers=2, ffn_dim=346, vocab_size=512)
    result = _judged(tmp_path / "m")
    assert result.verdict() == "fail"
    mlp = [s for s in result.sites if s.role is Role.INTERMEDIATE]
    assert {s.value for s in mlp} == {173} and len(mlp) == 2
    assert {s.value for s in result.sites if s.role is Role.VOCAB} == {512}


def test_prophetnet_decoder_with_its_cross_attention_is_judged(tmp_path: Path) -> None:
    """ProphetNet's table build failed (its head counts are num_decoder_attention_heads), so
    243 tensors went unread. Its decoder embedding is tied to the shared one (not saved); its
    relative-position projection makes num_buckets x heads rows, read as the heads count."""
    _, misaligned = build("prophetnet", "mlp173", tmp_path / "m")
    assert misaligned
    result = _judged(tmp_path / "m")
    assert result.verdict() == "fail"
    layer = "prophetnet.decoder.layers.1"
    assert 173 in {s.value for s in result.sites if s.role is Role.INTERMEDIATE}
    heads = next(s for s in result.sites if s.role is Role.HEADS and s.layer == 1)
    assert heads.value == 16  # ProphetNet's default head count: the zoo sets another key
    assert len(heads.axes) == 2 * 32  # weight and bias, num_buckets blocks of heads each
    hidden = next(s for s in result.sites if s.name == "hidden")
    assert (f"{layer}.cross_attn.key_proj.weight", 1) in {(a.tensor, a.axis)
                                                          for a in hidden.axes}


def test_mimo_v2_flash_layer_kinds_and_value_heads(tmp_path: Path) -> None:
    """MiMo-V2-Flash's value heads are v_head_dim wide (not head_dim): o_proj's input was a
    width the table could not name, so it was refused in every variant. Its sliding-window
    layers hold twice the key/value heads: the table records the labels per layer kind, and
    config.json's layer_types says which kind each layer is."""
    import json

    build("mimo_v2_flash", "hd20", tmp_path / "m")
    result = _judged(tmp_path / "m")
    assert result.verdict() == "fail"
    sites = {s.name: s for s in result.sites}
    for layer, kv_heads in ((0, 2), (1, 4)):  # full attention, then sliding window
        attn = f"model.layers.{layer}.self_attn"
        assert sites[f"{attn}:head_dim"].value == 20
        value = sites[f"{attn}:v_head_dim"]
        assert value.value == 128 and value.config_field == ("v_head_dim",)
        assert {(a.tensor, a.blocks) for a in value.axes} == {
            (f"{attn}.v_proj.weight", kv_heads), (f"{attn}.o_proj.weight", 4)}
    config = tmp_path / "m" / "config.json"
    cfg = json.loads(config.read_text())
    del cfg["layer_types"]
    config.write_text(json.dumps(cfg))
    with pytest.raises(BadInput, match="layer_types does not say layer 0's kind"):
        gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")


def test_longcat_flash_identity_experts_and_latent_attention(tmp_path: Path) -> None:
    """LongCat-Flash's identity experts hold gate and up but no down (the fused gate_up is
    built for n_routed_experts + zero_expert_num, down for the routed ones): expert 512's
    down_proj was "missing", so it was refused in every variant. Its router reads every
    expert, and its two latent attentions per layer are read as DeepSeek's."""
    _, misaligned = build("longcat_flash", "mlp173", tmp_path / "m")
    assert misaligned
    result = _judged(tmp_path / "m")
    assert result.verdict() == "fail"
    experts = [s for s in result.sites if s.role is Role.EXPERT and s.layer == 0]
    assert {s.value for s in experts} == {173}
    assert len(experts) == 512 + 256  # the identity experts' gate/up rows are a width too
    router = next(s for s in result.sites if s.role is Role.EXPERTS and s.layer == 0)
    assert router.value == 512 + 256
    latents = {s.name for s in result.sites if s.role is Role.KV_LATENT}
    assert latents == {f"model.layers.0.self_attn.{k}:kv_lora_rank" for k in (0, 1)}


def test_xmod_adapters_are_judged_for_every_language(tmp_path: Path) -> None:
    """X-MOD's per-language adapters (hidden -> hidden // adapter_reduction_factor -> hidden)
    were a width the table could not name, under a language the table named literally
    (en_XX): refused in every variant. Every language config.json lists is read, its
    bottleneck judged as a GEMM width (64 // 3 = 21 here) and reported, not padded."""
    _save("xmod", tmp_path / "m", hidden_size=64, num_attention_heads=4, intermediate_size=128,
          num_hidden_layers=2, vocab_size=512, languages=["en_XX", "de_DE"],
          adapter_reduction_factor=3, is_decoder=True, pad_token_id=0, bos_token_id=0,
          eos_token_id=0)
    result = _judged(tmp_path / "m")
    assert result.verdict() == "fail"
    site = next(s for s in result.sites if s.name.endswith("layer.1.output:adapter_bottleneck"))
    assert site.value == 21 and site.inexact and site.config_field is None
    assert {a.tensor.split(".")[-3] for a in site.axes} == {"en_XX", "de_DE"}


def test_roc_bert_concatenated_embeddings_are_one_gemm_width(tmp_path: Path) -> None:
    """RoCBert's map_inputs_layer reads the word, pronunciation and shape embeddings side by
    side (hidden + 768 + 512): a width the table could not name, so RoCBert was refused in
    every variant. It is judged as the GEMM K it is (68 + 1280 = 1348 here) and reported."""
    _save("roc_bert", tmp_path / "m", hidden_size=68, num_attention_heads=4,
          intermediate_size=128, num_hidden_layers=2, vocab_size=512, is_decoder=True,
          pad_token_id=0)
    result = _judged(tmp_path / "m")
    site = next(s for s in result.sites if s.name == "concat")
    assert site.value == 68 + 768 + 512 and site.inexact
    assert [(a.tensor, a.axis) for a in site.axes] == [
        ("roc_bert.embeddings.map_inputs_layer.weight", 1)]


def test_a_whole_models_unused_head_dim_is_no_misaligned_build(tmp_path: Path) -> None:
    """LongcatFlashModel keeps config.head_dim (20) while its latent attention builds heads of
    qk_nope + rope and v_head_dim: its hd20 build holds no width 20, so its pass is no silent
    one (the sweep counted it as one); MiMo-V2-Flash's attention does build heads of 20."""
    assert build("longcat_flash", "hd20", tmp_path / "l")[1] is False
    assert build("mimo_v2_flash", "hd20", tmp_path / "m")[1] is True
