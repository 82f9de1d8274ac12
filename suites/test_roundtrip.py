"""Equivalence through each compressor's own layout, over drawn sizes: build what the
compressor saves (tests/compressors.py), repair it, load OUT with that compressor's loading
call, compare logits. tests/test_roundtrip_compressors.py runs one case of each through the
CLI; this suite varies the ranks and widths the compressors would produce."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gac_check.api import repair
from tests import compressors as C

ROUND_TRIP = settings(max_examples=4, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


def round_trip(build, dtype: str | None = "float16") -> None:
    """Build in a fresh directory, repair, load OUT the compressor's way, compare."""
    with tempfile.TemporaryDirectory() as tmp:
        built = build(Path(tmp) / "model")
        report = repair(built.path, Path(tmp) / "out", "gpu", dtype=dtype).report
        assert report.plan.repairs, "nothing was misaligned: the example proves nothing"
        C.assert_loads_same(built, Path(tmp) / "out")


@ROUND_TRIP
@given(st.floats(0.2, 0.9).filter(lambda r: any(k % 8 for k in C.svdllm_ranks(r))))
def test_svdllm(ratio: float) -> None:
    round_trip(lambda p: C.build_svdllm(p, ratio))


@ROUND_TRIP
@given(st.booleans(), st.integers(100, 170).filter(lambda k: k % 8))
def test_llm_pruner(gqa: bool, keep: int) -> None:
    round_trip(lambda p: C.build_llm_pruner(p, gqa=gqa, mlp_keep=keep))


@ROUND_TRIP
@given(st.lists(st.integers(40, 63), min_size=4, max_size=4).filter(
    lambda ws: any(w % 8 for w in ws[:3])))
def test_slicegpt(widths: list[int]) -> None:
    round_trip(lambda p: C.build_slicegpt(p, widths), dtype=None)


@ROUND_TRIP
@given(st.lists(st.integers(3, 16), min_size=2, max_size=2).filter(
    lambda rs: any(r % 8 for r in rs)))
def test_palu(ranks: list[int]) -> None:
    """Latents the repair pads: above 16 a latent padded to 24 costs more than its dense
    64 x 32 group (break-even 21), and the repair leaves it as it is
    (tests/test_repair_dense_cost.py)."""
    round_trip(lambda p: C.build_palu(p, tuple(ranks)))


@ROUND_TRIP
@given(st.floats(0.2, 0.9))
def test_asvd(ratio: float) -> None:
    round_trip(lambda p: C.build_asvd(p, ratio))
