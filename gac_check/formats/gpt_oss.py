"""gpt-oss's mixture of experts: every expert of a layer fused into four tensors, as
transformers' ``GptOssForCausalLM`` (5.x) holds them and its ``save_pretrained`` writes them
(no conversion is registered for gpt_oss, so the saved names are the module's own):

- ``mlp.experts.gate_up_proj`` [E, hidden, 2I]: gate and up INTERLEAVED along the last axis
  (``GptOssExperts._apply_gate``: ``gate_up[..., ::2]``, ``gate_up[..., 1::2]``), so one unit
  of the expert width is two adjacent columns; ``gate_up_proj_bias`` [E, 2I] likewise;
- ``mlp.experts.down_proj`` [E, I, hidden] and ``down_proj_bias`` [E, hidden];
- the router ``mlp.router.weight`` [E, hidden] and ``mlp.router.bias`` [E].

A fused tensor holds one width for all E experts, so each layer has one expert-width site
(``...mlp.experts:intermediate``; an expert-width pruner that keeps the layout must cut every
expert of a layer alike) and one expert-count site over the router's rows and the experts'
leading axis, reported and never padded (:data:`gac_check.formats.moe.EXPERTS_NOT_PADDED`).
Layers whose counts differ, or a router whose rows disagree with its experts, are refused:
``GptOssConfig`` builds every layer from one ``num_local_experts``.

Padding the width is exact: the appended (gate, up) column pairs and their biases are zero,
so the clamped SwiGLU gives ``(clamp(up) + 1) * gate * sigmoid(alpha * gate)`` = ``1 * 0 *
0.5`` = 0 for each padded unit, and its ``down_proj`` row is zero as well (tests/test_gpt_oss.py
loads the padded checkpoint in transformers' class and compares logits).

The released checkpoints store the experts in MXFP4; their reader
(:mod:`gac_check.checkpoint.quantized.mxfp4`) gives those tensors these logical names and
shapes, so the sites here are the same.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.moe import EXPERTS_NOT_PADDED
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

#: The family name ``--repair`` and the reports give this layout.
NAME = "gpt_oss"
_GATE_UP = re.compile(r"^(.*?layers)\.(\d+)\.mlp\.experts\.gate_up_proj$")
WIDTH_KEY = "intermediate_size"
COUNT_KEY = "num_local_experts"


@dataclass(frozen=True)
class FusedExperts:
    """One gpt-oss MoE layer's tensor names."""

    block: str  # model.layers.N.mlp
    layer: int

    @property
    def experts(self) -> str:
        return f"{self.block}.experts"

    def name(self, tensor: str) -> str:
        return f"{self.experts}.{tensor}"

    @property
    def router(self) -> str:
        return f"{self.block}.router"


def find_fused(ckpt: Checkpoint) -> list[FusedExperts]:
    """Every layer holding gpt-oss's fused experts and its router (empty for any other
    checkpoint: transformers holds Mixtral's experts fused too, without biases, gate and up
    concatenated and routed by ``mlp.gate``; written so, they stay unread)."""
    found = []
    for name in ckpt.tensors:
        m = _GATE_UP.match(name)
        lay = FusedExperts(f"{m.group(1)}.{m.group(2)}.mlp", int(m.group(2))) if m else None
        if lay and f"{lay.router}.weight" in ckpt.tensors:  # Mixtral's held layout: mlp.gate
            found.append(lay)
    return sorted(found, key=lambda f: f.layer)


def fused_family(ckpt: Checkpoint) -> str | None:
    return NAME if find_fused(ckpt) else None


def fused_sites(ckpt: Checkpoint, shared: list[DimSite]) -> list[DimSite]:
    """Per gpt-oss MoE layer: the expert-count site and the one expert-width site; the
    experts' and router's residual-stream axes join the family's ``hidden`` site."""
    layers = find_fused(ckpt)
    if not layers:
        return []
    hidden = next((s for s in shared if s.role is Role.HIDDEN and s.name == "hidden"), None)
    sites: list[DimSite] = []
    counts: dict[int, int] = {}
    for lay in layers:
        count, width, reads, hidden_axes = _read_layer(ckpt, lay)
        counts[lay.layer] = count.value
        sites += [count, width]
        if hidden is not None:
            if reads != hidden.value:
                raise BadInput(f"{lay.name('gate_up_proj')} reads {reads} inputs but the "
                               f"hidden size is {hidden.value}", ckpt.path)
            hidden.axes.extend(hidden_axes)
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"layer {i}: {n}" for i, n in list(counts.items())[:8])
        raise BadInput(f"the MoE layers keep different expert counts ({shown}); "
                       f"GptOssForCausalLM builds each layer from one {COUNT_KEY}, so the "
                       "model loads nowhere: prune the same number of experts in every layer",
                       ckpt.path)
    return sites


def _shape(ckpt: Checkpoint, name: str, rank: int) -> tuple[int, ...]:
    shape = ckpt.shapes.get(name)
    if shape is None or len(shape) != rank:
        raise BadInput(f"{name} is {'missing' if shape is None else list(shape)}: a gpt-oss "
                       f"MoE layer has it, with {rank} dimension{'s' if rank > 1 else ''}",
                       ckpt.path)
    return shape


def _read_layer(ckpt: Checkpoint,
                lay: FusedExperts) -> tuple[DimSite, DimSite, int, list[TensorAxis]]:
    """The layer's count and width sites, the hidden size its experts read, and its
    residual-stream axes."""
    e, h, two_i = _shape(ckpt, lay.name("gate_up_proj"), 3)
    gate_up_bias = _shape(ckpt, lay.name("gate_up_proj_bias"), 2)
    down = _shape(ckpt, lay.name("down_proj"), 3)
    down_bias = _shape(ckpt, lay.name("down_proj_bias"), 2)
    router = _shape(ckpt, f"{lay.router}.weight", 2)
    router_bias = _shape(ckpt, f"{lay.router}.bias", 1)
    if two_i % 2:
        raise BadInput(f"{lay.name('gate_up_proj')} has {two_i} gate/up columns, an odd number: "
                       "gpt-oss interleaves one gate and one up column per unit", ckpt.path)
    width = two_i // 2
    want = {lay.name("gate_up_proj_bias"): (e, two_i), lay.name("down_proj"): (e, width, h),
            lay.name("down_proj_bias"): (e, h)}
    for name, shape in zip(want, (gate_up_bias, down, down_bias), strict=True):
        if shape != want[name]:
            raise BadInput(f"{name} is {list(shape)}, but {lay.name('gate_up_proj')} "
                           f"[{e}, {h}, {two_i}] makes it {list(want[name])}", ckpt.path)
    if router != (e, h) or router_bias != (e,):
        raise BadInput(f"{lay.router} routes to {router[0]} experts over {router[1]} inputs "
                       f"(bias {list(router_bias)}) but the layer has {e} experts over {h}: "
                       "the router's rows must be pruned with the experts", ckpt.path)
    fused = [lay.name(t) for t in ("gate_up_proj", "gate_up_proj_bias", "down_proj",
                                   "down_proj_bias")]
    # the router's rows make one logit per expert; each fused tensor's leading axis is read by
    # that choice (never padded: the site is refused, so its kinds only describe)
    count_axes = [TensorAxis(f"{lay.router}.weight", 0, AxisKind.PRODUCER),
                  TensorAxis(f"{lay.router}.bias", 0, AxisKind.BIAS)]
    count_axes += [TensorAxis(t, 0, AxisKind.CONSUMER) for t in fused]
    count = DimSite(f"{lay.block}:experts", Role.EXPERTS, e, count_axes, layer=lay.layer,
                    module=lay.block, config_field=(COUNT_KEY,), inexact=EXPERTS_NOT_PADDED)
    _note(count, ckpt.config, COUNT_KEY)
    width_axes = [TensorAxis(lay.name("gate_up_proj"), 2, AxisKind.PRODUCER, unit=2),
                  TensorAxis(lay.name("gate_up_proj_bias"), 1, AxisKind.BIAS, unit=2),
                  TensorAxis(lay.name("down_proj"), 1, AxisKind.CONSUMER)]
    site = DimSite(f"{lay.experts}:intermediate", Role.EXPERT, width, width_axes,
                   layer=lay.layer, module=lay.experts, config_field=(WIDTH_KEY,))
    _note(site, ckpt.config, WIDTH_KEY)
    hidden_axes = [TensorAxis(lay.name("gate_up_proj"), 1, AxisKind.CONSUMER),
                   TensorAxis(f"{lay.router}.weight", 1, AxisKind.CONSUMER),
                   TensorAxis(lay.name("down_proj"), 2, AxisKind.PRODUCER),
                   TensorAxis(lay.name("down_proj_bias"), 1, AxisKind.BIAS)]
    return count, site, h, hidden_axes


def _note(site: DimSite, cfg: dict, key: str) -> None:
    declared = cfg.get(key)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared != site.value:
        site.notes.append(f"the config says {key}={declared}, tensors have {site.value}")


__all__ = ["NAME", "FusedExperts", "find_fused", "fused_family", "fused_sites"]
