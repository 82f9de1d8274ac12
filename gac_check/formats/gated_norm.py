"""A gated RMSNorm's low-rank gate (AXK2): its two linears as a GEMM-width site.

AXK2's layer norms are ``AXK2GatedRMSNorm`` (transformers 5.24.0 ``modeling_axk2.py``):
y = RMSNorm(x), out = y * sigmoid(fc2(silu(fc1(y)))), with fc1 [gated_norm_rank, hidden] and
fc2 [hidden, gated_norm_rank], saved as ``W_down`` / ``W_up`` (transformers'
``conversion_mapping.py`` renames them back on load). The rank is a GEMM width of its own
(``gated_norm_rank``: fc1's rows, fc2's columns); the hidden size is on fc1's columns and fc2's
rows. Zero-padding the rank adds fc1 rows of zeros, silu(0) = 0, and fc2 columns of zeros,
so the gate is unchanged: exact, as an MLP width is.
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis, layer_of

_DOWN, _UP = ".W_down.weight", ".W_up.weight"


def gated_norm_sites(ckpt: Checkpoint, hidden: int) -> tuple[list[DimSite], list[TensorAxis]]:
    """Each gated norm's rank site, and the hidden-size axes of its two linears; BadInput
    when a gate is not the pair of linears its class builds."""
    shapes = ckpt.shapes
    sites: list[DimSite] = []
    residual: list[TensorAxis] = []
    for down in sorted(n for n in shapes if n.endswith(_DOWN)):
        module = down[:-len(_DOWN)]
        up = module + _UP
        rank = shapes[down][0] if len(shapes[down]) == 2 else None
        if (rank is None or shapes[down] != (rank, hidden) or shapes.get(up) != (hidden, rank)
                or shapes.get(f"{module}.norm.weight") != (hidden,)):
            raise BadInput(f"{module}: a gated norm's W_down {shapes[down]} and W_up "
                           f"{shapes.get(up)} are not the [rank, {hidden}] / [{hidden}, rank] "
                           "pair (with norm.weight) AXK2's class builds; refusing to judge it",
                           ckpt.path)
        axes = [TensorAxis(down, 0, AxisKind.PRODUCER), TensorAxis(up, 1, AxisKind.CONSUMER)]
        site = DimSite(f"{module}:gated_norm_rank", Role.RANK, rank, axes,
                       layer=layer_of(module), module=module, config_field=("gated_norm_rank",))
        declared = ckpt.config.get("gated_norm_rank")
        if declared is not None and declared != rank:
            site.notes.append(f"the config says gated_norm_rank={declared}, tensors have {rank}")
        sites.append(site)
        residual += [TensorAxis(down, 1, AxisKind.CONSUMER), TensorAxis(up, 0, AxisKind.PRODUCER)]
    orphan = next((n for n in shapes if n.endswith(_UP) and n[:-len(_UP)] + _DOWN not in shapes),
                  None)
    if orphan:
        raise BadInput(f"{orphan}: a gated norm's W_up without its W_down", ckpt.path)
    return sites, residual
