"""The tiny stock models have one source (gac_check.testing.models) and a Qwen2 keeps the
q/k/v biases a released Qwen2 has: non-zero, or a bias bug hides behind zeros."""
from __future__ import annotations

import torch

from gac_check.testing import models
from gac_check.testing.strategies import TinyModel
from tests import helpers


def test_the_tests_build_from_the_public_module():
    assert helpers.tiny_qwen2 is models.tiny_qwen2 and helpers.LLAMA is models.LLAMA


def test_qwen2_biases_are_random_and_the_weights_unchanged_by_them():
    qwen = models.tiny_qwen2(seed=3)
    biases = {n: p for n, p in qwen.named_parameters() if n.endswith("bias")}
    assert {n.rsplit(".", 2)[-2] for n in biases} == {"q_proj", "k_proj", "v_proj"}
    assert all(p.abs().min() > 0 for p in biases.values())
    torch.manual_seed(3)
    import transformers

    stock = transformers.Qwen2ForCausalLM(models.config("qwen2", models.QWEN2))
    assert torch.equal(stock.model.layers[0].self_attn.q_proj.weight,
                       qwen.model.layers[0].self_attn.q_proj.weight)


def test_the_strategies_model_is_the_builders_model():
    built = TinyModel("qwen2", dict(models.QWEN2)).build(seed=5)
    same = models.tiny_qwen2(seed=5)
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(),
                                                 same.state_dict().values(), strict=True))
