"""A dense ``--base`` measuring the choices of a layout that chooses from its own factors
(SVD-LLM's whitened pairs, PaLU's head groups): the same per-matrix output error and, with
``--calib``, the same whole-model output as an ASVD ``--realign --base`` reports, while the
ranks stay those its own factors chose.

Every choice of such a layout keeps the leading components ``order[:r]`` of the stored factors
``u @ v`` (all of them at or above the stored rank: the zero padding), so ``W_r`` is a product
of stored tensors, read by the bounded readers (SVD-LLM's pickle is never unpickled); ``W`` is
the dense weight the factors replaced, matched by the module's own name in the base
(``<module>.weight``; a PaLU group's rows of it, in group order). The whole model is the dense
``--base`` run with each module's output replaced (:mod:`gac_check.ranks.model_output`), so
gac-check never loads the compressed model.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import torch

from gac_check.checkpoint.index import open_checkpoint
from gac_check.ranks.calibration import Activations, activations
from gac_check.ranks.candidates import RankMenu
from gac_check.ranks.factors import base_weight
from gac_check.ranks.guarantee import lowest
from gac_check.ranks.kept import CHOICES, Kept
from gac_check.ranks.knapsack import DENSE, Matrix, Rank
from gac_check.ranks.model_output import Operator, model_output
from gac_check.ranks.output_error import (
    IDENTITY,
    OutputError,
    calibration_inputs,
    truncation_errors,
)
from gac_check.ranks.shares import Probe, output_weights


@dataclass(frozen=True)
class Truncated:
    """One knapsack site (an SVD-LLM pair, a PaLU group): the dense module it stands for, its
    rows of that module's output, and its stored factors with their components' order."""

    site: str
    module: str
    start: int  # its first output row in the module
    u: torch.Tensor  # [rows, r]
    v: torch.Tensor  # [r, in]
    order: torch.Tensor

    def kept(self, rank: Rank) -> torch.Tensor:
        n = len(self.order)
        return self.order[:n if rank == DENSE else min(int(rank), n)]


def measure(k: Kept, sites: list[Truncated], base_dir: Path, calib: Path | None,
            progress: bool = True) -> Kept:
    """``k`` with each site's relative output error per choice against the base (on the
    calibration text's inputs with ``calib``, else X = I) and, with ``calib``, the whole
    model's output per choice. ``sites`` in module order, a module's sites in row order."""
    base = open_checkpoint(base_dir)
    by_module = [(m, list(group)) for m, group in groupby(sites, key=lambda s: s.module)]
    weights = require_base(sites, base_dir)
    acts = activations(base_dir, list(weights), calib) if calib is not None else None
    ranks = {row.module: row.ranks for row in k.matrices}
    errors = {}
    for module, group in by_module:
        w = base_weight(base, module, weights[module])
        x = acts.samples.get(module) if acts else None
        for s in group:
            errors[s.site] = truncation_errors(w[s.start:s.start + s.u.shape[0]], s.u, s.v,
                                               s.order, ranks[s.site], x)
    k = dataclasses.replace(k, output=OutputError(*_inputs(acts, calib), errors))
    if calib is None:
        return k
    return dataclasses.replace(k, model=model_output(
        base_dir, calib, _operators(by_module, ranks), {}, progress))


def require_base(sites: list[Truncated], base_dir: Path) -> dict[str, tuple[int, int]]:
    """Each module's dense shape, every one refused (one line) where the base does not hold
    it, before any model runs."""
    base = open_checkpoint(base_dir)
    shapes = {}
    for module, group in groupby(sites, key=lambda s: s.module):
        group = list(group)
        shapes[module] = (sum(s.u.shape[0] for s in group), group[0].v.shape[1])
        base_weight(base, module, shapes[module])
    return shapes


def site_weights(sites: list[Truncated], menus: list[RankMenu], spectra: list[torch.Tensor],
                 base_dir: Path, calib: Path, progress: bool = True) -> dict[str, float]:
    """The knapsack's weight per site for a whitened form (SVD-LLM, PaLU) with ``--base
    --calib``: the base held to every module first (one line, before any model runs), then
    each module's share of the output error (:func:`gac_check.ranks.shares.output_weights`)."""
    require_base(sites, base_dir)
    return output_weights(base_dir, calib, probes(sites, menus, spectra), progress)


def probes(sites: list[Truncated], menus: list[RankMenu], spectra: list[torch.Tensor]
           ) -> list[Probe]:
    """Each module as :mod:`gac_check.ranks.shares` perturbs it: its sites' stored factors,
    then each site at its menu's lowest rank (PaLU's groups of a module together), with the
    energy the cut discards beyond the input's (``spectra``: the knapsack's, in menu order).
    ``sites`` in module order, as :func:`measure` takes them."""
    by_site = {m.module: (m, sv) for m, sv in zip(menus, spectra, strict=True)}
    out = []
    for module, group in groupby(sites, key=lambda s: s.module):
        group = list(group)
        energy, ranks = 0.0, {}
        for s in group:
            menu, sv = by_site[s.site]
            low = lowest(menu)
            ranks[s.site] = {"input": menu.rank, "cut": menu.rank if low is None else low}
            mat = Matrix(menu.module, menu.m, menu.n, sv=sv.numpy())
            energy += mat.error(ranks[s.site]["cut"]) - mat.error(menu.rank)
        ops = _operators([(module, group)], ranks, ("input", "cut"))
        out.append(Probe(module, tuple(s.site for s in group), ops["input"][module],
                         ops["cut"][module], energy))
    return out


def _inputs(acts: Activations | None, calib: Path | None) -> tuple[str, int]:
    if acts is None:
        return IDENTITY, 0
    rows = min((len(x) for x in acts.samples.values()), default=0)
    return calibration_inputs(str(calib), rows, acts.lines, acts.tokens), rows


def _operators(by_module: Iterable[tuple[str, list[Truncated]]],
               ranks: dict[str, dict[str, Rank]], choices: Iterable[str] = CHOICES
               ) -> dict[str, dict[str, Operator]]:
    """Per choice, what each module computes: its sites' truncated products, their output
    rows concatenated in row order (the dense module's bias is added by the hook, as the
    compressors copy it onto their factors)."""
    out: dict[str, dict[str, Operator]] = {c: {} for c in choices}
    for module, group in by_module:
        for c in out:
            parts = [(s.u[:, s.kept(ranks[s.site][c])].double(),
                      s.v[s.kept(ranks[s.site][c])].double()) for s in group]
            out[c][module] = lambda x, parts=parts: torch.cat(
                [(x @ v.T) @ u.T for u, v in parts], dim=-1)
    return out
