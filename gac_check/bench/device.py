"""Which device is present, which profile it is, and which baseline file belongs to it.

One answer for every measuring path: the perf tests (:mod:`gac_check.plugin.perf`), the
baseline recording (``gac-check baseline record``) and ``gac-check MODEL --bench``. Had each its
own, an unlisted GPU could record into one file and be gated against another.

Measuring always happens on the device present (the first CUDA device, else the CPU);
``--gpu`` there asks to measure on a particular one and is refused where it is absent. Which
hardware a model will be *served* on is another question (:mod:`gac_check.profiles`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gac_check.errors import HardwareMissing
from gac_check.profiles import (
    BY_SM,
    GPU_PROFILES,
    capability,
    cpu_name,
    cpu_profile_key,
    cuda_profile,
)


@dataclass(frozen=True)
class Device:
    """A device measurements run on and the baseline file key for it."""

    kind: str  # "cuda" | "cpu": where torch runs the kernels
    profile: str  # a named GPU (a100, l4, b200, ...); sm86 etc. by capability; gpu; cpu
    key: str  # baseline file key: a100, gpu-nvidia-l40s, cpu-amd-avx2, ...

    @property
    def name(self) -> str:
        """The device's model name (what a report says the figures speak for)."""
        return cpu_name() if self.kind == "cpu" else cuda_name()


def cuda_name() -> str:
    """The first CUDA device's name, as torch reports it."""
    import torch

    return torch.cuda.get_device_name(0)


def gpu_key(name: str) -> str:
    """A GPU without a profile of its own: ``gpu-<name>`` (``NVIDIA L40S`` -> gpu-nvidia-l40s)."""
    return "gpu-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def cpu() -> Device:
    return Device("cpu", "cpu", cpu_profile_key())


def cuda(profile: str) -> Device:
    """The CUDA device present, whose profile (``cuda_profile()``) is ``profile``."""
    return Device("cuda", profile, profile if profile in GPU_PROFILES else gpu_key(cuda_name()))


def present() -> Device:
    """The device measurements run on here: the first CUDA device, else the CPU."""
    profile = cuda_profile()
    return cpu() if profile is None else cuda(profile)


def measuring(requested: str | None) -> Device:
    """The device ``--gpu requested`` measures on: ``auto`` (or None) whatever is present,
    ``cpu`` the CPU, ``gpu`` any CUDA device, a GPU profile only that GPU, a capability
    profile (``sm89``) any GPU of that capability.

    Raises HardwareMissing, naming what is present, where the device asked for is absent.
    """
    req = (requested or "auto").lower()
    if req == "cpu":
        return cpu()
    here = present()
    if req == "auto" or (req == "gpu" and here.kind == "cuda") or req == here.profile:
        return here
    if req in BY_SM.values() and here.profile not in ("cpu", "gpu") and capability(
            req) == capability(here.profile):
        return here
    have = ("no CUDA device" if here.kind == "cpu" else
            f"a {here.key}" if here.profile == "gpu" else f"a {here.profile.upper()}")
    want = "a CUDA GPU" if req == "gpu" else f"an {req.upper()}"
    raise HardwareMissing(f"measuring happens on the device present and --gpu {req} asks for "
                          f"{want}; this machine has {have}")


def contract_key(profile: str) -> str:
    """The baseline file a contract profile's measured rules come from: ``cpu`` is this
    machine's CPU (its ISA decides the kernels), a GPU profile its own name."""
    return cpu_profile_key() if profile == "cpu" else profile
