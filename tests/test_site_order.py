"""Sites come out in model order (layer 10 after layer 9) with the layer they belong to, for
every module naming scheme gac-check reads. Found by benchmarks/hand_mutants.py (group
"elsewhere"): sorting names as text, or forgetting GPT-style ``.h.N``, passed every test before.
"""
from __future__ import annotations

import pytest

from gac_check.analysis import check
from gac_check.models.compress import compress_dir
from gac_check.sites import layer_of, natural_key
from gac_check.testing.strategies import TinyModel


def test_sites_of_a_twelve_layer_model_are_in_layer_order(tmp_path):
    TinyModel("llama", dict(vocab_size=32, hidden_size=16, intermediate_size=24,
                            num_hidden_layers=12, num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=16)).build(0).save_pretrained(tmp_path / "d")
    compress_dir(tmp_path / "d", tmp_path / "c", 0.5)
    ranks = [s for s in check(tmp_path / "c", "a100", "float16").sites if s.role.value == "rank"]
    layers = [s.layer for s in ranks]
    assert layers == sorted(layers) and set(layers) == set(range(12))
    assert all(f"layers.{s.layer}." in s.module for s in ranks)


@pytest.mark.parametrize(("module", "layer"), [
    ("model.layers.11.mlp.up_proj", 11), ("encoder.layer.3.attention.self.query", 3),
    ("transformer.h.7.attn.c_attn", 7), ("blocks.2.ffn", 2), ("lm_head", None),
    ("model.layers.x.mlp", None),
])
def test_layer_of_reads_every_naming_scheme(module, layer):
    assert layer_of(module) == layer


def test_natural_key_orders_numbers_as_numbers():
    names = ["model.layers.10.mlp", "model.layers.9.mlp", "model.layers.1.mlp",
             "model.layers.2.self_attn"]
    assert sorted(names, key=natural_key) == [
        "model.layers.1.mlp", "model.layers.2.self_attn", "model.layers.9.mlp",
        "model.layers.10.mlp"]
