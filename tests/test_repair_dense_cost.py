"""Never a fix dearer than dense (issue 28 item 4): a rank or latent whose padded factors
would hold more parameters than the dense matrix they approximate is left as it is, with
both costs and what to do instead, and ``--repair`` does not write it.

The boundary is on the planner's own rule (equal cost pads, one more parameter refuses);
the CLI runs on the reference compressor's real ASVD checkpoint, whose MLP ranks (46 of a
176 x 64 matrix) cross the dense cost when padded to 48 while its attention ranks (31 of
64 x 64) land exactly on it at 32.
"""
from __future__ import annotations

import json

from safetensors import safe_open

from gac_check.padding.plan import dearer_than_dense, dense_cost
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis
from tests import helpers


def asvd_rank(rank: int, n_in: int, n_out: int) -> tuple[DimSite, dict]:
    shapes = {"x.BLinear.weight": (rank, n_in), "x.ALinear.weight": (n_out, rank)}
    axes = [TensorAxis("x.BLinear.weight", 0, AxisKind.PRODUCER),
            TensorAxis("x.ALinear.weight", 1, AxisKind.CONSUMER)]
    return DimSite("x:rank", Role.RANK, rank, axes), shapes


def test_factors_as_dear_as_dense_pad_and_one_unit_more_is_refused():
    site, shapes = asvd_rank(31, 64, 64)
    assert dense_cost(site, shapes) == (4096, 128)
    assert dearer_than_dense(site, 32, shapes) is None  # 32 x 128 == 64 x 64
    why = dearer_than_dense(site, 33, shapes)
    assert why is not None and "4,224" in why and "4,096" in why and "dense" in why


def test_the_issues_asvd_lm_head_rank_81_to_256():
    site, shapes = asvd_rank(81, 256, 1000)  # lm_head: hidden 256, vocabulary 1000
    why = dearer_than_dense(site, 256, shapes)
    assert why is not None and "321,536" in why and "256,000" in why


def test_a_palu_group_latent_is_judged_against_its_groups_dense_width():
    """Group 1 of a VT [64 + 64, 4096] whose U.1 is [128, 64]: the dense width per group is
    128 x 4096; 124 is the last latent whose factors cost no more, and the issue's 256 is
    refused."""
    shapes = {"k.VT.weight": (128, 4096), "k.U.1.weight": (128, 64)}
    axes = [TensorAxis("k.VT.weight", 0, AxisKind.PRODUCER, start=64),
            TensorAxis("k.U.1.weight", 1, AxisKind.CONSUMER)]
    site = DimSite("k:group1", Role.KV_LATENT, 64, axes)
    assert dense_cost(site, shapes) == (128 * 4096, 4096 + 128)
    assert dearer_than_dense(site, 124, shapes) is None
    assert dearer_than_dense(site, 125, shapes) is not None
    assert "1,081,344" in dearer_than_dense(site, 256, shapes)  # type: ignore[operator]


def test_other_roles_have_no_dense_cost():
    site = DimSite("m:intermediate", Role.INTERMEDIATE, 170,
                   [TensorAxis("up.weight", 0, AxisKind.PRODUCER),
                    TensorAxis("down.weight", 1, AxisKind.CONSUMER)])
    assert dearer_than_dense(site, 100000, {"up.weight": (170, 64),
                                            "down.weight": (64, 170)}) is None


def test_repair_leaves_a_dearer_rank_unpadded_and_says_both_costs(tmp_path):
    dense, lowrank, out = tmp_path / "dense", tmp_path / "asvd", tmp_path / "out"
    helpers.tiny_llama().save_pretrained(dense)
    made = helpers.gac("compress", dense, lowrank, "--ratio", "0.99")
    assert made.returncode == 0 and "ranks [31, 46]" in made.stdout
    check = json.loads(helpers.gac(lowrank, "--gpu", "gpu", "--dtype", "float16",
                                   "--format", "json").stdout)
    up = next(s for s in check["sites"] if s["name"] == "model.layers.0.mlp.up_proj:rank")
    assert "11,520" in up["refusal"] and "11,264" in up["refusal"]  # the check says so too
    proc = helpers.gac(lowrank, "--gpu", "gpu", "--dtype", "float16", "--repair", out,
                       "--format", "json")
    assert proc.returncode == 1, proc.stderr  # the refused ranks stay misaligned, and gate
    report = json.loads(proc.stdout)
    repaired = {r["name"]: r["to"] for r in report["repaired"]}
    refused = {r["name"]: r["reason"] for r in report["refused"]}
    assert repaired["model.layers.0.self_attn.q_proj:rank"] == 32  # exactly as dear: padded
    why = refused["model.layers.0.mlp.up_proj:rank"]
    assert "46 -> 48" in why and "11,520" in why and "11,264" in why and "dense" in why
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.layers.0.mlp.up_proj.BLinear.weight").get_shape()[0] == 46
        assert f.get_slice("model.layers.0.self_attn.q_proj.BLinear.weight").get_shape()[0] == 32
    ranks = json.loads((out / "config.json").read_text())["truncation_ranks"]
    assert ranks["model.layers.0.mlp.up_proj"] == 46
