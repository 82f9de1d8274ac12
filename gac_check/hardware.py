"""Which hardware profile a run is about, and which device is present.

Two questions kept apart on purpose: ``--gpu`` names the hardware the model will be *served*
on (a laptop check of a model bound for an H100 must use the H100's rules), while measuring
always happens on the device that is present.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from gac_check.errors import BadInput

#: Profiles with published or measured rules. "gpu" is the generic published GPU contract.
PROFILES = ("a100", "h100", "h200", "gpu", "cpu")
CHOICES = (*PROFILES, "auto")


def _profile_of(name: str) -> str:
    name = name.lower()
    return next((key for key in ("a100", "h100", "h200") if key in name), "gpu")


def _driver_view() -> str | bool | None:
    """What the NVIDIA driver says without importing torch (1-2 s, most of a check's time).

    False: certainly no usable NVIDIA GPU (Linux without the driver's device files, macOS, or
    CUDA_VISIBLE_DEVICES hiding them all); a profile: every GPU the driver lists is that kind;
    None: cannot tell cheaply (other platforms, mixed GPUs), so ask torch.
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    if sys.platform == "darwin":
        return False
    if not sys.platform.startswith("linux"):
        return None
    if not any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")):
        return False
    profiles = set()
    for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
        try:
            model = next((ln for ln in info.read_text().splitlines() if ln.startswith("Model:")),
                         "")
        except OSError:
            return None
        profiles.add(_profile_of(model))
    return profiles.pop() if len(profiles) == 1 else None


def cuda_profile() -> str | None:
    """The profile of the CUDA device present, or None without one."""
    cheap = _driver_view()
    if cheap is not None:
        return cheap or None
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    return _profile_of(torch.cuda.get_device_name(0))


def resolve_profile(requested: str) -> str:
    """Turn a ``--gpu`` value into a profile key.

    ``auto`` is the GPU present and, with none, the generic GPU contract: never the CPU's,
    because a model checked on a laptop is still bound for a GPU. ``cpu`` only when asked.
    """
    value = requested.lower()
    if value == "auto":
        return cuda_profile() or "gpu"
    if value not in PROFILES:
        raise BadInput(f"unknown hardware profile {requested!r} (choose from "
                       f"{', '.join(CHOICES)})")
    return value
