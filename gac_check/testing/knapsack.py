"""Knapsack test helpers: instance strategies, the independent oracles, and naive rounding.

The oracles (HiGHS MILP, brute force) and the naive rounding baselines are what the exact
solver is checked and benchmarked against; nothing at run time needs them, so scipy is only a
``test`` extra.

Strategies for rank re-selection instances (used by suites/test_knapsack.py):

Instances carry the real weight matrices, not just their singular values, so a test can check
a plan's errors against an explicit truncated reconstruction instead of trusting the same
arithmetic the solver uses. Shapes come from a small pool so that several matrices share a
shape, which is what exercises the solver's merging of equal-step matrices.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gac_check.ranks.knapsack import (
    DEFAULT_ALIGN,
    DENSE,
    DENSE_CODE,
    Matrix,
    Rank,
    RankPlan,
    budget_from_ranks,
    build_options,
    check_budget,
    options_for,
    plan_from_picks,
)
from gac_check.ranks.knapsack_solver import cost_unit

SPECTRA = ("random", "flat", "power", "steep", "lowrank")
#: What makes a rank re-selection hard for a bound-and-DP solver (issue 13): "flat" spectra (all
#: singular values equal: every rank ties and the Lagrangian bound sits far below any integer
#: plan), "near_equal" (1 + 1e-9 noise: the same, without exact ties), "coprime" shapes (rows and
#: columns shortened by 0-63 per matrix, so the gcd of all costs, the DP's unit, is tiny) and
#: "align2" (alignment 2: four times the candidates of 8).
FAMILIES = ("flat", "near_equal", "coprime", "align2")
#: Llama-3-70B's low-rank sites per layer (rows, columns).
LLAMA70B_SHAPES = {"q_proj": (8192, 8192), "k_proj": (1024, 8192), "v_proj": (1024, 8192),
                   "o_proj": (8192, 8192), "gate_proj": (28672, 8192),
                   "up_proj": (28672, 8192), "down_proj": (8192, 28672)}


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
    if kind == "near_equal":
        return np.sort(1 + 1e-9 * rng.standard_normal(p))[::-1]
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


def llama_instance(layers: int, families: Sequence[str] = (), seed: int = 0,
                   shapes: Mapping[str, tuple[int, int]] = LLAMA70B_SHAPES
                   ) -> tuple[list[Matrix], int, int, dict[str, int]]:
    """A Llama-shaped instance ``(matrices, budget, align, ranks)`` from singular values alone
    (``ranks``: the misaligned compressor ranks the budget is the cost of).

    Without ``families``: power-law spectra (exponent 0.3-1.2 and scale per matrix, 5%
    log-normal noise), the benchmark's instance. ``families`` (any of :data:`FAMILIES`) make it
    pathological. The budget is that of odd compressor ranks keeping 20-50% of each matrix's
    largest useful rank (``--budget same``).
    """
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown instance families {sorted(unknown)}")
    rng = np.random.default_rng(seed)
    matrices, ranks = [], {}
    for layer in range(layers):
        for proj, (m, n) in shapes.items():
            if "coprime" in families:
                m, n = max(1, m - int(rng.integers(0, 64))), max(1, n - int(rng.integers(0, 64)))
            p = min(m, n)
            if "flat" in families:
                sv = np.ones(p)
            elif "near_equal" in families:
                sv = 1 + 1e-9 * rng.standard_normal(p)
            else:
                k = np.arange(1, p + 1)
                alpha = rng.uniform(0.3, 1.2)
                sv = rng.uniform(0.5, 2.0) * k ** (-alpha / 2) * np.exp(rng.normal(0, 0.05, p))
            name = f"layers.{layer}.{proj}"
            matrices.append(Matrix(name, m, n, sv=sv))
            useful = max(matrices[-1].max_useful_rank(), 1)
            ranks[name] = int(rng.uniform(0.2, 0.5) * useful) | 1  # odd: never aligned
    align = 2 if "align2" in families else DEFAULT_ALIGN
    return matrices, budget_from_ranks(matrices, ranks), align, ranks


@st.composite
def family_instances(draw: st.DrawFn, max_layers: int = 2, scale: int = 256) -> Instance:
    """Small Llama-shaped instances (Llama-3-70B's shapes / ``scale``) from any combination of
    :data:`FAMILIES`, with real weights of those spectra, for the oracles."""
    families = draw(st.sets(st.sampled_from(FAMILIES)))
    layers = draw(st.integers(1, max_layers))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    align = 2 if "align2" in families else DEFAULT_ALIGN
    kind = ("flat" if "flat" in families else "near_equal" if "near_equal" in families
            else "power")
    weights, matrices, ranks = {}, [], {}
    for layer in range(layers):
        for proj, (m, n) in LLAMA70B_SHAPES.items():
            m, n = max(1, m // scale), max(1, n // scale)
            if "coprime" in families:
                m, n = m + int(rng.integers(0, 8)), n + int(rng.integers(0, 8))
            name = f"layers.{layer}.{proj}"
            w = weight(rng, m, n, kind)
            weights[name] = w
            matrices.append(Matrix(name, m, n, sv=np.linalg.svd(w, compute_uv=False)))
            ranks[name] = draw(st.integers(1, min(m, n)))
    options = build_options(matrices, align)
    cheapest = sum(int(o.costs.min()) for o in options)
    richest = sum(int(o.costs.max()) for o in options)
    return Instance(weights, matrices, align, draw(st.integers(cheapest, richest)), True, ranks)


# ----------------------------------------------------------------------------- cross-checks

def solve_milp(matrices: Sequence[Matrix], budget: int, align: int = DEFAULT_ALIGN,
               candidates: Mapping[str, Sequence[Rank]] | None = None,
               allow_dense: bool = True, time_limit: float | None = None) -> RankPlan:
    """The same instance as a 0/1 MILP for scipy's HiGHS: the independent cross-check.

    Costs go in gcd units and errors are scaled so the optimum is large: HiGHS stops at an
    absolute gap of 1e-6, which must be negligible against the 1e-9 relative agreement we test.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_array, vstack

    options = build_options(matrices, align, candidates, allow_dense)
    check_budget(options, budget)
    unit = cost_unit(options)
    errors = np.concatenate([o.errors for o in options])
    costs = np.concatenate([o.costs // unit for o in options]).astype(np.float64)
    owner = np.concatenate([np.full(len(o.costs), i) for i, o in enumerate(options)])
    scale = 1e7 / max(float(np.sum([o.errors.max() for o in options])), 1e-300)
    one_each = csr_array((np.ones(len(owner)), (owner, np.arange(len(owner)))))
    a = vstack([one_each, csr_array(costs[None, :])])
    lb = np.concatenate((np.ones(len(options)), [-np.inf]))
    ub = np.concatenate((np.ones(len(options)), [budget // unit]))
    opts: dict = {"mip_rel_gap": 0.0}
    if time_limit is not None:
        opts["time_limit"] = time_limit
    res = milp(errors * scale, constraints=LinearConstraint(a, lb, ub),
               integrality=np.ones(len(errors)), bounds=Bounds(0, 1), options=opts)
    if res.x is None:
        raise RuntimeError(f"HiGHS found no solution: {res.message}")
    starts = np.cumsum([0] + [len(o.costs) for o in options[:-1]])
    picks = [int(np.argmax(res.x[s: s + len(o.costs)])) for s, o in zip(starts, options,
                                                                          strict=True)]
    bound = getattr(res, "mip_dual_bound", None)
    return plan_from_picks(matrices, options, picks, budget, "milp", res.status == 0,
                 None if bound is None else float(bound) / scale)


def solve_bruteforce(matrices: Sequence[Matrix], budget: int, align: int = DEFAULT_ALIGN,
                     candidates: Mapping[str, Sequence[Rank]] | None = None,
                     allow_dense: bool = True, limit: int = 2_000_000) -> RankPlan:
    """Every combination, for tiny instances: the check that needs no theory at all."""
    options = build_options(matrices, align, candidates, allow_dense)
    check_budget(options, budget)
    total = math.prod(len(o.costs) for o in options)
    if total > limit:
        raise ValueError(f"{total} combinations is too many for brute force (limit {limit})")
    best: tuple[float, int, tuple[int, ...]] | None = None
    for picks in itertools.product(*(range(len(o.costs)) for o in options)):
        cost = sum(int(o.costs[j]) for o, j in zip(options, picks, strict=True))
        if cost > budget:
            continue
        err = math.fsum(float(o.errors[j]) for o, j in zip(options, picks, strict=True))
        if best is None or (err, cost) < best[:2]:
            best = (err, cost, picks)
    assert best is not None
    return plan_from_picks(matrices, options, best[2], budget, "bruteforce", True, best[0])


# ----------------------------------------------------------------------------- naive rounding

def _snap(matrix: Matrix, rank: Rank, align: int, how: str) -> Rank:
    if rank == DENSE:
        return DENSE
    if how == "down":
        r = (int(rank) // align) * align
    elif how == "up":
        r = -(-int(rank) // align) * align
    else:  # nearest, ties up
        r = ((int(rank) + align // 2) // align) * align
    r = max(r, align)
    if r > matrix.full_rank or r * (matrix.m + matrix.n) >= matrix.dense_params:
        return DENSE  # cheaper than the factors, and exact
    return r


def _rounded(matrices: Sequence[Matrix], ranks: Mapping[str, Rank], align: int, how: str,
             budget: int | None) -> RankPlan:
    spent = budget_from_ranks(matrices, ranks) if budget is None else budget
    snapped = {mat.name: _snap(mat, ranks[mat.name], align, how) for mat in matrices}
    options = [options_for(mat, np.array([DENSE_CODE if r == DENSE else r], np.int64))
               for mat, r in ((mat, snapped[mat.name]) for mat in matrices)]
    return plan_from_picks(matrices, options, [0] * len(matrices), spent, f"round_{how}", False)


def round_down(matrices: Sequence[Matrix], ranks: Mapping[str, Rank],
               align: int = DEFAULT_ALIGN, budget: int | None = None) -> RankPlan:
    """Each rank down to a multiple of ``align`` (at least ``align``): the naive baseline that
    always fits the compressor's budget unless a rank was below ``align``."""
    return _rounded(matrices, ranks, align, "down", budget)


def round_up(matrices: Sequence[Matrix], ranks: Mapping[str, Rank],
             align: int = DEFAULT_ALIGN, budget: int | None = None) -> RankPlan:
    """Each rank up to a multiple of ``align``: better error, usually over budget."""
    return _rounded(matrices, ranks, align, "up", budget)


def nearest(matrices: Sequence[Matrix], ranks: Mapping[str, Rank],
            align: int = DEFAULT_ALIGN, budget: int | None = None) -> RankPlan:
    """Each rank to the nearest multiple of ``align`` (ties up)."""
    return _rounded(matrices, ranks, align, "nearest", budget)
