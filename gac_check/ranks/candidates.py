"""Which ranks ``--realign`` may choose for each matrix, and why: the knapsack's menu.

A rank is a candidate when it is a multiple of the contract's rank alignment and, with
``--target``, when every target would run the factor pair fast at it (its per-shard widths,
group sizes and packing: the same verdicts the check gives, so a realigned model re-checks
fast where a rank was offered). The dense matrix is always offered: a matrix whose break-even
rank (m*n/(m+n), where factors stop being smaller) is below its smallest fast rank can only
be served fast dense. Everything here comes from the headers, so a menu nothing fits is
refused before any SVD (:func:`gac_check.api.refusals.require_feasible`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gac_check.contract.rules import Contract
from gac_check.ranks.knapsack import DENSE, Rank
from gac_check.sites import DimSite, Role


@dataclass(frozen=True)
class RankMenu:
    """One factorised matrix: its dense shape, the input's rank and the ranks it may take."""

    module: str
    m: int
    n: int
    rank: int
    candidates: tuple[Rank, ...]
    #: what the input's rank breaks (the contract's and the targets' reasons), or ""
    problem: str
    #: the targets the candidates are fast on ("" without --target)
    targets: str
    #: no dense original: a rank above the input's is its factors zero-padded
    from_factors: bool = False

    @property
    def dense_params(self) -> int:
        return self.m * self.n

    def params(self, rank: Rank) -> int:
        return self.dense_params if rank == DENSE else int(rank) * (self.m + self.n)

    @property
    def cheapest(self) -> int:
        return min(self.params(r) for r in self.candidates)

    def why(self, chosen: Rank) -> str:
        """Why the matrix ended at ``chosen``: what its old rank broke, what was offered."""
        ranks = [r for r in self.candidates if r != DENSE]
        offered = (f"fast on {self.targets}" if self.targets else "aligned")
        if chosen == DENSE:
            reason = ("no rank below the dense cost is " + offered if not ranks else
                      "dense was the knapsack's best use of the budget")
        elif chosen == self.rank:
            reason = f"{offered} already"
        elif self.from_factors and int(chosen) > self.rank:
            reason = (f"the knapsack's choice among the ranks {offered}: zero-padded up, no "
                      "component lost, with parameters other matrices freed")
        else:
            reason = f"the knapsack's choice among the ranks {offered}"
        return f"{self.problem}; {reason}" if self.problem else reason


def rank_menus(sites: list[DimSite], shapes: Mapping[str, tuple[int, ...]],
               contract: Contract, align: int, with_base: bool, *,
               pad_up: bool = False) -> list[RankMenu]:
    """Every low-rank site's menu. With the dense weights (``with_base``) any aligned rank
    below the break-even is possible; without them only the existing factors are, so a rank
    can go down within its own (or up to the alignment, zero-padded). ``pad_up`` also offers
    the next aligned rank above it, zero-padded: no error lost, for parameters the budget may
    have spare once other ranks went down (SVD-LLM, whose menus have no dense option)."""
    menus = []
    for site in sites:
        if site.role is not Role.RANK:
            continue
        b, a = (ax.tensor for ax in site.axes)  # B [r, in] then A [out, r]
        m, n = shapes[a][0], shapes[b][1]
        top = (min(m, n, (m * n - 1) // (m + n)) if with_base else max(site.value, align))
        if pad_up and not with_base:
            top = max(top, min(-(-site.value // align) * align, m, n))
        ranks = list(range(align, top + 1, align))
        targets = ""
        if contract.targets is not None:
            ranks = contract.targets.fast_values(site, ranks)
            targets = ", ".join(t.spec for t in contract.targets.targets)
        problem = "; ".join(r.why for r in contract.violations(site))
        menus.append(RankMenu(site.module, m, n, site.value, (*ranks, DENSE),
                              f"rank {site.value}: {problem}" if problem else "", targets,
                              not with_base))
    return menus
