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
from gac_check.api.repair_targets import plan_for_targets
from gac_check.errors import BadInput
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


def served_llama(root: Path, intermediate: int, heads: int = 24, kv_heads: int = 12) -> Path:
    """A Llama both targets start: 24 heads and 12 KV heads divide by 3 and 4, and so does
    a vocabulary of 32256 once padded to 64 (168 x 192)."""
    return sparse_llama(root, hidden=3072, intermediate=intermediate, heads=heads,
                        kv_heads=kv_heads, head_dim=128, layers=2, vocab=32256)


@pytest.mark.parametrize("specs", [[AWQ_TP4, TP3], [TP3, AWQ_TP4]], ids=["awq-first",
                                                                        "tp3-first"])
def test_the_repair_of_a_checkpoint_pads_to_the_joint_width(tmp_path: Path, specs):
    """``--repair --target A --target B``'s plan (api/repair_targets.py) on a written
    checkpoint pads every MLP to the joint width, and the padded model is fast on both
    targets at every site."""
    result = gac_check.check(served_llama(tmp_path / "src", WIDTH), "h100", None, specs)
    planned = plan_for_targets(result, "minimal", uniform=False).plan
    assert {r.site.name: r.target for r in planned.repairs} == {
        "model.layers.0.mlp:intermediate": JOINT, "model.layers.1.mlp:intermediate": JOINT}
    again = gac_check.check(served_llama(tmp_path / "fixed", JOINT), "h100", None, specs)
    assert {v.verdict for s in again.sites for v in again.contract.targets.of(s)} == {FAST}


@pytest.mark.parametrize("specs", [[AWQ_TP4, TP3], [TP3, AWQ_TP4]], ids=["awq-first",
                                                                        "tp3-first"])
def test_a_repair_one_target_would_still_refuse_names_it_wherever_it_is_listed(tmp_path: Path,
                                                                                specs):
    """32 heads do not divide over 3 ranks and heads are never padded: whichever place
    ``vllm,tp=3`` has among the targets, the repair is refused naming it, nothing planned."""
    src = served_llama(tmp_path / "src", WIDTH, heads=32, kv_heads=8)
    result = gac_check.check(src, "h100", None, specs)
    with pytest.raises(BadInput) as refused:
        plan_for_targets(result, "minimal", uniform=False)
    message = str(refused.value)
    assert f"--repair: {TP3} would still refuse OUT at model.layers.0.self_attn:heads" in message
    assert f"drop --target {TP3}" in message and AWQ_TP4 not in message


def test_llamacpp_judges_each_mix_class_once_and_every_layer_as_alone(monkeypatch):
    """Q4_K_M gives ffn_down one of two types per layer (Q6_K in llama.cpp's "more bits"
    layers): the layers are judged once per type, not once per layer (issue 32: per layer,
    80 layers' size searches were most of a four-target check), and each layer's verdict is
    still what judging it alone gives."""
    from gac_check.targets import verdicts as v

    sites = [DimSite(f"model.layers.{i}.mlp:intermediate", Role.INTERMEDIATE, 10944, [],
                     layer=i) for i in range(16)]
    target = parse_target("llama.cpp,quant=Q4_K_M")
    shape = model_shape(sites)
    alone = [v.judge(s, shape, target, "h100") for s in sites]
    judged = []
    real = v.judge
    monkeypatch.setattr(v, "judge", lambda site, *a: judged.append(site.layer) or real(site, *a))
    out = judge_all(sites, (target,), "h100")
    assert judged == [0, 2]  # of 16, layers 0 and 1 are "more bits" (Q6_K), layer 2 is not
    got = [(tv.verdict, tv.kernel, tv.fast_at, tv.why) for s in sites for tv in out.of(s)]
    assert got == [(tv.verdict, tv.kernel, tv.fast_at, tv.why) for tv in alone]
    assert len({k for _, k, _, _ in got}) == 2
