"""Time kernels: run workloads on a device and turn their timings into :class:`Measurement`s.

(The run *document*, what a check or a test session leaves behind, is
:mod:`gac_check.report.run`.)
"""
from __future__ import annotations

from gac_check.bench import timing
from gac_check.bench.baselines import Measurement, Provenance
from gac_check.bench.device import present
from gac_check.bench.peak import peak
from gac_check.bench.workloads import Prepared, Workload


def to_measurement(work: Workload, prepared: Prepared, t: timing.Timing, device: str,
                   command: str, with_peak: bool = True) -> Measurement:
    dtype = str(work.params.get("dtype", "float32"))  # a CPU's peak in the process's dtype
    peak_tflops = peak(device, dtype).tflops if with_peak else None
    return Measurement.from_samples(work.key, t.samples, Provenance.measured(command),
                                    work.flops, peak_tflops, prepared.backend)


def run(work: Workload, device: str | None = None,
        config: timing.TimingConfig = timing.DEFAULT_CONFIG, command: str = "",
        with_peak: bool = True) -> Measurement:
    """Time one workload. Raises workloads.Unsupported when the device refuses it."""
    device = device or present().kind
    prepared = work.prepare(device)
    t = timing.measure(prepared.fn, device, config)
    return to_measurement(work, prepared, t, device, command, with_peak)


def run_interleaved(works: list[Workload], device: str | None = None,
                    config: timing.TimingConfig = timing.DEFAULT_CONFIG, command: str = "",
                    with_peak: bool = True) -> list[Measurement]:
    """Time several workloads trial by trial in turn (for comparisons within one test)."""
    device = device or present().kind
    prepared = {w.key: (w, w.prepare(device)) for w in works}
    times = timing.measure_interleaved({k: p.fn for k, (_, p) in prepared.items()}, device,
                                       config)
    return [to_measurement(w, p, times[k], device, command, with_peak)
            for k, (w, p) in prepared.items()]
