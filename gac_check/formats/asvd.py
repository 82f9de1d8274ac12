"""ASVD (hahnyuan/ASVD4LLM) and gac-check's own reference compressor, which writes its layout.

Each compressed linear ``X`` becomes ``X.BLinear`` (weight [r, in]) followed by ``X.ALinear``
(weight [out, r], optional bias); config.json's ``truncation_ranks`` maps ``X`` to r.
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.base import Format
from gac_check.formats.layout import Linear, dense_linear
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis, layer_of, natural_key

B, A = ".BLinear.weight", ".ALinear.weight"


class ASVD(Format):
    name = "asvd"
    description = "ASVD low-rank (BLinear/ALinear + truncation_ranks)"

    def matches(self, ckpt: Checkpoint) -> bool:
        return "truncation_ranks" in ckpt.config or any(n.endswith(B) for n in ckpt.tensors)

    def linear(self, ckpt: Checkpoint, module: str) -> Linear | None:
        shapes = ckpt.shapes
        b, a = module + B, module + A
        if b in shapes and a in shapes:
            bias = f"{module}.ALinear.bias"
            return Linear(module, shapes[a][0], shapes[b][1], ((a, 0),), ((b, 1),),
                          bias if bias in shapes else None)
        return dense_linear(shapes, module)

    def own_sites(self, ckpt: Checkpoint) -> list[DimSite]:
        shapes = ckpt.shapes
        declared = ckpt.config.get("truncation_ranks") or {}
        if not isinstance(declared, dict):
            raise BadInput("truncation_ranks must map module names to ranks",
                           ckpt.path / "config.json")
        sites = []
        for name in sorted(shapes, key=natural_key):
            if not name.endswith(B):
                continue
            module = name[: -len(B)]
            rank = shapes[name][0]
            axes = [TensorAxis(name, 0, AxisKind.PRODUCER),
                    TensorAxis(module + A, 1, AxisKind.CONSUMER)]
            field = ("truncation_ranks", module) if module in declared else None
            site = DimSite(f"{module}:rank", Role.RANK, rank, axes, layer=layer_of(module),
                           module=module, config_field=field)
            if module in declared and declared[module] != rank:
                site.notes.append(f"truncation_ranks says {declared[module]}, tensors have {rank}")
            sites.append(site)
        return sites
