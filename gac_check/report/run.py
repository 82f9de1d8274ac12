"""The run document (schema ``gac-check-run/1``): everything one run of gac-check produced.

HTML reports render from this JSON-able dict, never from live objects, so a report can be
rebuilt from a saved file and runs from several machines (an A100 job and an H100 job) can be
merged side by side. One run holds:

``label``        what the run is called in a merged report: the report's file name stem
``created``      ISO-8601 UTC time the run finished
``fail_on``      the severity that fails the gate ("error", "warning", "refused", "fallback",
                 "never"; the middle two gate on the --target verdicts alone)
``environment``  the fingerprint of the machine that ran it (:func:`environment`)
``checks``       ``gac-check/1`` objects, one per checked model directory
``tests``        pytest outcomes: counts and the non-passing tests (empty for the CLI)
``perf``         performance verdicts (records shaped as :mod:`gac_check.plugin.collect` says)
``equivalence``  failing property tests with hypothesis' example and a reproduce command
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from gac_check.checkpoint.files import read_json
from gac_check.contract.rules import FAIL_ON
from gac_check.errors import BadInput
from gac_check.report.json_report import SCHEMA as CHECK_SCHEMA

RUN_SCHEMA = "gac-check-run/1"
READABLE = (CHECK_SCHEMA, RUN_SCHEMA)


def new_run(checks: list[dict], *, label: str, fail_on: str = "error",
            tests: dict | None = None, perf: list[dict] | None = None,
            equivalence: list[dict] | None = None) -> dict:
    """A run document for this machine, now."""
    return {
        "schema": RUN_SCHEMA,
        "label": label,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "fail_on": fail_on,
        "environment": environment(),
        "checks": checks,
        "tests": tests or {"counts": {}, "failures": []},
        "perf": perf or [],
        "equivalence": equivalence or [],
    }


def environment() -> dict:
    """The machine and software versions behind a run: what a reviewer needs to trust timings.

    Versions come from package metadata so a plain CLI check does not pay for importing torch;
    the CUDA device is probed only when torch is already loaded (pytest runs, benchmarks).
    """
    from importlib import metadata  # only where a run document is written

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count() or 0,
    }
    for dist in ("gac-check", "torch", "transformers", "safetensors", "hypothesis",
                 "flash-attn"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    env.update(_cuda_fingerprint())
    return env


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cuda_fingerprint() -> dict:
    torch = sys.modules.get("torch")
    if torch is None:
        return {"device": "not probed (torch not loaded)"}
    if not torch.cuda.is_available():
        return {"device": "cpu (no CUDA device)"}
    major, minor = torch.cuda.get_device_capability(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "compute_capability": f"{major}.{minor}",
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()),
        "devices": torch.cuda.device_count(),
    }


def load_run(path: Path) -> dict:
    """Read a saved run (or a bare ``gac-check --format json`` object) and validate its shape.

    A bare check object becomes a one-check run whose environment is unknown. Anything whose
    schema this version does not read, or whose structure is broken, is a BadInput naming the
    file, because a merge must never render half of someone's results as if they were all.
    The file is read through :func:`~gac_check.checkpoint.files.read_json`: a FIFO, a nesting
    bomb or a 5,000-digit integer is refused there, in one line.
    """
    data = read_json(path)
    schema = data.get("schema")
    if schema not in READABLE:
        raise BadInput(f"schema {schema!r} is not one this gac-check reads "
                       f"({', '.join(READABLE)})", path)
    if schema == CHECK_SCHEMA:
        _validate_check(data, path, "")
        run = new_run([data], label=Path(path).stem)
        run["environment"] = {"recorded": "no (a bare gac-check --format json object)"}
        run["created"] = None
        return run
    _validate_run(data, path)
    return data


def _validate_run(run: dict, path: Path) -> None:
    _expect(run, "label", str, path, "")
    _expect(run, "fail_on", str, path, "")
    if run["fail_on"] not in FAIL_ON:
        raise BadInput(f"fail_on must be one of {', '.join(FAIL_ON)}", path)
    _expect(run, "environment", dict, path, "")
    _expect(run, "checks", list, path, "")
    _expect(run, "tests", dict, path, "")
    _expect(run, "perf", list, path, "")
    _expect(run, "equivalence", list, path, "")
    for i, check in enumerate(run["checks"]):
        if not isinstance(check, dict) or check.get("schema") != CHECK_SCHEMA:
            raise BadInput(f"checks[{i}] is not a {CHECK_SCHEMA} object", path)
        _validate_check(check, path, f"checks[{i}].")
    counts = run["tests"].get("counts", {})
    if not isinstance(counts, dict):
        raise BadInput("tests.counts is not an object", path)
    for key in counts:
        _optional(counts, key, INT, path, "tests.counts.")
    _optional(run["tests"], "failures", (list,), path, "tests.")
    for i, rec in enumerate(run["tests"].get("failures") or []):
        if not isinstance(rec, dict):
            raise BadInput(f"tests.failures[{i}] is not an object", path)
    for i, rec in enumerate(run["perf"]):
        if not isinstance(rec, dict) or not isinstance(rec.get("case"), str):
            raise BadInput(f"perf[{i}] has no case key", path)
        for key, kinds in PERF_FIELDS.items():
            _optional(rec, key, kinds, path, f"perf[{i}].")
    for i, rec in enumerate(run["equivalence"]):
        if not isinstance(rec, dict) or not isinstance(rec.get("nodeid"), str):
            raise BadInput(f"equivalence[{i}] has no nodeid", path)
    fix = run.get("fix")
    if fix is not None and not isinstance(fix, dict):
        raise BadInput("fix is not an object", path)
    if fix and fix.get("quality") is not None:
        _validate_quality(fix["quality"], path)


def _validate_quality(q: object, path: Path) -> None:
    """A realign's ``fix.quality`` (:meth:`gac_check.ranks.kept.Kept.to_json`), which the
    report charts: every number it draws present and a number."""
    where = "fix.quality."
    if not isinstance(q, dict):
        raise BadInput("fix.quality is not an object", path)
    _expect(q, "objective", str, path, where)
    _expect(q, "budget", int, path, where)
    _expect(q, "choices", list, path, where)
    _expect(q, "totals", dict, path, where)
    _expect(q, "matrices", list, path, where)
    choices = q["choices"]
    if not all(isinstance(c, str) for c in choices):
        raise BadInput(f"{where}choices are not all strings", path)
    for c in choices:
        total = q["totals"].get(c)
        if not isinstance(total, dict):
            raise BadInput(f"{where}totals has no {c!r}", path)
        for key, kind in (("params", int), ("kept", float), ("energy", float)):
            _number(total, key, kind, path, f"{where}totals.{c}.")
    for i, mat in enumerate(q["matrices"]):
        here = f"{where}matrices[{i}]."
        if not isinstance(mat, dict):
            raise BadInput(f"{where}matrices[{i}] is not an object", path)
        _expect(mat, "module", str, path, here)
        _number(mat, "energy", float, path, here)
        for field_, kind in (("ranks", None), ("kept", float), ("params", int)):
            _expect(mat, field_, dict, path, here)
            for c in choices:
                if kind is None:
                    rank = mat[field_].get(c)
                    if not (isinstance(rank, str) or (isinstance(rank, int)
                                                      and not isinstance(rank, bool))):
                        raise BadInput(f"{here}ranks.{c} is missing or not a rank", path)
                else:
                    _number(mat[field_], c, kind, path, f"{here}{field_}.")
    if q.get("output") is not None:
        _validate_output(q, path)
    if q.get("model_output") is not None:
        _validate_model_output(q, path)


def _validate_model_output(q: dict, path: Path) -> None:
    """``fix.quality.model_output``: the whole model's figures per choice."""
    where = "fix.quality.model_output."
    mo = q["model_output"]
    if not isinstance(mo, dict):
        raise BadInput("fix.quality.model_output is not an object", path)
    _expect(mo, "inputs", str, path, where)
    for key in ("lines", "tokens"):
        _number(mo, key, int, path, where)
    for key in ("relative", "cosine"):
        _expect(mo, key, dict, path, where)
        for c in q["choices"]:
            _number(mo[key], c, float, path, f"{where}{key}.")


def _validate_output(q: dict, path: Path) -> None:
    """``fix.quality.output`` and each matrix's ``output_error``: what the output-error panel
    draws, a number per choice."""
    where = "fix.quality.output."
    out = q["output"]
    if not isinstance(out, dict):
        raise BadInput("fix.quality.output is not an object", path)
    _expect(out, "inputs", str, path, where)
    _number(out, "rows", int, path, where)
    _expect(out, "mean", dict, path, where)
    for c in q["choices"]:
        _number(out["mean"], c, float, path, f"{where}mean.")
    for i, mat in enumerate(q["matrices"]):
        here = f"fix.quality.matrices[{i}]."
        _expect(mat, "output_error", dict, path, here)
        for c in q["choices"]:
            _number(mat["output_error"], c, float, path, f"{here}output_error.")


def _number(obj: dict, key: str, kind: type, path: Path, where: str) -> None:
    """``obj[key]`` a finite number (an int where ``kind`` is int; never a bool)."""
    value = obj.get(key)
    kinds = (int,) if kind is int else (int, float)
    if (not isinstance(value, kinds) or isinstance(value, bool)
            or not math.isfinite(value)):
        raise BadInput(f"{where}{key} is missing or not a finite number", path)


def _validate_check(check: dict, path: Path, where: str) -> None:
    _expect(check, "model_dir", str, path, where)
    _expect(check, "hardware", dict, path, where)
    _expect(check["hardware"], "profile", str, path, f"{where}hardware.")
    _expect(check, "sites", list, path, where)
    _expect(check, "summary", dict, path, where)
    _optional(check, "model_path", (str,), path, where)
    for i, site in enumerate(check["sites"]):
        here = f"{where}sites[{i}]."
        if not isinstance(site, dict):
            raise BadInput(f"{where}sites[{i}] is not an object", path)
        _expect(site, "name", str, path, here)
        _expect(site, "value", int, path, here)
        _expect(site, "aligned", bool, path, here)
        for key, kinds in SITE_FIELDS.items():
            _optional(site, key, kinds, path, here)
        for j, rule in enumerate(site.get("rules") or []):
            if not isinstance(rule, str):
                raise BadInput(f"{here}rules[{j}] is not str", path)
    for key, kinds in SUMMARY_FIELDS.items():
        _optional(check["summary"], key, kinds, path, f"{where}summary.")


def _expect(obj: dict, key: str, kind: type, path: Path, where: str) -> None:
    value = obj.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadInput(f"{where}{key} is missing or not {kind.__name__}", path)


#: The types the report reads a field as, where the field may be absent or null. A bool is
#: not a number here (``True`` would count as 1 error), nor is a numeric string ("0" is truthy:
#: a run with "0" failed tests would be drawn as failing).
INT = (int,)
NUMBER = (int, float)
SITE_FIELDS = {"layer": INT, "severity": (str,), "repair_to": INT, "optimal_to": INT,
               "padding_params": INT, "refusal": (str,), "role": (str,), "rules": (list,),
               "expected_slowdown": NUMBER, "slowdown": (dict,), "exact_repair": (bool,)}
SUMMARY_FIELDS = {"sites": INT, "misaligned": INT, "errors": INT, "warnings": INT,
                  "params": INT, "misaligned_fraction": NUMBER,
                  "repair_overhead_fraction": NUMBER}
PERF_FIELDS = {"measured_ms": NUMBER, "measured_iqr_ms": NUMBER, "baseline_ms": NUMBER,
               "baseline_iqr_ms": NUMBER, "ratio": NUMBER, "delta": NUMBER,
               "p_value": NUMBER, "tflops": NUMBER, "samples": INT, "verdict": (str,),
               "reason": (str,), "device": (str,), "dim": (str,), "baseline_source": (str,)}


def _optional(obj: dict, key: str, kinds: tuple[type, ...], path: Path, where: str) -> None:
    """``obj[key]`` absent, null, or one of ``kinds`` (never a bool where a number goes)."""
    value = obj.get(key)
    if value is None:
        return
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BadInput(f"{where}{key} is {type(value).__name__}, not {names}", path)


def check_writable(path: Path) -> Path:
    """Refuse an output that is a directory or a link loop, or whose nearest existing ancestor
    is not a directory, before any work or writing starts. Missing directories are fine: the
    writer creates them (a CI job's ``reports/`` does not exist in a fresh clone)."""
    path = Path(path)
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # Python 3.11 reports a link loop as RuntimeError
        raise BadInput("is a symlink loop", path) from None
    if path.is_dir():
        raise BadInput("is a directory, not a file", path)
    ancestor = next(p for p in resolved.parents if p.exists())
    if not ancestor.is_dir():
        raise BadInput(f"cannot be created: {ancestor} is not a directory", path)
    return path


def dumps(run: dict) -> str:
    return json.dumps(run, indent=2, sort_keys=False) + "\n"
