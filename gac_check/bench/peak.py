"""The machine's own peak, measured once per process, so every result can say which fraction
of *this* device it reaches (a datasheet peak is never reached and differs by clock and SKU).

GPU: a large bf16 GEMM (8192^3) for compute and a 1 GiB device-to-device copy for memory.
CPU: a 1024^3 GEMM in the process's dtype on the benchmark thread count, and a 64 MiB copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gac_check.bench import timing
from gac_check.bench.workloads import gemm, randn


@dataclass(frozen=True)
class Peak:
    tflops: float
    copy_gbs: float
    gemm_case: str

    def as_dict(self) -> dict[str, float]:
        return {"tflops": self.tflops, "copy_gbs": self.copy_gbs}


def peak(device: str, cpu_dtype: str = "float32") -> Peak:
    """The device's peak; a CPU's in the process's one dtype, a GPU's always in bf16."""
    return _peak(device, "bfloat16" if timing.is_cuda(device) else cpu_dtype)


@cache
def _peak(device: str, dtype: str) -> Peak:
    cuda = timing.is_cuda(device)
    n = 8192 if cuda else 1024
    config = timing.TimingConfig(samples=10 if cuda else 5, trials=2 if cuda else 1)
    work = gemm(n, n, n, dtype)
    t = timing.measure(work.prepare(device).fn, device, config).median
    nbytes = (1 << 30) if cuda else (64 << 20)
    src = randn((nbytes // 4,), "float32", device)
    dst = src.clone()
    copy_t = timing.measure(lambda: dst.copy_(src), device,
                            timing.TimingConfig(samples=10, trials=1, flush_l2=False)).median
    return Peak(work.flops / t / 1e12, 2 * nbytes / copy_t / 1e9, work.key)
