"""Where the figures came from: the device, its driver and clocks, the software, the commit.

Clocks are read, never set: ``nvidia-smi --query-gpu`` (one bounded subprocess) reports the
current and maximum SM and memory clocks, the power limit and the temperature at the moment of
reading; the run reads them before and after measuring, so a reader sees whether the GPU ran
at its boost clock or throttled. Where nvidia-smi is absent or fails, the record says so.
"""
from __future__ import annotations

import hashlib
import platform
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

#: nvidia-smi's names for what is read (``--query-gpu``), all read-only queries.
SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm",
              "clocks.max.mem", "power.limit", "temperature.gpu", "persistence_mode")
SMI_TIMEOUT_S = 15
#: the gac_check package, whose sources the digest covers
PACKAGE = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "transformers", "safetensors", "jinja2", "pytest", "numpy")


def clocks() -> dict:
    """The first GPU's clocks and limits as nvidia-smi reads them now, or why not."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"error": "nvidia-smi not found"}
    try:
        done = subprocess.run([smi, f"--query-gpu={','.join(SMI_FIELDS)}",
                               "--format=csv,noheader,nounits", "--id=0"],
                              capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi: {exc}"}
    if done.returncode != 0:
        return {"error": f"nvidia-smi exit {done.returncode}: {done.stderr.strip()[:200]}"}
    values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(SMI_FIELDS, values, strict=False))


def software() -> dict:
    """Python, the packages the figures depend on, torch's CUDA and cuDNN, the commit."""
    import torch

    out: dict = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out["commit"] = commit()
    out["source_digest"] = source_digest()
    return out


def source_digest(package: Path = PACKAGE) -> str:
    """A digest of the package's Python sources as they ran: the one provenance that travels
    with the tree. The first H200 loan showed why the commit alone is not enough: the device
    machine's copy of ``.git`` lagged the working tree it ran, so two calls named a commit that
    lacked the option they used. The same function here, at a candidate commit, confirms it."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def commit() -> str | None:
    """The source tree's commit: git where the tree has its .git (the device machine gets the
    working tree without it), else None; the committed RESULTS entry names it either way."""
    root = Path(__file__).resolve().parents[2]
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        return None
    try:
        done = subprocess.run([git, "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def device(kind: str) -> dict:
    """The device's own description (torch's view), for any kind."""
    import torch

    if kind != "cuda":
        from gac_check.profiles import cpu_name

        return {"kind": "cpu", "name": cpu_name(), "threads": torch.get_num_threads()}
    props = torch.cuda.get_device_properties(0)
    return {"kind": "cuda", "name": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2 ** 30, 1),
            "multiprocessors": props.multi_processor_count,
            "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2 ** 20, 1)}
