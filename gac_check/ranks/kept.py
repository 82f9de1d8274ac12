"""What each way of aligning the ranks keeps: the knapsack's choice against rounding each rank
down or up on the same menus, per matrix and in all (the HTML report's quality chart).

A reviewer of a ``--realign`` wants to know whether the re-selection was worth it: rounding
every rank to the nearest fast one below (or above, or the nearer of the two while the budget
lasts: "round nearest") is what anyone would do by hand. The value
compared is the knapsack's own objective, the energy ``sum s^2`` a rank keeps of its matrix's
spectrum (the dense weights' with ``--base``, activation-scaled with ``--calib``, SVD-LLM's
whitened values, PaLU's group values), so the figure shows what the choice was made for. With
``--base`` each matrix's output error under every choice is measured too
(:mod:`gac_check.ranks.output_error`), and with ``--calib`` the whole model's output on the
start of the text (:mod:`gac_check.ranks.model_output`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gac_check.ranks.candidates import RankMenu
from gac_check.ranks.guarantee import nearest_within, rounded
from gac_check.ranks.knapsack import Matrix, Rank, RankPlan
from gac_check.ranks.model_output import ModelOutput
from gac_check.ranks.output_error import OutputError

#: The choices compared, in the order the report draws them.
INPUT, REALIGNED, DOWN, NEAREST, UP = ("input", "realigned", "round down", "round nearest",
                                       "round up")
CHOICES = (INPUT, REALIGNED, DOWN, NEAREST, UP)

__all__ = ["CHOICES", "DOWN", "INPUT", "NEAREST", "REALIGNED", "UP", "Kept", "MatrixKept",
           "kept", "rounded"]


@dataclass(frozen=True)
class MatrixKept:
    """One matrix: its rank under each choice, the parameters and the energy each keeps."""

    module: str
    m: int
    n: int
    energy: float  # the whole spectrum's: what a dense matrix keeps
    ranks: dict[str, Rank]
    kept: dict[str, float]
    params: dict[str, int]

    def to_json(self) -> dict:
        return {"module": self.module, "m": self.m, "n": self.n, "energy": self.energy,
                "ranks": self.ranks, "kept": self.kept, "params": self.params}


@dataclass(frozen=True)
class Kept:
    """Every matrix's :class:`MatrixKept`, the budget they share and what the energy is."""

    matrices: tuple[MatrixKept, ...]
    budget: int
    objective: str
    #: each matrix's relative output error per choice, where a dense reference was given
    output: OutputError | None = field(default=None)
    #: the whole model's last hidden state per choice against dense (with --calib)
    model: ModelOutput | None = field(default=None)
    #: which plan was written and each writable plan's measured figure (guarantee.Verdict)
    written: dict | None = field(default=None)

    def totals(self) -> dict[str, dict]:
        """Per choice: parameters, energy kept, and the whole energy (kept / energy is the
        fraction the report draws)."""
        energy = math.fsum(k.energy for k in self.matrices)
        return {c: {"params": sum(k.params[c] for k in self.matrices),
                    "kept": math.fsum(k.kept[c] for k in self.matrices), "energy": energy}
                for c in CHOICES}

    def to_json(self) -> dict:
        out = {"objective": self.objective, "budget": self.budget, "choices": list(CHOICES),
               "totals": self.totals(), "matrices": [k.to_json() for k in self.matrices]}
        if self.output is not None:
            out["output"] = {"inputs": self.output.inputs, "rows": self.output.rows,
                             "mean": self.output.means(CHOICES)}
            for row in out["matrices"]:
                row["output_error"] = self.output.errors[row["module"]]
        if self.model is not None:
            out["model_output"] = self.model.to_json()
        if self.written is not None:
            out["written"] = self.written
        return out


def kept(menus: Sequence[RankMenu], matrices: Sequence[Matrix], plan: RankPlan,
         objective: str, old_errors: Mapping[str, float] | None = None) -> Kept:
    """What the input, the plan and the two roundings keep of each matrix (``matrices`` in
    the menus' order). ``old_errors``: the input's own error per matrix where its factors are
    not a truncation of the spectrum (an ASVD model against its dense ``--base``); else the
    spectrum truncated at the input's rank."""
    rows = []
    nearest = nearest_within(menus, plan.budget)
    for menu, mat in zip(menus, matrices, strict=True):
        ranks = {INPUT: menu.rank, REALIGNED: plan.ranks[menu.module],
                 DOWN: rounded(menu, "down"), NEAREST: nearest[menu.module],
                 UP: rounded(menu, "up")}
        errors = {c: mat.error(r) for c, r in ranks.items()}
        if old_errors is not None:
            errors[INPUT] = old_errors[menu.module]
        rows.append(MatrixKept(menu.module, menu.m, menu.n, mat.energy, ranks,
                               {c: max(mat.energy - e, 0.0) for c, e in errors.items()},
                               {c: menu.params(r) for c, r in ranks.items()}))
    return Kept(tuple(rows), plan.budget, objective)
