"""Hypothesis strategies for rank re-selection instances (used by suites/test_knapsack.py).

Instances carry the real weight matrices, not just their singular values, so a test can check
a plan's errors against an explicit truncated reconstruction instead of trusting the same
arithmetic the solver uses. Shapes come from a small pool so that several matrices share a
shape, which is what exercises the solver's merging of equal-step matrices.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gac_check.knapsack import Matrix, build_options

SPECTRA = ("random", "flat", "power", "steep", "lowrank")


@dataclass
class Instance:
    """A knapsack instance: weights, the matrices built from them, and the solve arguments."""

    weights: dict[str, np.ndarray]
    matrices: list[Matrix]
    align: int
    budget: int
    allow_dense: bool
    ranks: dict[str, int]  # a compressor's (usually misaligned) ranks: the "same" budget


def spectrum(rng: np.random.Generator, kind: str, p: int) -> np.ndarray:
    """Singular values of one of several shapes; "flat" makes ties, "lowrank" exact zeros."""
    k = np.arange(1, p + 1, dtype=np.float64)
    if kind == "random":
        return np.sort(rng.uniform(0, 1, p))[::-1]
    if kind == "flat":
        return np.full(p, rng.uniform(0.5, 2))
    if kind == "power":
        return k ** -rng.uniform(0.1, 1.0)
    if kind == "steep":
        return np.exp(-rng.uniform(0.1, 1.0) * k)
    s = np.sort(rng.uniform(0, 1, p))[::-1]
    s[rng.integers(0, p + 1):] = 0.0
    return s


def weight(rng: np.random.Generator, m: int, n: int, kind: str) -> np.ndarray:
    """A real m x n matrix with the given spectrum (random orthogonal factors)."""
    p = min(m, n)
    u = np.linalg.qr(rng.normal(size=(m, p)))[0]
    v = np.linalg.qr(rng.normal(size=(n, p)))[0]
    return (u * spectrum(rng, kind, p)) @ v.T


@st.composite
def instances(draw: st.DrawFn, max_matrices: int = 6, max_dim: int = 48,
              aligns: tuple[int, ...] = (1, 2, 4, 8), max_shapes: int = 3,
              kinds: tuple[str, ...] = SPECTRA, dense: bool | None = None) -> Instance:
    """Matrices from a shape pool, an alignment, and a budget anywhere from the cheapest
    feasible choice to everything at its best (or the compressor's own, when that fits)."""
    align = draw(st.sampled_from(aligns))
    dims = st.integers(1, max_dim)
    pool = draw(st.lists(st.tuples(dims, dims), min_size=1, max_size=max_shapes))
    count = draw(st.integers(1, max_matrices))
    allow_dense = draw(st.booleans()) if dense is None else dense
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights, matrices, ranks = {}, [], {}
    for i in range(count):
        m, n = draw(st.sampled_from(pool))
        if not allow_dense and min(m, n) < align:
            m, n = max(m, align), max(n, align)  # otherwise it has no candidate at all
        w = weight(rng, m, n, draw(st.sampled_from(kinds)))
        name = f"layers.{i}.proj"
        weights[name] = w
        matrices.append(Matrix(name, m, n, sv=np.linalg.svd(w, compute_uv=False)))
        ranks[name] = draw(st.integers(1, min(m, n)))
    options = build_options(matrices, align, allow_dense=allow_dense)
    cheapest = sum(int(o.costs.min()) for o in options)
    richest = sum(int(o.costs.max()) for o in options)
    same = sum(r * (mat.m + mat.n) for mat, r in zip(matrices, ranks.values(), strict=True))
    if draw(st.booleans()) and cheapest <= same:
        budget = same
    else:
        budget = draw(st.integers(cheapest, richest))
    return Instance(weights, matrices, align, budget, allow_dense, ranks)
