"""Never a fix dearer than dense: what padding a rank or latent costs against the dense form.

A low-rank pair's rank is worth padding only while its factors hold no more parameters than
the dense matrix they approximate (issue 28). A PaLU group's latent is different: it is the
width the KV cache holds per token for that group, so it is costed as that width against the
group's dense width (issue 40), and PaLU's module has no dense form to offer instead. Where the
format does load a dense weight in the pair's place (ASVD's layout), storing the product dense
is the remedy offered; elsewhere re-selecting ranks within the budget is.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from gac_check.sites import AxisKind, DimSite, Role


def dense_cost(site: DimSite, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, int] | None:
    """For a low-rank rank or latent: the dense matrix's parameters (out x in) and what one
    unit of rank costs in the two factors (in + out); None for any other site."""
    if site.role not in (Role.RANK, Role.KV_LATENT):
        return None
    prod = [ax for ax in site.axes if ax.kind is AxisKind.PRODUCER]
    cons = [ax for ax in site.axes if ax.kind is AxisKind.CONSUMER]
    if len(prod) != 1 or len(cons) != 1 or any(ax.tensor not in shapes for ax in prod + cons):
        return None
    n_in = math.prod(n for i, n in enumerate(shapes[prod[0].tensor]) if i != prod[0].axis)
    n_out = math.prod(n for i, n in enumerate(shapes[cons[0].tensor]) if i != cons[0].axis)
    return n_out * n_in, n_in + n_out


def dearer_than_dense(site: DimSite, target: int,
                      shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why padding a rank to ``target`` is refused when the padded factors would hold more
    parameters than the dense matrix they approximate (None when they hold no more).

    A PaLU group's latent is costed as what it is, the width the KV cache holds per token for
    that group (:func:`latent_too_wide`): padding it up to the group's dense width is never
    dearer than the uncompressed cache, whatever the factors hold."""
    if latent_width(site, shapes) is not None:
        return latent_too_wide(site, target, shapes)
    cost = dense_cost(site, shapes)
    if cost is None:
        return None
    dense, per_unit = cost
    factors = target * per_unit
    if factors <= dense:
        return None
    instead = ("store the product of the factors as one dense weight (exact), or pad less "
               if dense_loadable(site) else "re-select aligned ranks within the budget "
               "(--realign OUT), or pad less ")
    return (f"padding the {site.role.value} {site.value} -> {target} would store {factors:,} "
            f"parameters in the two factors, more than the dense matrix's {dense:,}: "
            f"{instead}(another --target or none) and accept the slower kernel")


def dense_loadable(site: DimSite) -> bool:
    """Whether the format loads a dense ``X.weight`` where this factor pair is: ASVD's layout
    does (a module without a truncation rank is a plain Linear, as ``--realign`` writes
    it); SVD-LLM's u/v modules, PaLU's VT/U and MLA's latent projections have no dense form."""
    return all(ax.tensor.endswith((".ALinear.weight", ".BLinear.weight")) for ax in site.axes)


def latent_width(site: DimSite, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """A PaLU group latent's dense width (its ``U.{g}``'s rows: the K/V width the group's heads
    would cache uncompressed), None for any other site."""
    if site.role is not Role.KV_LATENT:
        return None
    prod = [ax for ax in site.axes if ax.kind is AxisKind.PRODUCER]
    cons = [ax for ax in site.axes if ax.kind is AxisKind.CONSUMER]
    if (len(prod) != 1 or len(cons) != 1 or not prod[0].tensor.endswith(".VT.weight")
            or cons[0].tensor not in shapes):
        return None
    return int(shapes[cons[0].tensor][0])


def latent_too_wide(site: DimSite, target: int,
                    shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why a PaLU latent is not padded to ``target``: past the group's dense width its cache
    would hold more per token than the uncompressed model's (None up to that width)."""
    width = latent_width(site, shapes)
    if width is None or target <= width:
        return None
    return (f"padding the {site.role.value} {site.value} -> {target} would make the group's "
            f"latent (what the KV cache holds per token) wider than its dense width {width}: "
            "PaLU has no dense form of this group to store instead; pad less (--strategy "
            "minimal, another --target or none) or re-compress the group at an aligned rank "
            "(--realign OUT)")
