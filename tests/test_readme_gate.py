"""The README's "complete gate" works as written, on every profile: its two files are copied
out of README.md into a throwaway project and run there through the installed plugin."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gac_check.profiles import CHOICES, capability
from tests.helpers import pytest_here, tiny_llama

ROOT = Path(__file__).resolve().parents[1]


def readme_file(first_line: str) -> str:
    """The README's python block that starts with ``first_line`` (a ``# path`` comment)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (block,) = [b for b in blocks if b.startswith(first_line)]
    return block


def gate_profiles() -> list[str]:
    """One profile per set of rules: the GPUs with published sweeps of their own (a100, h100,
    h200), one per compute capability for the rest (a named GPU without a published sweep,
    an L4, is judged by its capability's rules, which tests/test_gpu_profiles.py holds to each
    name), and gpu, cpu, auto. Every choice costs a pytest run of ~18 s on a busy runner."""
    out = ["a100", "h100", "h200"]
    seen = {capability(p) for p in out}
    for choice in CHOICES:
        sm = capability(choice) if choice not in ("gpu", "cpu", "auto") else None
        if sm is None or sm not in seen:
            out.append(choice)
            seen.add(sm)
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gate")
    (root / "tests").mkdir()
    (root / "baselines").mkdir()
    for name in ("conftest.py", "test_alignment_gate.py"):
        (root / "tests" / name).write_text(readme_file(f"# tests/{name}"))
    # aligned for every profile: widths 64/256, head_dim 32
    tiny_llama(vocab_size=128, hidden_size=128, intermediate_size=256,
               num_hidden_layers=1).save_pretrained(root / "model")
    return root


@pytest.mark.parametrize("profile", gate_profiles())
def test_the_readme_gate_passes_on_an_aligned_model(project, profile, pytester):
    """``auto`` as a user runs it, ``python -m pytest`` through the installed plugin; the
    other profiles in this process (pytester), which loads the plugin the same way."""
    args = ("-q", "-rs", "--gpu", profile, "--model", "model", "tests")
    if profile == "auto":
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTEST_", "HYPOTHESIS"))}
        env["GAC_BASELINES_DIR"] = str(project / "baselines")  # a project's own, still empty
        res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                             cwd=project, env=env, capture_output=True, text=True, timeout=600,
                             check=False)
        code, out, err = res.returncode, res.stdout, res.stderr
    else:
        shutil.copytree(project, pytester.path, dirs_exist_ok=True)
        run = pytest_here(pytester, *args,
                          env={"GAC_BASELINES_DIR": str(pytester.path / "baselines")})
        code, out, err = run.ret, run.stdout.str(), run.stderr.str()
    assert code == 0, out[-3000:] + err[-2000:]
    assert re.search(r"\b2 passed", out), out[-2000:]
