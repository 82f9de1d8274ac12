"""Is a repair plan complete? Every tensor axis that carries a padded dimension must be padded.

The plan is built from the sites a format adapter describes; an adapter that misses a tensor
(OPT's position table beside its token table, a fused ``gate_up_proj``, a bias) yields a plan
that pads some axes of a dimension and not others, and a checkpoint its loader rejects. This
check does not trust the adapter: for each padded site it looks at the tensors around it, from
their shapes alone, and any axis that still holds the old size without being padded refuses
the whole repair, naming the tensor, before anything is written. An axis some site names is
known to carry that site's dimension and is not suspect.

"Around it" is the scope a dimension can live in. A residual-stream width (``hidden``) runs
through whole layers and the embeddings and head, so its scope is every layer one of its
tensors is in, plus the tensors outside the layer list. Any other dimension stays inside its
module (an MLP, a factorised linear, a PaLU projection). An unrelated axis that happens to
share the old size inside that scope, and that no site names, also refuses the repair: a false
refusal costs a user a message, a false completion a model that does not load.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from gac_check.errors import BadInput
from gac_check.padding.plan import RepairPlan, SiteRepair
from gac_check.sites import Role

_LAYER = re.compile(r"^(.*?\.(?:layers|layer|h|blocks)\.\d+)\.")


def _layer(name: str) -> str | None:
    m = _LAYER.match(name)
    return m.group(1) if m else None


def _scope(rep: SiteRepair, layers: Mapping[str, str | None]) -> list[str]:
    """The tensors a site's dimension can live in; ``layers`` maps each tensor to its layer."""
    site = rep.site
    if site.role is Role.HIDDEN:
        mine = {layers[ax.tensor] for ax in site.axes}
        return [n for n, layer in layers.items() if layer in mine]  # None: outside the layers
    prefix = site.module + "."
    return [n for n in layers if n.startswith(prefix)] if site.module else []


def unpadded_axes(repair_plan: RepairPlan,
                  shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, int, str]]:
    """(tensor, axis, site name) of every axis in a padded site's scope that holds the site's
    old size, that no repair in the plan pads and that no site names (an axis a site names
    carries that site's dimension, which may have the same size by coincidence: a PaLU
    group's latent of 8 beside its 8 output rows)."""
    layers = {name: _layer(name) for name in sorted(shapes)}  # once, not once per site
    padded = {(t, a) for t, edit in repair_plan.edits.items() for a in edit.axes}
    known = padded | repair_plan.claimed  # an axis a site names carries its own dimension
    missing = []
    for rep in repair_plan.repairs:
        for name in _scope(rep, layers):
            for axis, n in enumerate(shapes[name]):
                if n == rep.site.value and (name, axis) not in known:
                    missing.append((name, axis, rep.site.name))
    return missing


def require_complete(repair_plan: RepairPlan, shapes: Mapping[str, tuple[int, ...]],
                     auxiliary: Mapping[str, str] | None = None) -> None:
    """Refuse (BadInput, exit 2) a plan that would leave a dimension padded in some tensors
    and not in others. ``auxiliary`` (:attr:`Checkpoint.auxiliary`, what the accounting
    read as a layout's scales or indices) names what such a tensor is."""
    missing = unpadded_axes(repair_plan, shapes)
    if missing:
        tensor, axis, site = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        what = (auxiliary or {}).get(tensor)
        shown = f"{tensor} ({what})" if what else tensor
        raise BadInput(f"cannot repair {site}: {shown} axis {axis} also holds its size "
                       f"{shapes[tensor][axis]} but the repair would not pad it{more}; "
                       "gac-check does not understand this architecture well enough to pad "
                       "it safely")
