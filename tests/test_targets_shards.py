"""Per-shard arithmetic (gac_check/targets/shards.py) and target spec parsing, as units: what
one tensor-parallel rank holds of each site, on Llama-70B's real widths (64 heads, 8 KV heads,
head_dim 128, hidden 8192, MLP 28672), independent of any engine's rule pack."""
from __future__ import annotations

import pytest

from gac_check.errors import BadInput
from gac_check.sites import DimSite, Role
from gac_check.targets.shards import kv_heads_per_rank, model_shape, split, uses
from gac_check.targets.spec import parse_target


def site(role: Role, value: int, layer: int | None = 0, **attrs: object) -> DimSite:
    return DimSite(f"model.layers.0.{role.name.lower()}", role, value, [], layer=layer,
                   attrs=dict(attrs))


LLAMA_70B = [site(Role.HEADS, 64, kv_heads=8), site(Role.HEAD_DIM, 128),
             site(Role.INTERMEDIATE, 28672), site(Role.HIDDEN, 8192, layer=None)]


def quantities(role: Role, value: int, tp: int, name: str, sites=LLAMA_70B,
               kv_rule: str = "replicate") -> dict[str, int]:
    shape = model_shape(sites)
    target = next(s for s in sites if s.role is role)
    use = next(u for u in uses(target, shape, tp, None, kv_rule) if u.name == name)
    return use.quantities(value)


def test_kv_heads_are_read_into_the_shape_from_the_heads_site() -> None:
    shape = model_shape(LLAMA_70B)
    assert (shape.layer(0).heads, shape.layer(0).kv_heads, shape.layer(0).head_dim) == (64, 8, 128)
    mha = model_shape([site(Role.HEADS, 32)])  # no kv_heads: multi-head attention
    assert mha.layer(0).kv_heads == 32


@pytest.mark.parametrize(("tp", "shard_out", "kvpr"), [
    (1, (64 + 2 * 8) * 128, 8),
    (8, (8 + 2 * 1) * 128, 1),   # 8 query heads and one KV head per rank
    (16, (4 + 2 * 1) * 128, 1),  # more ranks than KV heads: each rank holds a copy
])
def test_a_fused_qkv_per_rank_width(tp, shard_out, kvpr) -> None:
    q = quantities(Role.HEAD_DIM, 128, tp, "qkv_proj")
    assert q["out"] == (64 + 2 * 8) * 128 and q["shard_out"] == shard_out
    attention = quantities(Role.HEAD_DIM, 128, tp, "attention")
    assert attention["heads_per_rank"] == 64 // tp and attention["kv_heads_per_rank"] == kvpr
    assert quantities(Role.HEAD_DIM, 128, tp, "o_proj")["shard_in"] == 64 // tp * 128


def test_no_qkv_shard_where_the_heads_do_not_split() -> None:
    sites = [site(Role.HEADS, 40, kv_heads=8), site(Role.HEAD_DIM, 128)]
    names = [u.name for u in uses(sites[1], model_shape(sites), 16, None)]
    assert names == ["attention"]  # 40 heads over 16 ranks: no per-rank qkv exists
    attention = quantities(Role.HEAD_DIM, 128, 16, "attention", sites)
    assert "heads_per_rank" not in attention


@pytest.mark.parametrize(("kv", "tp", "rule", "held"), [
    (8, 8, "replicate", 1), (8, 4, "replicate", 2), (8, 16, "replicate", 1),
    (8, 16, "divide", None), (3, 8, "replicate", None), (6, 4, "replicate", None),
    (2, 8, "replicate", 1), (1, 8, "replicate", 1),
])
def test_kv_heads_per_rank(kv, tp, rule, held) -> None:
    assert kv_heads_per_rank(kv, tp, rule) == held


def test_gate_up_is_fused_and_divided_per_part() -> None:
    q = quantities(Role.INTERMEDIATE, 27000, 8, "gate_up_proj")
    assert (q["part_out"], q["out"], q["shard_out"]) == (27000, 54000, 6750)
    odd = quantities(Role.INTERMEDIATE, 27001, 2, "gate_up_proj")
    assert "shard_out" not in odd  # 2 x 27001 divides by 2, but one part does not
    assert quantities(Role.INTERMEDIATE, 27000, 8, "down_proj")["shard_in"] == 3375
    assert split(27000, 7) is None


def test_heads_site_judges_kv_heads_per_rank_with_its_kv() -> None:
    q = quantities(Role.HEADS, 64, 16, "heads")
    assert (q["heads_per_rank"], q["kv_heads_per_rank"], q["kv_heads"]) == (4, 1, 8)


@pytest.mark.parametrize(("spec", "kv"), [("vllm", "auto"), ("vllm,kv=fp8", "fp8"),
                                          ("vllm,kv=FP8_E5M2", "fp8_e5m2"),
                                          ("sglang,tp=2,kv=bf16", "bf16")])
def test_kv_is_parsed(spec, kv) -> None:
    assert parse_target(spec).kv == kv


@pytest.mark.parametrize("spec", ["vllm,kv=int4", "vllm,kv=", "vllm,tp=0", "vllm,tp=-2",
                                  "vllm,tp=two", "vllm,colour=red", "nosuchengine"])
def test_bad_target_specs_are_refused(spec) -> None:
    with pytest.raises(BadInput):
        parse_target(spec)
