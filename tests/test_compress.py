"""The reference compressor writes ASVD's layout, with ASVD's ranks, loadable back."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from transformers import BertForMaskedLM, LlamaForCausalLM

from gac_check.analysis import check
from gac_check.checkpoint.index import open_checkpoint
from gac_check.checkpoint.tensors import read_state
from gac_check.errors import BadInput
from gac_check.models.compress import asvd_rank, compress_dir, layer_linears
from gac_check.models.loaders import load_model
from gac_check.models.lowrank import factorize
from tests import helpers


@pytest.mark.parametrize(("out", "inp", "ratio", "rank"), [
    (4096, 4096, 0.9, 1843), (11008, 4096, 0.9, 2686),
    (4096, 4096, 0.85, 1740), (11008, 4096, 0.85, 2537),
])
def test_rank_formula_reproduces_asvd_published_ranks(out, inp, ratio, rank):
    assert asvd_rank(out, inp, ratio) == rank


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    model = helpers.tiny_llama(intermediate_size=160, num_key_value_heads=2, vocab_size=128)
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
    r = _run_cli(src, tmp_path / "exists")
    assert r.returncode == 2 and "already exists" in r.stderr and len(r.stderr.splitlines()) == 1
    r = _run_cli(src, tmp_path / "new", "--ratio", "1.5")
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


def _run_cli(*args) -> subprocess.CompletedProcess:
    """``gac-check compress ARGS``, run in this process."""
    return helpers.gac("compress", *args)


def test_bf16_model_compresses_to_a_bf16_checkpoint(tiny_llama, tmp_path):
    """Writing fp32 factors under a config that says bfloat16 doubles the size for nothing."""
    dense, _ = tiny_llama
    src = tmp_path / "bf16"
    copy = LlamaForCausalLM(dense.config).eval()
    copy.load_state_dict(dense.state_dict())
    copy.to(torch.bfloat16).save_pretrained(src)
    compress_dir(src, tmp_path / "c16", 0.6)
    out = open_checkpoint(tmp_path / "c16")
    assert {t.dtype for t in out.tensors.values()} == {"bfloat16"}
    assert any(n.endswith(".BLinear.weight") for n in out.tensors)
    assert out.dtype() == "bfloat16"
    fp32 = tmp_path / "fp32"
    dense.save_pretrained(fp32)
    compress_dir(fp32, tmp_path / "c32", 0.6)
    size16, size32 = ((tmp_path / d / "model.safetensors").stat().st_size for d in ("c16", "c32"))
    assert size16 < 0.55 * size32
    # the factors are the float64 SVD of the bf16 weight rounded once to bf16
    ranks = json.loads((tmp_path / "c16" / "config.json").read_text())["truncation_ranks"]
    name = "model.layers.0.mlp.down_proj"
    f = factorize(copy.get_submodule(name).weight.float(), ranks[name], torch.bfloat16)
    written = read_state(open_checkpoint(tmp_path / "c16"))
    assert torch.equal(written[f"{name}.BLinear.weight"], f.B)
    with torch.no_grad():
        logits = load_model(tmp_path / "c16")(torch.randint(0, 128, (1, 5))).logits
    assert torch.isfinite(logits).all()


def test_compressing_a_compressed_model_is_refused(tiny_llama, tmp_path):
    _, src = tiny_llama
    compress_dir(src, tmp_path / "c", 0.6)
    r = _run_cli(tmp_path / "c", tmp_path / "cc")
    assert r.returncode == 2 and "already low-rank" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1
    # the BLinear tensors alone are enough to tell (a config that lost truncation_ranks)
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    del config["truncation_ranks"]
    (tmp_path / "c" / "config.json").write_text(json.dumps(config))
    r = _run_cli(tmp_path / "c", tmp_path / "cc")
    assert r.returncode == 2 and "already low-rank" in r.stderr, r.stderr
    assert not (tmp_path / "cc").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no partial directory either


@pytest.mark.parametrize(("config", "reason"), [
    (None, "no config.json"),
    ({"model_type": "no-such-model"}, "no-such-model"),
    ({"hidden_size": 8}, "model_type"),
])
def test_unusable_config_is_one_line_not_a_traceback(tiny_llama, tmp_path, config, reason):
    _, src = tiny_llama
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(src / "model.safetensors", bad)
    if config is not None:
        (bad / "config.json").write_text(json.dumps(config))
    r = _run_cli(bad, tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(bad) in r.stderr and reason in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def test_bert_mlm_with_tied_decoder_compresses_and_loads(tmp_path):
    """BERT ties cls.predictions.decoder.weight to the word embeddings and aliases its bias to
    cls.predictions.bias; neither is lm_head, so the aliases must come from the model."""
    dense = helpers.tiny_bert(masked_lm=True, hidden_size=32, intermediate_size=48,
                              vocab_size=90, max_position_embeddings=32)
    with torch.no_grad():
        dense.cls.predictions.bias.normal_()  # zeros at init would hide a lost alias
    dense.save_pretrained(tmp_path / "dense")
    ranks = compress_dir(tmp_path / "dense", tmp_path / "c", 0.6)
    assert set(ranks) == set(layer_linears(dense)) and ranks
    written = open_checkpoint(tmp_path / "c").tensors
    assert "cls.predictions.decoder.weight" not in written
    assert "cls.predictions.decoder.bias" not in written
    reference = BertForMaskedLM(dense.config).eval()
    reference.load_state_dict(dense.state_dict())
    for name, lin in layer_linears(reference).items():
        f = factorize(lin.weight.detach(), ranks[name])
        lin.weight.data = f.A @ f.B
    ids = torch.randint(0, 90, (2, 11))
    with torch.no_grad():
        got = load_model(tmp_path / "c")(input_ids=ids).logits
        want = reference(input_ids=ids).logits
        dense_logits = dense(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert not torch.allclose(got, dense_logits, atol=1e-3)
    loaded = load_model(tmp_path / "dense")  # the dense source loads too
    assert loaded.cls.predictions.decoder.weight is loaded.bert.embeddings.word_embeddings.weight
