"""An expected slowdown and where it comes from.

A figure without its provenance gets quoted as a fact: "3x slower" read from an fp16 GEMM sweep
at K ~ 4000 says little about a rank-153 factor in fp32. So every figure a report shows is a
:class:`Slowdown` that names the hardware, dtype and shape it was measured at, and whether it
was published, measured on this kind of machine, estimated from a stated model, or timed on the
model's own shapes by ``--bench``. A site whose shape no data covers gets a Slowdown without a
value that says so ("not measured at this shape") instead of a borrowed number.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

PUBLISHED, MEASURED, ESTIMATE, BENCH = "published", "measured", "estimate", "bench"
SOURCES = (PUBLISHED, MEASURED, ESTIMATE, BENCH)


@dataclass(frozen=True)
class Slowdown:
    """``value``x slower than the repaired size, or None: not measured at this shape.

    ``hardware``, ``dtype`` and ``shape`` say where the figure was measured (``shape``: the
    exact comparison, e.g. ``SDPA B=4 S=2048 H=32: D=107 vs D=112``), ``coverage`` which data
    it was taken from (``GEMM K 4000-4100 at M=512 N=4096``), ``citation`` the paper, baseline
    file and command, or run, and ``note`` why it applies here (or why none does).
    """

    value: float | None
    source: str | None = None  # one of SOURCES; None without a value
    hardware: str | None = None
    dtype: str | None = None
    shape: str | None = None
    coverage: str | None = None
    citation: str | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if (self.value is None) != (self.source is None):
            raise ValueError("a slowdown has both a value and a source, or neither")
        if self.source is not None and self.source not in SOURCES:
            raise ValueError(f"unknown slowdown source {self.source!r}")

    @classmethod
    def not_measured(cls, note: str, hardware: str | None = None, dtype: str | None = None,
                     coverage: str | None = None, citation: str | None = None) -> Slowdown:
        return cls(None, hardware=hardware, dtype=dtype, coverage=coverage, citation=citation,
                   note=f"not measured at this shape: {note}")

    @property
    def measured(self) -> bool:
        """A figure read from data at this shape (not an estimate, not missing)."""
        return self.source in (PUBLISHED, MEASURED, BENCH)

    @property
    def short(self) -> str:
        """The table cell: ``1.39x``; an estimate ``~1.41x``; no value ``n/m``."""
        if self.value is None:
            return "n/m"
        return ("~" if self.source == ESTIMATE else "") + f"{self.value:.2f}x"

    @property
    def basis(self) -> str:
        """One line naming where the figure comes from (the key of a report's legend)."""
        if self.value is None:
            return self.note
        what = f"{self.source}: {self.hardware or '?'} {self.dtype or ''}".rstrip()
        parts = [what, self.coverage, self.note, self.citation]
        return "; ".join(p for p in parts if p)

    def sentence(self) -> str:
        """One sentence for messages (JUnit, tooltips)."""
        if self.value is None:
            return f"slowdown {self.note}"
        lead = ("estimated ~" if self.source == ESTIMATE else "expected ") + f"{self.value:.2f}x"
        where = ", ".join(p for p in (self.hardware, self.dtype, self.shape) if p)
        return f"{lead} slower ({self.source}: {where})"

    def as_dict(self) -> dict:
        return asdict(self)
