"""The install path outside the checkout: build the wheel, install it into a fresh virtualenv
(torch pinned first, as on any CPU machine), and use the CLI and the pytest plugin from a
project directory that knows nothing of this repository.

Slow (a virtualenv with torch is about a minute): ``make test-slow`` and CI run it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import tiny_llama
from tests.wheel import TORCH_PIN, build_wheel, fresh_venv, run

pytestmark = pytest.mark.slow

GATE_TEST = '''
from gac_check.analysis import check


def test_gate(gac_models, gac_profile):
    (model,) = gac_models
    errors = [f.site.name for f in check(model, gac_profile).findings if f.severity == "error"]
    assert errors == ["model.layers.0.mlp:intermediate"]
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the built wheel installed; returns its bin/ directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp / "dist")
    bin_dir = fresh_venv(tmp / "env")
    for args in ([TORCH_PIN], [str(wheel)]):
        res = run(bin_dir / "pip", "install", "-q", *args, cwd=tmp)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return bin_dir


def misaligned_llama(path: Path) -> None:
    """A one-layer Llama with MLP width 1843 (a pruner's output), random weights."""
    tiny_llama(vocab_size=128, intermediate_size=1843, num_hidden_layers=1).save_pretrained(path)


def test_the_wheel_installs_and_its_cli_and_plugin_work_outside_the_checkout(installed,
                                                                            tmp_path):
    where = run(installed / "python", "-c", "import gac_check; print(gac_check.__file__)",
                cwd=tmp_path)
    assert str(installed.parent) in where.stdout, where.stdout + where.stderr
    misaligned_llama(tmp_path / "model")

    check = run(installed / "gac-check", "model", "--gpu", "a100", "--format", "json",
                cwd=tmp_path)
    assert check.returncode == 1, check.stderr  # an error-level finding: the gate fails
    doc = json.loads(check.stdout)
    assert doc["summary"]["misaligned"] >= 1 and doc["hardware"]["profile"] == "a100"

    targets = run(installed / "gac-check", "model", "--gpu", "a100", "--format", "json",
                  "--target", "vllm,quant=awq", "--target", "llama.cpp,quant=Q4_K_M",
                  cwd=tmp_path)  # the rule packs ship in the wheel as package data
    assert set(json.loads(targets.stdout)["summary"]["targets"]) == {
        "vllm,quant=awq", "llama.cpp,quant=Q4_K_M"}, targets.stderr

    report = run(installed / "gac-check", "model", "--gpu", "a100", "--report", "r.html",
                 "--fail-on", "never", cwd=tmp_path)  # the jinja2 template ships in the wheel
    assert report.returncode == 0 and "<html" in (tmp_path / "r.html").read_text()[:200]

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_gate.py").write_text(GATE_TEST)
    plugin = run(installed / "python", "-m", "pytest", "-p", "no:cacheprovider", "-q",
                 "--gpu", "h100", "--model", "model", "tests", cwd=tmp_path)
    assert plugin.returncode == 0, plugin.stdout[-3000:] + plugin.stderr[-2000:]
    assert "1 passed" in plugin.stdout
