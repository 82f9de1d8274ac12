"""SVD-LLM (AIoT-MLSys-Lab/SVD-LLM): every linear ``P.N_proj`` split into two linears.

``P.N_u_proj.weight`` is [out, r] and ``P.N_v_proj.weight`` is [r, in], so the value
projection becomes ``self_attn.v_u_proj`` / ``self_attn.v_v_proj``: a name ending in
``v_proj.weight`` is not enough to tell SVD-LLM's V factor from a dense value projection, which
is why sites are found from the ``_u_proj`` half and its partner. Ranks live only in tensor
shapes; the usual container is a pickled whole model (``torch.save({'model': m, ...})``).
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.formats.base import Format
from gac_check.formats.layout import Linear, dense_linear
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis, layer_of, natural_key

U_SUFFIX, V_SUFFIX = "_u_proj.weight", "_v_proj.weight"


def _factors(module: str) -> tuple[str, str]:
    """``...self_attn.v_proj`` -> (``...self_attn.v_u_proj.weight``, ``...v_v_proj.weight``);
    a linear not named ``*_proj`` (OPT's ``fc1``) -> ``fc1_u_proj`` / ``fc1_v_proj``."""
    stem = module.removesuffix("_proj")
    return stem + U_SUFFIX, stem + V_SUFFIX


class SVDLLM(Format):
    name = "svd-llm"
    description = "SVD-LLM low-rank (*_u_proj [out, r] / *_v_proj [r, in])"

    def matches(self, ckpt: Checkpoint) -> bool:
        return any(self._pair(ckpt, n) for n in ckpt.tensors if n.endswith(U_SUFFIX))

    @staticmethod
    def _pair(ckpt: Checkpoint, u_name: str) -> str | None:
        """The module a ``_u_proj`` weight belongs to, when its ``_v_proj`` partner fits it."""
        module = u_name[: -len(U_SUFFIX)] + "_proj"
        v_name = u_name[: -len(U_SUFFIX)] + V_SUFFIX
        u, v = ckpt.tensors[u_name].shape, ckpt.tensors.get(v_name)
        if v is None or len(u) != 2 or len(v.shape) != 2 or u[1] != v.shape[0]:
            return None
        return module

    def linear(self, ckpt: Checkpoint, module: str) -> Linear | None:
        shapes = ckpt.shapes
        names = _factors(module)
        if all(n in shapes for n in names):
            u, v = names
            bias = u.removesuffix(".weight") + ".bias"
            return Linear(module, shapes[u][0], shapes[v][1], ((u, 0),), ((v, 1),),
                          bias if bias in shapes else None)
        return dense_linear(shapes, module)

    def own_sites(self, ckpt: Checkpoint) -> list[DimSite]:
        sites = []
        for name in sorted(ckpt.tensors, key=natural_key):
            module = self._pair(ckpt, name) if name.endswith(U_SUFFIX) else None
            if module is None:
                continue
            u, v = _factors(module)
            rank = ckpt.tensors[u].shape[1]
            axes = [TensorAxis(v, 0, AxisKind.PRODUCER), TensorAxis(u, 1, AxisKind.CONSUMER)]
            sites.append(DimSite(f"{module}:rank", Role.RANK, rank, axes,
                                 layer=layer_of(module), module=module))
        return sites
