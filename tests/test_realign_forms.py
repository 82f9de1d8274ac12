"""benchmarks/bench_realign_forms.py's measurement, on a tiny BERT with the MiniLM tokenizer.

The table is only worth its factorisation and its variants: the SVD-LLM-way factors must be
SVD-LLM's (a truncation that loses exactly the discarded whitened singular values, columns of
``u`` orthogonal), rounding up must embed exactly as the compressed model does (zero padding),
every aligned variant must be aligned, the knapsack and rounding down within the budget, and
the knapsack must keep at least the whitened energy rounding down keeps (its objective).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from tests.test_realign_quality import TEXTS, dense  # noqa: F401 (the tiny BERT fixture)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_realign_forms.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_realign_forms", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_factors_are_svdllms_whitened_truncation(bench):
    """||(W - u v) S||_F^2 is the sum of the discarded whitened singular values squared
    (SVD-LLM's truncation loss), ``u``'s columns are orthogonal with squared norms the kept
    whitened singular values, and ``u v S`` is the whitened SVD truncated."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(24, 40, generator=gen, dtype=torch.float64)
    x = torch.randn(200, 40, generator=gen, dtype=torch.float64) * torch.logspace(-1, 1, 40,
                                                                                   dtype=torch.float64)
    s = bench.whitening(x.T @ x)
    u, v, energy = bench.whitened_pair(w, s, 9)
    sigma = torch.linalg.svdvals(w @ s)
    assert energy == pytest.approx(float(sigma.square().sum()))
    loss = float(((w - u @ v) @ s).square().sum())
    assert loss == pytest.approx(float(sigma[9:].square().sum()), rel=1e-9)
    gram = u.T @ u
    torch.testing.assert_close(gram, torch.diag(sigma[:9]), rtol=1e-9, atol=1e-9)
    U, S, Vh = torch.linalg.svd(w @ s)
    torch.testing.assert_close(u @ v @ s, (U[:, :9] * S[:9]) @ Vh[:9], rtol=0, atol=1e-9)
    # what a variant computes at a rank: the leading components, or all of them zero-padded
    pair = bench.Pair("w", "w", slice(0, 24), u, v, energy)
    torch.testing.assert_close(pair.product(4), u[:, :4] @ v[:4], rtol=0, atol=1e-12)
    torch.testing.assert_close(pair.product(16), u @ v, rtol=0, atol=1e-12)


def test_every_variant_is_measured_from_gac_checks_choices(bench, dense):  # noqa: F811
    rows = bench.compare(dense, [0.6], TEXTS, TEXTS, group_heads=2, gpu="a100")
    for form in ("svd-llm", "palu"):
        got = {r.variant: r for r in rows if r.form == form}
        assert list(got)[:5] == ["compressed (misaligned)", "round down", "round nearest",
                                 "round up", "knapsack"]
        (written_label,) = list(got)[5:]
        compressed, down, nearest, up, knapsack, written = got.values()
        # what --realign writes is one of its writable choices, the best on the calibration
        # lines, and never below rounding down there
        assert written_label.split(": ")[1] in ("realigned", "round down", "round nearest")
        assert written.calib_cos >= down.calib_cos
        assert not nearest.misaligned and nearest.params <= nearest.budget
        assert compressed.misaligned and compressed.params == compressed.budget
        assert compressed.rel_error > 1e-3  # it did compress
        assert not (down.misaligned or up.misaligned or knapsack.misaligned)
        assert down.params <= down.budget and knapsack.params <= knapsack.budget
        assert up.params > up.budget  # rounding up pays for its exactness
        # zero padding is exact: rounding up embeds as the compressed model does
        assert up.mean_cos == pytest.approx(compressed.mean_cos, abs=1e-6)
        assert up.rel_error == pytest.approx(compressed.rel_error, abs=1e-6)
        assert up.kept == pytest.approx(compressed.kept)
        assert knapsack.kept >= down.kept * (1 - 1e-12)
        assert 0 < down.kept < compressed.kept <= 1
