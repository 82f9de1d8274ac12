"""The reference compressor writes ASVD's layout, with ASVD's ranks, loadable back."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gac_check.analysis import check
from gac_check.compress import asvd_rank, compress_dir, factorize, layer_linears
from gac_check.errors import BadInput
from gac_check.lowrank import load_model


@pytest.mark.parametrize(("out", "inp", "ratio", "rank"), [
    (4096, 4096, 0.9, 1843), (11008, 4096, 0.9, 2686),
    (4096, 4096, 0.85, 1740), (11008, 4096, 0.85, 2537),
])
def test_rank_formula_reproduces_asvd_published_ranks(out, inp, ratio, rank):
    assert asvd_rank(out, inp, ratio) == rank


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = LlamaForCausalLM(cfg).eval()
    src = tmp_path_factory.mktemp("dense")
    model.save_pretrained(src)
    return model, src


def test_compressed_model_equals_its_factor_product(tiny_llama, tmp_path):
    """Loading the ASVD layout must compute exactly x @ (A @ B).T for every compressed linear."""
    dense, src = tiny_llama
    ranks = compress_dir(src, tmp_path / "c", 0.6)
    assert set(ranks) == set(layer_linears(dense))
    reference = LlamaForCausalLM(dense.config).eval()
    reference.load_state_dict(dense.state_dict())
    for name, lin in layer_linears(reference).items():
        f = factorize(lin.weight.detach(), ranks[name])
        lin.weight.data = f.A @ f.B
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        got = load_model(tmp_path / "c")(ids).logits
        want = reference(ids).logits
        dense_logits = dense(ids).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert not torch.allclose(got, dense_logits, atol=1e-3)  # compression really happened


def test_checker_sees_the_ranks_the_compressor_chose(tiny_llama, tmp_path):
    _, src = tiny_llama
    ranks = compress_dir(src, tmp_path / "c", 0.8)
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    assert config["truncation_ranks"] == ranks
    result = check(tmp_path / "c", "a100", "float16")
    rank_sites = {s.module: s.value for s in result.sites if s.role.value == "rank"}
    assert rank_sites == ranks
    assert result.format.name == "asvd"


def test_cli_refuses_existing_output_and_bad_ratio(tiny_llama, tmp_path):
    _, src = tiny_llama
    (tmp_path / "exists").mkdir()
    cmd = [sys.executable, "-m", "gac_check.compress", str(src)]
    r = subprocess.run([*cmd, str(tmp_path / "exists")], capture_output=True, text=True)
    assert r.returncode == 2 and "already exists" in r.stderr and len(r.stderr.splitlines()) == 1
    r = subprocess.run([*cmd, str(tmp_path / "new"), "--ratio", "1.5"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--ratio" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]


def test_output_inside_input_is_refused(tiny_llama):
    _, src = tiny_llama
    with pytest.raises(BadInput, match="inside"):
        compress_dir(src, src / "sub", 0.5)


def test_factors_reconstruct_the_weight_at_full_rank():
    w = torch.randn(24, 40)
    f = factorize(w, 24)
    assert torch.allclose(f.A @ f.B, w, atol=1e-5)
    err = [(w - (g := factorize(w, r)).A @ g.B).norm() for r in (4, 8, 16)]
    assert err[0] > err[1] > err[2]  # truncation keeps the largest singular values first
