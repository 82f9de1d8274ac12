"""Which hardware profile a run is about, and which device is present.

Two questions kept apart on purpose: ``--gpu`` names the hardware the model will be *served*
on (a laptop check of a model bound for an H100 must use the H100's rules), while measuring
always happens on the device that is present.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from gac_check.errors import BadInput


@dataclass(frozen=True)
class GpuProfile:
    """A GPU a model can be served on, by the compute capability the engines branch on.

    ``sm`` is what vLLM's ``DeviceCapability.to_int()`` and SGLang's ``get_device_sm()`` return
    (major * 10 + minor): every engine rule that depends on the GPU reads it. ``names`` are
    patterns of the device name the driver and torch report, so ``--gpu auto`` finds the
    profile by name; a GPU no pattern names is found by its capability (:data:`BY_SM`).
    """

    key: str
    sm: int
    title: str
    arch: str
    names: tuple[str, ...] = ()


#: The GPUs with a profile of their own (and a baseline file of that name), then one profile
#: per compute capability for GPUs not named here (an RTX A6000 is sm86, an L40 sm89).
GPUS = (
    GpuProfile("a100", 80, "NVIDIA A100", "Ampere GA100", (r"\ba100\b", r"\ba800\b")),
    GpuProfile("h100", 90, "NVIDIA H100", "Hopper GH100", (r"\bh100\b", r"\bh800\b")),
    GpuProfile("h200", 90, "NVIDIA H200", "Hopper GH100", (r"\bh200\b",)),
    GpuProfile("a10", 86, "NVIDIA A10", "Ampere GA102", (r"\ba10g?\b",)),
    GpuProfile("rtx3090", 86, "NVIDIA GeForce RTX 3090", "Ampere GA102", (r"rtx 3090",)),
    GpuProfile("l4", 89, "NVIDIA L4", "Ada Lovelace AD104", (r"\bl4\b",)),
    GpuProfile("l40s", 89, "NVIDIA L40S", "Ada Lovelace AD102", (r"\bl40s\b",)),
    GpuProfile("rtx4090", 89, "NVIDIA GeForce RTX 4090", "Ada Lovelace AD102", (r"rtx 4090",)),
    GpuProfile("b200", 100, "NVIDIA B200", "Blackwell GB100", (r"\bg?b200\b",)),
    GpuProfile("rtx5090", 120, "NVIDIA GeForce RTX 5090", "Blackwell GB202", (r"rtx 5090",)),
    GpuProfile("rtx-pro-6000", 120, "NVIDIA RTX PRO 6000 Blackwell", "Blackwell GB202",
               (r"rtx pro 6000",)),
)
CAPABILITY_PROFILES = tuple(GpuProfile(f"sm{sm}", sm, f"a GPU of compute capability "
                                       f"{sm // 10}.{sm % 10}", arch)
                            for sm, arch in ((80, "Ampere"), (86, "Ampere"), (89, "Ada Lovelace"),
                                             (90, "Hopper"), (100, "Blackwell"),
                                             (120, "Blackwell")))
GPU_BY_KEY = {g.key: g for g in (*GPUS, *CAPABILITY_PROFILES)}
BY_SM = {g.sm: g.key for g in CAPABILITY_PROFILES}
#: The generic GPU contract ("gpu") is judged as the oldest GPU the published contract
#: covers (an A100); the CPU has no compute capability.
GENERIC_SM = 80
#: The GPUs that have a profile of their own (and a baseline file of that name).
GPU_PROFILES = tuple(g.key for g in GPUS)
#: Profiles with published or measured rules. "gpu" is the generic published GPU contract.
PROFILES = (*GPU_PROFILES, *BY_SM.values(), "gpu", "cpu")
#: What ``--gpu`` accepts, in the CLI and in the pytest plugin alike.
CHOICES = (*PROFILES, "auto")


def capability(profile: str) -> int | None:
    """The compute capability (sm) a profile's engine rules are judged at; None for the CPU."""
    if profile == "cpu":
        return None
    gpu = GPU_BY_KEY.get(profile)
    return gpu.sm if gpu else GENERIC_SM


def profile_of_device(name: str, sm: int | None = None) -> str | None:
    """The profile of a device called ``name`` (``NVIDIA L40S``) of capability ``sm``: the
    GPU the name names, else the profile of its capability, else None (unknown)."""
    low = " ".join(name.lower().replace("-", " ").split())
    named = next((g.key for g in GPUS if any(re.search(p, low) for p in g.names)), None)
    if named is not None:
        return named
    return BY_SM.get(sm) if sm is not None else None


#: Default perf regression thresholds, as ratios of a case's time relative to the reference
#: kernel timed in the same trials. CPU: benchmarks/bench_trust.py, 20 reruns on the 2-core
#: machine with both cores busy beside it, gave unchanged ratios of at most 1.048 (0 false
#: regressions in 140 at 1.05 and above) and caught 140/140 of an injected 10% slowdown at 1.06
#: (benchmarks/RESULTS.md). GPUs keep asv's 1.10 until a GPU run measures their noise.
GPU_PERF_FACTOR = 1.10
CPU_PERF_FACTOR = 1.06

#: ISA flags that change which CPU kernels run (and so whether a CPU baseline applies).
CPU_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile",
                 "amx_bf16", "amx_int8", "asimd", "sve", "sve2", "bf16")


def _driver_view() -> str | bool | None:
    """What the NVIDIA driver says without importing torch (1-2 s, most of a check's time).

    False: certainly no usable NVIDIA GPU (Linux without the driver's device files, macOS, or
    CUDA_VISIBLE_DEVICES hiding them all); a profile: every GPU the driver lists is that named
    GPU; None: cannot tell cheaply (other platforms, mixed GPUs, a GPU no profile names: the
    driver's file has no compute capability), so ask torch.
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
        profiles.add(profile_of_device(model.partition(":")[2]))
    return profiles.pop() if len(profiles) == 1 else None


def cuda_profile() -> str | None:
    """The profile of the CUDA device present (by name, else by compute capability, else the
    generic ``gpu``), or None without one."""
    cheap = _driver_view()
    if cheap is not None:
        return cheap or None
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    sm = torch.cuda.get_device_capability(0)
    return profile_of_device(torch.cuda.get_device_name(0), sm[0] * 10 + sm[1]) or "gpu"


def profile_name(requested: object) -> str:
    """``requested`` (``"H100"``, ``" a100 "``) as one of :data:`CHOICES`, ``auto`` kept as
    it is; anything else is refused."""
    value = str(requested).strip().lower()
    if value not in CHOICES:
        raise BadInput(f"unknown hardware profile {requested!r} (choose from "
                       f"{', '.join(CHOICES)})")
    return value


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


def cpu_isa() -> tuple[str, ...]:
    """The ISA flags of this CPU that change which kernels torch runs."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("flags", "features")):
                flags.update(line.split(":", 1)[1].split())
                break
    return tuple(f for f in CPU_ISA_FLAGS if f in flags)


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (else what platform knows)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    import platform  # only where /proc/cpuinfo does not say (2 ms a check otherwise)

    return platform.processor() or platform.machine()


def cpu_profile_key() -> str:
    """``cpu-<vendor>-<isa>``: the CPU baselines' file key (cpu-intel-amx, cpu-amd-avx2).

    Vendor and the widest matrix/vector ISA decide which kernels torch runs, which is what a
    baseline is about; the exact model stays in the fingerprint.
    """
    name, isa = cpu_name().lower(), set(cpu_isa())
    vendor = next((v for v in ("intel", "amd", "apple") if v in name), None)
    if vendor is None:
        import platform

        vendor = "arm" if platform.machine().lower() in ("aarch64", "arm64") else "other"
    level = next((lvl for lvl, flag in (("amx", "amx_tile"), ("avx512", "avx512f"),
                                        ("avx2", "avx2"), ("sve", "sve"), ("neon", "asimd"))
                  if flag in isa), "generic")
    return f"cpu-{vendor}-{level}"


def driver_version() -> str | None:
    """The NVIDIA driver version, read from /proc without importing torch."""
    with contextlib.suppress(OSError):
        text = Path("/proc/driver/nvidia/version").read_text()
        for word in text.split():
            if word[:1].isdigit() and "." in word:
                return word
    return None
