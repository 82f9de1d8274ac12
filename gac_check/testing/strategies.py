"""Hypothesis strategies for alignment properties: dimensions, layer shapes, rank sets, tiny models.

Shared by this project's suites and by any compressor repository that installs the plugin. The
strategies lean towards the sizes that break kernels (odd values, one off a multiple of 8 or
16) because those are where padding and re-selection bugs hide; uniform sampling would spend
most examples on unremarkable even sizes. Model configs are small enough that building,
saving and running one takes well under a second on a CPU, and transformers is imported only
when a model is built.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from gac_check.testing import models
from gac_check.testing.models import FAMILIES


def dims(min_value: int = 1, max_value: int = 512) -> st.SearchStrategy[int]:
    """One dimension size, biased to the hostile ones: odd, and one either side of a multiple
    of 8 or 16 (107, 119, 121 ...)."""
    near = st.builds(lambda k, m, d: k * m + d, st.integers(1, max(1, max_value // 8)),
                     st.sampled_from((8, 16)), st.sampled_from((-1, 1)))
    pool = st.one_of(st.integers(min_value, max_value), near,
                     st.integers(min_value, max_value).map(lambda v: v | 1))
    return pool.filter(lambda v: min_value <= v <= max_value)


def misaligned_dims(modulus: int = 8, min_value: int = 1,
                    max_value: int = 512) -> st.SearchStrategy[int]:
    """A dimension that is not a multiple of ``modulus`` (every one needs a repair)."""
    return dims(min_value, max_value).filter(lambda v: v % modulus != 0)


def dim_sets(min_size: int = 1, max_size: int = 12, **bounds: int) -> st.SearchStrategy[list[int]]:
    """A list of dimensions, as one model's sites would have (repeats allowed, as in real
    models where every layer gets the same rank formula)."""
    return st.lists(dims(**bounds), min_size=min_size, max_size=max_size)


@dataclass(frozen=True)
class LayerShape:
    """One linear ``out x in`` and a low-rank rank for it (``rank < min(out, in)``)."""

    out_features: int
    in_features: int
    rank: int


@st.composite
def layer_shapes(draw, max_features: int = 96) -> LayerShape:
    """A linear's shape and an irregular rank it could be compressed to."""
    out_f = draw(st.integers(2, max_features))
    in_f = draw(st.integers(2, max_features))
    rank = draw(st.integers(1, min(out_f, in_f) - 1) if min(out_f, in_f) > 1 else st.just(1))
    return LayerShape(out_f, in_f, rank)


def rank_sets(max_rank: int = 64, min_size: int = 1,
              max_size: int = 8) -> st.SearchStrategy[list[int]]:
    """Per-group or per-layer ranks (PaLU's group latents, a rank map), each in 1..max_rank."""
    return st.lists(dims(1, max_rank), min_size=min_size, max_size=max_size)


def compress_ratios() -> st.SearchStrategy[float]:
    """ASVD parameter ratios the reference compressor takes; ASVD's formula turns them into
    irregular ranks."""
    return st.floats(0.3, 0.95).map(lambda r: round(r, 3))


@dataclass(frozen=True)
class TinyModel:
    """A transformers config small enough to build and run in well under a second.

    ``family`` is one of :data:`FAMILIES`; ``kwargs`` go to its config class. ``build`` makes
    the stock model with seeded random weights (no hub).
    """

    family: str
    kwargs: dict = field(hash=False)

    @property
    def head_dim(self) -> int:
        return self.kwargs.get("head_dim") or (self.kwargs["hidden_size"]
                                               // self.kwargs["num_attention_heads"])

    def config(self):
        """The stock transformers config of exactly ``kwargs``."""
        return models.config(self.family, self.kwargs)

    def build(self, seed: int = 0):
        """The stock model (LlamaForCausalLM ... BertModel) with seeded random weights, eval
        (:func:`gac_check.testing.models.build`: a Qwen2's q/k/v biases random too)."""
        return models.build(self.family, self.kwargs, seed)


@st.composite
def tiny_models(draw, family: str | None = None, intermediate: st.SearchStrategy[int] | None = None,
                max_layers: int = 2) -> TinyModel:
    """A tiny config of ``family`` (any of :data:`FAMILIES` when None).

    Llama: MHA; Mistral: grouped-query attention (fewer kv heads); Qwen2: q/k/v biases
    (randomised by ``build``); BERT: post-norm encoder with GELU and biases everywhere.
    ``intermediate`` defaults to any size in 8..80 (so pruned-looking sizes such as 37 occur).
    """
    fam = family or draw(st.sampled_from(FAMILIES))
    head_dim = draw(st.sampled_from((8, 12, 16)))
    heads = draw(st.sampled_from((2, 4)))
    kv_heads = heads
    if fam == "mistral":
        kv_heads = draw(st.sampled_from([k for k in (1, 2) if heads % k == 0 and k < heads]))
    elif fam == "qwen2":
        kv_heads = draw(st.sampled_from([k for k in (1, 2, heads) if heads % k == 0]))
    hidden = heads * head_dim
    inter = draw(intermediate if intermediate is not None else st.integers(8, 80))
    layers = draw(st.integers(1, max_layers))
    vocab = draw(st.integers(32, 96))
    if fam == "bert":
        kw = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, intermediate_size=inter,
                  max_position_embeddings=64, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    else:
        kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=64,
                  tie_word_embeddings=draw(st.booleans()))
    return TinyModel(fam, kw)


def token_batches(vocab_size: int, max_batch: int = 2,
                  max_len: int = 12) -> st.SearchStrategy[list[list[int]]]:
    """A batch of equal-length token id rows for a model with ``vocab_size`` tokens."""
    return st.integers(1, max_len).flatmap(lambda n: st.lists(
        st.lists(st.integers(0, vocab_size - 1), min_size=n, max_size=n),
        min_size=1, max_size=max_batch))
