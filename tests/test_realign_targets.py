"""``--realign --target``: the knapsack chooses only ranks every target runs fast (issue 31).

A Llama layer at widths where the serving kernels' rules bite (AWQ's kernels and llama.cpp's
k-quants, whose rows of 256 are far stricter than the GPU contract's multiple of 8),
compressed by the reference compressor to irregular ranks, realigned: every rank in OUT is one
the target runs fast, or the matrix is dense, the budget holds, and the re-check of OUT says
so. A budget no such choice fits is refused with the budget that would.
"""
from __future__ import annotations

import json

import pytest

from gac_check.analysis import check
from gac_check.api import realign
from gac_check.models.compress import compress_dir
from gac_check.ranks.knapsack import DENSE
from tests.helpers import gac, tiny_llama

AWQ, GGUF = "vllm,quant=awq", "llama.cpp,quant=Q4_K_M"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """One Llama layer of hidden 512 and MLP 1408 (break-even ranks 170 to 375), and its
    reference-compressed copy at 0.7 (irregular ranks, fast on no target)."""
    root = tmp_path_factory.mktemp("realign-targets")
    dense = tiny_llama(3, hidden_size=512, intermediate_size=1408, num_attention_heads=4,
                       num_key_value_heads=2, num_hidden_layers=1, vocab_size=256)
    dense.save_pretrained(root / "dense")
    ranks = compress_dir(root / "dense", root / "compressed", 0.7)
    assert all(r % 128 for r in ranks.values())
    return root / "dense", root / "compressed", ranks


def rank_verdicts(model_dir, target: str) -> dict[str, str]:
    result = check(model_dir, "h100", "float16", [target])
    return {s.module: result.contract.targets.of(s)[0].verdict
            for s in result.sites if s.role.value == "rank"}


@pytest.mark.parametrize(("target", "budget"), [(AWQ, "same"), (GGUF, "0.8")])
def test_realigned_ranks_are_fast_on_the_target_within_the_budget(pair, target, budget,
                                                                  tmp_path):
    dense_dir, compressed, ranks = pair
    assert set(rank_verdicts(compressed, target).values()) != {"fast"}
    fix = realign(compressed, tmp_path / "out", dense_dir, "h100", "float16", budget=budget,
                  target=target, progress=False)
    plan = fix.report.plan
    assert plan.within_budget and plan.optimal
    chosen = [r for r in plan.ranks.values() if r != DENSE]
    assert chosen and all(r % 8 == 0 for r in chosen), plan.ranks
    after = rank_verdicts(tmp_path / "out", target)
    assert set(after.values()) == {"fast"}, after  # dense matrices are no rank sites
    assert len(after) == len(chosen)
    for m in fix.report.to_json()["matrices"]:  # before, after, and why, per matrix
        assert m["before"] == ranks[m["module"]] and m["after"] == plan.ranks[m["module"]]
        assert m["why"].startswith(f"rank {m['before']}: ") and f"{target}: " in m["why"]
        if m["after"] != DENSE:
            assert f"fast on {target}" in m["why"]


def test_the_cli_takes_target_and_names_each_matrix(pair, tmp_path):
    dense_dir, compressed, ranks = pair
    run = gac(compressed, "--realign", tmp_path / "out", "--base", dense_dir, "--target", AWQ,
              "--gpu", "h100", "--dtype", "float16")
    assert run.returncode == 0, run.stdout + run.stderr
    for module, rank in ranks.items():
        assert f"  {module}: rank {rank} -> " in run.stdout
    record = json.loads((tmp_path / "out" / "gac-realign.json").read_text())
    assert record["remaining"] == {"error": 0, "warning": 0}


def test_a_budget_no_fast_choice_fits_is_refused_with_the_budget_that_would(pair, tmp_path):
    """llama.cpp's rows of 256 leave the attention matrices no rank below their dense cost, so
    the compressor's own budget cannot pay for them; the refusal names a budget that does."""
    dense_dir, compressed, _ = pair
    args = (compressed, "--realign", tmp_path / "out", "--base", dense_dir, "--target", GGUF,
            "--gpu", "h100", "--dtype", "float16")
    run = gac(*args)
    assert run.returncode == 2 and not (tmp_path / "out").exists(), run.stderr
    assert "fewer than the cheapest choice fast on every --target" in run.stderr
    named = run.stderr.rsplit("the smallest feasible budget is ", 1)[1].strip()
    fits = gac(*args, "--budget", named)  # exit 1: the MLP width 1408 is not 256's multiple
    assert fits.returncode == 1 and "re-check of out: 1 sites" in fits.stdout, fits.stderr
    assert set(rank_verdicts(tmp_path / "out", GGUF).values()) == {"fast"}
