"""Logical linears: where a module's output rows and input columns physically live.

A dense ``q_proj`` keeps both in ``q_proj.weight``; ASVD splits it into ``ALinear`` (rows) and
``BLinear`` (columns); SVD-LLM into ``q_u_proj``/``q_v_proj``; PaLU's k/v into ``U.{g}`` and
``VT``. Architecture-level sites (intermediate, head_dim, hidden) are described once over
logical linears, so a compressor format only says how it stores each linear.
"""
from __future__ import annotations

from dataclasses import dataclass

from gac_check.sites import AxisKind, TensorAxis

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Linear:
    """One logical ``nn.Linear``: out rows live on ``rows``, in columns on ``cols``."""

    module: str
    out_features: int
    in_features: int
    rows: tuple[tuple[str, int], ...]  # (tensor, axis) pairs carrying the output features
    cols: tuple[tuple[str, int], ...]  # (tensor, axis) pairs carrying the input features
    bias: str | None = None
    #: further bias vectors when the rows are split over several tensors (PaLU's U.{g}.bias)
    split_biases: tuple[str, ...] = ()

    @property
    def biases(self) -> tuple[str, ...]:
        return (*((self.bias,) if self.bias else ()), *self.split_biases)

    def producer_axes(self, shapes: Shapes, unit: int | None = None) -> list[TensorAxis]:
        """Axes of the output features; with ``unit`` (a head_dim) one segment per head."""
        rows = [_axis(shapes, t, a, AxisKind.PRODUCER, unit) for t, a in self.rows]
        return rows + [_axis(shapes, b, 0, AxisKind.BIAS, unit) for b in self.biases]

    def consumer_axes(self, shapes: Shapes, unit: int | None = None) -> list[TensorAxis]:
        return [_axis(shapes, t, a, AxisKind.CONSUMER, unit) for t, a in self.cols]


def _axis(shapes: Shapes, tensor: str, axis: int, kind: AxisKind, unit: int | None) -> TensorAxis:
    if unit is None:
        return TensorAxis(tensor, axis, kind)
    return TensorAxis(tensor, axis, kind, blocks=shapes[tensor][axis] // unit, stride=unit)


def dense_linear(shapes: Shapes, module: str) -> Linear | None:
    """The plain ``module.weight`` [out, in] (+ ``module.bias``) layout, if present."""
    w = f"{module}.weight"
    if w not in shapes or len(shapes[w]) != 2:
        return None
    out_f, in_f = shapes[w]
    bias = f"{module}.bias" if f"{module}.bias" in shapes else None
    return Linear(module, out_f, in_f, ((w, 0),), ((w, 1),), bias)
