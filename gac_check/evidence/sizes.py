"""What the evidence run measures, at the GPU's real sizes or the smoke's tiny ones.

One dataclass, two instances: ``--smoke`` runs the same code on :data:`SMOKE`, so a CPU test
walks every stage a GPU run takes. The GPU sizes are Llama-3-8B's widths (hidden 4096, MLP
14336, 32 query heads of 128, 8 KV heads); the number of layers comes from the latency
stage's budget (:func:`layers_for`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    hidden: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    #: embeddings and lm_head are the same in every form; a real 128256-row head would be
    #: over half of a 2-layer model's prefill FLOPs and dilute the layers' difference, which
    #: at 32 layers it does not (docs/measuring.md)
    vocab: int
    pruned_inter: int  # the pruned form's MLP width
    ratio: float  # the compressor's kept parameter fraction (0.85: the paper's 15% cut)
    prefill: tuple[int, int]  # batch, tokens
    decode: tuple[int, int]  # batch, context tokens
    dtype: str
    seconds_per_layer: float  # planning figure for layers_for (not a measurement)
    max_layers: int
    sdpa_shape: tuple[int, int, int]  # B, S, H for the slow-path SDPA pairs
    tokens: int  # M of the slow-path GEMM pairs
    record_tests: tuple[str, ...]  # the regression cases recorded into the baseline (pytest)
    perf_tests: tuple[str, ...]  # the perf suites then gated against it (pytest arguments)


#: Llama-3-8B widths on the GPU. 120 s a layer for the six forms: the first run on an H200
#: (benchmarks/RESULTS.md, 2026-11-27) prepared the first three forms of two layers in 116 s
#: (dense 29.7, lowrank 38.0, realign 48.6), where 60 s a layer had been assumed.
GPU = Sizes(hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128, vocab=1024,
            pruned_inter=11000, ratio=0.85, prefill=(1, 2048), decode=(16, 2048),
            dtype="bfloat16", seconds_per_layer=120.0, max_layers=8,
            sdpa_shape=(4, 2048, 32), tokens=4096,
            record_tests=("suites", "-m", "perf", "-k", "regression"),
            perf_tests=("suites", "-m", "perf"))

#: one quick regression case: recorded, then gated (the CPU perf tier is minutes)
_SMOKE_TESTS = ("suites/test_gemm_perf.py::test_no_regression_against_baseline",
                "-k", "lowrank-aligned")
SMOKE = Sizes(hidden=64, inter=176, heads=4, kv_heads=2, head_dim=16, vocab=128,
              pruned_inter=150, ratio=0.85, prefill=(1, 16), decode=(2, 16),
              dtype="float32", seconds_per_layer=60.0, max_layers=1,
              sdpa_shape=(1, 32, 2), tokens=16,
              record_tests=_SMOKE_TESTS, perf_tests=_SMOKE_TESTS)


def layers_for(sizes: Sizes, budget_s: float) -> int:
    """How many decoder layers the latency stage's budget affords (at least one)."""
    return max(1, min(sizes.max_layers, int(budget_s // sizes.seconds_per_layer)))
