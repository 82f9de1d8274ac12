"""Properties of ``--realign --target``'s selection, on drawn targets, shapes, ranks, spectra
and budgets (issue 31): every rank the knapsack chooses is fast on every target when the
output is checked again (or the matrix is stored dense, always on the menu), the plan keeps
the budget (a budget no menu choice fits is refused, never overspent), and its objective is
no worse than rounding each rank down, or up, to the target's menu where that fits.

The oracles are the check itself, run again on a checkpoint written at the chosen ranks (its
verdicts per site, not the menu's own ``fast_values``), and errors summed here from the drawn
spectra. A Llama layer in ASVD's layout (``X.BLinear`` [r, in], ``X.ALinear`` [out, r]) whose
tensors are zeros: a check reads headers only.
"""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from gac_check.analysis import check
from gac_check.errors import BadInput
from gac_check.ranks.candidates import rank_menus
from gac_check.ranks.kept import rounded
from gac_check.ranks.knapsack import DENSE, Matrix, realign_plan
from gac_check.sites import Role
from gac_check.targets.verdicts import FAST, SM_OF_PROFILE, judge_uses, site_uses, worst

CI = settings.get_profile("ci")  # registered by the repository's conftest.py
ALIGN, GPU, DTYPE = 8, "h100", "float16"
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Llama layers whose widths the targets' rules bite on at TP up to 8 (heads divisible by 8)
SHAPES = ({"hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8,
           "num_key_value_heads": 8},
          {"hidden_size": 384, "intermediate_size": 1000, "num_attention_heads": 8,
           "num_key_value_heads": 4})


def _vllm() -> st.SearchStrategy[str]:
    def spec(tp: int, quant: str, group: int | None) -> str:
        out = f"vllm,tp={tp}"
        if quant != "none":
            out += f",quant={quant}" + (f",group={group}" if group is not None else "")
        return out
    return st.builds(spec, st.sampled_from((1, 2, 4, 8)),
                     st.sampled_from(("none", "awq", "gptq")),
                     st.sampled_from((None, 32, 64, 128)))


TARGETS = st.lists(st.one_of(_vllm(),
                             st.sampled_from(("sglang", "sglang,tp=2", "sglang,tp=4,quant=awq",
                                              "transformers"))),
                   min_size=1, max_size=2, unique=True)


def _shape(shape: dict, proj: str) -> tuple[int, int]:
    """(out, in) of one projection."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    return {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h),
            "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}[proj]


def _write(root: Path, shape: dict, ranks: dict[str, object]) -> None:
    """One Llama layer in ASVD's layout at ``ranks`` (a module at DENSE as a plain weight)."""
    from transformers import LlamaConfig

    h, vocab = shape["hidden_size"], 256
    state = {"model.embed_tokens.weight": torch.zeros(vocab, h),
             "model.norm.weight": torch.zeros(h), "lm_head.weight": torch.zeros(vocab, h),
             "model.layers.0.input_layernorm.weight": torch.zeros(h),
             "model.layers.0.post_attention_layernorm.weight": torch.zeros(h)}
    for module, rank in ranks.items():
        out, inp = _shape(shape, module.rsplit(".", 1)[1])
        if rank == DENSE:
            state[f"{module}.weight"] = torch.zeros(out, inp)
        else:
            state[f"{module}.BLinear.weight"] = torch.zeros(int(rank), inp)
            state[f"{module}.ALinear.weight"] = torch.zeros(out, int(rank))
    root.mkdir(parents=True)
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    config = LlamaConfig(num_hidden_layers=1, vocab_size=vocab, **shape).to_dict()
    config |= {"architectures": ["LlamaForCausalLM"], "torch_dtype": "float16",
               "truncation_ranks": {m: int(r) for m, r in ranks.items() if r != DENSE}}
    (root / "config.json").write_text(json.dumps(config))


def _module(proj: str) -> str:
    part = "self_attn" if proj in PROJ[:4] else "mlp"
    return f"model.layers.0.{part}.{proj}"


@st.composite
def cases(draw):
    shape = draw(st.sampled_from(SHAPES))
    ranks = {}
    for proj in PROJ:
        m, n = _shape(shape, proj)
        ranks[_module(proj)] = draw(st.integers(1, (m * n - 1) // (m + n)))
    targets = draw(TARGETS)
    decay = draw(st.floats(0.0, 0.05))
    seed = draw(st.integers(0, 2**16))
    budget_scale = draw(st.floats(0.7, 1.8))
    return shape, ranks, targets, decay, seed, budget_scale


def _error(sv: np.ndarray, rank) -> float:
    return 0.0 if rank == DENSE else float(np.sum(sv[int(rank):] ** 2))


@CI
@given(cases())
def test_realign_to_targets_is_fast_everywhere_within_budget_and_no_worse_than_rounding(case):
    shape, ranks, targets, decay, seed, budget_scale = case
    with tempfile.TemporaryDirectory() as tmp:
        _write(Path(tmp) / "in", shape, ranks)
        before = check(Path(tmp) / "in", GPU, DTYPE, targets)
        menus = rank_menus(before.sites, before.checkpoint.shapes, before.contract, ALIGN, True)
        assert {m.module for m in menus} == set(ranks)
        for m in menus:
            aligned = range(ALIGN, (m.m * m.n - 1) // (m.m + m.n) + 1, ALIGN)
            if len(m.candidates) - 1 < len(aligned):
                event("a menu narrowed by the targets' kernel rules")
        rng = np.random.default_rng(seed)
        spectra = {m.module: np.sort(rng.random(min(m.m, m.n)))[::-1]
                   * np.exp(-decay * np.arange(min(m.m, m.n))) for m in menus}
        matrices = [Matrix(m.module, m.m, m.n, sv=spectra[m.module]) for m in menus]
        budget = int(budget_scale * sum(m.params(m.rank) for m in menus))
        cheapest = sum(m.cheapest for m in menus)
        if budget < cheapest:
            try:
                realign_plan(matrices, budget, ALIGN, {m.module: m.candidates for m in menus})
            except BadInput:
                event("a budget below every menu's cheapest choice: refused")
                return
            raise AssertionError(f"budget {budget} below the cheapest {cheapest} not refused")
        plan = realign_plan(matrices, budget, ALIGN, {m.module: m.candidates for m in menus})
        # within the budget
        assert plan.total_params == sum(m.params(plan.ranks[m.module]) for m in menus)
        assert plan.total_params <= budget
        # every chosen rank is on the menu, dense always offered
        for m in menus:
            assert DENSE in m.candidates and plan.ranks[m.module] in m.candidates
        # fast on every target: the check of the output at the chosen ranks says so
        _write(Path(tmp) / "out", shape, plan.ranks)
        after = check(Path(tmp) / "out", GPU, DTYPE, targets)
        judged = after.contract.targets
        for site in after.sites:
            if site.role is not Role.RANK:
                continue
            event("a rank chosen fast on the targets")
            assert site.value == plan.ranks[site.module]  # the rank as written, read back
            for t in judged.targets:
                # the kernel's verdict at the rank read back (a target that cannot load ASVD's
                # layout refuses every site for that alone: docs/targets.md)
                outs = judge_uses(t, site_uses(site, judged.shape, t), site.value,
                                  SM_OF_PROFILE[GPU])
                assert worst(outs) == FAST, (site.name, site.value, t.spec,
                                             [o.why for o in outs])
            for v in judged.of(site):
                assert v.verdict == FAST or not judged.loads[v.target.spec].loads, v.why
        # no worse than rounding each rank down (or up) to the menu, where that fits
        objective = math.fsum(_error(spectra[m], r) for m, r in plan.ranks.items())
        for how in ("down", "up"):
            by_hand = {m.module: rounded(m, how) for m in menus}
            if sum(m.params(by_hand[m.module]) for m in menus) <= budget:
                theirs = math.fsum(_error(spectra[m], r) for m, r in by_hand.items())
                event(f"rounding {how} fits the budget")
                assert objective <= theirs * (1 + 1e-9) + 1e-12, (how, objective, theirs)
        assert math.isclose(objective, plan.objective, rel_tol=1e-9, abs_tol=1e-12)
