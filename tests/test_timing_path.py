"""One timing path: the loop that times on a GPU is the loop these CPU tests run.

The GPU differs from the CPU only in its Clock (CUDA events, an L2 flush, a synchronisation);
no GPU is needed to check that the shared loop calls that clock in the order a correct GPU
measurement needs: flush outside the timed region, one call per flushed sample, every event
read only after a synchronisation, trials interleaved. ``FlushingClock`` below is the CPU's own
clock with the GPU's call pattern (one call per sample, a real tensor written as the flush),
logging what the loop asks of it; the CUDA clock's own lines are checked against the torch API
they call.
"""
from __future__ import annotations

import ast
import inspect
import time

import pytest
import torch

from gac_check.bench import timing, workloads

FAST = timing.TimingConfig(samples=4, trials=3, warmup_s=0.0, min_warmup_calls=1)


class FlushingClock(timing.Clock):
    """The CPU clock with the CUDA clock's call pattern, logging every call."""

    batches = False

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.buffer = torch.empty(1 << 16, dtype=torch.uint8)

    def mark(self):
        self.log.append("mark")
        return super().mark()

    def seconds(self, start, end):
        self.log.append("read")
        return super().seconds(start, end)

    def flush(self) -> None:
        self.log.append("flush")
        self.buffer.zero_()

    def sync(self) -> None:
        self.log.append("sync")


def test_shared_loop_flushes_outside_the_marks_and_reads_after_sync():
    log: list[str] = []
    fn = lambda: log.append("call")  # noqa: E731
    t = timing.measure_interleaved({"a": fn}, "cpu", FAST, FlushingClock(log))["a"]
    assert len(t.trials) == FAST.trials and all(len(x) == FAST.samples for x in t.trials)
    trials = "".join({"flush": "F", "mark": "M", "call": "C", "sync": "S", "read": "R"}[e]
                     for e in log)
    warm, rest = trials.split("S", 1)
    assert set(warm) == {"C"}  # warm-up: calls, then one sync; nothing batched (no probe)
    one_trial = "FMCM" * FAST.samples + "S" + "R" * FAST.samples
    assert rest == one_trial * FAST.trials


def test_trials_are_interleaved_across_callables():
    seen: list[str] = []
    fns = {name: (lambda n=name: seen.append(n)) for name in "ab"}
    timing.measure_interleaved(fns, "cpu", FAST, FlushingClock([]))
    timed = "".join(seen)[2:]  # after one warm-up call each
    assert timed == ("a" * FAST.samples + "b" * FAST.samples) * FAST.trials


def test_cpu_clock_batches_short_calls_into_long_samples():
    config = timing.TimingConfig(samples=3, trials=1, warmup_s=0.0, min_warmup_calls=1,
                                 min_sample_s=0.002)
    calls = []
    t = timing.measure(lambda: calls.append(1), "cpu", config)
    assert len(calls) > 3 * 10  # each sample ran many calls
    assert max(t.samples) < 1e-4  # reported per call, not per sample


def test_real_kernel_through_the_gpu_call_pattern():
    """A real GEMM timed with one flushed call per sample gives plausible per-call times."""
    prepared = workloads.gemm(64, 256, 256, "float32").prepare("cpu")
    slow = workloads.gemm(64, 1024, 1024, "float32").prepare("cpu")
    config = timing.TimingConfig(samples=9, trials=2, warmup_s=0.0, min_warmup_calls=2)
    t = timing.measure_interleaved({"small": prepared.fn, "big": slow.fn}, "cpu", config,
                                   FlushingClock([]))
    assert 0 < t["small"].median < t["big"].median < 1.0


def test_default_clock_follows_the_device():
    assert type(timing.clock_for("cpu", FAST)) is timing.Clock
    assert timing.CudaClock.batches is False and timing.Clock.batches is True


def test_device_specific_code_is_only_the_cuda_clock():
    """Every use of torch.cuda in the timing module sits in CudaClock or the L2 buffer."""
    tree = ast.parse(inspect.getsource(timing))
    allowed = {"CudaClock", "_l2_buffer", "is_cuda"}
    offenders = [node.name for node in tree.body
                 if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name not in allowed
                 and "cuda" in ast.unparse(node).replace("is_cuda", "").replace("CudaClock", "")]
    assert offenders == []


def test_cuda_clock_calls_exist_in_this_torch():
    """The lines no CPU can run call API that exists under these names and signatures."""
    params = inspect.signature(torch.cuda.Event).parameters
    assert "enable_timing" in params
    for attr in ("record", "elapsed_time"):
        assert callable(getattr(torch.cuda.Event, attr))
    for fn in ("synchronize", "current_device", "get_device_properties"):
        assert callable(getattr(torch.cuda, fn))
    src = inspect.getsource(timing.CudaClock) + inspect.getsource(timing._l2_buffer)
    for used in ("Event(enable_timing=True)", ".record()", ".elapsed_time(", ".synchronize()",
                 "get_device_properties(", "L2_cache_size", ".zero_()"):
        assert used in src


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_clock_times_a_kernel():
    """On a GPU machine: the CUDA clock's events see a kernel (never runs on CPU CI)."""
    work = workloads.gemm(2048, 2048, 2048, "float16").prepare("cuda")
    t = timing.measure(work.fn, "cuda", FAST)
    assert 0 < t.median < 0.1
    start = time.perf_counter()
    work.fn()
    torch.cuda.synchronize()
    assert t.median < (time.perf_counter() - start) * 10
