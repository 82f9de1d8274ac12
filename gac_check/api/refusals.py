"""What ``--realign`` refuses from the input's headers, before minutes of SVDs."""
from __future__ import annotations

import math

from gac_check.analysis import CheckResult
from gac_check.errors import BadInput
from gac_check.sites import Role

#: What to run instead of --realign, per format it cannot rewrite.
INSTEAD = {
    "palu": "run --repair OUT instead: it pads each group latent r_g exactly, in PaLU's own "
            "layout (VT/U, head_wise_ranks), loadable with PaLU's from_pretrained; or re-run "
            "PaLU's compress.py so that every r_g is a multiple of {align}",
    "svd-llm": "run --repair OUT instead: it pads every rank exactly, in SVD-LLM's own layout "
               "(a pickled {{'model', 'tokenizer'}} stays one, u/v factors padded), loadable "
               "with torch.load as SVD-LLM's users do; or re-run SVDLLM.py with ratios whose "
               "ranks are multiples of {align}",
}


def not_realignable(fmt: str, align: int, misaligned_ranks: int) -> str:
    """Why --realign refuses a format, and the command that fixes it instead (or, when every
    rank is already a multiple of ``align``, that there is nothing to re-select)."""
    head = (f"is in {fmt} format; --realign re-selects ranks only in the ASVD layout "
            "(BLinear/ALinear + truncation_ranks)")
    if fmt in INSTEAD and not misaligned_ranks:
        return (f"{head}; its ranks are already multiples of {align}, so there is nothing to "
                "re-select (run without --realign to see what else the check finds)")
    advice = INSTEAD.get(fmt, "it has no low-rank factors to re-select; run --repair OUT to "
                         "zero-pad its misaligned sizes exactly in its own layout")
    return f"{head}; {advice.format(align=align)}"


def require_realignable(result: CheckResult, align: int) -> None:
    """Refuse every format but the ASVD layout, saying what to run instead."""
    if result.gguf is not None:
        from gac_check.padding.support import gguf_instead

        raise BadInput(gguf_instead(result.gguf.ftype).replace("--repair does not",
                                                                "--realign does not"),
                       result.checkpoint.path)
    if result.format.name != "asvd":
        ranks = [s for s in result.sites if s.role in (Role.RANK, Role.KV_LATENT)
                 and s.value % align]
        raise BadInput(not_realignable(result.format.name, align, len(ranks)),
                       result.checkpoint.path)


def require_feasible(result: CheckResult, budget: str, align: int) -> None:
    """Refuse, from the headers alone, what would otherwise fail after minutes of SVDs: a
    budget that is no fraction in (0, 1], or one no aligned choice fits."""
    from gac_check.ranks.knapsack import budget_fraction  # numpy: only for --realign

    fraction = budget_fraction(budget)
    shapes = result.checkpoint.shapes
    sizes = []  # (rows, columns, rank) of each factorised matrix
    for site in result.sites:
        if site.role is Role.RANK:
            b, a = (ax.tensor for ax in site.axes)  # B [r, in] then A [out, r]
            sizes.append((shapes[a][0], shapes[b][1], site.value))
    dense = sum(m * n for m, n, _ in sizes)
    spend = (sum(r * (m + n) for m, n, r in sizes) if fraction is None
             else math.floor(fraction * dense))
    least = sum(min(align * (m + n), m * n) for m, n, _ in sizes)
    if dense and spend < least:
        raise BadInput(f"--budget {budget} allows {spend:,} parameters, fewer than the "
                       f"cheapest aligned choice ({least:,}: rank {align} or dense for every "
                       f"matrix); the smallest feasible budget is "
                       f"{math.ceil(1000 * least / dense) / 1000:g}")
