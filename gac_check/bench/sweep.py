"""The alignment sweeps a measured contract is derived from, written into a baseline file.

    python -m gac_check.bench.sweep --profile cpu --out baselines/cpu-amd-avx2.json
    python -m gac_check.bench.sweep --profile h100 --out baselines/h100.json   # on an H100

SDPA over head_dim and GEMM over K and N (nn.Linear layout), every size in a contiguous range so
each modulus 2..64 has members and padded neighbours (the padding-rescue pairs). On a GPU the
SDPA sweep runs the default dispatch and each forced backend for fp16 and bf16; on a CPU one
dtype per process (``--dtype``). Sizes of one sweep are measured interleaved trial by trial, so
a burst of machine noise lands on all sizes rather than on a few.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from gac_check.bench import baselines, timing, workloads
from gac_check.bench.peak import peak
from gac_check.bench.run import present_device, run_interleaved
from gac_check.errors import BadInput
from gac_check.profiles import cpu_profile_key, cuda_profile


@dataclass(frozen=True)
class SweepPlan:
    sdpa: list[workloads.Workload]
    gemm: list[workloads.Workload]
    config: timing.TimingConfig


def gpu_plan(dtypes: tuple[str, ...] = ("float16", "bfloat16")) -> SweepPlan:
    sdpa = [workloads.sdpa(4, 2048, 32, d, dt, be) for dt in dtypes
            for be in ("default", "flash", "efficient", "cudnn", "math")
            for d in range(64, 257)]
    gemm = [w for dt in dtypes for s in range(4000, 4101)
            for w in (workloads.gemm(512, s, 4096, dt), workloads.gemm(512, 4096, s, dt))]
    return SweepPlan(sdpa, gemm, timing.TimingConfig(samples=20, trials=3, warmup_s=0.02))


def cpu_plan(dtype: str = "float32") -> SweepPlan:
    sdpa = [workloads.sdpa(1, 256, 8, d, dtype) for d in range(56, 137)]
    gemm = [w for s in range(960, 1089)
            for w in (workloads.gemm(64, s, 1024, dtype), workloads.gemm(64, 1024, s, dtype))]
    return SweepPlan(sdpa, gemm, timing.TimingConfig(samples=5, trials=5, warmup_s=0.01))


def run_plan(plan: SweepPlan, device: str, command: str, chunk: int = 32,
             log=sys.stderr) -> list[baselines.Measurement]:
    """Measure every case; a refused backend is logged and left out (that is data too: the
    forced-backend families then show which sizes each backend takes)."""
    out: list[baselines.Measurement] = []
    for family in (plan.sdpa, plan.gemm):
        for start in range(0, len(family), chunk):
            batch = []
            for work in family[start:start + chunk]:
                try:
                    work.prepare(device)  # refusals surface here, before timing
                    batch.append(work)
                except workloads.Unsupported as exc:
                    print(f"skip {work.key}: {exc}", file=log)
            out += run_interleaved(batch, device, plan.config, command) if batch else []
            print(f"{len(out)} cases measured", file=log)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gac_check.bench.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="a100, h100, h200 or cpu: must be the "
                   "device present")
    p.add_argument("--out", type=Path, help="baseline file (default baselines/<key>.json)")
    p.add_argument("--dtype", default="float32", help="CPU: the one dtype of this process")
    args = p.parse_args(argv)
    try:
        device, key = _device_for(args.profile)
    except BadInput as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    plan = cpu_plan(args.dtype) if device == "cpu" else gpu_plan()
    command = "python -m gac_check.bench.sweep " + shlex.join(argv or sys.argv[1:])
    found = run_plan(plan, device, command)
    out = args.out or baselines.path_for(key)
    baselines.update(out, key, baselines.present_fingerprint(device), found,
                     peak(device, args.dtype).as_dict())
    print(f"wrote {len(found)} cases to {out}")
    return 0


def _device_for(profile: str) -> tuple[str, str]:
    if profile == "cpu":
        return "cpu", cpu_profile_key()
    present = cuda_profile()
    if present != profile:
        raise BadInput(f"--profile {profile} asks for a device that is not present "
                       f"(present: {present or 'no CUDA device'})")
    return present_device(), profile


if __name__ == "__main__":
    raise SystemExit(main())
