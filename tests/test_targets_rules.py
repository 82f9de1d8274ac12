"""Deployment-target rules at and around their boundaries (docs/targets.md).

Table-driven: each row is one rule of a shipped pack, or a case from the engines' own issues
(vllm-project/vllm#7075, #9913, #13640, #16021; llm-compressor#54, #1489), judged the way a
check judges it: a site of the given role and width in a model of the given shape, on a
target, on a GPU profile. The expected verdicts were derived from the engines' sources as cited
in the packs, not from gac-check's output.
"""
from __future__ import annotations

import json

import pytest

from gac_check.errors import BadInput
from gac_check.formats.architectures import HEADS_NOT_PADDED
from gac_check.sites import DimSite, Role
from gac_check.targets.packs import PackError, packs, parse_pack
from gac_check.targets.shards import LayerShape, ModelShape, kv_heads_per_rank, split
from gac_check.targets.spec import parse_target
from gac_check.targets.verdicts import judge, judge_all, judge_uses, site_uses

LAYER = dict(heads=32, kv_heads=8, head_dim=128, intermediate=14336)


def verdict(role: str, value: int, target: str, gpu: str = "h100", dtype: str = "bfloat16",
            hidden: int = 4096, vocab: int = 32000, **layer):
    """Judge one site of ``role`` with ``value`` in a Llama-shaped model on ``target``."""
    lay = LayerShape(**{**LAYER, **layer})
    role_ = Role(role)
    if role_ is Role.INTERMEDIATE:
        lay.intermediate = value
    elif role_ is Role.HEAD_DIM:
        lay.head_dim = value
    elif role_ is Role.HEADS:
        lay.heads = value
    shape = ModelShape(hidden, vocab, {0: lay}, act_fp16=dtype == "float16")
    attrs = {"kv_heads": lay.kv_heads} if role_ is Role.HEADS else {}
    inexact = {Role.HEAD_DIM: "exactness is not what this test is about",
               Role.HEADS: HEADS_NOT_PADDED}.get(role_)
    site = DimSite(f"model.layers.0:{role}", role_, value, [], layer=0 if role_ not in
                   (Role.HIDDEN, Role.VOCAB) else None, inexact=inexact, attrs=attrs)
    return judge(site, shape, parse_target(target), gpu)


# --------------------------------------------------------------------------- vLLM attention
@pytest.mark.parametrize("target, head_dim, gpu, expected, kernel", [
    # v0.14.0+: FLASH_ATTN takes head_dim % 8 == 0 and <= 256, then FLASHINFER, TRITON, FLEX
    ("vllm", 128, "h100", "fast", "FLASH_ATTN"),
    ("vllm", 112, "h100", "fast", "FLASH_ATTN"),
    ("vllm", 104, "a100", "fast", "FLASH_ATTN"),
    ("vllm", 256, "h100", "fast", "FLASH_ATTN"),
    ("vllm", 107, "h100", "fallback", "TRITON_ATTN"),  # engine-cases attn-107-sm90
    ("vllm", 257, "h100", "fallback", "TRITON_ATTN"),
    # from v0.20.0 FLASH_ATTN runs head sizes % 8 up to 512 through FlashAttention 4 on sm90
    # (FlashAttentionBackend.supports_head_size: is_fa_version_supported(4)); sm80 has no FA4
    ("vllm", 512, "h100", "fast", "FLASH_ATTN"),
    ("vllm", 264, "h100", "fast", "FLASH_ATTN"),
    ("vllm@v0.20.0", 512, "h100", "fast", "FLASH_ATTN"),
    ("vllm@v0.20.0", 264, "h100", "fast", "FLASH_ATTN"),
    ("vllm@v0.17.0", 264, "h100", "fallback", "TRITON_ATTN"),  # before FA4: <= 256 only
    ("vllm@v0.17.0", 512, "h100", "fallback", "TRITON_ATTN"),  # FlashInfer's 512 from v0.22
    ("vllm", 520, "h100", "fallback", "TRITON_ATTN"),  # past FA4's 512
    ("vllm", 504, "h100", "fast", "FLASH_ATTN"),
    ("vllm", 260, "h100", "fallback", "TRITON_ATTN"),  # 260 % 8
    ("vllm", 264, "a100", "fallback", "TRITON_ATTN"),
    ("vllm", 512, "a100", "fast", "FLASHINFER"),  # FlashInfer's list from v0.22.0
    ("vllm", 32, "h100", "fast", "FLASH_ATTN"),
    ("vllm", 20, "h100", "fallback", "FLEX_ATTENTION"),  # attn-20: < 32 and not % 8
    ("vllm", 31, "h100", "fallback", "FLEX_ATTENTION"),
    # v0.11.0: the FlashAttention list, else FlexAttention
    ("vllm@v0.11.0", 128, "a100", "fast", "FLASH_ATTN"),
    ("vllm@v0.11.0", 80, "a100", "fallback", "FLEX_ATTENTION"),  # attn-80-v0.11
    ("vllm@v0.11.0", 107, "h100", "fallback", "FLEX_ATTENTION"),
    # v0.8.5 (V1 default): outside the list FlashAttentionImpl raises
    ("vllm@v0.8.5", 96, "a100", "fast", "FLASH_ATTN"),
    ("vllm@v0.8.5", 107, "h100", "refused", None),
    # v0.6.3.post1 (V0): FLASH_ATTN list, else XFORMERS' PagedAttention list, else refused
    ("vllm@v0.6.3.post1", 128, "a100", "fast", "FLASH_ATTN"),
    ("vllm@v0.6.3.post1", 80, "a100", "fallback", "XFORMERS"),
    ("vllm@v0.6.3.post1", 120, "a100", "fallback", "XFORMERS"),
    ("vllm@v0.6.3.post1", 107, "a100", "refused", None),
])
def test_vllm_attention_backend(target, head_dim, gpu, expected, kernel):
    v = verdict("head_dim", head_dim, target, gpu)
    assert (v.verdict, v.kernel if expected != "fast" else v.kernels[0]) == (expected, kernel)


@pytest.mark.parametrize("target, head_dim, fast_at", [
    ("vllm", 107, 112), ("vllm@v0.11.0", 107, 128), ("vllm@v0.8.5", 107, 128),
    ("vllm@v0.6.3.post1", 107, 128), ("vllm", 257, 264),
])
def test_vllm_attention_smallest_fast_head_dim(target, head_dim, fast_at):
    # 257 on sm90: FA4's 264 (from v0.20.0); on sm80 it is FlashInfer's 512 (below)
    v = verdict("head_dim", head_dim, target)
    assert v.fast_at == fast_at
    assert v.fix_to is None and "exactness" in v.cannot_pad  # head_dim: not exactly paddable


# ------------------------------------------------------------------------ vLLM TP and heads
@pytest.mark.parametrize("heads, kv, tp, expected", [
    (32, 8, 1, "fast"), (32, 8, 8, "fast"), (32, 8, 16, "fast"),  # 16 % 8: KV replicated
    (32, 2, 8, "fast"),  # tp-kv-rep: one KV head per rank, four replicas
    (30, 30, 4, "refused"),  # tp-heads: 30 % 4
    (40, 10, 4, "refused"),  # vllm#16021, Phi-4: 10 % 4 and 4 % 10
    (48, 6, 4, "refused"),  # tp-kv-bad
    (48, 6, 6, "fast"), (48, 6, 12, "fast"), (48, 6, 3, "fast"),
    (32, 6, 1, "refused"),  # 32 % 6: GQA groups
])
def test_vllm_heads_divide_by_tp_and_kv_heads_replicate(heads, kv, tp, expected):
    v = verdict("heads", heads, f"vllm,tp={tp}", kv_heads=kv)
    assert v.verdict == expected
    if expected == "refused":
        assert v.fix_to is None and v.cannot_pad


def test_phi4_at_tp4_says_which_tp_sizes_load():
    v = verdict("heads", 40, "vllm,tp=4", kv_heads=10)
    assert "tp=1/2" in v.cannot_pad and "loads at" in v.cannot_pad


@pytest.mark.parametrize("kv, tp, per_rank", [(8, 4, 2), (8, 8, 1), (2, 8, 1), (8, 16, 1),
                                              (6, 4, None), (3, 8, None), (1, 4, 1)])
def test_kv_heads_per_rank_replicates_below_tp(kv, tp, per_rank):
    assert kv_heads_per_rank(kv, tp) == per_rank


@pytest.mark.parametrize("n, tp, part", [(11008, 4, 2752), (11000, 3, None), (7, 1, 7)])
def test_split(n, tp, part):
    assert split(n, tp) == part


@pytest.mark.parametrize("intermediate, tp, expected", [
    (11008, 4, "fast"), (11000, 3, "refused"), (11001, 3, "fast"), (11001, 2, "refused"),
])
def test_vllm_mlp_width_must_divide_by_tp(intermediate, tp, expected):
    assert verdict("intermediate", intermediate, f"vllm,tp={tp}").verdict == expected


@pytest.mark.parametrize("vocab, tp, expected", [
    (32000, 2, "fast"), (32001, 2, "fast"), (32001, 3, "fast"),  # padded to 32064
    (32000, 3, "refused"),  # 32000 padded to 32000: % 3
])
def test_vllm_vocab_is_padded_to_64_then_divided(vocab, tp, expected):
    assert verdict("vocab", vocab, f"vllm,tp={tp}", vocab=vocab).verdict == expected


# --------------------------------------------------------------------- vLLM quantized linears
@pytest.mark.parametrize("target, gpu, dtype, width, expected, kernel", [
    # vllm#9913: DeepSeek-Coder-V2-Lite AWQ, down_proj in 10944 (% 128 = 64), v0.6.3.post1
    ("vllm@v0.6.3.post1,quant=awq", "a100", "float16", 10944, "refused", None),
    # from v0.8.5 a misaligned layer falls back to the AWQ GEMM kernel
    ("vllm@v0.8.5,quant=awq", "a100", "float16", 10944, "refused", None),  # 10944 % 128 group
    ("vllm@v0.8.5,quant=awq,group=64", "a100", "float16", 10944, "fallback", "awq"),
    # vllm#13640: Qwen2.5-VL-72B AWQ, 29568 at tp=2 -> 14784 % 128 = 64: v0.6.3 refused
    ("vllm@v0.6.3.post1,tp=2,quant=awq", "a100", "float16", 29568, "refused", None),
    ("vllm@v0.6.3.post1,tp=1,quant=awq", "a100", "float16", 29568, "fast", "awq_marlin"),
    # llm-compressor#57: W8A16-style Marlin, 29568 at tp=4 -> 7392 % 128 = 96 (group -1)
    ("vllm@v0.20.0,tp=4,quant=gptq,group=-1", "a100", "bfloat16", 29568, "refused", None),
    ("vllm,tp=4,quant=gptq,group=-1", "a100", "bfloat16", 29568, "fallback",
     "marlin (tile-padded)"),
    # gptq-8806: group 128 does not tile 8806: no kernel at v0.20.0; from v0.25.0 Humming
    # (last in the CUDA list) takes what nothing else does (test_gptq_group_straddle_* below)
    # 8806 = 68 groups of 128 and 102: a partial last group, whose scales vLLM trims
    ("vllm,quant=gptq", "h100", "bfloat16", 8806, "refused", None),
    ("vllm@v0.20.0,quant=gptq", "h100", "bfloat16", 8806, "refused", None),
    # aligned widths: Machete on sm90, Marlin on sm80
    ("vllm,tp=8,quant=gptq", "h100", "bfloat16", 28672, "fast", "machete"),
    ("vllm,tp=8,quant=gptq", "a100", "bfloat16", 28672, "fast", "marlin"),
    ("vllm,tp=8,quant=awq", "a100", "bfloat16", 28672, "fast", "awq_marlin"),
    # FP8: CUTLASS on sm89+ (from v0.21.0 it pads K, N to 16 at load and on every call: a
    # fallback that pads), weight-only Marlin below
    ("vllm,quant=fp8", "h100", "bfloat16", 8806, "fallback", "cutlass_scaled_mm (pads K, N to 16)"),
    ("vllm,quant=fp8", "h100", "bfloat16", 8816, "fast", "cutlass_scaled_mm"),
    ("vllm@v0.20.0,quant=fp8", "h100", "bfloat16", 8806, "fallback", "triton_scaled_mm"),
    ("vllm@v0.20.0,quant=fp8", "h100", "bfloat16", 8816, "fast", "cutlass_scaled_mm"),
    ("vllm,quant=fp8", "a100", "bfloat16", 8192, "fallback",
     "fp8 weight-only (humming; marlin for quant_method fp8)"),
    ("vllm@v0.30.0,quant=fp8", "a100", "bfloat16", 8192, "fallback", "fp8_marlin (weight-only)"),
    # INT8 W8A8: CUTLASS needs K, N % 16, else Triton
    ("vllm,quant=int8", "a100", "bfloat16", 8806, "fallback", "triton_scaled_mm"),
    ("vllm,quant=int8", "a100", "bfloat16", 8816, "fast", "cutlass_scaled_mm"),
    # scheme names, planned without a checkpoint: FP8 weight-only runs the weight-only
    # kernels on an H100 too (K % 4); asymmetric INT8 has no Triton fallback (K, N % 16);
    # static activation scales take their dynamic kin's dense rules
    ("vllm,quant=fp8_w8a16", "h100", "bfloat16", 8816, "fallback",
     "fp8 weight-only (humming; marlin for quant_method fp8)"),
    ("vllm,quant=fp8_w8a16", "h100", "bfloat16", 8806, "refused", None),
    ("vllm,quant=int8_asym", "a100", "bfloat16", 8806, "refused", None),
    ("vllm,quant=INT8_ASYM", "h100", "bfloat16", 8816, "fast", "cutlass_scaled_mm_azp"),
    ("vllm,quant=int8_static", "a100", "bfloat16", 8806, "fallback", "triton_scaled_mm"),
    ("vllm,quant=fp8_static", "h100", "bfloat16", 8806, "fallback",
     "cutlass_scaled_mm (pads K, N to 16)"),
])
def test_vllm_quantized_mlp_kernels(target, gpu, dtype, width, expected, kernel):
    v = verdict("intermediate", width, target, gpu, dtype)
    assert v.verdict == expected, v.why
    if kernel is not None:
        assert (v.kernels if expected == "fast" else [v.kernel])[-1] == kernel


@pytest.mark.parametrize("target, gpu, dtype, kernel", [
    # 11008 at tp=4: down_proj holds 2752 inputs, a 128-group straddles two ranks. vLLM's
    # GPTQ path (AutoGPTQLinearMethod -> choose_mp_linear_kernel) has no per-layer check:
    # Machete checks no group against the shard, Marlin does, ExLlama checks the full K,
    # Humming takes anything (last in the CUDA list from v0.25.0). At v0.33.0 the loader
    # was read: it computes wrong outputs (test_gptq_straddled_or_partial_group_is_refused)
    ("vllm@v0.30.0,tp=4,quant=gptq", "h100", "bfloat16", "machete"),
    ("vllm@v0.30.0,tp=4,quant=gptq", "a100", "float16", "exllama"),
    ("vllm@v0.30.0,tp=4,quant=gptq", "a100", "bfloat16", "humming"),
    ("vllm@v0.24.0,tp=4,quant=gptq", "a100", "bfloat16", "humming"),  # right after Marlin
    ("vllm@v0.23.0,tp=4,quant=gptq", "a100", "bfloat16", "humming"),
    ("vllm@v0.20.0,tp=4,quant=gptq", "h100", "bfloat16", "machete"),
    ("vllm@v0.20.0,tp=4,quant=gptq", "a100", "float16", "exllama"),
])
def test_gptq_group_straddling_the_shard_is_taken_by_a_kernel_not_refused(target, gpu, dtype,
                                                                          kernel):
    v = verdict("intermediate", 11008, target, gpu, dtype)
    assert (v.verdict, v.kernel) == ("fallback", kernel), v.why
    assert "Failed to find a kernel" not in v.why
    if kernel == "machete":  # Machete takes it: the reason is the straddle, and its cost
        assert "straddles the TP shard" in v.why and "misaligned scales" in v.why


@pytest.mark.parametrize("target, width", [
    ("vllm,tp=4,quant=gptq", 11008),  # Llama-2-7B: 2752 per rank, 21.5 groups
    ("vllm,quant=gptq", 688),  # GPTQModel's partial last group: 5 scale rows of the file's 6
    ("vllm,tp=2,quant=gptq,group=32", 688),  # 344 per rank: 10.75 groups
])
@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_gptq_straddled_or_partial_group_is_refused_as_wrong_outputs(target, width, gpu):
    """vLLM v0.33.0's AutoGPTQLinearMethod.create_weights allocates in_per_rank // group scale
    rows and loads: the model runs and computes wrong numbers, which is refused, never a
    fallback (issue 39)."""
    v = verdict("intermediate", width, target, gpu)
    assert v.verdict == "refused", v.why
    assert "wrong outputs" in v.why and "\n" not in v.why
    assert v.source.function.startswith("AutoGPTQLinearMethod.create_weights")


@pytest.mark.parametrize("width, tp, group", [(11008, 4, 128), (640, 2, 128), (688, 1, 128)])
def test_compressed_tensors_w4a16_group_must_divide_each_ranks_input(width, tp, group):
    """CompressedTensorsWNA16.create_weights calls verify_group_size_divides_partition:
    ValueError (issue 39: Llama-2-7B at tp=4, llm-compressor's MLP 640 at tp=2)."""
    v = verdict("intermediate", width, f"vllm,tp={tp},quant=wna16,group={group}", "h100")
    assert v.verdict == "refused", v.why
    assert "not divisible by group_size" in v.why
    assert v.source.file == "vllm/distributed/utils.py"
    ok = verdict("intermediate", 11264, f"vllm,tp={tp},quant=wna16,group={group}", "h100")
    assert ok.verdict == "fast", ok.why


@pytest.mark.parametrize("quant, words", [("gptq_act_order", "desc_act=True"),
                                          ("wna16_act_order", "actorder='group'")])
@pytest.mark.parametrize("role, width", [("intermediate", 11264), ("head_dim", 128)])
def test_group_activation_ordering_is_refused_whatever_the_width(quant, words, role, width):
    v = verdict(role, width, f"vllm,quant={quant}", "h100")
    assert v.verdict == "refused" and words in v.why and "no longer supported" in v.why


def test_gptq_group_straddle_boundary_and_the_versions_that_still_refuse():
    # 11264 / 4 = 2816 = 22 groups: Machete fast; v0.20.0 on sm80 in bf16 has no kernel
    aligned = verdict("intermediate", 11264, "vllm,tp=4,quant=gptq", "h100")
    assert (aligned.verdict, aligned.kernel) == ("fast", "machete")
    assert verdict("intermediate", 11008, "vllm,tp=4,quant=gptq", "h100").fix_to == 11264
    old = verdict("intermediate", 11008, "vllm@v0.20.0,tp=4,quant=gptq", "a100", "bfloat16")
    assert old.verdict == "refused" and "Failed to find a kernel" in old.why


def test_awq_straddle_is_refused_by_the_awq_method_not_by_the_kernel_list():
    v = verdict("intermediate", 11008, "vllm,tp=4,quant=awq", "h100")
    assert v.verdict == "refused"
    assert "input size is not aligned" in v.why and "Failed to find" not in v.why
    assert v.source.file.endswith("auto_awq.py")


@pytest.mark.parametrize("target, gpu, width, kernel", [
    # AWQ from v0.24.0: AutoAWQMarlinLinearMethod -> choose_mp_linear_kernel: Machete first
    # on sm90 (uint4 with zero points, group -1/64/128, in % 64, out % 128)
    ("vllm,tp=8,quant=awq", "h100", 28672, "machete"),
    ("vllm,tp=8,quant=awq", "a100", 28672, "awq_marlin"),
    # Machete takes no group 32; from v0.33.0 Humming outranks Marlin on sm90
    # (prioritize_humming, found by the oracle: tests/test_targets_vllm_oracle.py)
    ("vllm,tp=8,quant=awq,group=32", "h100", 28672, "humming"),
    ("vllm@v0.30.0,tp=8,quant=awq,group=32", "h100", 28672, "awq_marlin"),
    ("vllm,tp=8,quant=gptq,group=32", "h100", 28672, "humming"),
    ("vllm,tp=8,quant=gptq,group=32", "a100", 28672, "marlin"),
])
def test_awq_on_sm90_runs_machete(target, gpu, width, kernel):
    v = verdict("intermediate", width, target, gpu)
    assert v.verdict == "fast" and v.kernels[-1] == kernel


def test_fp8_cutlass_padding_is_a_fallback_that_says_what_it_pads():
    v = verdict("intermediate", 8806, "vllm,quant=fp8", "h100")
    assert (v.verdict, v.kernel) == ("fallback", "cutlass_scaled_mm (pads K, N to 16)")
    assert "pads N 17612 -> 17616" in v.why  # gate_up's fused N per rank, padded to 16
    assert v.fix_to == 8816  # down_proj's K 8806 pads too: 8808 would still pad it


@pytest.mark.parametrize("width, tp, expected", [
    # v0.33.0, below sm89: compressed-tensors FP8 runs weight-only on Humming, vLLM's own fp8 on
    # Marlin; both view each rank's N x K FP8 weight as int32 at load, so down_proj's K per
    # rank must be a multiple of 4 (found by the oracle: tests/test_targets_vllm_oracle.py)
    (8806, 1, "refused"),  # K 8806 % 4 = 2
    (8808, 1, "fallback"),
    (8808, 4, "refused"),  # 2202 per rank
    (8816, 4, "fallback"),  # 2204 per rank
])
def test_vllm_fp8_weight_only_needs_k_per_rank_multiple_of_4(width, tp, expected):
    v = verdict("intermediate", width, f"vllm,tp={tp},quant=fp8", "a100")
    assert v.verdict == expected, v.why
    if expected == "refused":
        assert "divisible by 4 to view Float8_e4m3fn as Int" in v.why
        assert v.source.file.endswith("humming/linear.py")
    else:
        assert v.kernel == "fp8 weight-only (humming; marlin for quant_method fp8)"
    # on an H100 CUTLASS runs it (padding K and N to 16), whatever K is
    assert verdict("intermediate", width, f"vllm,tp={tp},quant=fp8", "h100").verdict != "refused"


def test_kernels_the_stock_install_never_takes_stay_in_the_list_but_are_skipped():
    from gac_check.targets.packs import packs
    sel = next(s for s in packs()["vllm"].selections if s.id == "vllm-gptq-linear")
    order = [c.kernel for c in sel.candidates]
    assert order.index("machete") < order.index("marlin") < order.index("conch") \
        < order.index("exllama") < order.index("triton_w4a16") < len(order) - 1
    assert order[-1] == "humming" and {"allspark", "conch", "cutlass_w4a8"} <= set(order)
    assert all(c.only_if for c in sel.candidates if c.kernel in ("allspark", "conch"))


@pytest.mark.parametrize("width, tp, expected", [
    # vllm#42384: block-FP8 (128 x 128) weights: each rank's gate/up part and down_proj's
    # input must be a multiple of the block (validate_fp8_block_shape)
    (18432, 8, "fast"),  # 2304 per rank = 18 blocks
    (18432, 16, "fast"),  # 1152 = 9 blocks
    (18432, 32, "refused"),  # 576 per rank: 4.5 blocks
    (11008, 1, "fast"),  # 86 blocks, unsharded
    (11000, 1, "refused"),  # merged gate_up at tp=1: the gate part must be whole blocks too
    (11008, 4, "refused"),  # 2752 per rank % 128 = 64
    (11264, 4, "fast"),  # 2816 = 22 blocks
])
def test_vllm_block_fp8_needs_whole_blocks_per_rank(width, tp, expected):
    v = verdict("intermediate", width, f"vllm,tp={tp},quant=fp8_block", "h100")
    assert v.verdict == expected, v.why
    if expected == "refused":
        assert "block" in v.why and v.source.issue == "vllm-project/vllm#42384"


@pytest.mark.parametrize("width, gpu, expected", [
    # below sm89 block FP8 runs weight-only (Marlin; Humming for compressed-tensors), which
    # views the N x K weight as int32: at tp=1 down_proj's K is not split, so validate_fp8_
    # block_shape passes 8806 and the repack refuses it (the oracle's 8806 case)
    (8806, "a100", "refused"),
    (8808, "a100", "loads"),
    (8806, "h100", "loads"),  # CUTLASS block FP8: no such view
])
def test_vllm_block_fp8_down_proj_below_sm89_needs_k_multiple_of_4(width, gpu, expected):
    target = parse_target("vllm,quant=fp8_block")
    shape = ModelShape(4096, 32000, {0: LayerShape(**{**LAYER, "intermediate": width})})
    site = DimSite("model.layers.0:intermediate", Role.INTERMEDIATE, width, [], layer=0)
    sm = {"a100": 80, "h100": 90}[gpu]
    (down,) = [o for o in judge_uses(target, site_uses(site, shape, target), width, sm)
               if o.use == "down_proj" and o.selection == "vllm-fp8-block-shard"]
    assert down.verdict == ("refused" if expected == "refused" else "fast"), down
    if expected == "refused":
        assert down.why.startswith("RuntimeError: self.size(-1) must be divisible by 4")


def test_llm_compressor_1489_bf16_gptq_with_marlin_misaligned_input_is_refused():
    """in = 8256 (% 128 = 64), group 64, bf16, H100, v0.8.5: Machete takes only groups -1/128
    there, Marlin needs in % 128, ExLlama fp16 activations: no kernel."""
    v = verdict("hidden", 8256, "vllm@v0.8.5,quant=gptq,group=64", "h100", "bfloat16",
                hidden=8256)
    assert v.verdict == "refused" and "Failed to find a kernel" in v.why
    fp16 = verdict("hidden", 8256, "vllm@v0.8.5,quant=gptq,group=64", "h100", "float16",
                   hidden=8256)
    assert (fp16.verdict, fp16.kernel) == ("fallback", "exllama")


def test_vllm_7075_marlin_width_fine_at_tp1_fails_at_tp4():
    """A width that is fine on one GPU fails at TP=4 (the issue's point): 11264 / 4 = 2816,
    % 128 = 0, but 11008 / 4 = 2752, % 128 = 64."""
    assert verdict("intermediate", 11008, "vllm@v0.20.0,tp=1,quant=gptq", "a100").verdict == "fast"
    at4 = verdict("intermediate", 11008, "vllm@v0.20.0,tp=4,quant=gptq", "a100")
    assert at4.verdict == "refused" and at4.fix_to == 11264


@pytest.mark.parametrize("target, gpu, width, fix", [
    ("vllm,tp=4,quant=awq", "h100", 11000, 11264),  # shard_in % 128 (group, Marlin k)
    ("vllm,tp=2,quant=gptq", "h100", 8806, 8960),  # 4480 % 128 = 0; 2 x 8960 / 2 % 128 = 0
    ("vllm,quant=gptq", "h100", 8806, 8832),  # engine-cases gptq-8806: 8832
    ("vllm,tp=3", "h100", 11000, 11001),  # TP divisibility only
    ("vllm@v0.20.0,quant=fp8", "h100", 8806, 8816),
])
def test_fix_to_is_the_smallest_fast_width(target, gpu, width, fix):
    v = verdict("intermediate", width, target, gpu)
    assert v.fix_to == fix
    for smaller in range(width, fix):
        assert verdict("intermediate", smaller, target, gpu).verdict != "fast"
    assert verdict("intermediate", fix, target, gpu).verdict == "fast"


def test_lowrank_rank_is_out_of_one_gemm_and_in_of_the_other():
    """engine-cases lowrank-1843: AWQ packs out in eighths and groups in in 128s: 1920."""
    v = verdict("rank", 1843, "vllm,quant=awq", "h100")
    assert v.verdict == "refused" and v.fix_to == 1920


def test_per_layer_widths_are_refused_and_say_what_would_help():
    shape = ModelShape(4096, 32000, {0: LayerShape(32, 8, 128, 11008),
                                     1: LayerShape(32, 8, 128, 9000)})
    site = DimSite("model.layers.1.mlp:intermediate", Role.INTERMEDIATE, 9000, [], layer=1)
    v = judge(site, shape, parse_target("vllm"), "h100")
    assert v.verdict == "refused" and v.fix_to is None
    assert "re-run the compressor" in v.cannot_pad


def test_model_verdict_is_the_worst_with_counts():
    sites = [DimSite("a:intermediate", Role.INTERMEDIATE, 11000, [], layer=0),
             DimSite("b:intermediate", Role.INTERMEDIATE, 11008, [], layer=1)]
    out = judge_all(sites, (parse_target("vllm,tp=4,quant=awq"),), "h100")
    summary = out.summary()["vllm,tp=4,quant=awq"]
    assert summary["verdict"] == "refused" and summary["refused"] == 2  # and uniform-layers
    same = judge_all(sites[1:], (parse_target("vllm,tp=4"),), "h100").summary()
    assert {k: same["vllm,tp=4"][k] for k in ("verdict", "fast", "fallback", "refused")} == {
        "verdict": "fast", "fast": 1, "fallback": 0, "refused": 0}


# -------------------------------------------------------------------------------- specs
@pytest.mark.parametrize("spec, fields", [
    ("vllm", dict(engine="vllm", tp=1, quant="none", group=None)),
    ("vllm,tp=4,quant=awq", dict(tp=4, quant="awq", group=128)),
    ("VLLM@v0.8.5,quant=GPTQ,group=64", dict(version="v0.8.5", quant="gptq", group=64)),
    ("vllm,quant=gptq,group=-1", dict(group=-1)),
    ("vllm,kv=fp8", dict(kv="fp8")),
])
def test_target_spec_parses(spec, fields):
    t = parse_target(spec)
    assert t.spec == spec and t.version
    for key, value in fields.items():
        assert getattr(t, key) == value
    assert parse_target("vllm").version == packs()["vllm"].versions[-1]  # newest by default


@pytest.mark.parametrize("spec, says", [
    ("", "ENGINE"), ("nope", "known: "), ("vllm@v0.0.1", "known: v0.6.3.post1"),
    ("vllm,tp=0", "positive integer"), ("vllm,tp=-2", "positive integer"),
    ("vllm,tp=2.5", "positive integer"), ("vllm,tp=", "unknown option"),
    ("vllm,quant=q4", "known: none, awq"), ("vllm,zz=1", "known: tp=, quant="),
    ("vllm,tp=2,tp=4", "twice"), ("vllm,kv=int3", "known: auto"),
    ("vllm,group=0", "positive integer"),
])
def test_bad_target_spec_is_one_line_listing_what_is_known(spec, says):
    with pytest.raises(BadInput) as exc:
        parse_target(spec)
    assert says in str(exc.value) and "\n" not in str(exc.value)


# -------------------------------------------------------------------------------- packs
def test_every_shipped_rule_has_a_citation_and_a_version_range():
    for pack in packs().values():
        assert pack.versions
        for sel in pack.selections:
            for c in [*sel.candidates]:
                assert c.source.repo and c.source.file and c.source.function and c.source.ref
            assert sel.otherwise_source.ref


def test_a_rule_without_a_citation_does_not_load():
    raw = json.loads(json.dumps({
        "schema": "gac-check-pack/1", "engine": "x", "versions": ["1"],
        "selections": [{"id": "s", "component": "attention",
                        "candidates": [{"kernel": "k", "fast": True, "when": []}],
                        "otherwise": {"verdict": "refused", "source": {
                            "repo": "r", "file": "f", "function": "g", "ref": "1"}}}]}))
    with pytest.raises(PackError, match="source"):
        parse_pack(raw)
    raw["selections"][0]["candidates"][0]["source"] = {"repo": "r", "file": "f",
                                                       "function": "g", "ref": "1"}
    assert parse_pack(raw).selections[0].candidates[0].kernel == "k"
    del raw["selections"][0]["candidates"][0]["source"]["ref"]  # a source without a release
    with pytest.raises(PackError, match="source"):
        parse_pack(raw)
    raw["selections"][0]["candidates"][0]["source"]["ref"] = "1"
    raw["selections"][0]["candidates"][0]["when"] = [{"quantity": "nope", "max": 1}]
    with pytest.raises(PackError, match="unknown quantity"):
        parse_pack(raw)
    raw["selections"][0]["candidates"][0]["when"] = []
    raw["selections"][0]["candidates"][0]["versions"] = {"from": "2"}
    with pytest.raises(PackError, match="not in the pack's versions"):
        parse_pack(raw)


SOURCE = {"repo": "r", "file": "f", "function": "g", "ref": "1"}


def _pack_beyond_selections(cited: bool) -> dict:
    """A pack with a rule in every place outside the selections that needs a citation: the
    TP rules, SGLang's vocabulary widening, and llama.cpp's types, ftypes and extras."""
    src = {"source": dict(SOURCE)} if cited else {}
    return {"schema": "gac-check-pack/1", "engine": "x", "versions": ["1"], "selections": [],
            "tp": {"kv_heads": {"rule": "replicate", **src},
                   "vocab_padding": {"multiple": 64, "source": dict(SOURCE),
                                     "times_tp_when_indivisible": {"from": "1", **src}}},
            "types": {"Q4_0": {"block": 32, **src}},
            "ftypes": {"Q4_0": {"default": "Q4_0", **src}},
            "no_fallback": {"1": {"verdict": "refused", **src}}}


@pytest.mark.parametrize("where, says", [
    (("tp", "kv_heads"), "tp.kv_heads"),
    (("tp", "vocab_padding", "times_tp_when_indivisible"), "times_tp_when_indivisible"),
    (("types", "Q4_0"), "type Q4_0"), (("ftypes", "Q4_0"), "ftype Q4_0"),
    (("no_fallback", "1"), "no_fallback")])
def test_a_tp_or_gguf_rule_without_a_citation_does_not_load(where, says):
    """Each rule outside the selections is refused without its source, alone (the rest
    cited), naming where it is."""
    raw = _pack_beyond_selections(cited=True)
    assert parse_pack(raw).tp["kv_heads"]["rule"] == "replicate"
    node = raw
    for key in where:
        node = node[key]
    del node["source"]
    with pytest.raises(PackError, match="every rule needs a source") as exc:
        parse_pack(raw)
    assert says in str(exc.value)


def test_every_shipped_tp_rule_is_among_the_citations_the_source_check_resolves():
    """tests/test_targets_citations.py resolves what engine_sources.citations() walks: each
    shipped TP rule's source must be among them, so a TP rule is held to the engine's file."""
    from engine_sources import citations

    cited = {(c.repo, c.file, c.function, c.ref) for c in citations()}
    tp_rules = [(p.engine, key, rule["source"]) for p in packs().values()
                for key, rule in p.tp.items()]
    assert {e for e, _, _ in tp_rules} >= {"vllm", "sglang"}
    for engine, key, src in tp_rules:
        assert (src["repo"], src["file"], src["function"], src["ref"]) in cited, (engine, key)


# ---------------------------------------------------------------------------- llama.cpp
@pytest.mark.parametrize("target, role, value, expected, kernel, fix", [
    # ffn_down's row is the MLP width; Q4_K_M asks Q6_K for "more bits" layers (layer 0 of 8)
    ("llama.cpp,quant=Q4_K_M", "intermediate", 10944, "fallback", "Q8_0 (for Q6_K)", 11008),
    ("llama.cpp,quant=Q4_K_M", "intermediate", 11264, "fast", None, 11264),
    ("llama.cpp,quant=Q4_K_M", "intermediate", 8806, "fallback", "F16 (for Q6_K)", 8960),
    ("llama.cpp,quant=Q6_K", "intermediate", 8832, "fallback", "Q8_0 (for Q6_K)", 8960),
    ("llama.cpp,quant=Q8_0", "intermediate", 8832, "fast", None, 8832),
    ("llama.cpp,quant=Q8_0", "intermediate", 8806, "fallback", "F16 (for Q8_0)", 8832),
    ("llama.cpp@b4747,quant=Q8_0", "intermediate", 8806, "refused", None, 8832),
    ("llama.cpp,quant=Q3_K_S", "intermediate", 704, "fallback", "Q4_0 (for Q3_K)", 768),
    ("llama.cpp@b4747,quant=Q3_K_S", "intermediate", 704, "fallback", "IQ4_NL (for Q3_K)", 768),
    ("llama.cpp,quant=IQ4_XS", "intermediate", 704, "fallback", "Q5_1 (for Q5_K)", 768),
    ("llama.cpp,quant=IQ4_XS", "hidden", 704, "fallback", None, 768),  # IQ4_XS -> IQ4_NL
    ("llama.cpp,quant=Q5_K_S", "intermediate", 1856, "fallback", "Q5_1 (for Q5_K)", 2048),
    ("llama.cpp", "intermediate", 8806, "fast", None, 8806),  # F16: nothing to fall back from
    # the low-rank rank is the second factor's row
    ("llama.cpp,quant=Q4_K_S", "rank", 1843, "fallback", "F16 (for Q4_K)", 2048),
    # attn_output's row is heads x head_dim: 32 x 100 = 3200 = 12.5 x 256
    ("llama.cpp,quant=Q4_K_S", "head_dim", 100, "fallback", "Q5_0 (for Q4_K)", 104),
    # hidden: every q/k/v/gate/up row, token_embd and the output head (Q6_K, Q8_0 unaligned)
    ("llama.cpp,quant=Q4_K_M", "hidden", 4000, "fallback", None, 4096),
    ("llama.cpp,quant=IQ2_XS", "hidden", 4096, "refused", None, None),  # no imatrix
    # every low-bit tensor fell back, so no imatrix is needed; aligned, it would be refused
    ("llama.cpp,quant=IQ2_XS", "hidden", 4000, "fallback", None, None),
])
def test_llamacpp_gguf_types(target, role, value, expected, kernel, fix):
    layers = {i: LayerShape(**LAYER) for i in range(8)}
    shape = ModelShape(4096 if role != "hidden" else value, 32000, layers)
    inexact = "exactness is not what this test is about" if role in ("head_dim", "hidden") \
        else None
    site = DimSite(f"model.layers.0:{role}", Role(role), value, [],
                   layer=None if role == "hidden" else 0, inexact=inexact)
    if role == "intermediate":  # the same width in every layer (else: refused, below)
        for lay in layers.values():
            lay.intermediate = value
    v = judge(site, shape, parse_target(target), "cpu")
    assert v.verdict == expected, v.why
    if kernel:
        assert v.kernel == kernel
    if inexact is None:
        assert v.fix_to == fix
    else:
        assert v.fast_at == fix and v.fix_to is None


def test_llamacpp_has_no_tensor_parallelism():
    with pytest.raises(BadInput, match="no tensor parallelism"):
        parse_target("llama.cpp,tp=2,quant=Q4_K_M")
    assert parse_target("llamacpp,quant=q4_k_m").quant == "Q4_K_M"  # alias, any case


@pytest.mark.parametrize("role, value, target, gpu, expected", [
    # release boundaries read from consecutive wheels
    ("head_dim", 80, "vllm@v0.11.0", "a100", "fallback"),  # FA's list
    ("head_dim", 80, "vllm@v0.12.0", "a100", "fast"),  # FA's % 8 and <= 256
    ("head_dim", 512, "vllm@v0.21.0", "a100", "fallback"),  # FlashInfer 64/128/256
    ("head_dim", 512, "vllm@v0.22.0", "a100", "fast"),  # FlashInfer adds 512
    ("head_dim", 264, "vllm@v0.17.0", "h100", "fallback"),  # FA <= 256
    ("head_dim", 264, "vllm@v0.20.0", "h100", "fast"),  # FA4 on sm90: <= 512
    ("intermediate", 8806, "vllm@v0.20.0,quant=fp8", "h100", "fallback"),  # triton_scaled_mm
    ("intermediate", 8806, "vllm@v0.21.0,quant=fp8", "h100", "fallback"),  # CUTLASS pads
    ("intermediate", 29568, "vllm@v0.22.0,tp=4,quant=gptq,group=-1", "a100", "refused"),
    ("intermediate", 29568, "vllm@v0.23.0,tp=4,quant=gptq,group=-1", "a100", "fallback"),
    ("intermediate", 29568, "vllm@v0.24.0,tp=4,quant=gptq,group=-1", "a100", "fallback"),
])
def test_vllm_release_boundaries(role, value, target, gpu, expected):
    assert verdict(role, value, target, gpu).verdict == expected


def test_fallback_why_names_a_kernel_this_gpu_could_run():
    """On an A100 Machete (sm90 only) never runs, so a Marlin miss is the reason given."""
    v = verdict("intermediate", 29568, "vllm,tp=4,quant=gptq,group=-1", "a100")
    assert v.verdict == "fallback" and "sm" not in v.why and "shard_" in v.why


@pytest.mark.parametrize("widths, expected", [
    ((704, 704), "fast"),  # Q8_0: 704 % 32 == 0, one feed_forward_length
    ((704, 608), "refused"),  # both % 32: quantizes, but check_tensor_dims refuses the load
])
def test_llamacpp_refuses_per_layer_mlp_widths_at_load(widths, expected):
    layers = {i: LayerShape(**{**LAYER, "intermediate": w}) for i, w in enumerate(widths)}
    site = DimSite("model.layers.1.mlp:intermediate", Role.INTERMEDIATE, widths[1], [],
                   layer=1)
    v = judge(site, ModelShape(4096, 32000, layers), parse_target("llama.cpp,quant=Q8_0"), "cpu")
    assert v.verdict == expected, v.why
    if expected == "refused":
        assert "check_tensor_dims" in v.why and v.source.file == "src/llama-model-loader.cpp"
        assert v.fix_to is None and "same width in every layer" in v.cannot_pad


@pytest.mark.parametrize("target, vocab, tp, expected", [
    # v0.5.23 widens the padding to 64 x tp when the 64-padded vocabulary does not divide
    ("sglang", 32000, 3, "fast"),  # 32000 -> 32064 (= pad to 192): 10688 per rank
    ("sglang", 32000, 5, "fast"),
    ("sglang", 32000, 2, "fast"),
    ("sglang@v0.4.6.post5", 32000, 3, "refused"),  # 64 only: 32000 % 3
    ("sglang@v0.4.6.post5", 32001, 3, "fast"),  # 32064 % 3 == 0
    ("vllm", 32000, 3, "refused"),  # vLLM pads to 64 and asserts divisibility
])
def test_sglang_pads_the_vocabulary_by_64_times_tp(target, vocab, tp, expected):
    assert verdict("vocab", vocab, f"{target},tp={tp}", vocab=vocab).verdict == expected


@pytest.mark.parametrize("vocab, tp, multiple, widen, padded", [
    (32000, 3, 64, True, 32064), (32000, 3, 64, False, 32000), (32064, 3, 64, True, 32064),
    (32000, 2, 64, True, 32000), (151936, 7, 64, True, 152320),
])
def test_padded_vocab(vocab, tp, multiple, widen, padded):
    from gac_check.targets.shards import padded_vocab
    assert padded_vocab(vocab, tp, multiple, widen) == padded


def test_sglang_gptq_rule_cites_that_the_marlin_shape_check_is_discarded():
    v = verdict("intermediate", 11008, "sglang,tp=4,quant=gptq", "h100")
    assert v.verdict == "refused" and "discards" in v.why
    assert v.source.file.endswith("gptq_kernels.py")


# ------------------------------------------------------ SGLang, TensorRT-LLM, transformers
@pytest.mark.parametrize("target, role, value, gpu, expected, kernel", [
    # SGLang: fa3 on Hopper takes head_dim % 8 and <= 256; no automatic fallback
    ("sglang", "head_dim", 128, "h100", "fast", "fa3"),
    ("sglang", "head_dim", 112, "h100", "fast", "fa3"),
    ("sglang", "head_dim", 107, "h100", "refused", None),
    ("sglang", "head_dim", 128, "a100", "fast", "flashinfer"),
    ("sglang", "head_dim", 96, "a100", "refused", None),  # FlashInfer's list: 64/128/256
    ("sglang,tp=3", "heads", 32, "h100", "refused", None),
    ("sglang,tp=8", "heads", 32, "h100", "fast", None),
    # 11008 / 4 = 2752: not a multiple of Marlin's 128, nor of the 128 group (refused); with
    # group 64 the unoptimized AWQ GEMM kernel takes it
    ("sglang,tp=4,quant=awq", "intermediate", 11008, "h100", "refused", None),
    ("sglang,tp=4,quant=awq,group=64", "intermediate", 11008, "h100", "fallback",
     "AWQ GEMM (unoptimized)"),
    ("sglang,tp=4,quant=awq", "intermediate", 11264, "h100", "fast", "awq_marlin"),
    # TensorRT-LLM: precompiled XQA for 64/128/256, MMHA for its list, else refused
    ("tensorrt-llm", "head_dim", 128, "h100", "fast", "XQA (precompiled) + fused context FMHA"),
    ("tensorrt-llm", "head_dim", 80, "h100", "fallback", "MMHA + fused context FMHA"),
    ("tensorrt-llm", "head_dim", 107, "h100", "refused", None),
    ("tensorrt-llm,tp=3", "heads", 32, "h100", "refused", None),
    ("tensorrt-llm,quant=int4_awq", "intermediate", 11008, "h100", "fast",
     "CUTLASS fpA_intB (int4)"),
    ("tensorrt-llm,tp=4,quant=int4_awq", "intermediate", 11000, "h100", "refused", None),
    # transformers: SDPA's flash backend to 256, then mem-efficient (% 8), then math
    ("transformers", "head_dim", 128, "a100", "fast", "SDPA flash"),
    ("transformers", "head_dim", 264, "a100", "fast", "SDPA mem-efficient"),
    ("transformers", "head_dim", 260, "a100", "fallback", "SDPA math"),
])
def test_other_engines(target, role, value, gpu, expected, kernel):
    v = verdict(role, value, target, gpu)
    assert v.verdict == expected, v.why
    if kernel is not None:
        assert (v.kernels[0] if expected == "fast" else v.kernel) == kernel


def test_transformers_refuses_per_layer_widths():
    shape = ModelShape(4096, 32000, {0: LayerShape(32, 8, 128, 11008),
                                     1: LayerShape(32, 8, 128, 9000)})
    site = DimSite("model.layers.1.mlp:intermediate", Role.INTERMEDIATE, 9000, [], layer=1)
    v = judge(site, shape, parse_target("transformers"), "a100")
    assert v.verdict == "refused" and "re-run the compressor" in v.cannot_pad
