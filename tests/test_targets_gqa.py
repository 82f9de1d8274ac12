"""llama.cpp's GQA boundary: the low-bit ftypes store attn_v in a larger type when the model
has at least 4 query heads per KV head (src/llama-quant.cpp@0c1e57098,
llama_tensor_get_type_impl: ``qs.model.hparams.n_gqa() >= 4``, n_gqa = n_head / n_head_kv
in integers). At Q2_K that is Q4_K against Q3_K. 12 heads over 3 KV heads is 4, over 4 KV
heads 3: one KV head apart, the two sides of the boundary; 15 over 4 is 3.75, below it (the
division rounds down). Judged from a Hugging Face checkpoint (its config's
num_key_value_heads) and from a GGUF file (its head_count_kv).
"""
from __future__ import annotations

from pathlib import Path

import pytest

import gac_check
from gac_check.sites import Role
from gac_check.targets.gguf import tensor_uses
from gac_check.targets.packs import packs
from tests.gguf_files import write_gguf
from tests.target_models import sparse_llama

#: (query heads, KV heads, head_dim, n_gqa, the type Q2_K's mix asks for attn_v); every
#: row length a multiple of 256, so no tensor falls back
SIDES = [(12, 3, 64, 4, "Q4_K"), (12, 4, 64, 3, "Q3_K"), (15, 4, 256, 3, "Q3_K"),
         (12, 12, 64, 1, "Q3_K")]


@pytest.mark.parametrize("heads, kv, head_dim, gqa, attn_v", SIDES)
def test_a_checkpoint_s_kv_heads_set_attn_v_s_type(tmp_path: Path, heads, kv, head_dim, gqa,
                                                   attn_v):
    assert heads // kv == gqa
    src = sparse_llama(tmp_path / "m", hidden=768, intermediate=2048, heads=heads,
                       kv_heads=kv, head_dim=head_dim, layers=2, vocab=32000)
    result = gac_check.check(src, "h100", None, ["llama.cpp,quant=Q2_K"])
    hidden = next(s for s in result.sites if s.role is Role.HIDDEN)
    uses = tensor_uses(packs()["llama.cpp"], "Q2_K", hidden, result.contract.targets.shape)
    requested = {u.tensor: u.requested for u in uses}
    assert requested["attn_v"] == (attn_v,)
    assert requested["attn_k"] == ("Q2_K",)  # the boundary moves attn_v alone


def q2_k_types(layers: int, attn_v: str) -> dict[str, str]:
    """What llama.cpp's quantizer stores at Q2_K for an aligned llama: Q2_K, the head Q6_K,
    ffn_down and attn_output Q3_K, and attn_v as the GQA boundary says."""
    types = {"token_embd.weight": "Q2_K", "output.weight": "Q6_K"}
    for i in range(layers):
        b = f"blk.{i}."
        types |= {b + t: "Q2_K" for t in ("attn_q.weight", "attn_k.weight", "ffn_gate.weight",
                                          "ffn_up.weight")}
        types |= {b + "ffn_down.weight": "Q3_K", b + "attn_output.weight": "Q3_K",
                  b + "attn_v.weight": attn_v}
    return types


@pytest.mark.parametrize("heads, kv, head_dim, gqa, attn_v", SIDES)
def test_a_gguf_file_s_head_count_kv_sets_attn_v_s_type(tmp_path: Path, heads, kv, head_dim,
                                                        gqa, attn_v):
    m = {"hidden": 256, "ff": 768, "heads": heads, "kv_heads": kv, "head_dim": head_dim,
         "layers": 2, "vocab": 512}
    path = write_gguf(tmp_path / "m.gguf", m, "Q2_K", q2_k_types(2, attn_v))
    g = gac_check.check(path, gpu="h100").gguf
    assert g is not None and not g.disagreements and not g.fallbacks
    assert {t.requested for t in g.tensors if "attn_v" in t.name} == {attn_v}
    # the other side's type in the file is a disagreement, named
    other = "Q3_K" if attn_v == "Q4_K" else "Q4_K"
    path = write_gguf(tmp_path / "other.gguf", m, "Q2_K", q2_k_types(2, other))
    g = gac_check.check(path, gpu="h100").gguf
    assert [t.name for t in g.disagreements] == ["blk.0.attn_v.weight", "blk.1.attn_v.weight"]
    assert f"the file holds {other} where llama.cpp@0c1e57098 stores {attn_v}" in \
        g.disagreements[0].why
