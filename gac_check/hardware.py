"""Which hardware profile a run is about, and which device is present.

Two questions kept apart on purpose: ``--gpu`` names the hardware the model will be *served*
on (a laptop check of a model bound for an H100 must use the H100's rules), while measuring
always happens on the device that is present.
"""
from __future__ import annotations

from gac_check.errors import BadInput

#: Profiles with published or measured rules. "gpu" is the generic published GPU contract.
PROFILES = ("a100", "h100", "h200", "gpu", "cpu")
CHOICES = (*PROFILES, "auto")


def cuda_profile() -> str | None:
    """The profile of the CUDA device present, or None without one."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0).lower()
    for key in ("a100", "h100", "h200"):
        if key in name:
            return key
    return "gpu"


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
