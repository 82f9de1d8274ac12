"""DimSite: one logical dimension of a model and every tensor axis that carries it.

Everything downstream (contract checks, repair, benchmarks, reports) speaks in sites, so a new
checkpoint format only has to describe its sites. A site's axes are what a repair pads together:
padding only the producer of a rank and not its consumer would break the model, which is why
they live in one object rather than being rediscovered by each consumer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from itertools import pairwise


class Role(str, Enum):
    """What a dimension is; rules and repairs are chosen per role."""

    RANK = "rank"  # low-rank factorisation rank r in W ~ B @ A
    INTERMEDIATE = "intermediate"  # MLP hidden width
    HEAD_DIM = "head_dim"  # attention head width (q/k/v share it in stock modules)
    KV_LATENT = "kv_latent"  # PaLU per-group latent size r_g
    HIDDEN = "hidden"  # residual stream width
    HEADS = "heads"  # number of attention heads (query or key/value)
    VOCAB = "vocab"  # vocabulary size, when it is a GEMM dimension (lm_head)
    EXPERT = "expert_intermediate"  # one routed expert's MLP width (mixture of experts)
    SHARED_EXPERT = "shared_expert_intermediate"  # the always-on shared expert's MLP width
    EXPERTS = "experts"  # how many experts a layer's router chooses among
    SSM = "ssm_width"  # a GEMM width inside an SSM mixer (Mamba in_proj rows, out_proj columns)
    SSM_CONV = "ssm_conv_width"  # an SSM mixer's causal conv1d taps (d_conv)
    SSM_STATE = "ssm_state"  # a Mamba-1 mixer's state size (d_state: A_log's columns)
    INDEXER = "indexer_width"  # a DSA lightning indexer's GEMM width (index heads, head_dim)


class AxisKind(str, Enum):
    """How an axis relates to the dimension, which decides how padding must be compensated."""

    PRODUCER = "producer"  # rows that compute the dimension (out features)
    CONSUMER = "consumer"  # columns that read it (in features)
    BIAS = "bias"  # a bias vector over the producer's rows
    NORM = "norm"  # a normalisation weight over the dimension


@dataclass(frozen=True)
class TensorAxis:
    """One axis of one tensor that carries a site's dimension.

    The dimension may occupy only part of the axis, possibly repeated: a q_proj's rows hold
    ``blocks`` heads of ``value`` rows each, ``stride`` apart; a PaLU VT holds group ``g``'s
    latent at offset ``start``. Padding appends zeros after each of those segments. ``unit``
    entries of the axis make one unit of the dimension: gpt-oss interleaves its experts' gate
    and up columns (gate at even, up at odd indices of ``gate_up_proj``'s last axis), so one
    unit of the expert width is 2 entries there, and padding appends 2 zeros per unit.
    """

    tensor: str
    axis: int
    kind: AxisKind
    start: int = 0
    blocks: int = 1
    stride: int = 0
    unit: int = 1

    def segments(self, value: int) -> list[tuple[int, int]]:
        """(offset, length) of every segment of this axis that has the site's width."""
        step = self.stride or value * self.unit
        return [(self.start + b * step, value * self.unit) for b in range(self.blocks)]


@dataclass
class DimSite:
    """A logical dimension: its value, its role, and the tensors that must change together.

    ``config_field`` is the key path into config.json that records the value
    (``("intermediate_size",)``, ``("truncation_ranks", "model.layers.0.mlp.up_proj")``; keys
    may contain dots, hence a tuple), or None when only tensor shapes record it (LLM-Pruner,
    SVD-LLM). ``inexact`` holds the reason zero padding of
    this site would change the model's outputs in stock modules, or None when it is exact.
    """

    name: str
    role: Role
    value: int
    axes: list[TensorAxis]
    layer: int | None = None
    module: str = ""
    config_field: tuple[str, ...] | None = None
    inexact: str | None = None
    notes: list[str] = field(default_factory=list)
    attrs: dict[str, object] = field(default_factory=dict)

    @property
    def tensors(self) -> list[str]:
        return sorted({a.tensor for a in self.axes})

    def params_per_unit(self, shapes: dict[str, tuple[int, ...]]) -> int:
        """Parameters one more unit of this dimension costs (for padding-overhead sums)."""
        total = 0
        for ax in self.axes:
            shape = shapes[ax.tensor]
            other = 1
            for i, n in enumerate(shape):
                if i != ax.axis:
                    other *= n
            total += other * ax.blocks * ax.unit
        return total


def layer_of(module: str) -> int | None:
    """The layer index in a module path (``model.layers.3.mlp`` -> 3), for per-layer maps."""
    parts = module.split(".")
    for p, nxt in pairwise(parts):
        if p in ("layers", "layer", "h", "blocks") and nxt.isdigit():
            return int(nxt)
    return None


def natural_key(name: str) -> list:
    """Sort key that puts layer 10 after layer 9."""
    parts = name.replace("_", ".").split(".")
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in parts]
