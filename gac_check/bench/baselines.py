"""Stored per-hardware measurements: ``baselines/<profile>.json``.

A baseline is only meaningful on the machine that produced it, so every file carries the
hardware fingerprint and loading it for a different device is refused (a version drift of the
software stack is only warned: that is exactly what the regression suite is for). Files are
versioned; an older schema is upgraded through explicit, ordered migrations, a newer or unknown
one is refused with the file's name. Writes go to a temporary sibling and are renamed into place
under an exclusive ``fcntl`` lock, so several pytest-xdist workers updating the same profile
merge their cases instead of overwriting each other.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gac_check.bench import stats
from gac_check.checkpoint.atomic import locked, write_atomic
from gac_check.errors import BadInput
from gac_check.profiles import cpu_isa, cpu_name, driver_version

SCHEMA = "gac-check-baseline"
VERSION = 2


def _v1_to_v2(doc: dict) -> dict:
    """Version 2 adds a case's optional ``reference`` and ``relative`` (times relative to a
    reference kernel measured in the same trials); a version-1 case has neither."""
    return doc


#: ``MIGRATIONS[n]`` turns a version-n document into version n+1. Add one whenever VERSION
#: grows; loading walks the chain, so every old file keeps loading.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2}
#: Fields whose difference means a different device (refused); the rest is stack drift.
DEVICE_FIELDS = ("kind", "device", "capability", "isa")
STACK_FIELDS = ("torch", "cuda", "cudnn", "driver", "flash_attn", "threads")


class BaselineDriftWarning(UserWarning):
    """Same device, different software stack than the baseline's."""


@dataclass(frozen=True)
class Provenance:
    """Where a number comes from: measured here (date, command) or published (citation)."""

    kind: str  # "measured" | "published"
    date: str | None = None
    command: str | None = None
    citation: str | None = None

    @classmethod
    def measured(cls, command: str) -> Provenance:
        # time, not datetime: a plain check imports this module (2 ms less)
        return cls("measured", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command)


@dataclass
class Measurement:
    """One case on one device: seconds per call and what that means for the machine."""

    case: str
    median_s: float
    iqr_s: float | None  # None for published figures (only a median was published)
    samples: list[float]
    provenance: Provenance
    flops: float | None = None
    tflops: float | None = None
    peak_fraction: float | None = None  # of the session's measured GEMM peak
    backend: str | None = None  # the SDPA kernel that actually ran
    #: The reference kernel timed in the same trials, and per trial this case's time over the
    #: reference's: machine load slows both, so the ratio survives a busy runner.
    reference: str | None = None
    relative: list[float] | None = None

    @classmethod
    def from_samples(cls, case: str, samples: list[float], provenance: Provenance,
                     flops: float | None = None, peak_tflops: float | None = None,
                     backend: str | None = None) -> Measurement:
        med = stats.median(samples)
        tflops = flops / med / 1e12 if flops else None
        frac = tflops / peak_tflops if tflops and peak_tflops else None
        return cls(case, med, stats.iqr(samples), list(samples), provenance, flops, tflops,
                   frac, backend)


@dataclass(frozen=True)
class Fingerprint:
    kind: str  # "cuda" | "cpu"
    device: str
    capability: str | None = None
    isa: tuple[str, ...] = ()
    torch: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    driver: str | None = None
    flash_attn: str | None = None
    threads: int | None = None

    def differences(self, other: Fingerprint, fields: tuple[str, ...]) -> list[str]:
        return [f"{f}: {getattr(self, f)!r} vs {getattr(other, f)!r}" for f in fields
                if getattr(self, f) != getattr(other, f)]


@dataclass
class Baseline:
    profile: str
    fingerprint: Fingerprint
    cases: dict[str, Measurement] = field(default_factory=dict)
    peak: dict[str, float] = field(default_factory=dict)
    path: Path | None = None

    @property
    def published_only(self) -> bool:
        return bool(self.cases) and all(m.provenance.kind == "published"
                                        for m in self.cases.values())

    def get(self, case: str) -> Measurement | None:
        return self.cases.get(case)

    def compare(self, current: Measurement, factor: float = 1.10,
                alpha: float = 0.05, q: float = 0.5) -> stats.Verdict:
        """The verdict for a fresh measurement; a case not stored is "no baseline", never a
        pass. A measurement relative to a reference kernel is judged on those ratios, against a
        stored case measured relative to the same kernel (published figures: absolute)."""
        stored = self.cases.get(current.case)
        if stored is None:
            where = self.path or self.profile
            return stats.Verdict(stats.NO_BASELINE, factor=factor,
                                 reason=f"no baseline for {current.case} in {where}")
        if current.relative and stored.provenance.kind == "measured" and (
                not stored.relative or stored.reference != current.reference):
            return stats.Verdict(stats.NO_BASELINE, factor=factor, reason=(
                f"the stored {current.case} has no times relative to {current.reference} "
                "(recorded before relative gating); re-record it with --gac-update-baselines"))
        if current.relative and stored.relative:
            verdict = stats.compare(stored.relative, current.relative, factor, alpha, q=0.5)
            return stats.Verdict(verdict.status, verdict.ratio, verdict.p_value, factor,
                                 "; ".join(filter(None, [verdict.reason, "relative to "
                                                         f"{current.reference} in the same "
                                                         "trials"])))
        verdict = stats.compare(stored.samples, current.samples, factor, alpha,
                                baseline_median=stored.median_s, q=q)
        if stored.provenance.kind == "published":
            return stats.Verdict(verdict.status, verdict.ratio, verdict.p_value, factor,
                                 "; ".join(filter(None, [verdict.reason,
                                                         "baseline is a published figure"])))
        return verdict


def present_fingerprint(device: str, threads: int | None = 1) -> Fingerprint:
    """The fingerprint of ``device`` ("cpu" or "cuda[:i]") on this machine."""
    import torch

    tv = torch.__version__.split("+")[0]
    if not device.startswith("cuda"):
        return Fingerprint("cpu", cpu_name(), isa=cpu_isa(), torch=tv, threads=threads)
    idx = torch.device(device).index or 0
    major, minor = torch.cuda.get_device_capability(idx)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return Fingerprint("cuda", torch.cuda.get_device_name(idx), f"{major}.{minor}", (), tv,
                       torch.version.cuda, str(cudnn) if cudnn else None, driver_version(),
                       _flash_attn_version())


def _flash_attn_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flash-attn")
    except PackageNotFoundError:
        return None


#: Why a CPU baseline only speaks for its CPU model, and what a team does instead: its file
#: is named by vendor and ISA (cpu-amd-avx2), but CPU times move with the model, cache and
#: clock, and hosted runners of one label are handed different CPU models run to run.
CPU_NOT_PORTABLE = (" (CPU timings are not portable across CPU models: a hosted runner label "
                    "gets different ones from run to run, so a CPU baseline committed from a "
                    "laptop or one runner does not gate the next; gate perf on a runner whose "
                    "CPU is fixed (self-hosted, or a GPU runner), and on hosted CPU runners run "
                    "-m 'not perf'; docs/measuring.md, 'CPU baselines')")


def check_fingerprint(baseline: Baseline, present: Fingerprint) -> list[str]:
    """Refuse a baseline from another device; warn (and return) stack drift."""
    where = baseline.path or baseline.profile
    fields = DEVICE_FIELDS
    if baseline.published_only:  # a paper names the GPU, rarely its exact SKU string
        fields = tuple(f for f in DEVICE_FIELDS if f != "device")
    device = baseline.fingerprint.differences(present, fields)
    if device:
        raise BadInput(f"baseline was recorded on a different device ({'; '.join(device)}); "
                       "record one for this device with --gac-update-baselines"
                       f"{CPU_NOT_PORTABLE if present.kind == 'cpu' else ''}", where)
    drift = baseline.fingerprint.differences(present, STACK_FIELDS)
    if drift:
        warnings.warn(f"{where}: software stack differs from the baseline's: "
                      f"{'; '.join(drift)}", BaselineDriftWarning, stacklevel=2)
    return drift


# -------------------------------------------------------------------------------- files
def default_dir() -> Path:
    """Where baselines live: ``$GAC_BASELINES_DIR``; else ``./baselines`` of the project being
    tested (a compressor repository commits its own); else gac-check's own ``baselines/`` when
    running from a checkout; else ``./baselines``, created by the first update."""
    env = os.environ.get("GAC_BASELINES_DIR")
    if env:
        return Path(env)
    here = Path.cwd() / "baselines"
    ours = Path(__file__).resolve().parents[2] / "baselines"  # gac_check/bench/ -> checkout
    return ours if not here.is_dir() and ours.is_dir() else here


def path_for(profile_key: str, directory: Path | None = None) -> Path:
    return (directory or default_dir()) / f"{profile_key}.json"


def to_document(baseline: Baseline) -> dict:
    fp = asdict(baseline.fingerprint)
    fp["isa"] = list(fp["isa"])
    cases = {}
    for key in sorted(baseline.cases):
        m = asdict(baseline.cases[key])
        m.pop("case")
        m["provenance"] = {k: v for k, v in m["provenance"].items() if v is not None}
        cases[key] = {k: v for k, v in m.items() if v is not None}
    return {"schema": SCHEMA, "version": VERSION, "profile": baseline.profile,
            "fingerprint": {k: v for k, v in fp.items() if v not in (None, [])},
            "peak": baseline.peak, "cases": cases}


def from_document(doc: object, path: Path) -> Baseline:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise BadInput(f"not a gac-check baseline (expected \"schema\": \"{SCHEMA}\")", path)
    doc = migrate(doc, path)
    try:
        fp = dict(doc["fingerprint"])
        fp["isa"] = tuple(fp.get("isa", ()))
        cases = {}
        for key, raw in doc["cases"].items():
            m = dict(raw)
            m["provenance"] = Provenance(**m["provenance"])
            m["samples"] = [float(s) for s in m.get("samples", [])]
            m.setdefault("iqr_s", None)
            cases[key] = Measurement(case=key, **m)
            if not cases[key].median_s > 0:
                raise ValueError(f"case {key}: median_s must be positive")
        return Baseline(str(doc["profile"]), Fingerprint(**fp), cases,
                        dict(doc.get("peak", {})), path)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadInput(f"baseline does not match schema version {VERSION}: {exc}", path) from exc


def migrate(doc: dict, path: Path) -> dict:
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise BadInput(f"baseline has no valid schema version ({version!r})", path)
    if version > VERSION:
        raise BadInput(f"baseline schema version {version} is newer than this gac-check "
                       f"reads ({VERSION}); upgrade gac-check", path)
    while version < VERSION:
        if version not in MIGRATIONS:
            raise BadInput(f"no migration from baseline schema version {version}", path)
        doc = MIGRATIONS[version](doc)
        version += 1
        doc["version"] = version
    return doc


def load(path: Path) -> Baseline:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read baseline: {exc.strerror}", path) from exc
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"baseline is not valid JSON ({exc})", path) from exc
    return from_document(doc, Path(path))


def save(baseline: Baseline, path: Path) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(to_document(baseline), indent=1) + "\n")


def update(path: Path, profile: str, fingerprint: Fingerprint,
           measurements: list[Measurement], peak: dict[str, float] | None = None) -> Baseline:
    """Merge ``measurements`` into the file at ``path`` (created if absent) under the lock.

    A file from another device is refused rather than overwritten: a baseline is replaced
    on purpose (delete it), never by accident.
    """
    path = Path(path)
    with locked(path):
        if path.exists():
            baseline = load(path)
            check_fingerprint(baseline, fingerprint)
            baseline.fingerprint = fingerprint  # the stack it now reflects
        else:
            baseline = Baseline(profile, fingerprint, path=path)
        baseline.cases.update({m.case: m for m in measurements})
        if peak:
            baseline.peak.update(peak)
        save(baseline, path)
    return baseline
