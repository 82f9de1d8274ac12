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

from gac_check.padding.dense_cost import dearer_than_dense, dense_cost
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


def palu_group(rank: int, width: int, n_in: int, start: int = 0) -> tuple[DimSite, dict]:
    shapes = {"k.VT.weight": (start + rank, n_in), "k.U.1.weight": (width, rank)}
    axes = [TensorAxis("k.VT.weight", 0, AxisKind.PRODUCER, start=start),
            TensorAxis("k.U.1.weight", 1, AxisKind.CONSUMER)]
    return DimSite("k:group1", Role.KV_LATENT, rank, axes), shapes


def test_a_palu_group_latent_is_costed_as_the_kv_cache_width_it_is():
    """Issue 40: a latent is what the KV cache holds per token. The issue's group (64 rows of
    K/V from a 256-wide input) pads 57 -> 64 although its factors then hold 20,480 parameters
    against the dense 16,384: 64 is the group's dense width, the cache no wider than dense.
    One past it is refused, with no dense product offered (PaLU's module has none)."""
    site, shapes = palu_group(57, 64, 256)
    assert dearer_than_dense(site, 64, shapes) is None
    why = dearer_than_dense(site, 65, shapes)
    assert why is not None and "dense width 64" in why and "KV cache" in why
    assert "dense weight" not in why and "no dense form" in why
    site, shapes = palu_group(64, 128, 4096, start=64)  # a wide group: up to 128, not 124
    assert dearer_than_dense(site, 128, shapes) is None
    assert dearer_than_dense(site, 129, shapes) is not None


def test_the_dense_product_is_offered_only_where_the_format_loads_one():
    site, shapes = asvd_rank(46, 64, 176)  # ASVD: a module without a rank is a plain Linear
    assert "one dense weight" in dearer_than_dense(site, 48, shapes)  # type: ignore[operator]
    shapes = {"x_v_proj.weight": (46, 64), "x_u_proj.weight": (176, 46)}  # SVD-LLM's pair
    axes = [TensorAxis("x_v_proj.weight", 0, AxisKind.PRODUCER),
            TensorAxis("x_u_proj.weight", 1, AxisKind.CONSUMER)]
    why = dearer_than_dense(DimSite("x:rank", Role.RANK, 46, axes), 48, shapes)
    assert why is not None and "dense weight" not in why and "--realign" in why


def test_repair_pads_a_palu_latent_to_its_groups_width_and_reports_a_full_one(tmp_path):
    """PaLU's own layout (tests/compressors.py): group 0 at 29 of 32 rows pads to 32 (its
    factors then hold 3,072 parameters, more than the dense 2,048: allowed, the cache is no
    wider than dense); group 1 at 32 of 32 compresses nothing, and the check says so."""
    from tests import compressors as C

    built = C.build_palu(tmp_path / "palu", (29, 32))
    check = helpers.gac(built.path, "--gpu", "gpu", "--dtype", "float16")
    assert "rank 32 of a 32 x 64 group is at or above its dense width 32" in check.stdout
    assert "re-run PaLU with a lower rank" in check.stdout
    proc = helpers.gac(built.path, "--gpu", "gpu", "--dtype", "float16", "--repair",
                       tmp_path / "out", "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert not report["refused"]
    repaired = {r["name"]: r["to"] for r in report["repaired"]}
    assert repaired["model.layers.0.self_attn.k_proj:group0"] == 32
    C.assert_loads_same(built, tmp_path / "out")


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
