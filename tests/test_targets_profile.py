"""Targets are judged on the resolved hardware profile, never on ``--gpu auto`` itself: on a
machine without a GPU, auto is the generic GPU contract (judged as its oldest GPU, sm80), and
a verdict that asked for "auto" would find no SM and judge every SM-gated kernel wrongly."""
from __future__ import annotations

from pathlib import Path

import pytest

import gac_check
from gac_check.profiles import resolve_profile
from tests.target_models import sparse_llama

TARGETS = ["vllm,tp=2,quant=awq", "vllm,quant=gptq", "tensorrt-llm,tp=2"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return sparse_llama(tmp_path_factory.mktemp("auto") / "m", hidden=4096, intermediate=11000,
                        heads=32, kv_heads=8, layers=2)


def verdicts(result) -> dict:
    return {name: [(v.target.spec, v.verdict, v.kernel) for v in vs]
            for name, vs in result.contract.targets.by_site.items()}


def test_auto_is_judged_as_the_profile_it_resolves_to(model) -> None:
    resolved = resolve_profile("auto")
    auto = gac_check.check(model, "auto", target=TARGETS)
    assert auto.contract.targets.profile == resolved != "auto"
    assert verdicts(auto) == verdicts(gac_check.check(model, resolved, target=TARGETS))
