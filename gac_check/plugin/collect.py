"""Result collection for ``pytest --gac-report FILE.html``.

Collection runs only where the whole session is visible: the xdist controller (or the single
process without xdist). Workers need nothing special: their test reports, including each
test's ``user_properties``, are serialised to the controller, which receives them through
``pytest_runtest_logreport`` like its own.

The interface for performance tests (the ``gac_bench`` fixture) is one call::

    from gac_check.plugin.collect import perf_record, record_perf
    record_perf(request.node, perf_record(measurement, verdict, stored, device="cuda:0"))

``record_perf`` appends ``("gac_perf", record)`` to the test's ``user_properties``; a record is
a plain JSON-able dict (so it survives xdist's serialisation and a saved run file)::

    case            canonical case key, e.g. "sdpa/B=4,S=2048,H=32,D=107,dtype=float16"
    dim             optional: the case parameter swept on the staircase's x axis ("D");
                    default: the one numeric parameter that varies within the workload
    device          the device measured on
    measured_ms     median latency now;  measured_iqr_ms: its IQR;  samples: how many
    baseline_ms     the stored median (None: no baseline);  baseline_iqr_ms: its IQR
    baseline_source "measured" or "published"
    basis           what the verdict compares: "relative" (the case's time over the reference
                    kernel's, trial by trial) or "absolute" (seconds; published baselines)
    reference       the reference kernel's case key (relative basis)
    measured_rel    median per-trial ratio now;  measured_rel_iqr: its IQR;  trials: how many
    baseline_rel    the stored median ratio;  baseline_rel_iqr: its IQR
    ratio, delta    on the basis: measured / baseline, and ratio - 1 (None without a baseline)
    p_value         the comparison test's p-value (None when it could not run)
    verdict         a gac_check.bench.stats status: "regressed", "improved", "unchanged",
                    "no baseline", "recorded" (--gac-update-baselines; baseline_path says where)
    reason          the verdict's explanation
    nodeid          filled in by the collector
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gac_check.plugin.options import OPTION_GPU, OPTION_MODEL, OPTION_REPORT, OPTION_TARGET

PERF_PROPERTY = "gac_perf"
EXAMPLE_START = re.compile(r"^(Falsifying (?:explicit )?example|Failing test case): ")
DECORATOR = re.compile(r"@reproduce_failure\('[^']*', b'[^']*'\)")
SEED = re.compile(r"--hypothesis-seed=(-?\d+)")
ERROR_PREFIX = re.compile(r"^E {0,7}")


def record_perf(node: pytest.Item, record: dict) -> None:
    """Attach one performance verdict to a test so the report (and xdist) carries it."""
    node.user_properties.append((PERF_PROPERTY, record))


def perf_record(measurement, verdict, stored=None, device: str = "",
                dim: str | None = None, baseline_path: str | None = None) -> dict:
    """A record from :class:`gac_check.bench.baselines.Measurement` objects and a stats Verdict."""
    from gac_check.bench import stats

    rel = getattr(measurement, "relative", None)
    stored_rel = getattr(stored, "relative", None) if stored is not None else None
    relative = bool(rel) and (stored is None or bool(stored_rel))
    rec = {
        "basis": "relative" if relative else "absolute",
        "case": measurement.case,
        "device": device,
        "backend": getattr(measurement, "backend", None),
        "measured_ms": measurement.median_s * 1e3,
        "measured_iqr_ms": measurement.iqr_s * 1e3,
        "samples": len(measurement.samples),
        "tflops": getattr(measurement, "tflops", None),
        "baseline_ms": stored.median_s * 1e3 if stored is not None else None,
        "baseline_iqr_ms": (stored.iqr_s * 1e3 if stored is not None and stored.iqr_s is not None
                            else None),
        "baseline_source": stored.provenance.kind if stored is not None else None,
        "ratio": verdict.ratio,
        "delta": verdict.ratio - 1 if verdict.ratio is not None else None,
        "p_value": verdict.p_value,
        "verdict": verdict.status,
        "reason": verdict.reason,
    }
    if relative:
        rec.update({
            "reference": measurement.reference,
            "measured_rel": stats.median(rel), "measured_rel_iqr": stats.iqr(rel),
            "trials": len(rel),
            "baseline_rel": stats.median(stored_rel) if stored_rel else None,
            "baseline_rel_iqr": stats.iqr(stored_rel) if stored_rel else None,
        })
    if baseline_path is not None:
        rec["baseline_path"] = baseline_path
    if dim is not None:
        rec["dim"] = dim
    return rec


def hypothesis_failure(text: str) -> dict | None:
    """hypothesis' falsifying examples and reproduce hints from a failure's long report."""
    lines = [ERROR_PREFIX.sub("", line) for line in text.splitlines()]
    examples, i = [], 0
    while i < len(lines):
        if not EXAMPLE_START.match(lines[i]):
            i += 1
            continue
        block = [lines[i]]
        i += 1
        if block[0].rstrip().endswith("("):  # multi-line: arguments, then ")" on its own
            while i < len(lines) and block[-1].rstrip() != ")":
                block.append(lines[i])
                i += 1
        examples.append("\n".join(block))
    if not examples:
        return None
    decorator = DECORATOR.search(text)
    seed = SEED.search(text)
    return {"examples": examples, "decorator": decorator.group(0) if decorator else None,
            "seed": seed.group(1) if seed else None}


def reproduce_command(config: pytest.Config, nodeid: str, seed: str | None) -> str:
    """The command that reruns one test the way this session ran it, from pytest's rootdir
    (node ids are relative to it; the report says so): paths relative to it, never the
    absolute paths of the machine that ran the session."""
    from gac_check.report.paths import shown

    words = ["python", "-m", "pytest", nodeid]
    gpu = config.getoption(OPTION_GPU)
    if gpu:
        words += [OPTION_GPU, gpu]
    for model in config.getoption(OPTION_MODEL):
        words += [OPTION_MODEL, shown(str(Path(model).resolve()), str(config.rootpath))]
    if seed is not None:
        words.append(f"--hypothesis-seed={seed}")
    profile = _hypothesis_profile()
    env = f"HYPOTHESIS_PROFILE={shlex.quote(profile)} " if profile else ""
    return env + " ".join(shlex.quote(w) for w in words)


def _hypothesis_profile() -> str | None:
    from hypothesis import settings

    name = getattr(settings, "get_current_profile_name", lambda: None)()
    return name if name and name != "default" else None


@dataclass
class ReportCollector:
    """Registered on the controller when ``--gac-report`` is given; writes the report at the
    end of the session."""

    config: pytest.Config
    path: Path
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)
    equivalence: list[dict] = field(default_factory=list)
    perf: list[dict] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _outcome(report)
        if outcome is not None:
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if report.failed:
            self._failure(report)
        if report.when == "teardown":  # the last report carries every property the test set
            for name, value in report.user_properties:
                if name == PERF_PROPERTY and isinstance(value, dict):
                    self.perf.append({**value, "nodeid": report.nodeid})

    def _failure(self, report: pytest.TestReport) -> None:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else report.longreprtext
        message = message.strip().splitlines()[0] if message.strip() else "failed"
        hyp = hypothesis_failure(report.longreprtext)
        self.failures.append({"nodeid": report.nodeid, "when": report.when,
                              "message": message, "equivalence": hyp is not None})
        if hyp is not None:
            self.equivalence.append({
                "nodeid": report.nodeid, "message": message, "examples": hyp["examples"],
                "decorator": hyp["decorator"],
                "reproduce": reproduce_command(self.config, report.nodeid, hyp["seed"])})

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from gac_check.checkpoint.atomic import write_atomic
        from gac_check.report.html import render_html
        from gac_check.report.run import dumps, new_run

        run = new_run(self._checks(), label=self.path.stem, fail_on="never",
                      tests={"counts": self.counts, "failures": self.failures},
                      perf=self.perf, equivalence=self.equivalence)
        html, data = render_html([run]), dumps(run)
        write_atomic(self.path, html)
        write_atomic(self.path.with_suffix(".json"), data)
        self.written = [self.path, self.path.with_suffix(".json")]

    def _checks(self) -> list[dict]:
        """The alignment map of every ``--model``: header-only, so cheap at session end."""
        from gac_check.api import check
        from gac_check.errors import BadInput
        from gac_check.report.json_report import to_json

        gpu = self.config.getoption(OPTION_GPU) or "auto"
        targets = self.config.getoption(OPTION_TARGET) or []
        checks = []
        for model in self.config.getoption(OPTION_MODEL):
            try:
                checks.append(to_json(check(model, gpu, None, targets)))
            except BadInput as exc:
                self.failures.append({"nodeid": f"--model {model}", "when": "check",
                                      "message": str(exc), "equivalence": False})
        return checks

    def pytest_terminal_summary(self, terminalreporter) -> None:
        for path in self.written:
            terminalreporter.write_line(f"gac-check report: {path}")


def _outcome(report: pytest.TestReport) -> str | None:
    """One outcome per test: the call's, or the setup's when setup did not pass."""
    if hasattr(report, "wasxfail"):
        if report.when == "call" or report.skipped:
            return "xfailed" if report.skipped else "xpassed"
        return None
    if report.when == "call":
        return report.outcome
    if report.when == "setup" and not report.passed:
        return "error" if report.failed else "skipped"
    if report.when == "teardown" and report.failed:
        return "error"
    return None


def register(config: pytest.Config) -> None:
    """Install the collector on the process that sees the whole session."""
    from gac_check.errors import BadInput
    from gac_check.report.run import check_writable

    value = config.getoption(OPTION_REPORT)
    if not value or hasattr(config, "workerinput"):
        return
    path = Path(value)
    try:
        check_writable(path)
    except BadInput as exc:  # a usage error, reported before any test runs
        raise pytest.UsageError(f"{OPTION_REPORT}: {exc}") from None
    if path.suffix.lower() not in (".html", ".htm"):
        raise pytest.UsageError(f"{OPTION_REPORT}: {path}: give a .html file name (the run "
                                "JSON is written beside it)")
    config.pluginmanager.register(ReportCollector(config, path), "gac-check-report")

