"""Several ``--target`` values judged together (gac_check/targets/verdicts.py SiteVerdicts,
gac_check/api/repair_targets.py): a width or rank is chosen only if it is fast on every
target, and it is the smallest such.

The two targets below disagree on purpose: vLLM with AWQ at tp=4 takes an MLP width whose
per-rank share is a multiple of 128 (11264 is its first above 11000), plain vLLM at tp=3 one
that divides by 3 (11001). Neither answer is the other's; the first width both take is
12288 = 8 x 1536. The expected sizes are found here by trying every size on each target
alone, never by the joint search under test.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

import gac_check
from gac_check.sites import DimSite, Role
from gac_check.targets.shards import model_shape
from gac_check.targets.spec import parse_target
from gac_check.targets.verdicts import (
    FAST,
    SM_OF_PROFILE,
    judge_all,
    judge_uses,
    site_uses,
    worst,
)
from tests.target_models import sparse_llama

AWQ_TP4, TP3 = "vllm,tp=4,quant=awq", "vllm,tp=3"
WIDTH, JOINT = 11000, 12288


def llama_sites(width: int) -> list[DimSite]:
    """One Llama-7B-shaped layer (32 heads, 8 KV heads, head_dim 128) with MLP ``width``."""
    return [DimSite("model.layers.0:heads", Role.HEADS, 32, [], layer=0, attrs={"kv_heads": 8}),
            DimSite("model.layers.0:head_dim", Role.HEAD_DIM, 128, [], layer=0),
            DimSite("model.layers.0.mlp:intermediate", Role.INTERMEDIATE, width, [], layer=0),
            DimSite("hidden", Role.HIDDEN, 4096, [], layer=None)]


@cache
def fast_alone(spec: str, width: int) -> bool:
    """Whether the MLP width is fast on ``spec`` alone: every use of the site, judged one by
    one, takes a fast kernel."""
    sites = llama_sites(width)
    target = parse_target(spec)
    uses = site_uses(sites[2], model_shape(sites), target)
    return worst(judge_uses(target, uses, width, SM_OF_PROFILE["h100"])) == FAST


@pytest.mark.parametrize("specs", [(AWQ_TP4, TP3), (TP3, AWQ_TP4)], ids=["awq-first",
                                                                        "tp3-first"])
def test_the_joint_width_is_the_smallest_fast_on_every_target(specs):
    sites = llama_sites(WIDTH)
    verdicts = judge_all(sites, tuple(parse_target(s) for s in specs), "h100")
    mlp = sites[2]
    alone = {v.target.spec: v.fast_at for v in verdicts.of(mlp)}
    assert alone == {AWQ_TP4: 11264, TP3: 11001}  # each target's own answer is not the joint
    joint = verdicts.smallest_fast(mlp, WIDTH)
    assert joint == JOINT
    assert all(fast_alone(s, joint) for s in specs)
    for smaller in range(WIDTH, joint):  # none smaller is fast on both
        assert not all(fast_alone(s, smaller) for s in specs), smaller
    # the repair pads by the contract's target, which asks the same joint search
    assert verdicts.smallest_fast(mlp, 11264) == JOINT == verdicts.smallest_fast(mlp, 11001)


def test_the_joint_menu_holds_only_the_sizes_fast_on_every_target():
    """``--realign --target``'s candidates: the intersection of each target's fast sizes."""
    sites = llama_sites(WIDTH)
    verdicts = judge_all(sites, (parse_target(AWQ_TP4), parse_target(TP3)), "h100")
    menu = range(WIDTH, 14000)
    got = verdicts.fast_values(sites[2], menu)
    assert got == [v for v in menu if fast_alone(AWQ_TP4, v) and fast_alone(TP3, v)]
    assert got == [12288, 13824]


def test_the_repair_of_a_checkpoint_pads_to_the_joint_width(tmp_path: Path):
    """Through the public API on a written checkpoint: the plan pads every MLP to the joint
    width, and the padded model is fast on both targets."""
    src = sparse_llama(tmp_path / "src", intermediate=WIDTH, kv_heads=8, layers=2)
    result = gac_check.check(src, "h100", None, [AWQ_TP4, TP3])
    planned = {r.site.name: r.target for r in result.repair_plan.repairs
               if r.site.role is Role.INTERMEDIATE}
    assert len(planned) == 2 and set(planned.values()) == {JOINT}
    fixed = sparse_llama(tmp_path / "fixed", intermediate=JOINT, kv_heads=8, layers=2)
    again = gac_check.check(fixed, "h100", None, [AWQ_TP4, TP3])
    mlp = [v.verdict for s in again.sites if s.role is Role.INTERMEDIATE
           for v in again.contract.targets.of(s)]
    assert mlp == [FAST] * 4
