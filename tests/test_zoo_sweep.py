"""The model zoo sweep (gac_check.testing.zoo) and the table it writes into docs/formats.md.

The document's block is the renderer's output for its own rows (never typed), its headline
holds the goals the sweep measures (no silent pass, no crash), and, in the slow tier, a fresh
sweep of a sample of types gives the rows the document shows. The silent pass the sweep found
is held here too, on a real tiny model built by its own class and saved by ``save_pretrained``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import gac_check
from gac_check.errors import BadInput
from gac_check.sites import Role
from gac_check.testing.zoo import BEGIN, DOC, END, INERT, Row, parse, render, summary, sweep
from gac_check.testing.zoo import _build as build

#: a sample the slow test sweeps again: a table read, a hand-written family, a class that
#: ignores the MLP width (BLOOM), an encoder, a composite model with a vision tower
SAMPLE = ["gpt2", "llama", "bloom", "bert", "fuyu"]


def _block() -> str:
    text = DOC.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    return BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END


def test_zoo_table_in_the_docs_is_the_generated_one() -> None:
    """docs/formats.md's zoo block is what the renderer writes for its rows, never typed."""
    rows = parse(_block())
    assert rows, "the generated zoo table is empty"
    assert render(rows) == _block()


def test_the_documented_sweep_has_no_silent_pass_and_no_crash() -> None:
    """The goals of issue 38 the sweep measures: a misaligned build never passes unread or
    with no finding, and no type gives a traceback."""
    s = summary(parse(_block()))
    assert s["swept"] >= 200, s  # every causal-LM type transformers 5.24 ships, and BERTs
    assert s["silent"] == 0, [r for r in parse(_block()) if r.silent]
    assert s["crashed"] == 0, s


def test_silent_pass_is_counted_and_an_inert_variant_is_not() -> None:
    rows = [Row("a", "mlp173", "judged", "exit 0, 6 sites, unread 0", "-", 0.1),
            Row("b", "mlp173", "judged", f"exit 0, 6 sites, unread 0; {INERT}", "-", 0.1),
            Row("c", "aligned", "judged", "exit 0, 6 sites, unread 2", "-", 0.1),
            Row("d", "hd20", "judged", "exit 1, 6 sites, unread 0", "repaired", 0.1)]
    assert [r.silent for r in rows] == [True, False, True, False]
    assert summary(rows)["silent"] == 2
    assert "2 silent passes" in render(rows)


def test_a_class_ignoring_the_variant_is_marked_inert(tmp_path: Path) -> None:
    """BLOOM builds its MLP 4 x hidden whatever the config says: its 'mlp173' build holds no
    width 173, so its pass is not a silent one; GPT-2's does."""
    assert build("bloom", "mlp173", tmp_path / "b") == ("BloomForCausalLM", False)
    assert build("gpt2", "mlp173", tmp_path / "g") == ("GPT2LMHeadModel", True)


def test_a_tensor_at_a_size_the_class_does_not_fix_is_not_accounted(tmp_path: Path) -> None:
    """The class table once saw Fuyu's text tensors at their default size (``=4096``) and
    accounted each as fixed by the class at any size: a tiny Fuyu with every MLP width 173
    passed with 0 sites. Only the class's own fixed size is accounted; any other is unread,
    so the check refuses: GOT-OCR2's first upsampling conv is [512, 256, 3, 3] whatever the
    widths the table varies; at 1 x 1 taps it is not the class's."""
    from safetensors.torch import load_file, save_file

    _, misaligned = build("got_ocr2", "mlp173", tmp_path / "m")
    assert misaligned
    weights = load_file(tmp_path / "m" / "model.safetensors")
    conv = "multi_modal_projector.conv_upsampler1.weight"
    weights[conv] = weights[conv][:, :, :1, :1].clone()
    save_file(weights, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BadInput, match="did not read"):
        gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")


@pytest.mark.slow
def test_a_fresh_sweep_of_a_sample_gives_the_documented_rows(tmp_path: Path) -> None:
    """The document is not stale: the sample swept now has the outcomes it shows."""
    documented = {(r.model_type, r.variant): r for r in parse(_block())}
    for row in sweep(SAMPLE, tmp_path / "rows.jsonl"):
        doc = documented[(row.model_type, row.variant)]
        assert (row.outcome, row.detail, row.repair) == (doc.outcome, doc.detail, doc.repair)


@pytest.mark.parametrize("model_type", ["electra", "albert"])
def test_a_position_table_over_a_fixed_embedding_size_is_accounted(model_type: str,
                                                                    tmp_path: Path) -> None:
    """ELECTRA's and ALBERT's position table is [positions, embedding_size=128]: no GEMM
    width on either axis. It was left unread, so both families were refused in every variant;
    now they are judged, the MLP width found."""
    build(model_type, "mlp173", tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and result.accounting.unknown == []
    assert result.verdict() == "fail"
    assert 173 in {s.value for s in result.sites}


def test_an_attention_class_named_with_norm_is_read_per_head(tmp_path: Path) -> None:
    """RoBERTa-PreLayerNorm's attention classes carry "Norm" in their name, so the table's
    derivation took them for norms and left q/k/v on the hidden width: head_dim 20 passed
    with no finding (the sweep's one silent pass). Now the head_dim site is judged."""
    _, misaligned = build("roberta-prelayernorm", "hd20", tmp_path / "m")
    assert misaligned
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    assert result.verdict() == "fail"
    assert {s.value for s in result.sites if s.role is Role.HEAD_DIM} == {20}
