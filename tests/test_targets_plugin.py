"""``pytest --gac-target SPEC``: the plugin's option and its ``gac_targets`` and
``gac_check_model`` fixtures, in a project outside the checkout (run in this process by
pytester), and a bad spec is a usage error."""
from __future__ import annotations

from tests.helpers import pytest_here
from tests.target_models import sparse_llama

TEST = '''
from gac_check.analysis import check


def test_deploys(gac_targets, gac_models, gac_profile):
    assert [t.spec for t in gac_targets] == ["vllm,tp=3", "llama.cpp,quant=Q8_0"]
    result = check(gac_models[0], gac_profile, None, gac_targets)
    summary = {spec: v["verdict"] for spec, v in result.contract.targets.summary().items()}
    assert summary == {"vllm,tp=3": "refused", "llama.cpp,quant=Q8_0": "fast"}


def test_checks_a_model_in_memory_as_saved(gac_check_model, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=170, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    result = gac_check_model(model)
    assert [t.spec for t in result.targets] == ["vllm,tp=3", "llama.cpp,quant=Q8_0"]
    assert result.contract.profile == "h100" and result.checkpoint.container == "in-memory"
    assert "model.layers.0.mlp:intermediate" in {f.site.name for f in result.findings}
    model.save_pretrained(tmp_path)
    assert gac_check_model(tmp_path).findings == result.findings
'''


def test_gac_target_option_and_fixture(pytester):
    sparse_llama(pytester.path / "model", hidden=4096, intermediate=11008, heads=32,
                 kv_heads=8, vocab=32000)
    pytester.makepyfile(test_deploy=TEST)
    res = pytest_here(pytester, "-q", "--gpu", "h100", "--model", "model", "--gac-target",
                      "vllm,tp=3", "--gac-target", "llama.cpp,quant=Q8_0", "test_deploy.py")
    assert res.ret == 0, res.stdout.str()[-2000:] + res.stderr.str()[-2000:]
    res.assert_outcomes(passed=2)
    bad = pytest_here(pytester, "-q", "--gac-target", "vllm,tp=0", "test_deploy.py")
    assert bad.ret == 4 and "positive integer" in bad.stderr.str()  # a usage error
