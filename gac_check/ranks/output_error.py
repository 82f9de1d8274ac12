"""What each choice of ranks does to each matrix's output: ``||X (W - W_r)^T||_F / ||X W^T||_F``
on the dense model's own inputs X, for the input's ranks, ``--realign``'s, and each rank
rounded down or up (the report's output-error panel).

The knapsack's objective is an energy; a reviewer wants to know what a layer's output loses.
With ``--calib`` X is a bounded sample of each module's real input rows on the calibration
text (:func:`gac_check.ranks.calibration.activations`); without it no inputs are known, so
X = I and the figure is the relative weight error, which is what inputs spread evenly over
every direction would see, and the run says so. Computed from the SVD ``W = U S Vh`` the
solver already has: ``U`` has orthonormal columns, so the error of rank r is the tail
``sum_{j >= r} ||X Vh_j||^2 s_j^2`` of one k x p product, never a reconstruction per choice.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gac_check.ranks.knapsack import DENSE, Rank

#: What the inputs were, as the run document and the report name them.
IDENTITY = "none given (X = I: the relative weight error, as inputs spread evenly would see)"


def calibration_inputs(path: str, rows: int, lines: int, tokens: int) -> str:
    return (f"the dense model's inputs to each matrix on {path} ({lines} lines, {tokens} "
            f"tokens; {rows} rows a matrix, spread evenly over them)")


@dataclass(frozen=True)
class Spectrum:
    """One matrix's output energy per singular direction on X, and the input's own error."""

    energy: torch.Tensor  # c_j = ||X Vh_j||^2 s_j^2, float64
    input_error: float  # ||X (W - A B)^T||_F^2

    def relative(self, rank: Rank) -> float:
        total = float(self.energy.sum())
        if total <= 0:
            return 0.0
        tail = 0.0 if rank == DENSE else float(self.energy[min(int(rank), len(self.energy)):]
                                                .sum())
        return math.sqrt(tail / total)

    def relative_input(self) -> float:
        total = float(self.energy.sum())
        return math.sqrt(self.input_error / total) if total > 0 else 0.0


def spectrum(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, S: torch.Tensor,
             Vh: torch.Tensor, x: torch.Tensor | None) -> Spectrum:
    """``W = U S Vh`` (``Vh`` already unscaled where the SVD was activation-scaled), the
    input's factors ``a @ b``, the sample ``x`` (rows x n; None: X = I)."""
    if x is None:
        energy = (Vh * Vh).sum(1) * S * S
        err = float(((w - a @ b) ** 2).sum())
    else:
        x = x.double()
        energy = ((x @ Vh.T) ** 2).sum(0) * S * S
        err = float(((x @ w.T - (x @ b.T) @ a.T) ** 2).sum())
    return Spectrum(energy, err)


@dataclass(frozen=True)
class OutputError:
    """Per matrix and choice, the relative output error; what X was, and how many rows."""

    inputs: str
    rows: int
    errors: dict[str, dict[str, float]]  # module -> choice -> relative error

    def means(self, choices) -> dict[str, float]:
        """Per choice, the mean of the matrices' relative errors (every matrix counts once,
        as a layer's output does)."""
        n = len(self.errors) or 1
        return {c: math.fsum(e[c] for e in self.errors.values()) / n for c in choices}


def output_error(spectra: Mapping[str, Spectrum], ranks: Mapping[str, Mapping[str, Rank]],
                 inputs: str, rows: int, input_choice: str) -> OutputError:
    """Every matrix's relative output error under each choice's rank (``ranks``: module ->
    choice -> rank); ``input_choice``'s is the input's own factors, not a truncation."""
    errors = {}
    for module, by_choice in ranks.items():
        sp = spectra[module]
        errors[module] = {c: sp.relative_input() if c == input_choice else sp.relative(r)
                          for c, r in by_choice.items()}
    return OutputError(inputs, rows, errors)


def truncation_errors(w: torch.Tensor, u: torch.Tensor, v: torch.Tensor, order: torch.Tensor,
                      ranks: Mapping[str, Rank], x: torch.Tensor | None = None
                      ) -> dict[str, float]:
    """Per choice, ``||X (W - W_r)^T|| / ||X W^T||`` where ``W_r`` keeps the components
    ``order[:r]`` of the factors ``u @ v`` (all of them at or above their rank, as the zero
    padding does): SVD-LLM's pairs and PaLU's groups, whose ranks are chosen from their own
    factors, so the dense ``W`` measures them and never chose them (X = I when ``x`` is None)."""
    w, u, v = w.double(), u.double(), v.double()
    ref = w if x is None else x.double() @ w.T
    total = float((ref ** 2).sum())
    errors = {}
    for choice, rank in ranks.items():
        keep = order[:len(order) if rank == DENSE else min(int(rank), len(order))]
        if x is None:
            diff = w - u[:, keep] @ v[keep]
        else:
            diff = ref - (x.double() @ v[keep].T) @ u[:, keep].T
        errors[choice] = math.sqrt(float((diff ** 2).sum()) / total) if total > 0 else 0.0
    return errors
