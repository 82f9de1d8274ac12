"""The install path outside the checkout: build the wheel, install it into a fresh virtualenv
(torch pinned first, as on any CPU machine), and use the CLI and the pytest plugin from a
project directory that knows nothing of this repository.

Slow (a virtualenv with torch is about a minute): ``make test-slow`` and CI run it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
TORCH_PIN = os.environ.get("GAC_TORCH_PIN", f"torch=={torch.__version__.split('+')[0]}")

pytestmark = pytest.mark.slow

GATE_TEST = '''
from gac_check.analysis import check


def test_gate(gac_models, gac_profile):
    (model,) = gac_models
    errors = [f.site.name for f in check(model, gac_profile).findings if f.severity == "error"]
    assert errors == ["model.layers.0.mlp:intermediate"]
'''


def run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PYTHONPATH", "VIRTUAL_ENV"))}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the built wheel installed; returns its bin/ directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    built = run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                tmp / "dist", ROOT, cwd=tmp)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("gac_check-*.whl")
    venv.create(tmp / "env", with_pip=True)
    pip = tmp / "env" / "bin" / "pip"
    for args in ([TORCH_PIN], [str(wheel)]):
        res = run(pip, "install", "-q", *args, cwd=tmp)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return tmp / "env" / "bin"


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
