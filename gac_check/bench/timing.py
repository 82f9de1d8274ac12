"""Sampling a callable's run time so the numbers survive a kernel engineer's review.

GPU: CUDA events around each call (host-side timers measure launch, not the kernel), a warm-up
until clocks and caches settle, the L2 cache flushed before every call by writing a buffer
twice its size (otherwise a repeated call reads its inputs from L2 and a memory-bound kernel
looks several times faster than in a model), many samples per trial and several trials.

CPU: the same loop with ``perf_counter``; a sample times enough back-to-back calls to last
``min_sample_s`` (timer resolution and call overhead stay below 0.1%), the garbage collector is
off while sampling, and torch runs with a fixed thread count. The CPU caches are not flushed:
CPU cases are small enough to be cache-resident in a model as well, and a flush would dominate
their time. One dtype per process (on AMX machines fp32 after bf16 runs ~27% slower): the
sweep and the suites keep to that; this module cannot enforce it.
"""
from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gac_check.bench import stats


@dataclass(frozen=True)
class TimingConfig:
    """How much to sample. The defaults suit a suite case; sweeps use fewer samples."""

    warmup_s: float = 0.05
    min_warmup_calls: int = 3
    samples: int = 15  # per trial
    trials: int = 3
    min_sample_s: float = 0.001  # CPU: batch calls into samples at least this long
    flush_l2: bool = True  # GPU only
    cpu_threads: int = 1  # CPU only; 1 keeps neighbours (xdist workers) from interfering


DEFAULT_CONFIG = TimingConfig()


@dataclass
class Timing:
    """Seconds per call: every sample, trial by trial."""

    trials: list[list[float]] = field(default_factory=list)

    @property
    def samples(self) -> list[float]:
        return [s for t in self.trials for s in t]

    @property
    def median(self) -> float:
        return stats.median(self.samples)

    @property
    def iqr(self) -> float:
        return stats.iqr(self.samples)

    @property
    def trial_medians(self) -> list[float]:
        return [stats.median(t) for t in self.trials]


def is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def measure(fn: Callable[[], object], device: str = "cpu",
            config: TimingConfig = DEFAULT_CONFIG) -> Timing:
    """Time ``fn`` (inputs already bound, already on ``device``)."""
    sampler = _cuda_samples if is_cuda(device) else _cpu_samples
    with _quiet(device, config):
        _warm_up(fn, device, config)
        inner = 1 if is_cuda(device) else _calls_per_sample(fn, config.min_sample_s)
        return Timing([sampler(fn, config, inner) for _ in range(config.trials)])


def measure_interleaved(fns: dict[str, Callable[[], object]], device: str = "cpu",
                        config: TimingConfig = DEFAULT_CONFIG) -> dict[str, Timing]:
    """Time several callables trial by trial in turn (A, B, A, B, ...).

    Comparisons inside one test (repaired vs original, aligned vs misaligned) then see the same
    machine state; drift between trials hits both sides instead of biasing one.
    """
    sampler = _cuda_samples if is_cuda(device) else _cpu_samples
    out = {name: Timing() for name in fns}
    with _quiet(device, config):
        inner = {}
        for name, fn in fns.items():
            _warm_up(fn, device, config)
            inner[name] = 1 if is_cuda(device) else _calls_per_sample(fn, config.min_sample_s)
        for _ in range(config.trials):
            for name, fn in fns.items():
                out[name].trials.append(sampler(fn, config, inner[name]))
    return out


@contextlib.contextmanager
def _quiet(device: str, config: TimingConfig) -> Iterator[None]:
    import torch

    gc_was_on = gc.isenabled()
    threads = torch.get_num_threads()
    gc.disable()
    if not is_cuda(device):
        torch.set_num_threads(config.cpu_threads)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(threads)
        if gc_was_on:
            gc.enable()


def _warm_up(fn: Callable[[], object], device: str, config: TimingConfig) -> None:
    deadline = time.perf_counter() + config.warmup_s
    calls = 0
    while calls < config.min_warmup_calls or time.perf_counter() < deadline:
        fn()
        calls += 1
    if is_cuda(device):
        import torch

        torch.cuda.synchronize()


def _calls_per_sample(fn: Callable[[], object], min_sample_s: float) -> int:
    start = time.perf_counter()
    fn()
    one = max(time.perf_counter() - start, 1e-7)
    return max(1, min(10_000, round(min_sample_s / one)))


def _cpu_samples(fn: Callable[[], object], config: TimingConfig, inner: int) -> list[float]:
    out = []
    clock = time.perf_counter
    for _ in range(config.samples):
        start = clock()
        for _ in range(inner):
            fn()
        out.append((clock() - start) / inner)
    return out


def _cuda_samples(fn: Callable[[], object], config: TimingConfig, inner: int) -> list[float]:
    """One event pair per call; the L2 flush runs outside the events."""
    import torch

    del inner  # every GPU sample is one call, flushed
    flush = _l2_buffer() if config.flush_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(config.samples)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(config.samples)]
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]


_L2: dict[int, object] = {}


def _l2_buffer():
    """A buffer twice the L2 size of the current device (writing it evicts everything)."""
    import torch

    dev = torch.cuda.current_device()
    if dev not in _L2:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 64 << 20
        _L2[dev] = torch.empty(2 * l2, dtype=torch.uint8, device=f"cuda:{dev}")
    return _L2[dev]
