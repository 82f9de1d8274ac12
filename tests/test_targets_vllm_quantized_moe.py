"""vLLM v0.33.0's load rules for quantized fused-MoE layers (issue 39 item 1): what each
route's own ``create_weights`` refuses, and the block-FP8 refinement vLLM's own ``fp8`` does.
The slow-tier oracle (tests/test_targets_vllm_oracle.py) holds these against vLLM's code; here
the boundaries, fast."""
from __future__ import annotations

import pytest

from gac_check.sites import DimSite, Role
from gac_check.targets.selection import REFUSED, judge_uses, site_uses, worst
from gac_check.targets.shards import LayerShape, ModelShape
from gac_check.targets.spec import parse_target


def expert(width: int, spec: str, sm: int, hidden: int = 4096) -> tuple[str, str | None, str]:
    """The expert-width site's verdict, kernel and first refusal's reason at capability sm."""
    target = parse_target(spec)
    shape = ModelShape(hidden, 32000, {0: LayerShape(32, 8, 128, None, moe=True)})
    site = DimSite("experts:expert", Role.EXPERT, width, [], layer=0)
    outs = judge_uses(target, site_uses(site, shape, target), width, sm)
    kernel = next((o.kernel for o in outs if not o.gate and o.kernel), None)
    why = next((o.why for o in outs if o.verdict == REFUSED), "")
    return worst(outs), kernel, why


@pytest.mark.parametrize("sm", [80, 89, 90])
def test_vllms_own_block_fp8_moe_refines_its_scales_and_loads_on_triton(sm):
    """Qwen3-30B-A3B-FP8: 768 at tp=4 is 192 per rank, which 128 does not divide;
    refine_fp8_moe_block_shape takes gcd(128, 192, 2048) = 64 blocks, which only Triton-based
    experts consume (sm89-90); compressed-tensors' block FP8 does not refine."""
    verdict, kernel, why = expert(768, "vllm,tp=4,quant=fp8_block", sm, hidden=2048)
    if sm >= 89:
        assert verdict != REFUSED, why
        assert kernel.startswith("TritonExperts")
    else:  # Marlin below sm89 takes only whole 128 blocks
        assert verdict == REFUSED and "block_n = 128" in why
    ct, _, why = expert(768, "vllm,tp=4,quant=ct_fp8_block", sm, hidden=2048)
    assert ct == REFUSED and "does not refine" in why
    # gcd(128, 192, 2880) = 64 as well; 2880 + 16: gcd 16 < 32, not refined
    assert expert(768, "vllm,tp=4,quant=fp8_block", 90, hidden=2896)[0] == REFUSED


@pytest.mark.parametrize("sm", [80, 90])
def test_awq_moe_without_a_group_is_refused(sm):
    verdict, _, why = expert(1408, "vllm,quant=awq,group=-1", sm)
    assert verdict == REFUSED and "AutoAWQMoEMethod.create_weights" in why
    assert expert(1408, "vllm,quant=awq,group=128", sm)[0] != REFUSED


def test_compressed_tensors_per_channel_w4a16_moe_is_refused_off_marlin():
    """CompressedTensorsWNA16MoEMethod.__init__ asserts a group scheme where the backend is not
    Marlin: sm90 (Humming first), or any GPU where hidden % 128 keeps Marlin out."""
    verdict, _, why = expert(1408, "vllm,quant=wna16,group=-1", 90)
    assert verdict == REFUSED and "strategy == 'group'" in why
    assert expert(1408, "vllm,quant=wna16,group=-1", 80)[0] != REFUSED
    assert expert(1408, "vllm,quant=wna16,group=-1", 80, hidden=2880)[0] == REFUSED
    # group scales: the width per rank and the hidden size must be whole groups
    assert expert(1408, "vllm,tp=2,quant=wna16,group=128", 90)[0] == REFUSED  # 704 per rank
    assert expert(1536, "vllm,tp=2,quant=wna16,group=128", 90)[0] != REFUSED


def test_gptq_moe_off_marlin_without_a_group_is_refused():
    """hidden % 128 keeps the Marlin MoE route out (check_moe_marlin_supports_config), and
    MoeWNA16Method.create_weights cannot size group -1's scales."""
    assert expert(1408, "vllm,quant=gptq,group=-1", 80)[0] != REFUSED
    verdict, _, why = expert(1408, "vllm,quant=gptq,group=-1", 80, hidden=2880)
    assert verdict == REFUSED and "negative" in why


@pytest.mark.parametrize("quant", ["gptq_act_order", "wna16_act_order"])
def test_moe_with_group_activation_ordering_is_refused(quant):
    verdict, _, why = expert(1408, f"vllm,quant={quant}", 90)
    assert verdict == REFUSED and "no longer supported" in why
