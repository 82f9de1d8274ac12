"""What ``--realign`` refuses from the input's headers, before minutes of SVDs, and the
targets whose engine does not build the model (refused by ``--repair`` too)."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from gac_check.analysis import CheckResult
from gac_check.errors import BadInput

if TYPE_CHECKING:  # targets are imported only where a check names one; ranks (numpy) for --realign
    from gac_check.ranks.candidates import RankMenu
    from gac_check.targets.loadability import Loadability

#: The layouts --realign rewrites (ASVD's BLinear/ALinear, SVD-LLM's whitened u/v factors,
#: PaLU's per-group VT/U latents).
REALIGNABLE = frozenset({"asvd", "svd-llm", "palu"})


def not_realignable(fmt: str) -> str:
    """Why --realign refuses a format, and the command that fixes it instead."""
    head = (f"is in {fmt} format; --realign re-selects ranks only in the ASVD layout "
            "(BLinear/ALinear + truncation_ranks), SVD-LLM's (whitened u/v factors) and "
            "PaLU's (per-group VT/U latents)")
    return (f"{head}; it has no low-rank factors to re-select; run --repair OUT to zero-pad its "
            "misaligned sizes exactly in its own layout")


def require_realignable(result: CheckResult) -> None:
    """Refuse every format but the ASVD, SVD-LLM and PaLU layouts, saying what to run
    instead."""
    if result.gguf is not None:
        from gac_check.padding.support import gguf_instead

        raise BadInput(gguf_instead(result.gguf.ftype).replace("--repair does not",
                                                                "--realign does not"),
                       result.checkpoint.path)
    if result.format.name not in REALIGNABLE:
        raise BadInput(not_realignable(result.format.name), result.checkpoint.path)


def refuse_unloadable(result: CheckResult, message: str,
                      removable: Callable[[Loadability], bool] = lambda _: False
                      ) -> list[Loadability]:
    """The targets whose engine does not build the model; :class:`BadInput` for the first
    whose blocker the flow cannot remove (``removable``), with ``message`` formatted with its
    ``spec``, ``why`` and ``remedy``: what would serve it, before anything is written."""
    verdicts = result.contract.targets
    blocked = [v for v in verdicts.loads.values() if not v.loads] if verdicts else []
    for load in blocked:
        if not removable(load):
            raise BadInput(message.format(spec=load.target.spec, why=load.why,
                                          remedy=load.remedy), result.checkpoint.path)
    return blocked


def require_loadable(result: CheckResult) -> None:
    """--realign keeps the input's layout, so a target whose engine has no model class for it
    refuses OUT as it refuses the input: refused before any SVD, saying what would serve it."""
    refuse_unloadable(result, "--realign: {spec} would refuse OUT as it refuses the input: "
                      "{why}; re-selected ranks keep the layout. To serve it: {remedy}. "
                      "Nothing was written")


def require_feasible(result: CheckResult, budget: str, menus: list[RankMenu]) -> None:
    """Refuse, from the headers alone, what would otherwise fail after minutes of SVDs: a
    budget that is no fraction in (0, 1], or one no choice on the menus fits (every matrix
    at its cheapest aligned, or with --target fast, rank or dense); say which budget would."""
    from gac_check.ranks.knapsack import budget_fraction  # numpy: only for --realign

    fraction = budget_fraction(budget)
    dense = sum(menu.dense_params for menu in menus)
    spend = (sum(menu.params(menu.rank) for menu in menus) if fraction is None
             else math.floor(fraction * dense))
    least = sum(menu.cheapest for menu in menus)
    if dense and spend < least:
        offered = ("fast on every --target" if any(menu.targets for menu in menus)
                   else "aligned")
        raise BadInput(f"--budget {budget} allows {spend:,} parameters, fewer than the "
                       f"cheapest choice {offered} ({least:,}: every matrix at its smallest "
                       f"such rank, or dense); the smallest feasible budget is "
                       f"{math.ceil(1000 * least / dense) / 1000:g}")
