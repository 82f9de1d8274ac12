"""The GPU machine simulated: a fresh virtualenv with only that machine's package set, no
network, the project on PYTHONPATH (not installed: the device tool copies the working tree),
and ``gac-check evidence --smoke`` run in it. What the evidence run would miss there is found
here. torch 2.13.0 (CPU) stands in for the GPU machine's 2.11 (CUDA 13), and this machine's
Python (3.11) for its 3.12.

Slow (creating the virtualenv installs torch and transformers: minutes): ``make test-slow``.
"""
from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
#: The GPU machine's packages as issue 29 lists them (each with its own requirements, as
#: that image has them); nothing of gac-check's own requirements beyond these.
GPU_MACHINE = (f"torch=={torch.__version__.split('+')[0]}", "transformers", "safetensors",
               "jinja2", "hypothesis", "pytest", "pytest-xdist", "scipy", "huggingface_hub")
#: Every way a library could reach the network, pointed at a closed port on this machine.
NOWHERE = "http://127.0.0.1:9"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HTTP_PROXY": NOWHERE, "HTTPS_PROXY": NOWHERE, "ALL_PROXY": NOWHERE,
           "http_proxy": NOWHERE, "https_proxy": NOWHERE, "all_proxy": NOWHERE,
           "NO_PROXY": "", "no_proxy": "", "PIP_NO_INDEX": "1"}

pytestmark = pytest.mark.slow


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PYTHONPATH", "VIRTUAL_ENV", "GAC_"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def gpu_machine_python(tmp_path_factory) -> Path:
    """A virtualenv (no system site packages) with exactly the GPU machine's package set."""
    env_dir = tmp_path_factory.mktemp("gpu-machine") / "env"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = env_dir / "bin" / "python"
    done = subprocess.run([python, "-m", "pip", "install", "-q", *GPU_MACHINE],
                          capture_output=True, text=True, timeout=1800, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def test_the_smoke_runs_with_only_the_gpu_machines_packages_and_no_network(gpu_machine_python,
                                                                            tmp_path):
    gac_import = subprocess.run([gpu_machine_python, "-c", "import gac_check, sys; "
                                 "print(gac_check.__file__)"], capture_output=True, text=True,
                                env=clean_env(), cwd=tmp_path, timeout=120)
    assert gac_import.returncode != 0  # not installed there: only the copied tree has it
    out = tmp_path / "out"
    command = ["-m", "gac_check.cli", "evidence", "--smoke", "--minutes", "60", "--out", out]
    done = subprocess.run([gpu_machine_python, *command], capture_output=True, text=True,
                          cwd=tmp_path, env=clean_env(PYTHONPATH=str(ROOT), **OFFLINE),
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    errors = {n: doc[n]["error"] for n in doc["stages"]
              if isinstance(doc[n], dict) and "error" in doc[n]}
    assert errors == {}, errors
    assert {s["status"] for s in doc["stages"].values()} == {"complete"}, doc["stages"]
    counts = doc["suites"]["counts"]  # ran; the gate's verdict is a timing, not asserted
    assert counts["tests"] >= 1 and counts["errors"] == 0 and counts["skipped"] == 0, counts
    assert len(list(out.iterdir())) <= 8
