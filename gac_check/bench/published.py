"""The published A100 and H100 sweeps as baselines (provenance "published").

    gac-check baseline published h100 baselines/h100.json
    gac-check baseline published a100 baselines/a100.json --reference DIR

The paper's tables (``published-<gpu>-sdpa-latency.tsv``, ``published-<gpu>-gemm-alignment-
sweep.tsv``, values read from its figures' vector data) ship inside the package
(``gac_check/data/``), so the contract's expected slowdowns (gac_check.contract.evidence) work
from an installed wheel, and this command writes the same cases into ``baselines/<gpu>.json``
for the perf gate. Only medians were published, so these cases carry no samples and no IQR: a
comparison against them is decided on the factor alone and says so. The GEMM sweeps give
TFLOP/s with M=512 and the other dimension 4096; they are stored as time per call so every case
has the same unit.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gac_check.bench import baselines, workloads
from gac_check.errors import BadInput

PAPER = "'When Smaller Is Slower: Dimensional Collapse in Compressed LLMs' (EuroMLSys 2026)"
#: The shapes the paper measured (the TSVs' headers say so): SDPA over head_dim, GEMM over K or N.
SDPA_SHAPE = dict(b=4, s=2048, h=32)
GEMM_M, GEMM_OTHER = 512, 4096
DTYPE = "float16"


@dataclass(frozen=True)
class PublishedGpu:
    """One GPU's published sweeps: whose figures, on which device, from which files."""

    key: str
    fingerprint: baselines.Fingerprint
    figures: str  # where in the paper

    def citation(self, file: str) -> str:
        return f"{PAPER}, {self.figures}, values read from the figures' vector data ({file})"


GPUS = {
    "a100": PublishedGpu("a100", baselines.Fingerprint("cuda", "NVIDIA A100-80GB", "8.0",
                                                       torch="2.9.1", cuda="12.8"),
                         "hardware-alignment and SDPA figures"),
    # The H100 tables name neither the SKU nor the software stack: the fingerprint says only
    # what they do (a comparison on an H100 then warns about the unknown stack).
    "h100": PublishedGpu("h100", baselines.Fingerprint("cuda", "NVIDIA H100", "9.0"),
                         "H100 appendix, Figures 12 (SDPA) and 13 (GEMM) of arXiv 2604.09595"),
}


def reference_dir() -> Path:
    """The packaged copies of the paper's tables (package data beside the modules: read as
    a path, as before, without importing importlib.resources, which a plain check paid
    tempfile, shutil and zipfile for)."""
    return Path(__file__).resolve().parents[1] / "data"


def read_tsv(path: Path) -> list[list[str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path) from exc
    rows = [ln.split("\t") for ln in lines if ln.strip() and not ln.startswith("#")]
    return rows[1:]  # header


def published_cases(reference: Path, gpu: str = "a100") -> list[baselines.Measurement]:
    spec = GPUS[gpu]
    out = []
    gemm_file = reference / f"published-{gpu}-gemm-alignment-sweep.tsv"
    cite = baselines.Provenance("published", citation=spec.citation(gemm_file.name))
    for dim, k_tf, n_tf, _l2 in read_tsv(gemm_file):
        s = int(dim)
        for work, tf in ((workloads.gemm(GEMM_M, s, GEMM_OTHER, DTYPE), float(k_tf)),
                         (workloads.gemm(GEMM_M, GEMM_OTHER, s, DTYPE), float(n_tf))):
            out.append(baselines.Measurement(work.key, work.flops / (tf * 1e12), None, [],
                                             cite, work.flops, tf))
    sdpa_file = reference / f"published-{gpu}-sdpa-latency.tsv"
    cite = baselines.Provenance("published", citation=spec.citation(sdpa_file.name))
    for d, ms in read_tsv(sdpa_file):
        work = workloads.sdpa(SDPA_SHAPE["b"], SDPA_SHAPE["s"], SDPA_SHAPE["h"], int(d), DTYPE)
        t = float(ms) / 1e3
        out.append(baselines.Measurement(work.key, t, None, [], cite, work.flops,
                                         work.flops / t / 1e12))
    return out


def published_baseline(gpu: str, reference: Path | None = None) -> baselines.Baseline:
    """The published sweeps of ``gpu`` as a Baseline (from the packaged tables by default)."""
    cases = published_cases(reference or reference_dir(), gpu)
    return baselines.Baseline(gpu, GPUS[gpu].fingerprint, {m.case: m for m in cases})


@cache
def packaged(gpu: str) -> baselines.Baseline:
    """The packaged published baseline, read once per process."""
    return published_baseline(gpu)


if __name__ == "__main__":  # the old spelling of `gac-check baseline published`: runs that command
    import runpy  # the CLI is run as a program, not imported: it sits above this module

    sys.argv[1:1] = ["baseline", "published"]
    runpy.run_module("gac_check.cli", run_name="__main__")
