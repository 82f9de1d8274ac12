"""A real grouped-query checkpoint's shape as the targets see it (gac_check/targets/shards.py):
its KV heads are config.json's ``num_key_value_heads`` (not its query heads), and a fused
qkv's width, whole and per rank, is what transformers' own q_proj, k_proj and v_proj hold
(V included). Each seen red under its mutant."""
from __future__ import annotations

from pathlib import Path

import pytest

from gac_check.analysis import check
from gac_check.sites import Role
from gac_check.targets.shards import model_shape, uses
from tests import helpers

HEADS, KV, HEAD_DIM = 8, 2, 16


@pytest.fixture(scope="module")
def gqa(tmp_path_factory) -> tuple[object, list]:
    """A tiny transformers Llama with 8 query heads sharing 2 KV heads of 16, saved; and the
    sites gac-check reads from it."""
    model = helpers.tiny_llama(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                               num_key_value_heads=KV)
    root: Path = tmp_path_factory.mktemp("gqa") / "model"
    model.save_pretrained(root)
    return model, check(root, "gpu").sites


def test_the_shape_holds_the_configs_kv_heads_not_its_query_heads(gqa):
    model, sites = gqa
    shape = model_shape(sites)
    assert {(i, lay.heads, lay.kv_heads, lay.head_dim) for i, lay in shape.layers.items()} == {
        (i, model.config.num_attention_heads, model.config.num_key_value_heads, HEAD_DIM)
        for i in range(model.config.num_hidden_layers)}
    heads = next(s for s in sites if s.role is Role.HEADS and s.layer == 0)
    use = next(u for u in uses(heads, shape, 2, None) if u.name == "heads")
    assert use.quantities(heads.value)["kv_heads"] == model.config.num_key_value_heads


@pytest.mark.parametrize("tp, q_heads, kv_heads", [
    (1, 8, 2), (2, 4, 1),
    (4, 2, 1),  # more ranks than KV heads: each rank holds a copy of one K and one V head
])
def test_a_fused_qkv_is_q_k_and_v_whole_and_per_rank(gqa, tp, q_heads, kv_heads):
    """qkv's width is q_proj + k_proj + v_proj of the stock module; each rank holds its query
    heads and one K and one V head per KV head it holds, each HEAD_DIM wide."""
    model, sites = gqa
    attn = model.model.layers[0].self_attn
    whole = sum(p.out_features for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    head_dim = next(s for s in sites if s.role is Role.HEAD_DIM and s.layer == 0)
    qkv = next(u for u in uses(head_dim, model_shape(sites), tp, None) if u.name == "qkv_proj")
    got = qkv.quantities(head_dim.value)
    assert got["out"] == whole
    assert got["shard_out"] == (q_heads + kv_heads + kv_heads) * HEAD_DIM
    if tp <= KV:  # split evenly: the ranks together hold the module once
        assert got["shard_out"] * tp == whole
