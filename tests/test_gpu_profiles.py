"""GPU profiles for every capability teams deploy on (issue 39 item 2): each named GPU and each
capability resolves, ``--gpu auto`` finds a device's profile by its name or else its compute
capability, the published contract rules follow the capability (and say where nothing is
published), and the engines' GPU-dependent rules read the profile's capability."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gac_check.bench.device import measuring
from gac_check.contract.rules import gpu_rules
from gac_check.errors import BadInput, HardwareMissing
from gac_check.profiles import (
    BY_SM,
    GPU_PROFILES,
    PROFILES,
    capability,
    profile_name,
    profile_of_device,
    resolve_profile,
)
from gac_check.sites import DimSite, Role
from gac_check.targets.shards import LayerShape, ModelShape
from gac_check.targets.spec import parse_target
from gac_check.targets.verdicts import FALLBACK, FAST, judge
from tests import helpers
from tests.target_models import sparse_llama

#: each GPU as the driver and torch name it, with the capability NVIDIA's CUDA GPUs page
#: gives it (developer.nvidia.com/cuda-gpus)
DEVICES = {
    "NVIDIA A100-SXM4-80GB": ("a100", 80), "NVIDIA A10": ("a10", 86),
    "NVIDIA A10G": ("a10", 86), "NVIDIA GeForce RTX 3090": ("rtx3090", 86),
    "NVIDIA L4": ("l4", 89), "NVIDIA L40S": ("l40s", 89),
    "NVIDIA GeForce RTX 4090": ("rtx4090", 89), "NVIDIA H100 80GB HBM3": ("h100", 90),
    "NVIDIA H200": ("h200", 90), "NVIDIA B200": ("b200", 100),
    "NVIDIA GeForce RTX 5090": ("rtx5090", 120),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": ("rtx-pro-6000", 120),
}


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_auto_finds_each_named_gpu_by_its_name(name):
    key, sm = DEVICES[name]
    assert profile_of_device(name, sm) == key
    assert profile_of_device(name) == key  # the driver's file: a name, no capability
    assert capability(key) == sm
    assert resolve_profile(key) == key == profile_name(key.upper())


@pytest.mark.parametrize("sm", sorted(BY_SM))
def test_auto_maps_an_unnamed_gpu_by_its_capability(sm):
    """An RTX A6000 (sm86), an L40 (sm89) or a GPU yet to be named gets its capability's
    profile, never sm80's; an unknown capability is None (then the generic ``gpu``)."""
    assert profile_of_device("NVIDIA Some Future GPU", sm) == f"sm{sm}"
    assert capability(f"sm{sm}") == sm
    assert resolve_profile(f"sm{sm}") == f"sm{sm}"
    assert profile_of_device("NVIDIA Some Future GPU", 103) is None
    assert profile_of_device("NVIDIA Some Future GPU") is None


def test_every_gpu_profile_has_a_capability_and_unknown_ones_are_refused():
    assert {p: capability(p) for p in PROFILES if capability(p) is None} == {"cpu": None}
    assert set(GPU_PROFILES) == {key for key, _ in DEVICES.values()}
    with pytest.raises(BadInput, match="unknown hardware profile"):
        resolve_profile("b300")


def test_a_capability_profile_measures_only_on_a_gpu_of_that_capability():
    """``--gpu sm89`` asks for a GPU of capability 8.9: on this CPU machine, refused."""
    with pytest.raises(HardwareMissing, match="SM89"):
        measuring("sm89")


def _rule(profile: str, rule_id: str, dtype: str = "bfloat16"):
    return next((r for r in gpu_rules(dtype, profile) if r.id == rule_id), None)


def test_the_contract_rules_follow_the_capability_and_say_where_nothing_is_published():
    """FlashAttention-2's buckets on Ampere and Ada (its README's GPUs), FA3's on Hopper, none
    on Blackwell (neither README lists it); TMA's 16-byte rule from sm90 on; a K-sweep figure
    only for the GPUs whose sweep is published."""
    for profile in ("a100", "a10", "rtx3090", "l4", "l40s", "rtx4090", "sm86", "sm89"):
        assert _rule(profile, "attn-head-dim-bucket").allowed == (32, 64, 96, 128, 192, 256)
        assert "TMA" not in _rule(profile, "gemm-align-16B").why
    for profile in ("h100", "h200", "sm90"):
        assert _rule(profile, "attn-head-dim-bucket").allowed == (64, 96, 128, 192, 256)
    for profile in ("b200", "rtx5090", "rtx-pro-6000", "sm100", "sm120"):
        assert _rule(profile, "attn-head-dim-bucket") is None
    for profile in ("h100", "b200", "rtx5090"):
        assert "TMA" in _rule(profile, "gemm-align-16B").why
    assert "published A100" in _rule("a100", "gemm-optimal-32B").why
    for profile in ("l4", "b200", "rtx3090", "sm89"):
        why = _rule(profile, "gemm-optimal-32B").why
        assert "no K sweep is published" in why and "A100" not in why


def _verdict(spec: str, role: Role, value: int, profile: str, **layer):
    shape = ModelShape(4096, 32000, {0: LayerShape(32, 8, layer.get("head_dim", 128),
                                                   layer.get("intermediate", 14336))})
    site = DimSite(f"s:{role.value}", role, value, [], layer=0)
    return judge(site, shape, parse_target(spec), profile)


def test_fp8_linears_run_cutlass_fp8_from_sm89_and_marlin_weight_only_below():
    """vLLM v0.33.0: CUTLASS FP8 from sm89 (cutlass_scaled_mm_supports_fp8), Marlin/Humming
    weight-only below (Ampere has no FP8 Tensor Cores): an L4 is not judged as an A100."""
    for profile, verdict, kernel in (("a100", FALLBACK, "weight-only"),
                                     ("a10", FALLBACK, "weight-only"),
                                     ("l4", FAST, "cutlass_scaled_mm"),
                                     ("rtx4090", FAST, "cutlass_scaled_mm"),
                                     ("b200", FAST, "cutlass_scaled_mm")):
        tv = _verdict("vllm,quant=fp8", Role.INTERMEDIATE, 14336, profile)
        assert tv.verdict == verdict and kernel in (tv.kernel or ""), (profile, tv.kernel)


def test_attention_backends_follow_the_capability_on_vllm_and_sglang():
    """vLLM v0.33.0 puts FlashInfer first on sm10x (_get_backend_priorities), FlashAttention
    elsewhere; SGLang v0.5.23 picks fa3 on Hopper, trtllm_mha on sm10x, FlashInfer otherwise
    (get_default_attn_backend; tests/test_targets_sglang_oracle.py runs SGLang's own)."""
    want = {"a100": ("FLASH_ATTN", "flashinfer"), "l4": ("FLASH_ATTN", "flashinfer"),
            "h100": ("FLASH_ATTN", "fa3"), "b200": ("FLASHINFER", "trtllm_mha"),
            "rtx5090": ("FLASH_ATTN", "flashinfer"), "sm86": ("FLASH_ATTN", "flashinfer")}
    for profile, (vllm, sglang) in want.items():
        got = tuple(_verdict(engine, Role.HEAD_DIM, 128, profile, head_dim=128).kernel
                    for engine in ("vllm", "sglang"))
        assert got == (vllm, sglang), profile
    # a head size FlashInfer has no kernel for: FlashAttention on B200 as on Hopper
    assert _verdict("vllm", Role.HEAD_DIM, 96, "b200", head_dim=96).kernel == "FLASH_ATTN"


def test_the_cli_judges_a_named_gpu_by_its_own_rules(tmp_path: Path):
    """``gac-check MODEL --gpu l4 --target vllm,quant=fp8``: the L4's rules in the JSON."""
    model = sparse_llama(tmp_path / "m", hidden=512, intermediate=1376, heads=8, kv_heads=8,
                         layers=1)
    out = {}
    for gpu in ("a100", "l4"):
        run = helpers.gac_process(model, "--gpu", gpu, "--target", "vllm,quant=fp8",
                                  "--format", "json")
        assert run.returncode in (0, 1), run.stderr[-2000:]
        doc = json.loads(run.stdout)
        out[gpu] = {t["kernel"] for s in doc["sites"] for t in s.get("targets", [])
                    if s["role"] == "intermediate"}
    assert any("cutlass_scaled_mm" in (k or "") for k in out["l4"]), out
    assert not any("cutlass_scaled_mm" in (k or "") for k in out["a100"]), out


def test_a_gpu_with_nothing_published_borrows_no_other_gpus_figure():
    """The L4's expected slowdown for a misaligned GEMM width is "not measured", saying that
    nothing is published for it, where the A100 quotes its own published sweep."""
    from gac_check.contract.evidence import evidence_for

    for profile, borrowed in (("l4", False), ("b200", False), ("a100", True)):
        fig = evidence_for(profile).figure(Role.INTERMEDIATE, 4001, 4008, "float16",
                                           lambda u: -(-u // 8) * 8)
        assert ("nothing is published for this GPU" in (fig.note or "")) is not borrowed, fig
        assert (fig.hardware is not None) is borrowed, (profile, fig)
