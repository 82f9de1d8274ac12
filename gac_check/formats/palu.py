"""PaLU (shadowpa0327/Palu): low-rank K/V projections with per-group latents.

PaLU replaces ``k_proj`` and ``v_proj`` by a ``HeadwiseLowRankModule``: ``X.VT`` (weight
[sum(r_g), hidden]) projects to the concatenated latents, and one ``X.U.{g}`` per head group
(weight [head_dim * group_size, r_g], bias when the original linear had one) reconstructs that
group's heads. config.json's ``head_wise_ranks`` maps ``X`` to ``[r_0, r_1, ...]``. Each r_g is
a GEMM dimension (the latent cache is r_g wide); the attention head_dim is unchanged.
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.formats.base import Format
from gac_check.formats.layout import Linear, dense_linear
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis, layer_of, natural_key

VT = ".VT.weight"
PALU_MODEL_TYPES = ("palullama", "palumistral", "paluqwen2", "paluqwen")


class PaLU(Format):
    name = "palu"
    description = "PaLU low-rank K/V (VT + U.{g} per head group, head_wise_ranks)"

    def matches(self, ckpt: Checkpoint) -> bool:
        return ("head_wise_ranks" in ckpt.config
                or ckpt.config.get("model_type") in PALU_MODEL_TYPES
                or any(n.endswith(VT) for n in ckpt.tensors))

    def linear(self, ckpt: Checkpoint, module: str) -> Linear | None:
        shapes = ckpt.shapes
        vt = module + VT
        us = _group_weights(shapes, module)
        if vt not in shapes or not us:
            return dense_linear(shapes, module)
        biases = tuple(b for g in range(len(us)) if (b := f"{module}.U.{g}.bias") in shapes)
        out = sum(shapes[u][0] for u in us)
        return Linear(module, out, shapes[vt][1], tuple((u, 0) for u in us), ((vt, 1),),
                      split_biases=biases)

    def own_sites(self, ckpt: Checkpoint) -> list[DimSite]:
        shapes = ckpt.shapes
        declared = ckpt.config.get("head_wise_ranks") or {}
        if not isinstance(declared, dict):
            declared = {}
        sites: list[DimSite] = []
        for name in sorted(shapes, key=natural_key):
            if name.endswith(VT):
                module = name[: -len(VT)]
                sites.extend(_group_sites(shapes, module, declared.get(module)))
        return sites


#: What marks a group that compresses nothing (a note, not a disagreement of config and tensors).
FULL_WIDTH = "at or above its dense width"


def full_width(rank: int, width: int, n_in: int) -> str:
    """A group whose latent is as wide as the K/V rows it rebuilds: its cache holds as much per
    token as the dense model's and its factors more parameters, so nothing is compressed."""
    return (f"rank {rank} of a {width} x {n_in} group is {FULL_WIDTH} {width}: nothing is "
            "compressed there (its latent cache is as wide as the dense K/V rows); re-run "
            "PaLU with a lower rank for this group, or give its budget to the others "
            "(--realign OUT --budget FLOAT)")


def _group_weights(shapes: dict[str, tuple[int, ...]], module: str) -> list[str]:
    """``X.U.0.weight``, ``X.U.1.weight``, ... in group order, stopping at the first gap."""
    out = []
    while f"{module}.U.{len(out)}.weight" in shapes:
        out.append(f"{module}.U.{len(out)}.weight")
    return out


def _group_sites(shapes: dict[str, tuple[int, ...]], module: str,
                 declared: object) -> list[DimSite]:
    vt = module + VT
    ranks = declared if isinstance(declared, list) else None
    sites = []
    start = 0
    groups = _group_weights(shapes, module)
    for g, u in enumerate(groups):
        r = shapes[u][1]
        axes = [TensorAxis(vt, 0, AxisKind.PRODUCER, start=start),
                TensorAxis(u, 1, AxisKind.CONSUMER)]
        site = DimSite(f"{module}:group{g}", Role.KV_LATENT, r, axes, layer=layer_of(module),
                       module=module,
                       config_field=("head_wise_ranks", module) if ranks is not None else None,
                       attrs={"group": g, "start": start, "groups": len(groups)})
        width = shapes[u][0]
        if r >= width:
            site.notes.append(full_width(r, width, shapes[vt][1]))
        if ranks is not None and g < len(ranks) and ranks[g] != r:
            site.notes.append(f"head_wise_ranks says {ranks[g]}, tensors have {r}")
        sites.append(site)
        start += r
    if sites:
        if start != shapes[vt][0]:
            sites[0].notes.append(f"VT has {shapes[vt][0]} rows but the groups' U take {start}")
        if ranks is not None and len(ranks) != len(groups):
            sites[0].notes.append(f"head_wise_ranks lists {len(ranks)} groups, tensors have "
                                  f"{len(groups)}")
        elif ranks is None:
            sites[0].notes.append("config.json has no head_wise_ranks entry for this module")
    return sites
