"""Contract edges, pinned on public behaviour that outlives reworded reasons and re-read figures:
rule ids, moduli, limits, which sites are flagged, and where a quoted figure comes from.

* head_dim exactly at FlashAttention's limit (256) is fine on every GPU profile and dtype;
  one more is an error of ``attn-head-dim-max``.
* The H200 is a Hopper part: its own rules are the H100's (FlashAttention-3 buckets, so a
  head_dim of 32 is off-bucket there though it is a bucket on an A100).
* A measured sweep replaces the published rules of the roles it covers, but never a hard limit:
  an SDPA sweep still leaves head_dim <= 256 in force.
* The generic ``gpu`` profile (what ``--gpu auto`` gives without a GPU) quotes the A100's
  published figures and says so on every figure: never as measured, never unattributed; a named
  GPU quotes its own tables, never the A100's.

Each test was run against a mutant of the contract code and went red
(benchmarks/hand_mutants.py, group "contract").
"""
from __future__ import annotations

import json

import pytest

from gac_check.bench import baselines, workloads
from gac_check.bench.baselines import Baseline, Fingerprint, Measurement, Provenance
from gac_check.contract.select import for_hardware
from gac_check.sites import DimSite, Role
from gac_check.testing.strategies import TinyModel
from tests.helpers import gac

GPUS = ("a100", "h100", "h200", "gpu")
DTYPES = ("float16", "bfloat16", "float32", "float8_e4m3fn")
H100 = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", torch="2.13.0", cuda="12.8")
MEASURED = Provenance("measured", "2026-11-21T00:00:00Z", "test")


def site(role: Role, value: int) -> DimSite:
    return DimSite(f"x:{role.value}", role, value, [])


def flagged(profile: str, dtype: str, role: Role, value: int) -> set[str]:
    return {r.id for r in for_hardware(profile, dtype).violations(site(role, value))}


@pytest.fixture(autouse=True)
def no_measured_baselines(tmp_path, monkeypatch):
    """Published rules only, unless a test writes a sweep: the checkout's baselines/ (and any
    machine's own) must not decide what these tests see."""
    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path))


# ------------------------------------------------------------------ head_dim at the limit
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("profile", GPUS)
def test_head_dim_256_is_within_the_limit_and_257_is_not(profile, dtype):
    assert "attn-head-dim-max" not in flagged(profile, dtype, Role.HEAD_DIM, 256)
    assert "attn-head-dim-max" in flagged(profile, dtype, Role.HEAD_DIM, 257)
    assert "attn-head-dim-max" in flagged(profile, dtype, Role.HEAD_DIM, 264)  # aligned, over


@pytest.mark.parametrize("profile", GPUS)
def test_head_dim_256_in_half_precision_breaks_no_rule(profile):
    assert for_hardware(profile, "float16").check([site(Role.HEAD_DIM, 256)]) == []


def test_the_limit_is_a_hard_error_with_nothing_to_pad_to():
    (finding,) = for_hardware("h100", "float16").check([site(Role.HEAD_DIM, 264)])
    assert finding.severity == "error"
    assert [r.max_value for r in finding.rules if r.id == "attn-head-dim-max"] == [256]


# ---------------------------------------------------------------------------- the H200
def rule_table(profile: str, dtype: str) -> list[tuple]:
    return sorted((r.id, r.severity, tuple(sorted(x.value for x in r.roles)), r.modulus,
                   r.allowed, r.max_value) for r in for_hardware(profile, dtype).rules)


@pytest.mark.parametrize("dtype", DTYPES)
def test_h200_has_the_h100s_rules(dtype):
    assert rule_table("h200", dtype) == rule_table("h100", dtype)


@pytest.mark.parametrize(("value", "h200", "a100"), [
    (32, {"attn-head-dim-bucket"}, set()),  # an FA2 bucket, not an FA3 one
    (64, set(), set()),
    (160, {"attn-head-dim-bucket"}, {"attn-head-dim-bucket"}),
])
def test_h200_head_dim_buckets_are_flashattention_3s(value, h200, a100):
    assert flagged("h200", "bfloat16", Role.HEAD_DIM, value) == h200
    assert flagged("a100", "bfloat16", Role.HEAD_DIM, value) == a100
    if h200:
        (finding,) = for_hardware("h200", "bfloat16").check([site(Role.HEAD_DIM, value)])
        assert finding.optimal_to == {32: 64, 160: 192}[value]


# ------------------------------------------------------------ a measured sweep's limits
def sdpa_staircase(path) -> None:
    """A measured fp16 SDPA head_dim sweep on this "H100": sizes off a multiple of 8 run 1.5x."""
    cases = {}
    for d in range(96, 168):
        t = d * 1e-5 * (1.5 if d % 8 else 1.0)
        samples = [t * (1 + 0.01 * ((i % 3) - 1)) for i in range(9)]
        key = workloads.sdpa(4, 2048, 32, d, "float16").key
        cases[key] = Measurement.from_samples(key, samples, MEASURED)
    baselines.save(Baseline("h100", H100, cases), path)


def test_a_measured_sdpa_sweep_keeps_the_head_dim_limit(tmp_path):
    sdpa_staircase(tmp_path / "h100.json")
    contract = for_hardware("h100", "float16")
    assert contract.source == "measured"
    head_rules = {r.id: r for r in contract.rules if Role.HEAD_DIM in r.roles}
    measured = [r for r in head_rules.values() if r.source == "measured"]
    assert [r.modulus for r in measured] == [8]
    assert head_rules["attn-head-dim-max"].max_value == 256
    assert "attn-head-dim-max" in flagged("h100", "float16", Role.HEAD_DIM, 264)
    assert "attn-head-dim-max" not in flagged("h100", "float16", Role.HEAD_DIM, 256)
    assert flagged("h100", "float16", Role.HEAD_DIM, 107) == {measured[0].id}
    # the sweep covers no GEMM: ranks keep their published rules
    assert flagged("h100", "float16", Role.RANK, 1001) == {"gemm-align-16B", "gemm-optimal-32B"}


# ------------------------------------------------------- whose figures a profile quotes
@pytest.fixture(scope="module")
def misaligned_model(tmp_path_factory):
    """head_dim 106 and intermediate 4001: both inside the published sweeps' ranges."""
    path = tmp_path_factory.mktemp("edge") / "m"
    model = TinyModel("llama", dict(vocab_size=64, hidden_size=64, intermediate_size=4001,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=106,
                                    max_position_embeddings=32)).build(0)
    model.save_pretrained(path)
    return path


def figures(model, gpu: str, tmp_path) -> tuple[str, list[dict]]:
    run = gac(model, "--gpu", gpu, "--dtype", "float16", "--format", "json", timeout=300,
              env={"GAC_BASELINES_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""})
    doc = json.loads(run.stdout)
    quoted = [s["slowdown"] for s in doc["sites"] if s["slowdown"] and s["slowdown"]["value"]]
    return doc["hardware"]["profile"], quoted


def test_gpu_auto_without_a_gpu_quotes_the_a100_as_published_and_says_so(misaligned_model,
                                                                          tmp_path):
    profile, quoted = figures(misaligned_model, "auto", tmp_path)
    assert profile == "gpu"
    assert len(quoted) == 2
    for fig in quoted:
        assert fig["source"] == "published" and "A100" in fig["hardware"]
        assert "A100" in fig["note"] and fig["citation"]


@pytest.mark.parametrize(("gpu", "from_note"), [("h100", False), ("h200", True)])
def test_a_named_gpu_never_quotes_the_a100(misaligned_model, tmp_path, gpu, from_note):
    profile, quoted = figures(misaligned_model, gpu, tmp_path)
    assert profile == gpu and len(quoted) == 2
    for fig in quoted:
        assert fig["source"] == "published" and "H100" in fig["hardware"]
        assert ("H100" in fig["note"]) == from_note  # the H200 says whose figures it quotes
