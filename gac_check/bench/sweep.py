"""Record a machine's baseline in one command: the sweeps a measured contract is derived from,
the expected slowdowns are read from, and the reference kernels the perf gate normalises by.

    gac-check baseline record --gpu h100        # on an H100: baselines/h100.json
    gac-check baseline record --dry-run         # what it would record here, how long
    gac-check baseline record --gpu cpu --smoke # the whole path in seconds

(``python -m gac_check.bench.sweep`` is the same command; its old ``--profile`` still works.)

What is recorded is :func:`record_plan`, the one list of cases (add a group there, not here):

* GPU: SDPA over head_dim 32-256 at the published shape (B=4 S=2048 H=32) with the default
  dispatch in fp16 and bf16, and each forced backend (flash, efficient, cuDNN; math at a few
  sizes) in fp16; GEMMs (nn.Linear layout) over K and over N 4000-4100 at the published shape
  (M=512, other side 4096) in fp16 and bf16, and over K and N 96-320 at M=4096 tokens, where
  low-rank factors live (ranks 153 or 245 are outside any published sweep); the perf gate's
  reference kernel. Each sweep is a contiguous range, so it holds every padding-rescue pair
  (size, padded size) for moduli 2-64 that :mod:`gac_check.contract.measured` derives the rules
  from and :mod:`gac_check.contract.evidence` reads slowdowns from.
* CPU: the same groups at CPU sizes, one dtype per process (``--dtype``).

The file gets each case with its provenance (measured, date, this command), the device's
fingerprint and its measured peak. Groups are saved as they finish, and the run stops before a
group that would start after ``--max-seconds`` (default 540, inside a 10-minute slot), so a run
that is cut short keeps what it measured and says what it left out (exit 1).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from gac_check.bench import baselines, timing, workloads
from gac_check.bench.kernels import run_interleaved
from gac_check.bench.peak import peak
from gac_check.progress import steps

#: Published shapes (gac_check.bench.published), so measured cases replace published ones.
GPU_SDPA = (4, 2048, 32)
GPU_HEAD_DIMS = range(32, 257)
GPU_GEMM = dict(m=512, other=4096, sizes=range(4000, 4101))
GPU_RANK_GEMM = dict(m=4096, other=4096, sizes=range(96, 321))
CPU_SDPA = (1, 256, 8)
CPU_HEAD_DIMS = range(56, 137)
CPU_GEMM = dict(m=64, other=1024, sizes=range(960, 1089))
MATH_HEAD_DIMS = (64, 107, 112, 128)
#: A planning figure for --dry-run, not a measurement: throughput (TFLOP/s) assumed per call,
#: below what the published H100 tables show (SDPA 35-78, GEMM 100-350: this errs long),
#: overhead per sample (events, flush, Python) and per case (inputs, warm-up, dispatch checks).
ASSUMED_TFLOPS = {"cuda": {"sdpa": 50.0, "gemm": 100.0}, "cpu": {"sdpa": 0.02, "gemm": 0.05}}
MATH_SLOWER = 10.0
SAMPLE_OVERHEAD_S = {"cuda": 2e-4, "cpu": 2e-5}
CASE_OVERHEAD_S = {"cuda": 0.06, "cpu": 0.02}
MAX_SECONDS = 540


@dataclass(frozen=True)
class Group:
    """Cases measured together (interleaved in chunks) and saved together."""

    name: str
    works: list[workloads.Workload]
    config: timing.TimingConfig


@dataclass(frozen=True)
class RecordPlan:
    device: str  # "cuda" | "cpu"
    groups: list[Group]

    @property
    def cases(self) -> int:
        return sum(len(g.works) for g in self.groups)

    def estimate_s(self) -> float:
        """Seconds the plan should take, from ASSUMED_TFLOPS (refused backends counted too,
        so this errs long)."""
        total = 0.0
        for g in self.groups:
            calls = g.config.trials * g.config.samples
            for w in g.works:
                slow = MATH_SLOWER if w.params.get("backend") == "math" else 1.0
                call = w.flops / (ASSUMED_TFLOPS[self.device][w.kind] * 1e12) * slow
                total += (CASE_OVERHEAD_S[self.device] + max(g.config.warmup_s, call)
                          + calls * (call + SAMPLE_OVERHEAD_S[self.device]))
        return total

    def smoke(self) -> RecordPlan:
        """Every group on three sizes with few samples: the whole path in seconds."""
        quick = timing.TimingConfig(samples=3, trials=1, warmup_s=0.0, min_warmup_calls=1)
        return RecordPlan(self.device, [replace(g, works=g.works[:3], config=quick)
                                        for g in self.groups])


def _gemm_sweep(m: int, other: int, sizes: range, dtype: str) -> list[workloads.Workload]:
    """K swept (N fixed), then N swept (K fixed): the two GEMMs a rank or width feeds."""
    return ([workloads.gemm(m, s, other, dtype) for s in sizes]
            + [workloads.gemm(m, other, s, dtype) for s in sizes])


def record_plan(device: str, dtype: str = "float32") -> RecordPlan:
    """What a baseline recording measures on ``device`` ("cuda" or "cpu"); ``dtype`` is the CPU
    process's one dtype (a GPU records fp16 and bf16)."""
    if device == "cuda":
        b, s, h = GPU_SDPA
        config = timing.TimingConfig(samples=20, trials=3, warmup_s=0.02)
        sdpa = timing.TimingConfig(samples=10, trials=3, warmup_s=0.02)  # ~1-3 ms per call
        return RecordPlan(device, [
            Group("reference", [workloads.reference_workload(device)], config),
            Group("sdpa-default", [workloads.sdpa(b, s, h, d, dt) for dt in ("float16",
                  "bfloat16") for d in GPU_HEAD_DIMS], sdpa),
            Group("gemm-published-shape", [w for dt in ("float16", "bfloat16")
                                           for w in _gemm_sweep(**GPU_GEMM, dtype=dt)], config),
            Group("gemm-rank-sizes", [w for dt in ("float16", "bfloat16")
                                      for w in _gemm_sweep(**GPU_RANK_GEMM, dtype=dt)], config),
            # last: for reading which sizes each backend takes, not for the contract
            Group("sdpa-backends", [workloads.sdpa(b, s, h, d, "float16", be)
                                    for be in ("flash", "efficient", "cudnn")
                                    for d in GPU_HEAD_DIMS]
                  + [workloads.sdpa(b, s, h, d, "float16", "math") for d in MATH_HEAD_DIMS],
                  sdpa),
        ])
    b, s, h = CPU_SDPA
    config = timing.TimingConfig(samples=5, trials=5, warmup_s=0.01)
    groups = [Group("sdpa-default", [workloads.sdpa(b, s, h, d, dtype) for d in CPU_HEAD_DIMS],
                    config),
              Group("gemm", _gemm_sweep(**CPU_GEMM, dtype=dtype), config)]
    refs = [w for w in [workloads.reference_workload(device)] if w.params["dtype"] == dtype]
    if refs:  # one dtype per process: another dtype's reference waits for its own run
        groups.insert(0, Group("reference", refs, config))
    return RecordPlan(device, groups)


def run_group(group: Group, device: str, command: str, chunk: int = 32,
              log=sys.stderr, deadline: float | None = None) -> list[baselines.Measurement]:
    """Measure a group's cases; a refused backend is logged and left out (that is data too:
    the forced-backend families then show which sizes each backend takes). No chunk starts
    after ``deadline`` (a ``time.monotonic()`` value): a budgeted run keeps what it measured."""
    out: list[baselines.Measurement] = []
    refused: list[str] = []
    starts = range(0, len(group.works), chunk)
    for start in steps(starts, group.name, total=len(starts)):
        if deadline is not None and time.monotonic() > deadline:
            print(f"{group.name}: stopped at budget after {start} of {len(group.works)} cases",
                  file=log)
            break
        batch = []
        for work in group.works[start:start + chunk]:
            try:
                work.prepare(device)  # refusals surface here, before timing
                batch.append(work)
            except workloads.Unsupported as exc:
                refused.append(f"{work.key}: {exc}")
        out += run_interleaved(batch, device, group.config, command) if batch else []
    if refused:
        print(f"{group.name}: {len(refused)} cases refused by the device, e.g. {refused[0]}",
              file=log)
    return out


def record(plan: RecordPlan, device: str, key: str, out: Path, command: str, dtype: str,
           max_seconds: float = MAX_SECONDS, log=sys.stderr) -> list[str]:
    """Run the plan group by group, merging each into ``out``; returns the groups left out
    because the time was up."""
    started = time.monotonic()
    fingerprint = baselines.present_fingerprint(device)
    peak_figures = peak(device, dtype).as_dict()
    skipped = []
    for group in plan.groups:
        if time.monotonic() - started > max_seconds:
            skipped.append(group.name)
            continue
        found = run_group(group, device, command, log=log)
        baselines.update(out, key, fingerprint, found, peak_figures)
        print(f"{group.name}: {len(found)} cases saved to {out} "
              f"({time.monotonic() - started:.0f} s)", file=log)
    return skipped


if __name__ == "__main__":  # the old spelling of `gac-check baseline record`: runs that command
    import runpy  # the CLI is run as a program, not imported: it sits above this module

    sys.argv[1:1] = ["baseline", "record"]
    runpy.run_module("gac_check.cli", run_name="__main__")
