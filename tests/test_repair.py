"""planner.plan / writer.apply units, and proof that the equivalence suite catches padding bugs.

The mutant tests inject one plausible bug at a time into the padding code (scale compensation
dropped, consumer padding filled with noise, a bias left unpadded, a PaLU group boundary off
by one, the wrong axis padded) and run the checks suites/test_repair_equivalence.py runs
(:mod:`gac_check.testing.equivalence`) on an example that passes unmutated: each must go red.
"""
from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from gac_check.checkpoint.index import open_checkpoint
from gac_check.contract.select import for_hardware
from gac_check.errors import BadInput
from gac_check.padding import plan as planner
from gac_check.padding import write as writer
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis
from gac_check.testing.equivalence import (
    check_asvd,
    check_head_dim_compensated,
    check_lowrank_pair,
    check_palu,
    check_pruned,
)
from gac_check.testing.strategies import LayerShape, TinyModel

FP16 = for_hardware("gpu", "float16")
#: PaLU at r=0.8: per-head latent sizes and how many heads got each (published histogram).
PALU_HISTOGRAM = {114: 51, 116: 89, 117: 42, 118: 68, 120: 16, 121: 73, 122: 58, 123: 47,
                  124: 52, 125: 16}


def _latent_sites(histogram: dict[int, int]) -> tuple[list[DimSite], dict]:
    """One KV_LATENT site per head, each the only axis of its own [r, 1] tensor, so
    parameters are the latent sizes themselves (the published overhead's definition)."""
    sites, shapes = [], {}
    for value, count in histogram.items():
        for i in range(count):
            name = f"latent{value}.{i}"
            shapes[name] = (value, 1)
            sites.append(DimSite(name, Role.KV_LATENT, value,
                                 [TensorAxis(name, 0, AxisKind.PRODUCER)]))
    return sites, shapes


@pytest.mark.parametrize(("strategy", "expected"), [("minimal", 0.0372), ("optimal", 0.0720)])
def test_published_palu_histogram_overhead(strategy, expected):
    sites, shapes = _latent_sites(PALU_HISTOGRAM)
    p = planner.plan(sites, FP16, strategy, shapes=shapes)
    assert round(p.overhead_fraction, 4) == expected
    assert len(p.repairs) == sum(n for v, n in PALU_HISTOGRAM.items()
                                 if v % (8 if strategy == "minimal" else 16))


def _vt_sites(ranks: list[int]) -> tuple[list[DimSite], dict]:
    shapes = {"VT": (sum(ranks), 10)}
    sites, start = [], 0
    for g, r in enumerate(ranks):
        shapes[f"U{g}"] = (64, r)  # 64 x 10 dense: padding to 8 costs less (never dearer)
        sites.append(DimSite(f"g{g}", Role.KV_LATENT, r,
                             [TensorAxis("VT", 0, AxisKind.PRODUCER, start=start),
                              TensorAxis(f"U{g}", 1, AxisKind.CONSUMER)],
                             config_field=("head_wise_ranks", "m"), attrs={"group": g}))
        start += r
    return sites, shapes


def test_groups_on_one_axis_compose_into_one_index_map():
    sites, shapes = _vt_sites([5, 7, 3])
    p = planner.plan(sites, FP16, "minimal", shapes=shapes)
    edit = p.edits["VT"]
    assert edit.new_shape == (24, 10)
    vt = torch.arange(15 * 10, dtype=torch.float32).reshape(15, 10) + 1
    out = edit.apply(vt)
    for (lo, n), new_lo in (((0, 5), 0), ((5, 7), 8), ((12, 3), 16)):
        assert torch.equal(out[new_lo:new_lo + n], vt[lo:lo + n])
        pad_end = new_lo + 8
        assert not out[new_lo + n:pad_end].any()
    assert edit.axes[0].new_index(5) == 8 and edit.axes[0].new_index(12) == 16


@st.composite
def tensor_edits(draw):
    """A small tensor of 1-3 dims with zero-insertions at random places on random axes."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    edit = planner.TensorEdit("t", shape)
    for axis in draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)):
        positions = draw(st.lists(st.integers(0, shape[axis]), min_size=1, max_size=3,
                                  unique=True))
        edit.axes[axis] = planner.AxisEdit(shape[axis], [(p, draw(st.integers(1, 3)))
                                                        for p in positions])
    return edit


@settings(max_examples=60, deadline=None)
@given(edit=tensor_edits(), dtype=st.sampled_from((torch.float32, torch.bfloat16, torch.int64)))
def test_byte_pieces_write_exactly_what_apply_computes(edit, dtype):
    """The streaming writer's file-to-file pieces and the in-memory padding agree byte for
    byte, for any mix of edited axes and dtypes."""
    t = torch.arange(math.prod(edit.shape), dtype=torch.float64).reshape(edit.shape).to(dtype)
    t += 1  # no real entry is zero, so a misplaced zero shows
    src = t.contiguous().view(torch.uint8).numpy().tobytes()
    itemsize = t.element_size()
    out = b"".join(bytes(n) if s is None else src[s:s + n]
                   for s, n in edit.byte_pieces(itemsize))
    assert out == edit.apply(t).contiguous().view(torch.uint8).numpy().tobytes()


def test_head_dim_site_scales_query_rows_and_bias_only():
    heads, d = 2, 6
    shapes = {"q": (12, 4), "qb": (12,), "k": (12, 4), "v": (12, 4), "o": (4, 12)}
    axes = [TensorAxis(t, 1 if t == "o" else 0,
                       AxisKind.CONSUMER if t == "o" else AxisKind.BIAS if t == "qb"
                       else AxisKind.PRODUCER, blocks=heads, stride=d) for t in shapes]
    site = DimSite("hd", Role.HEAD_DIM, d, axes, attrs={"softmax_scale_rows": ("q", "qb")})
    p = planner.plan([site], FP16, "minimal", shapes=shapes)
    assert p.repairs[0].target == 8
    q, k = torch.ones(12, 4), torch.ones(12, 4)
    factor = (8 / 6) ** 0.5
    assert torch.allclose(p.edits["q"].apply(q)[:6], torch.full((6, 4), factor))
    assert not p.edits["q"].apply(q)[6:8].any()
    assert torch.equal(p.edits["k"].apply(k)[8:14], torch.ones(6, 4))
    assert torch.allclose(p.edits["qb"].apply(torch.ones(12))[8:14], torch.full((6,), factor))


def test_head_dim_without_named_query_rows_is_refused():
    site = DimSite("hd", Role.HEAD_DIM, 6, [TensorAxis("q", 0, AxisKind.PRODUCER)])
    p = planner.plan([site], FP16, "minimal", shapes={"q": (6, 4)})
    assert not p.repairs and p.refused[0].reason == planner.NO_SCALE_ROWS


def test_inexact_sites_are_refused_with_their_reason_and_the_rest_repaired():
    exact = DimSite("r", Role.RANK, 13, [TensorAxis("a", 0, AxisKind.PRODUCER)])
    hidden = DimSite("hidden", Role.HIDDEN, 13, [TensorAxis("b", 0, AxisKind.PRODUCER)],
                     inexact="norm statistics change")
    p = planner.plan([exact, hidden], FP16, "minimal", shapes={"a": (13, 2), "b": (13, 2)})
    assert [r.site.name for r in p.repairs] == ["r"]
    assert [(r.site.name, r.reason) for r in p.refused] == [("hidden", "norm statistics change")]


def test_sites_sharing_a_config_value_must_agree():
    """config.json holds one intermediate_size; if one layer's site is refused the others
    cannot be padded without the config lying about that layer."""
    a = DimSite("l0", Role.INTERMEDIATE, 37, [TensorAxis("w0", 0, AxisKind.PRODUCER)],
                config_field=("intermediate_size",))
    b = DimSite("l1", Role.INTERMEDIATE, 37, [TensorAxis("w1", 0, AxisKind.PRODUCER)],
                config_field=("intermediate_size",), inexact="not exact here")
    shapes = {"w0": (37, 4), "w1": (37, 4)}
    p = planner.plan([a, b], FP16, "minimal", shapes=shapes, config={"intermediate_size": 37})
    assert not p.repairs and {r.site.name for r in p.refused} == {"l0", "l1"}
    assert "records one intermediate_size" in next(r.reason for r in p.refused
                                                   if r.site.name == "l0")
    ok = planner.plan([a], FP16, "minimal", shapes=shapes, config={"intermediate_size": 37})
    assert ok.config_edits == [planner.ConfigEdit(("intermediate_size",), None, 37, 40)]
    pruned = planner.plan([a], FP16, "minimal", shapes=shapes,
                         config={"intermediate_size": 11008})
    assert pruned.repairs and not pruned.config_edits  # LLM-Pruner: config keeps dense sizes


def test_list_config_values_are_edited_per_group():
    sites, shapes = _vt_sites([5, 8, 3])
    p = planner.plan(sites, FP16, "minimal", shapes=shapes, config={"head_wise_ranks":
                                                                     {"m": [5, 8, 3]}})
    edited = writer._edited_config({"head_wise_ranks": {"m": [5, 8, 3]}}, p.config_edits)
    assert edited == {"head_wise_ranks": {"m": [8, 8, 8]}}


def test_overlapping_and_out_of_bounds_sites_are_refused():
    a = DimSite("a", Role.RANK, 10, [TensorAxis("t", 0, AxisKind.PRODUCER)])
    b = DimSite("b", Role.RANK, 5, [TensorAxis("t", 0, AxisKind.PRODUCER, start=7)])
    c = DimSite("c", Role.RANK, 30, [TensorAxis("u", 0, AxisKind.PRODUCER)])
    p = planner.plan([a, b, c], FP16, "minimal", shapes={"t": (12, 3), "u": (20, 3)})
    reasons = {r.site.name: r.reason for r in p.refused}
    assert [r.site.name for r in p.repairs] == ["a"]
    assert "overlaps" in reasons["b"] and "disagree" in reasons["c"]


def test_unknown_strategy_is_bad_input():
    with pytest.raises(BadInput, match="--strategy"):
        planner.plan([], FP16, "fastest", shapes={})


def _write_st(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    save_file(tensors, str(path), metadata=metadata)


def test_writer_keeps_untouched_bytes_metadata_order_and_dtypes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    gen = torch.Generator().manual_seed(0)
    tensors = {"x.BLinear.weight": torch.randn(13, 64, generator=gen).bfloat16(),
               "x.ALinear.weight": torch.randn(64, 13, generator=gen).bfloat16(),
               "ids": torch.arange(7, dtype=torch.int64),
               "mask": torch.tensor([True, False])}
    _write_st(src / "model.safetensors", tensors, {"format": "pt", "note": "kept"})
    (src / "config.json").write_text(json.dumps({"truncation_ranks": {"x": 13}}))
    (src / "tokenizer.json").write_text("{}")
    ckpt = open_checkpoint(src)
    site = DimSite("x:rank", Role.RANK, 13, [TensorAxis("x.BLinear.weight", 0, AxisKind.PRODUCER),
                                            TensorAxis("x.ALinear.weight", 1,
                                                       AxisKind.CONSUMER)],
                   config_field=("truncation_ranks", "x"))
    p = planner.plan([site], FP16, "minimal", shapes=ckpt.shapes, config=ckpt.config)
    report = writer.apply(p, ckpt, tmp_path / "out")
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert out["x.BLinear.weight"].dtype == torch.bfloat16
    assert torch.equal(out["x.BLinear.weight"][:13], tensors["x.BLinear.weight"])
    assert not out["x.BLinear.weight"][13:].any() and not out["x.ALinear.weight"][:, 13:].any()
    assert torch.equal(out["ids"], tensors["ids"]) and torch.equal(out["mask"], tensors["mask"])
    raw = (tmp_path / "out" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "pt", "note": "kept"} and (8 + n) % 8 == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["truncation_ranks"] == \
        {"x": 16}
    assert (tmp_path / "out" / "tokenizer.json").exists()
    provenance = json.loads((tmp_path / "out" / writer.PROVENANCE).read_text())
    assert provenance["repaired"][0]["to"] == 16 and report.files


def test_sidecar_sizes_are_rewritten_with_the_tensors(tmp_path):
    """SliceGPT records stream widths in a JSON sidecar, not config.json."""
    src = tmp_path / "src"
    src.mkdir()
    _write_st(src / "model.safetensors", {"w": torch.ones(30, 4), "r": torch.ones(4, 30)})
    slicing = {"embedding_dimensions": {"0": 30}, "head_dimension": 30, "other": {"0": 30}}
    (src / "slicing.json").write_text(json.dumps(slicing))
    site = DimSite("hidden:embedding", Role.HIDDEN, 30,
                   [TensorAxis("w", 0, AxisKind.PRODUCER), TensorAxis("r", 1, AxisKind.CONSUMER)],
                   attrs={"sidecar": "slicing.json",
                          "sidecar_fields": [["embedding_dimensions", "0"],
                                             ["head_dimension", ""]]})
    ckpt = open_checkpoint(src)
    writer.apply(planner.plan([site], FP16, "minimal", shapes=ckpt.shapes), ckpt,
                 tmp_path / "out")
    assert json.loads((tmp_path / "out" / "slicing.json").read_text()) == {
        "embedding_dimensions": {"0": 32}, "head_dimension": 32, "other": {"0": 30}}
    assert json.loads((src / "slicing.json").read_text()) == slicing


def test_apply_refuses_a_plan_for_other_tensors_and_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _write_st(src / "model.safetensors", {"w": torch.zeros(5, 3)})
    site = DimSite("w", Role.RANK, 6, [TensorAxis("w", 0, AxisKind.PRODUCER)])
    p = planner.plan([site], FP16, "minimal", shapes={"w": (6, 3)})
    with pytest.raises(BadInput, match="expects tensor 'w'"):
        writer.apply(p, open_checkpoint(src), tmp_path / "out")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["src"]


def test_progress_reports_on_stderr_after_a_while():
    stream = io.StringIO()
    progress = writer.Progress(2_000_000_000, stream, after=0.0)
    progress.advance(1_000_000_000, "layer.0.weight (model-00001-of-00002.safetensors)")
    assert stream.getvalue().startswith("gac-check repair:  50.0% (1.00 of 2.00 GB) layer.0")


# ------------------------------------------------------------------------------- mutants
LLAMA = TinyModel("llama", dict(vocab_size=48, hidden_size=32, intermediate_size=37,
                                num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, max_position_embeddings=32))
#: head_dim 16: a group latent padded to 8 costs less than the dense 16 x 32 group
QWEN = TinyModel("qwen2", dict(vocab_size=48, hidden_size=32, intermediate_size=24,
                               num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=2, max_position_embeddings=32))
BERT = TinyModel("bert", dict(vocab_size=48, hidden_size=32, num_hidden_layers=1,
                              num_attention_heads=2, intermediate_size=37,
                              max_position_embeddings=32, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0))
SHAPE_BUGS = (AssertionError, RuntimeError, ValueError, BadInput)


def _patch_edits(monkeypatch, mutate) -> None:
    """Run ``mutate(edits, repairs)`` on every plan's tensor edits."""
    original = planner._tensor_edits

    def mutant(repairs, shapes):
        edits = original(repairs, shapes)
        mutate(edits, repairs)
        return edits

    monkeypatch.setattr(planner, "_tensor_edits", mutant)


def _noise_in_padding(monkeypatch, tensors: set[str] | None) -> None:
    """Padding filled with noise instead of zeros (for ``tensors``, or all when None)."""
    original = planner.TensorEdit.apply

    def apply(self, tensor):
        out = original(self, tensor)
        if tensors is None or self.name in tensors:
            real = original(self, torch.ones_like(tensor)) != 0
            out = torch.where(real, out, torch.randn(out.shape).to(out.dtype))
        return out

    monkeypatch.setattr(planner.TensorEdit, "apply", apply)
    # the streaming writer pads without apply(): its zero pieces get the same noise
    writing = {"name": ""}
    write_pieces = writer._write_pieces

    def pieces(out, info, byte_pieces):
        writing["name"] = info.name
        write_pieces(out, info, byte_pieces)

    def zeros(n):
        if tensors is None or writing["name"] in tensors:
            return torch.randn(n // 4 + 1).numpy().tobytes()[:n]
        return bytes(n)

    monkeypatch.setattr(writer, "_write_pieces", pieces)
    monkeypatch.setattr(writer, "_zeros", zeros)


def test_mutant_scale_compensation_missing_is_caught(monkeypatch):
    check_head_dim_compensated(2, 12)

    def drop_scales(edits, _):
        for edit in edits.values():
            for axis in edit.axes.values():
                axis.scales.clear()

    _patch_edits(monkeypatch, drop_scales)
    with pytest.raises(AssertionError, match="relative error"):
        check_head_dim_compensated(2, 12)


def test_mutant_consumer_columns_padded_with_noise_is_caught(monkeypatch, tmp_path):
    check_asvd(LLAMA, 0.7, "minimal", tmp_path / "ok")
    consumers: set[str] = set()

    def record(_, repairs):
        consumers.update(a.tensor for r in repairs for a in r.site.axes
                         if a.kind is AxisKind.CONSUMER)

    _patch_edits(monkeypatch, record)
    _noise_in_padding(monkeypatch, consumers)
    with pytest.raises(AssertionError, match="relative error"):
        check_asvd(LLAMA, 0.7, "minimal", tmp_path / "bad")
    assert consumers


def test_mutant_noise_in_low_rank_padding_is_caught(monkeypatch):
    shape = LayerShape(20, 17, 5)
    check_lowrank_pair(shape)
    _noise_in_padding(monkeypatch, None)
    with pytest.raises(AssertionError, match="relative error"):
        check_lowrank_pair(shape)


def test_mutant_bias_left_unpadded_is_caught(monkeypatch, tmp_path):
    check_pruned(BERT, "minimal", tmp_path / "ok")

    def drop_bias_edits(edits, repairs):
        for r in repairs:
            for a in r.site.axes:
                if a.kind is AxisKind.BIAS:
                    edits.pop(a.tensor, None)

    _patch_edits(monkeypatch, drop_bias_edits)
    with pytest.raises(SHAPE_BUGS):
        check_pruned(BERT, "minimal", tmp_path / "bad")


def test_mutant_palu_group_boundary_off_by_one_is_caught(monkeypatch, tmp_path):
    check_palu(QWEN, 1, [[5, 6, 3, 7]], tmp_path / "ok")

    def shift_later_groups(edits, _):
        for name, edit in edits.items():
            if name.endswith(".VT.weight"):
                axis = edit.axes[0]
                axis.inserts = [(p - 1 if i else p, c)
                                for i, (p, c) in enumerate(sorted(axis.inserts))]

    _patch_edits(monkeypatch, shift_later_groups)
    with pytest.raises(AssertionError, match="relative error"):
        check_palu(QWEN, 1, [[5, 6, 3, 7]], tmp_path / "bad")


def test_mutant_wrong_axis_padded_is_caught(monkeypatch, tmp_path):
    check_lowrank_pair(LayerShape(20, 17, 5))

    def swap_axes(edits, _):
        for edit in edits.values():
            if len(edit.shape) == 2 and list(edit.axes) in ([0], [1]):
                (axis, change), = edit.axes.items()
                other = 1 - axis
                change.length = edit.shape[other]
                edit.axes = {other: change}

    _patch_edits(monkeypatch, swap_axes)
    with pytest.raises(SHAPE_BUGS):
        check_lowrank_pair(LayerShape(20, 17, 5))
    with pytest.raises(SHAPE_BUGS):
        check_asvd(LLAMA, 0.7, "minimal", tmp_path / "bad")
