"""The padding cost of sites that span several heads (issue 22, "tests that bite"): a head_dim
site pads every head of q, k and v (and their biases) and every head's columns of o, so one
more unit of head_dim costs heads x hidden per projection, with key/value heads counted as
many times as there are of them (GQA), in split and fused (qkv_proj) layouts alike. The
figures are computed here from first principles.

Each test fails on one of the "padding" mutants in benchmarks/hand_mutants.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Phi3Config, Phi3ForCausalLM

from gac_check.analysis import check
from gac_check.checkpoint.index import open_checkpoint
from gac_check.report.json_report import to_json
from tests.helpers import gac, tiny_bert, tiny_llama, tiny_qwen2


def tiny_phi3(**overrides):
    torch.manual_seed(0)
    cfg = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 170,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 20, "max_position_embeddings": 64, "pad_token_id": 0,
           "eos_token_id": 1, "bos_token_id": 1, **overrides}
    return Phi3ForCausalLM(Phi3Config(**cfg))


def per_unit(hidden: int, heads: int, kv: int, bias: bool) -> int:
    """What one more unit of head_dim costs: rows of q (heads), k and v (kv heads each), their
    biases, and the columns of o (heads)."""
    return hidden * (heads + 2 * kv) + hidden * heads + (heads + 2 * kv) * bias


#: model, head_dim, its fp16 repair target, padding cost per layer
MODELS = [
    ("llama MHA", lambda: tiny_llama(head_dim=20), 20, 24, 4 * per_unit(64, 4, 4, False)),
    ("qwen2 GQA with biases", lambda: tiny_qwen2(head_dim=20), 20, 24,
     4 * per_unit(64, 4, 2, True)),
    ("qwen2 one kv head", lambda: tiny_qwen2(head_dim=20, num_key_value_heads=1), 20, 24,
     4 * per_unit(64, 4, 1, True)),
    ("bert MHA with biases", lambda: tiny_bert(hidden_size=80), 20, 24,
     4 * per_unit(80, 4, 4, True)),
    ("phi3 fused qkv, GQA", tiny_phi3, 20, 24, 4 * per_unit(64, 4, 2, False)),
    ("phi3 fused qkv, head_dim 12", lambda: tiny_phi3(head_dim=12), 12, 16,
     4 * per_unit(64, 4, 2, False)),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    out = {}
    for name, build, *_ in MODELS:
        out[name] = root / name.replace(" ", "-").replace(",", "")
        build().save_pretrained(out[name])
    return out


@pytest.mark.parametrize(("name", "head_dim", "target", "cost"),
                         [(m[0], *m[2:]) for m in MODELS], ids=[m[0] for m in MODELS])
def test_a_head_dim_site_costs_every_head(saved, name, head_dim, target, cost):
    doc = to_json(check(saved[name], "a100", "float16"))
    heads = [s for s in doc["sites"] if s["role"] == "head_dim"]
    assert len(heads) == 2
    for s in heads:
        assert (s["value"], s["repair_to"], s["padding_params"]) == (head_dim, target, cost)


def test_a_fused_mlp_costs_both_halves_in_the_json_the_table_and_the_summary(saved):
    """Phi-3's gate_up_proj holds gate rows then up rows: 170 -> 176 pads 6 rows in each half
    and 6 columns of down_proj (64 each), per layer. The table's +params folds both layers;
    the summary's overhead counts the MLPs only (the head_dim sites are refused under RoPE,
    and their row says "-")."""
    model = saved["phi3 fused qkv, GQA"]
    doc = to_json(check(model, "a100", "float16"))
    mlp = [s for s in doc["sites"] if s["role"] == "intermediate"]
    assert [s["padding_params"] for s in mlp] == [6 * 3 * 64] * 2
    assert doc["summary"]["repair_overhead_fraction"] == pytest.approx(
        2 * 6 * 3 * 64 / open_checkpoint(model).params)
    proc = gac(model, "--gpu", "a100", "--dtype", "float16")
    assert proc.returncode == 1, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.startswith("  model.layers.*")}
    assert rows["model.layers.*.mlp:intermediate"][7] == f"{2 * 6 * 3 * 64:,}"
    assert rows["model.layers.*.self_attn:head_dim"][3:8] == ["no*", "error", "n/m", "[2]",
                                                              "-"]
