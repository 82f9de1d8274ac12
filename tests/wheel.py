"""gac-check as a user installs it: the wheel built from this checkout, installed into a fresh
virtualenv that sees nothing of this one (no system site-packages, no PYTHONPATH), with the
requirements resolved by pip from the machine's configured indexes."""
from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
#: torch first, as on any CPU machine, pinned to the release these tests run on.
TORCH_PIN = os.environ.get("GAC_TORCH_PIN", f"torch=={torch.__version__.split('+')[0]}")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would make a child see this checkout or this
    pytest run."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PYTHONPATH", "VIRTUAL_ENV"))}
    return {**env, **extra}


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or clean_env(),
                          capture_output=True, text=True, timeout=900, check=False)


def build_wheel(dest: Path) -> Path:
    """``python -m build --wheel`` of this checkout into ``dest``; returns the wheel."""
    built = run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dest,
                ROOT, cwd=dest.parent)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dest.glob("gac_check-*.whl")
    return wheel


def fresh_venv(path: Path) -> Path:
    """An empty virtualenv with pip; returns its bin/ directory."""
    venv.create(path, with_pip=True)
    return path / "bin"
