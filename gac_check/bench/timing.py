"""Sampling a callable's run time so the numbers survive a kernel engineer's review.

One timing path for every device: warm-up, per-sample call batching, interleaved trials, the
garbage collector off and one sample loop (:func:`_samples`) are the same code on a CPU and on
a GPU, so the CPU tests run the loop a GPU measurement uses. What differs is a
:class:`Clock` of a few lines:

* GPU (:class:`CudaClock`): CUDA events around each call (host-side timers measure the launch,
  not the kernel), the L2 cache flushed before every call by writing a buffer twice its size
  (otherwise a repeated call reads its inputs from L2 and a memory-bound kernel looks several
  times faster than in a model), one call per sample, one synchronisation per trial.
* CPU (:class:`Clock`): ``perf_counter``; a sample times enough back-to-back calls to last
  ``min_sample_s`` (timer resolution and call overhead stay below 0.1%), and torch runs with a
  fixed thread count. CPU caches are not flushed: CPU cases are small enough to be
  cache-resident in a model as well, and a flush would dominate their time.

Why not a ready timer: ``torch.utils.benchmark.Timer`` times blocks of calls between host
timestamps (no per-call events, no L2 flush, so a flush would land inside the timed block) and
cannot interleave several callables trial by trial; ``triton.testing.do_bench`` has the events
and the flush but is CUDA-only and triton is not a dependency, so the CPU tests could not run
it. Keeping the device part to one small class is what lets a CPU-only CI test everything
else. One dtype per process (on AMX machines fp32 after bf16 runs ~27% slower): the sweep and
the suites keep to that; this module cannot enforce it.
"""
from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

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


class Clock:
    """How a sample is timed on the CPU; :class:`CudaClock` is the GPU's few lines.

    ``mark()`` is taken right before and right after a sample's calls, ``flush()`` runs before
    the first mark (outside the timed region), ``sync()`` once all marks of a trial are taken
    and before ``seconds()`` reads them."""

    batches = True  # several calls per sample (CPU); a flushing clock times one call

    def mark(self) -> Any:
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return end - start

    def flush(self) -> None:
        """CPU caches are not flushed (module docstring)."""

    def sync(self) -> None:
        """CPU work is done when the call returns."""


class CudaClock(Clock):
    """CUDA events and an L2 flush: the only device-specific timing code."""

    batches = False

    def __init__(self, flush_l2: bool) -> None:
        import torch

        self._cuda = torch.cuda
        self._flush = _l2_buffer() if flush_l2 else None

    def mark(self) -> Any:
        event = self._cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3  # milliseconds

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.zero_()

    def sync(self) -> None:
        self._cuda.synchronize()


def measure(fn: Callable[[], object], device: str = "cpu",
            config: TimingConfig = DEFAULT_CONFIG) -> Timing:
    """Time ``fn`` (inputs already bound, already on ``device``)."""
    return measure_interleaved({"fn": fn}, device, config)["fn"]


def measure_interleaved(fns: dict[str, Callable[[], object]], device: str = "cpu",
                        config: TimingConfig = DEFAULT_CONFIG,
                        clock: Clock | None = None) -> dict[str, Timing]:
    """Time several callables trial by trial in turn (A, B, A, B, ...).

    Comparisons inside one test (repaired vs original, aligned vs misaligned) then see the same
    machine state; drift between trials hits both sides instead of biasing one. ``clock``
    defaults to the device's.
    """
    out = {name: Timing() for name in fns}
    with _quiet(device, config):
        clock = clock or clock_for(device, config)
        inner = {}
        for name, fn in fns.items():
            _warm_up(fn, clock, config)
            inner[name] = (_calls_per_sample(fn, clock, config.min_sample_s)
                           if clock.batches else 1)
        for _ in range(config.trials):
            for name, fn in fns.items():
                out[name].trials.append(_samples(fn, clock, config.samples, inner[name]))
    return out


def clock_for(device: str, config: TimingConfig) -> Clock:
    return CudaClock(config.flush_l2) if is_cuda(device) else Clock()


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


def _warm_up(fn: Callable[[], object], clock: Clock, config: TimingConfig) -> None:
    deadline = time.perf_counter() + config.warmup_s
    calls = 0
    while calls < config.min_warmup_calls or time.perf_counter() < deadline:
        fn()
        calls += 1
    clock.sync()


def _calls_per_sample(fn: Callable[[], object], clock: Clock, min_sample_s: float) -> int:
    start = clock.mark()
    fn()
    end = clock.mark()
    clock.sync()
    one = max(clock.seconds(start, end), 1e-7)
    return max(1, min(10_000, round(min_sample_s / one)))


def _samples(fn: Callable[[], object], clock: Clock, count: int, inner: int) -> list[float]:
    """``count`` samples of ``inner`` calls each, in seconds per call; the flush before each
    sample stays outside its marks, and the clock is read once, after one sync."""
    marks = []
    for _ in range(count):
        clock.flush()
        start = clock.mark()
        for _ in range(inner):
            fn()
        marks.append((start, clock.mark()))
    clock.sync()
    return [clock.seconds(a, b) / inner for a, b in marks]


_L2: dict[int, object] = {}


def _l2_buffer():
    """A buffer twice the L2 size of the current device (writing it evicts everything)."""
    import torch

    dev = torch.cuda.current_device()
    if dev not in _L2:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 64 << 20
        _L2[dev] = torch.empty(2 * l2, dtype=torch.uint8, device=f"cuda:{dev}")
    return _L2[dev]
