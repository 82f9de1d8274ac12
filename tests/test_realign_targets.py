"""``--realign --target``: each matrix's menu is the ranks every target runs fast (issue 31).

A Llama layer at widths where the serving kernels' rules bite (AWQ's kernels; llama.cpp's
k-quants, whose rows of 256 are far stricter than the GPU contract's multiple of 8), stored in
ASVD's layout at irregular ranks. The menus are read from the headers: every rank on them is
one the target's kernel rules take, the dense matrix is always there, the knapsack keeps the
budget over them, and a budget no menu choice fits names the one that would. No engine has a
model class for ASVD's factor pairs (docs/targets.md, "Loadability first"), so a realign for
one is refused before any SVD, as a repair for it is.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from gac_check.analysis import check
from gac_check.api.refusals import require_feasible
from gac_check.errors import BadInput
from gac_check.models.compress import layer_linears
from gac_check.ranks.candidates import rank_menus
from gac_check.ranks.knapsack import DENSE, Matrix, realign_plan
from tests.helpers import gac, tiny_llama

AWQ, GGUF = "vllm,quant=awq", "llama.cpp,quant=Q4_K_M"
#: the ranks ASVD left (a 0.7 ratio of each matrix's parameters): fast on neither target
RANKS = {"q_proj": 179, "k_proj": 119, "v_proj": 119, "o_proj": 179, "gate_proj": 262,
         "up_proj": 262, "down_proj": 262}


@pytest.fixture(scope="module")
def asvd(tmp_path_factory):
    """One Llama layer of hidden 512 and MLP 1408 (break-even ranks 170 to 375) in ASVD's
    layout (``X.BLinear`` [r, in], ``X.ALinear`` [out, r], ``truncation_ranks``)."""
    root = tmp_path_factory.mktemp("realign-targets") / "asvd"
    dense = tiny_llama(3, hidden_size=512, intermediate_size=1408, num_attention_heads=4,
                       num_key_value_heads=2, num_hidden_layers=1, vocab_size=256)
    state = {n: t.contiguous() for n, t in dense.state_dict().items()}
    ranks = {}
    for name, lin in layer_linears(dense).items():
        r = RANKS[name.rsplit(".", 1)[1]]
        del state[f"{name}.weight"]
        state[f"{name}.BLinear.weight"] = torch.randn(r, lin.in_features)
        state[f"{name}.ALinear.weight"] = torch.randn(lin.out_features, r)
        ranks[name] = r
    root.mkdir()
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    config = dense.config.to_dict() | {"truncation_ranks": ranks}
    (root / "config.json").write_text(json.dumps(config))
    return root, ranks


def menus(model_dir, target: str):
    result = check(model_dir, "h100", "float16", [target])
    return result, rank_menus(result.sites, result.checkpoint.shapes, result.contract, 8, True)


@pytest.mark.parametrize("target", [AWQ, GGUF])
def test_each_menu_holds_only_ranks_the_targets_kernels_take(asvd, target):
    model_dir, ranks = asvd
    result, found = menus(model_dir, target)
    sites = {s.module: s for s in result.sites if s.role.value == "rank"}
    assert {m.module for m in found} == set(ranks)
    for menu in found:
        assert menu.candidates[-1] == DENSE and menu.rank == ranks[menu.module]
        offered = [r for r in menu.candidates if r != DENSE]
        assert menu.rank not in offered  # the compressor's rank is slow there
        assert all(r % 8 == 0 and r * (menu.m + menu.n) < menu.m * menu.n for r in offered)
        # every rank below break-even that the target runs fast is offered, and no other
        every = range(8, min(menu.m, menu.n, (menu.m * menu.n - 1) // (menu.m + menu.n)) + 1, 8)
        fast = result.contract.targets.fast_values(sites[menu.module], every)
        assert offered == fast
        assert menu.problem.startswith(f"rank {menu.rank}: ") and f"{target}: " in menu.problem
    # AWQ runs some ranks of every MLP matrix; llama.cpp none of the attention matrices
    mlp = [m for m in found if ".mlp." in m.module]
    assert all(len(m.candidates) > 1 for m in mlp)
    if target == GGUF:
        assert all(m.candidates == (DENSE,) for m in found if ".self_attn." in m.module)


def test_the_knapsack_keeps_the_budget_over_the_menus(asvd):
    model_dir, _ = asvd
    _, found = menus(model_dir, AWQ)
    rng = np.random.default_rng(0)
    matrices = [Matrix(m.module, m.m, m.n, sv=np.sort(rng.random(min(m.m, m.n)))[::-1])
                for m in found]
    budget = sum(m.params(m.rank) for m in found)
    plan = realign_plan(matrices, budget, 8, {m.module: m.candidates for m in found})
    assert plan.within_budget and plan.optimal
    menu = {m.module: m for m in found}
    assert all(c.rank in menu[c.name].candidates for c in plan.choices)
    assert any(c.rank != DENSE for c in plan.choices)
    why = menu[plan.choices[0].name].why(plan.choices[0].rank)
    assert why.startswith(menu[plan.choices[0].name].problem)


def test_a_budget_no_menu_fits_names_the_budget_that_would(asvd):
    """llama.cpp leaves the attention matrices no rank below their dense cost, so the
    compressor's own budget cannot pay for them: refused from the headers, with a budget that
    the menus do fit."""
    model_dir, _ = asvd
    result, found = menus(model_dir, GGUF)
    with pytest.raises(BadInput) as refused:
        require_feasible(result, "same", found)
    message = str(refused.value)
    assert "fewer than the cheapest choice fast on every --target" in message
    named = message.rsplit("the smallest feasible budget is ", 1)[1]
    require_feasible(result, named, found)  # the budget it names fits


def test_a_target_that_cannot_load_the_layout_is_refused_before_any_svd(asvd, tmp_path):
    """Re-selected ranks keep ASVD's layout, which vLLM has no model class for: one line,
    exit 2, nothing written, and what would serve it."""
    model_dir, _ = asvd
    run = gac(model_dir, "--realign", tmp_path / "out", "--target", AWQ, "--gpu", "h100",
              "--dtype", "float16")
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert f"--realign: {AWQ} would refuse OUT" in run.stderr
    assert "no model class" in run.stderr and "To serve it: merge each pair" in run.stderr
    assert not (tmp_path / "out").exists() and "factorizing" not in run.stderr
