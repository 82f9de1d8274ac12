"""Tiny stock transformers models: the one place this project and its users build them.

Every model is a stock transformers class (``LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM``, ``BertModel``/``BertForMaskedLM``) with seeded random weights and nothing
downloaded, small enough to build, save and run in well under a second on a CPU. Each family
starts from one base config (:data:`LLAMA`, :data:`MISTRAL`, :data:`QWEN2`, :data:`BERT`) and
a test gives its own sizes as overrides: the sizes are what a test is about (an MLP of 1843, a
head_dim of 106), so a test states every size it relies on.

Qwen2's q/k/v projections carry biases (``bias=True`` in stock ``Qwen2Attention``, as in every
released Qwen2 checkpoint, where they are trained and far from zero), but transformers
initialises every Linear bias to zero. A repair that pads v_proj's weight and forgets its bias,
or a loader that drops the biases, is invisible on zeros, so :func:`build` gives a Qwen2 random
biases (std 0.1) from their own generator: the weights drawn after ``torch.manual_seed(seed)``
stay what they would be without it. transformers is imported only when a model is built.
"""
from __future__ import annotations

from typing import Any

#: The families :func:`build` knows.
FAMILIES = ("llama", "mistral", "qwen2", "bert")
#: The base config of each family's tiny model: head_dim 16, two layers, MHA.
LLAMA = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 64}
#: Mistral and Qwen2: grouped-query attention (2 key/value heads for 4 query heads).
MISTRAL = {**LLAMA, "num_key_value_heads": 2}
QWEN2 = {**LLAMA, "num_key_value_heads": 2}
BERT = {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 144, "max_position_embeddings": 64}

_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM"),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "bert": ("BertConfig", "BertModel")}


def config(family: str, kwargs: dict):
    """The stock config of ``family`` with exactly ``kwargs`` (no base config merged in)."""
    import transformers

    if family not in _CLASSES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    return getattr(transformers, _CLASSES[family][0])(**kwargs)


def build(family: str, kwargs: dict, seed: int | None = 0, dtype: Any = None,
          masked_lm: bool = False):
    """The stock model of ``family`` from a config of exactly ``kwargs``, in eval mode.

    Built right after ``torch.manual_seed(seed)`` (``seed=None``: from the RNG as it stands);
    a Qwen2 then gets random q/k/v biases (module docstring); cast to ``dtype`` last.
    ``masked_lm`` builds BERT with its MLM head.
    """
    import torch
    import transformers

    cfg = config(family, kwargs)
    if seed is not None:
        torch.manual_seed(seed)
    name = "BertForMaskedLM" if family == "bert" and masked_lm else _CLASSES[family][1]
    model = getattr(transformers, name)(cfg)
    if family == "qwen2":
        randomise_biases(model, None if seed is None else seed + 1)
    model = model.eval()
    return model if dtype is None else model.to(dtype)


def randomise_biases(model, seed: int | None) -> None:
    """Every bias of ``model`` drawn from N(0, 0.1^2): from a generator seeded with ``seed``
    (``None``: the global RNG)."""
    import torch

    gen = None if seed is None else torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def tiny_llama(seed: int | None = 0, dtype: Any = None, **overrides: object):
    """A ``LlamaForCausalLM`` of :data:`LLAMA` with ``overrides`` (see :func:`build`)."""
    return build("llama", {**LLAMA, **overrides}, seed, dtype)


def tiny_mistral(seed: int | None = 0, dtype: Any = None, **overrides: object):
    """A ``MistralForCausalLM`` of :data:`MISTRAL` with ``overrides``."""
    return build("mistral", {**MISTRAL, **overrides}, seed, dtype)


def tiny_qwen2(seed: int | None = 0, dtype: Any = None, **overrides: object):
    """A ``Qwen2ForCausalLM`` of :data:`QWEN2` with ``overrides``; its q/k/v biases random."""
    return build("qwen2", {**QWEN2, **overrides}, seed, dtype)


def tiny_bert(seed: int | None = 0, dtype: Any = None, masked_lm: bool = False,
              **overrides: object):
    """A ``BertModel`` (``masked_lm``: ``BertForMaskedLM``) of :data:`BERT` with ``overrides``."""
    return build("bert", {**BERT, **overrides}, seed, dtype, masked_lm)


def tiny(family: str, seed: int | None = 0, **overrides: object):
    """The tiny model of ``family`` (one of :data:`FAMILIES`) with ``overrides``."""
    builders = {"llama": tiny_llama, "mistral": tiny_mistral, "qwen2": tiny_qwen2,
                "bert": tiny_bert}
    if family not in builders:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    return builders[family](seed, **overrides)
