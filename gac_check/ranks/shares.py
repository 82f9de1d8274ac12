"""Each matrix's weight in the knapsack's objective: what a unit of its own energy is worth on
the model's output (``--realign --base --calib``).

The knapsack minimises discarded ``s^2`` summed over matrices, each in the compressor's own
basis (activation-scaled for ASVD, whitened for SVD-LLM and PaLU). Those sums are on each
matrix's own scale: a unit discarded from a query projection is not worth a unit from a
``down_proj`` on the output (issue 40). So, once, with the dense ``--base`` on the start of
the calibration text, every matrix is perturbed alone: first replaced by the input's own
factors, then by its cut the menus allow (the lowest rank on its bounded menu,
:func:`gac_check.ranks.guarantee.bounded`), every other matrix dense. The extra squared
relative output error of the cut, over the extra energy it discards, is the matrix's weight:
what moving along its menu costs on the output, per unit of its objective. The knapsack then
minimises the weighted sum, so a move away from the compressor's allocation is taken only where
the output it buys (measured) exceeds the output it costs.

A first-order estimate: each matrix alone, near the compressor's ranks (the bounded menus are
where it was measured; the errors of several matrices are taken to add). Without ``--calib``
there is no text to run the model on, so there are no weights; the bounded menus alone keep
the plan near the compressor's allocation.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gac_check.ranks.model_output import Operator, model_output

#: What the plan's note says when the objective was weighted.
WEIGHTED = ("each matrix's energy weighted by its share of the model's output error (each "
            "matrix cut alone on the calibration text with the dense --base: "
            "gac_check/ranks/shares.py)")

#: A weight below this fraction of the mean is raised to it: a cut the probe measured as free
#: (or, by noise, as helping) still ranks below others by its energy.
FLOOR = 1e-3


@dataclass(frozen=True)
class Probe:
    """One model module perturbed alone: what it computes under the input's factors and under
    its menus' lowest ranks, the knapsack sites it holds, and the energy the cut discards
    beyond the input's (summed over those sites)."""

    module: str
    sites: tuple[str, ...]
    input: Operator
    cut: Operator
    energy: float
    bias: torch.Tensor | None = None


def output_weights(base_dir: Path, calib: Path, probes: Sequence[Probe],
                   progress: bool = True) -> dict[str, float]:
    """Per knapsack site, its module's extra squared relative output error per unit of extra
    energy discarded (:data:`FLOOR` below), scaled to a mean of 1."""
    choices = {}
    for p in probes:
        choices[f"{p.module} input"] = {p.module: p.input}
        choices[f"{p.module} cut"] = {p.module: p.cut}
    biases = {p.module: p.bias for p in probes}
    measured = model_output(base_dir, calib, choices, biases, progress).relative
    raw = {}
    for p in probes:
        extra = measured[f"{p.module} cut"] ** 2 - measured[f"{p.module} input"] ** 2
        raw[p.module] = max(extra, 0.0) / p.energy if p.energy > 0 else math.nan
    return per_site(probes, raw)


def per_site(probes: Sequence[Probe], raw: Mapping[str, float]) -> dict[str, float]:
    """``raw`` (per module; nan where nothing was cut) as weights per site, mean 1, none below
    :data:`FLOOR` (a module with nothing cut takes the mean)."""
    known = [w for w in raw.values() if not math.isnan(w)]
    mean = math.fsum(known) / len(known) if known and math.fsum(known) > 0 else 1.0
    out = {}
    for p in probes:
        w = raw[p.module]
        w = 1.0 if math.isnan(w) else max(w / mean, FLOOR)
        out.update(dict.fromkeys(p.sites, w))
    return out
