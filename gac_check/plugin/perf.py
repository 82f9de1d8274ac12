"""The perf side of the pytest plugin: where perf tests measure, against which baseline, and how.

Decisions (docs/measuring.md explains them to users):

* Perf tests measure on the device present. ``--gpu a100|h100|h200|gpu`` asks to measure on
  that GPU; where it is absent every perf test is SKIPPED with one reason naming what is
  present, and everything else (structure, equivalence, knapsack suites under that GPU's
  contract) runs as usual, so ``pytest suites/ --gpu h100`` is green on a laptop. ``--gpu cpu``
  measures on the CPU; ``auto`` on whatever is present.
* A baseline is used only when its fingerprint matches this device. No file for the device, a
  file from another device, or a case missing from the file all give "no baseline": the test is
  SKIPPED with that reason (never passed). A corrupted or wrong-schema file is an error naming it.
* A regression case is timed trial by trial against a reference kernel of its own family at an
  aligned size (SDPA at head_dim 128, a low-rank pair at rank 128, a GEMM against one aligned
  GEMM; ``workloads.reference_for``) in the same process, and what is stored and compared is
  the case's time *relative to the reference* in each trial: a busy runner slows both, so the
  ratio holds where absolute times moved 1.3-3x (benchmarks/bench_trust.py measures it). The
  verdict is asv's: the relative time is more than ``factor`` above the baseline's AND
  significantly so (Mann-Whitney on the per-trial ratios), in 36 trials, and a case that looks
  regressed is measured again (freshly prepared) and fails only if that second look is
  regressed too (``stats.confirm``). Within a trial a CPU contributes its minimum (interference
  only adds time), a GPU its median. Baselines without ratios (published figures, old files)
  are compared on absolute times. The factor defaults to ``gac_check.profiles``'
  GPU_PERF_FACTOR or CPU_PERF_FACTOR; ``--gac-perf-factor`` overrides it.
* ``--gac-update-baselines`` records every regression case measured (two looks pooled), passes
  it as "recorded" and lists what it stored in the terminal summary; each worker merges its
  cases into the device's file under a lock (an ``flock`` on the directory: nothing but the
  baseline is left in the repository) at the end of its session.
"""
from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass, field

import pytest

from gac_check.bench.device import Device, measuring
from gac_check.errors import HardwareMissing, Unsupported
from gac_check.plugin.options import OPTION_GPU, OPTION_PERF_FACTOR, OPTION_UPDATE_BASELINES
from gac_check.profiles import CPU_PERF_FACTOR, GPU_PERF_FACTOR, cuda_profile

#: The statistic compared on a CPU: the minimum (interference only adds time); GPUs: median.
CPU_Q, GPU_Q = 0.0, 0.5
#: Regression cases: many short trials, each giving one case/reference ratio. 36 trials: on
#: the 2-core CI machine under load 5-6 the median of 12 trial ratios moved up to 1.9x (a
#: burst covering the whole look), of 36 at most 3.5% (benchmarks/RESULTS.md, perf gate).
RELATIVE_CONFIG = dict(samples=5, trials=36)
#: Fail a case only when a second, freshly prepared look is regressed as well.
SECOND_LOOK = True


def perf_target(requested: str | None) -> Device:
    """The device perf tests measure on, and its baseline key (bench.device.measuring)."""
    try:
        return measuring(requested)
    except HardwareMissing as exc:
        raise HardwareMissing(f"perf tests: {exc} (run them there, or with --gpu cpu/auto "
                              "here)") from None


def relative_times(case: list[float], reference: list[float], per_trial: int,
                   q: float) -> list[float]:
    """Per trial, the case's ``q`` quantile over the reference's (samples are stored trial by
    trial, ``per_trial`` each); on a CPU (q=0, minima) only the trials in which both kernels
    ran clean (``stats.trial_ratios``)."""
    from gac_check.bench import stats

    chunks = range(0, len(case), per_trial)
    return stats.trial_ratios([case[i:i + per_trial] for i in chunks],
                              [reference[i:i + per_trial] for i in chunks], q,
                              stats.CLEAN_TRIAL if q == CPU_Q else None)


# --------------------------------------------------------------------------------- hooks
def collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests without CUDA, and perf tests when the device ``--gpu`` asks to
    measure on is absent, each with the reason; every other test runs."""
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    perf_items = [i for i in items if i.get_closest_marker("perf")]
    if not (gpu_items or perf_items):
        return
    if gpu_items and cuda_profile() is None:
        skip = pytest.mark.skip(reason="needs a CUDA device; none is present")
        for item in gpu_items:
            item.add_marker(skip)
    try:
        perf_target(config.getoption(OPTION_GPU))
    except HardwareMissing as exc:
        skip = pytest.mark.skip(reason=f"gac-check: {exc}")
        for item in perf_items:
            item.add_marker(skip)


@dataclass
class Session:
    """Per-process perf state: the target, its baseline, and what to store at the end."""

    target: Device
    factor: float
    update: bool
    q: float
    recorded: list = field(default_factory=list)
    _baseline: object = None
    _refused: str | None = None

    def baseline(self):
        """The matching Baseline, or None with ``refused`` saying why."""
        from gac_check.bench import baselines
        from gac_check.errors import BadInput

        if self._baseline is None and self._refused is None:
            path = self.path()
            present = baselines.present_fingerprint(self.target.kind)
            if not path.exists():
                self._refused = (f"no baseline for this device: {path} does not exist "
                                 "(record it with --gac-update-baselines)")
                return None
            loaded = baselines.load(path)  # corrupted / wrong schema: BadInput, an error
            try:
                baselines.check_fingerprint(loaded, present)
            except BadInput as exc:
                self._refused = f"no matching baseline: {exc}"
                return None
            self._baseline = loaded
        return self._baseline

    @property
    def refused(self) -> str | None:
        self.baseline()
        return self._refused

    def path(self):
        from gac_check.bench import baselines

        return baselines.path_for(self.target.key)

    def record_note(self, m) -> str:
        """What ``--gac-update-baselines`` stores for ``m``, in words."""
        from gac_check.bench import stats

        what = (f"{stats.median(m.relative):.4g}x the time of {m.reference} (median of "
                f"{len(m.relative)} trials)" if m.relative else "")
        return "; ".join(filter(None, [
            f"recorded into {self.path()} at the end of the session", what,
            f"absolute {m.median_s * 1e3:.4g} ms ({len(m.samples)} samples)"]))


def make_session(config: pytest.Config) -> Session:
    try:
        target = perf_target(config.getoption(OPTION_GPU))
    except HardwareMissing as exc:  # a test using gac_bench without the perf marker
        pytest.skip(f"gac-check: {exc}")
    factor = config.getoption(OPTION_PERF_FACTOR) or (
        GPU_PERF_FACTOR if target.kind == "cuda" else CPU_PERF_FACTOR)
    q = GPU_Q if target.kind == "cuda" else CPU_Q
    return Session(target, factor, bool(config.getoption(OPTION_UPDATE_BASELINES)), q)


class Bench:
    """What ``gac_bench`` hands a test: measure workloads, or check one against the baseline."""

    def __init__(self, session: Session, node: pytest.Item) -> None:
        self.session, self.node = session, node

    @property
    def device(self) -> str:
        return self.session.target.kind

    def _prepare_check(self, works):
        for w in works:
            try:
                w.prepare(self.device)
            except Unsupported as exc:
                pytest.skip(f"{w.key}: {exc}")

    def measure(self, work, config=None):
        return self.interleaved([work], config)[0]

    def interleaved(self, works, config=None):
        """Measure several workloads trial by trial in turn (for within-test comparisons)."""
        from gac_check.bench import timing
        from gac_check.bench.kernels import run_interleaved

        self._prepare_check(works)
        return run_interleaved(works, self.device, config or timing.DEFAULT_CONFIG,
                               _command(), with_peak=True)

    def relative(self, work, config=None):
        """Time ``work`` trial by trial against the reference kernel; the Measurement carries
        both its seconds and, per trial, its time relative to the reference."""
        from gac_check.bench import timing, workloads

        ref = workloads.reference_for(work, self.device)
        config = config or timing.TimingConfig(**RELATIVE_CONFIG)
        m, r = self.interleaved([work, ref], config)
        ratios = relative_times(m.samples, r.samples, config.samples, self.session.q)
        return dataclasses.replace(m, reference=ref.key, relative=ratios)

    def regression(self, work, config=None):
        """Measure relative to the reference kernel and compare with the baseline: skip on "no
        baseline", fail on a regression that a second, freshly prepared look confirms. With
        ``--gac-update-baselines``: measure two looks, record them, pass ("recorded").
        Returns the Verdict."""
        from gac_check.bench import stats
        from gac_check.plugin.collect import perf_record, record_perf

        m = self.relative(work, config)
        if self.session.update:
            m = pooled(m, self.relative(work, config))
            self.session.recorded.append(m)
            verdict = stats.Verdict(stats.RECORDED, factor=self.session.factor,
                                    reason=self.session.record_note(m))
            record_perf(self.node, perf_record(m, verdict, None, device=self.device,
                                               baseline_path=str(self.session.path())))
            return verdict
        base = self.session.baseline()
        if base is None:
            verdict = stats.Verdict(stats.NO_BASELINE, factor=self.session.factor,
                                    reason=self.session.refused or "")
            stored = None
        else:
            verdict = base.compare(m, self.session.factor, q=self.session.q)
            stored = base.get(m.case)
            if verdict.regressed and m.relative and SECOND_LOOK:
                again = self.relative(work, config)
                both = pooled(m, again)
                verdict = stats.confirm(verdict,
                                        base.compare(again, self.session.factor,
                                                     q=self.session.q),
                                        base.compare(both, self.session.factor,
                                                     q=self.session.q))
                m = both if verdict.regressed else again
        record_perf(self.node, perf_record(m, verdict, stored, device=self.device))
        if verdict.status == stats.NO_BASELINE:
            pytest.skip(f"{m.case}: no baseline: {verdict.reason}")
        if verdict.regressed:
            pytest.fail(f"{m.case} regressed on {self.session.target.key}: "
                        f"{verdict.describe()}", pytrace=False)
        return verdict


def pooled(a, b):
    """Two looks at one case as one Measurement: samples and per-trial ratios joined."""
    from gac_check.bench import stats

    samples = [*a.samples, *b.samples]
    return dataclasses.replace(a, samples=samples, median_s=stats.median(samples),
                               iqr_s=stats.iqr(samples),
                               relative=[*(a.relative or []), *(b.relative or [])] or None)


def _command() -> str:
    return "pytest " + shlex.join(sys.argv[1:]) if sys.argv else "pytest"


def terminal_summary(reporter) -> None:
    """Under ``--gac-update-baselines``: one line per case recorded (on the xdist controller
    too: the records travel in the tests' user_properties)."""
    from gac_check.bench import stats
    from gac_check.plugin.collect import PERF_PROPERTY

    recs = [v for outcome in ("passed",) for rep in reporter.stats.get(outcome, [])
            for k, v in getattr(rep, "user_properties", ()) if k == PERF_PROPERTY
            and v.get("verdict") == stats.RECORDED]
    if not recs:
        return
    paths = sorted({r.get("baseline_path") or "" for r in recs})
    reporter.write_sep("-", f"gac-check: {len(recs)} baseline case(s) recorded into "
                            f"{', '.join(paths)}")
    for r in recs:
        rel = (f"{r['measured_rel']:.4g}x {r['reference']}" if r.get("measured_rel")
               else "absolute only")
        reporter.write_line(f"recorded {r['case']}: {rel}; {r['measured_ms']:.4g} ms")


def session_finish(session: Session | None) -> None:
    """``--gac-update-baselines``: merge this process's cases into the device's file."""
    if session is None or not session.update or not session.recorded:
        return
    from gac_check.bench import baselines
    from gac_check.bench.peak import peak

    t = session.target
    baselines.update(baselines.path_for(t.key), t.key, baselines.present_fingerprint(t.kind),
                     session.recorded, peak(t.kind).as_dict())
