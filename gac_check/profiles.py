"""Which hardware profile a run is about, and which device is present.

Two questions kept apart on purpose: ``--gpu`` names the hardware the model will be *served*
on (a laptop check of a model bound for an H100 must use the H100's rules), while measuring
always happens on the device that is present.
"""
from __future__ import annotations

import contextlib
import os
import platform
import sys
from pathlib import Path

from gac_check.errors import BadInput

#: Profiles with published or measured rules. "gpu" is the generic published GPU contract.
PROFILES = ("a100", "h100", "h200", "gpu", "cpu")
#: What ``--gpu`` accepts, in the CLI and in the pytest plugin alike.
CHOICES = (*PROFILES, "auto")
#: The GPUs that have a profile of their own (and a baseline file of that name).
GPU_PROFILES = ("a100", "h100", "h200")

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


def _profile_of(name: str) -> str:
    name = name.lower()
    return next((key for key in GPU_PROFILES if key in name), "gpu")


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
    return platform.processor() or platform.machine()


def cpu_profile_key() -> str:
    """``cpu-<vendor>-<isa>``: the CPU baselines' file key (cpu-intel-amx, cpu-amd-avx2).

    Vendor and the widest matrix/vector ISA decide which kernels torch runs, which is what a
    baseline is about; the exact model stays in the fingerprint.
    """
    name, isa = cpu_name().lower(), set(cpu_isa())
    vendor = next((v for v in ("intel", "amd", "apple") if v in name), None)
    if vendor is None:
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
