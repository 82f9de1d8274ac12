"""``--repair OUT --target T``: pad every site to the smallest size that is fast on every
target, exactly as the plain repair pads, and say what padding cannot fix.

The property test draws widths, TP sizes, quantizations, versions and GPUs, plans the repair
the CLI would carry out, writes a checkpoint of the planned widths and re-checks it: no
fallback or refused verdict that padding could fix may remain, and no site may be padded past
the smallest size a brute-force search over sizes finds fast on every target.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gac_check.analysis import check
from gac_check.contract.rules import ERROR
from gac_check.contract.select import for_hardware
from gac_check.sites import Role
from gac_check.targets.packs import packs
from gac_check.targets.verdicts import FAST, SM_OF_PROFILE, judge_uses, site_uses, worst
from tests import helpers
from tests.target_models import sparse_llama

VLLM = packs()["vllm"]


@st.composite
def target_specs(draw) -> str:
    version = draw(st.sampled_from(VLLM.versions))
    quant = draw(st.sampled_from(VLLM.quants))
    tp = draw(st.sampled_from((1, 2, 3, 4, 8)))
    group = draw(st.sampled_from(("", ",group=64", ",group=-1"))) if quant in ("awq",
                                                                             "gptq") else ""
    return f"vllm@{version},tp={tp},quant={quant}{group}"


def brute_force(result, site, value_from: int, span: int = 4096) -> int | None:
    """The smallest size >= the site's that clears the GPU contract's error rules and is fast
    on every target, by trying every size: no use of the planner's own search."""
    contract = for_hardware(result.contract.profile, result.contract.dtype)
    shape = result.contract.targets.shape
    sm = SM_OF_PROFILE[result.contract.profile]
    uses = [(t, site_uses(site, shape, t)) for t in result.targets]
    for v in range(value_from, value_from + span):
        if any(r.severity == ERROR and r.violated_by(v) for r in contract.rules_for(site)):
            continue
        if all(worst(judge_uses(t, u, v, sm)) == FAST for t, u in uses):
            return v
    return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(width=st.integers(64, 30000), targets=st.lists(target_specs(), min_size=1, max_size=3,
                                                      unique=True),
       gpu=st.sampled_from(("a100", "h100")), dtype=st.sampled_from(("bfloat16", "float16")))
def test_repair_to_targets_is_fast_on_recheck_and_minimal(width, targets, gpu, dtype):
    with tempfile.TemporaryDirectory() as tmp:
        model = sparse_llama(Path(tmp) / "m", hidden=4096, intermediate=width, heads=32,
                             kv_heads=8, head_dim=128, layers=1, vocab=32000, dtype=dtype)
        result = check(model, gpu, None, targets)
        site = next(s for s in result.sites if s.role is Role.INTERMEDIATE)
        planned = {r.site.name: r.target for r in result.repair_plan.repairs}
        best = brute_force(result, site, width)
        got = planned.get(site.name, width)
        if best is None:  # no size in reach is fast on all targets: nothing is promised
            return
        assert got == best, (targets, width, got, best)
        # the re-check of a model with the planned width: every target fast at this site
        fixed = sparse_llama(Path(tmp) / "fixed", hidden=4096, intermediate=got, heads=32,
                             kv_heads=8, head_dim=128, layers=1, vocab=32000, dtype=dtype)
        again = check(fixed, gpu, None, targets)
        site2 = next(s for s in again.sites if s.role is Role.INTERMEDIATE)
        assert [v.verdict for v in again.contract.targets.of(site2)] == ["fast"] * len(targets)


@pytest.mark.parametrize("width, spec, fix", [
    (176, "vllm,tp=2,quant=awq", 256), (176, "vllm,tp=3", 180), (170, "vllm,quant=int8", 176),
])
def test_cli_repair_pads_to_the_target_size_and_the_recheck_is_fast(tmp_path, width, spec, fix):
    # a vocabulary of 192 loads at tp=3 (vLLM pads it to a multiple of 64, then divides it;
    # 96 would be refused there, and so would the repair)
    model = helpers.tiny_llama(intermediate_size=width, num_attention_heads=6, hidden_size=96,
                               num_key_value_heads=6, vocab_size=192)
    src = tmp_path / "src"
    model.save_pretrained(src)
    out = tmp_path / "out"
    proc = helpers.gac(src, "--gpu", "h100", "--target", spec, "--repair", out, "--format",
                       "json")
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == fix
    again = helpers.gac(out, "--gpu", "h100", "--target", spec, "--format", "json")
    doc = json.loads(again.stdout)
    mlp = [v for s in doc["sites"] if s["role"] == "intermediate" for v in s["targets"]]
    assert mlp and all(v["verdict"] == "fast" for v in mlp)


def test_repair_refuses_what_the_target_would_still_refuse(tmp_path):
    """Heads that do not divide by TP cannot be padded exactly, so vLLM at tp=4 would refuse
    OUT: the repair refuses before writing anything, saying why and which TP sizes load."""
    model = helpers.tiny_llama(intermediate_size=176, num_attention_heads=6, hidden_size=96,
                               num_key_value_heads=6)
    src = tmp_path / "src"
    model.save_pretrained(src)
    before = helpers.tree_digest(src)
    proc = helpers.gac(src, "--gpu", "h100", "--target", "vllm,tp=4", "--repair",
                       tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert "vllm,tp=4 would still refuse OUT" in proc.stderr and "heads" in proc.stderr
    assert "loads at tp=1/2" in proc.stderr and "Nothing was written" in proc.stderr
    assert not (tmp_path / "out").exists() and helpers.tree_digest(src) == before
