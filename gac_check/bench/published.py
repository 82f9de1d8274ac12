"""Seed ``baselines/a100.json`` from the published A100 sweeps (provenance "published").

    python -m gac_check.bench.published /work/shared/reference baselines/a100.json

Only medians were published, so these cases carry no samples and no IQR: a comparison against
them is decided on the factor alone and says so. The GEMM sweep gives TFLOP/s with the other
dimensions at 4096 and M=512; it is stored as time per call so every case has the same unit.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gac_check.bench import baselines, workloads
from gac_check.errors import BadInput

CITATION = ("'When Smaller Is Slower: Dimensional Collapse in Compressed LLMs' (EuroMLSys "
            "2026), hardware-alignment and SDPA figures, values read from the figures' vector "
            "data ({file})")
A100 = baselines.Fingerprint("cuda", "NVIDIA A100-80GB", "8.0", torch="2.9.1", cuda="12.8")


def read_tsv(path: Path) -> list[list[str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path) from exc
    rows = [ln.split("\t") for ln in lines if ln.strip() and not ln.startswith("#")]
    return rows[1:]  # header


def published_cases(reference: Path) -> list[baselines.Measurement]:
    out = []
    gemm_file = reference / "published-a100-gemm-alignment-sweep.tsv"
    cite = baselines.Provenance("published", citation=CITATION.format(file=gemm_file.name))
    for dim, k_tf, n_tf, _l2 in read_tsv(gemm_file):
        s = int(dim)
        for work, tf in ((workloads.gemm(512, s, 4096, "float16"), float(k_tf)),
                         (workloads.gemm(512, 4096, s, "float16"), float(n_tf))):
            out.append(baselines.Measurement(work.key, work.flops / (tf * 1e12), None, [],
                                             cite, work.flops, tf))
    sdpa_file = reference / "published-a100-sdpa-latency.tsv"
    cite = baselines.Provenance("published", citation=CITATION.format(file=sdpa_file.name))
    for d, ms in read_tsv(sdpa_file):
        work = workloads.sdpa(4, 2048, 32, int(d), "float16")
        t = float(ms) / 1e3
        out.append(baselines.Measurement(work.key, t, None, [], cite, work.flops,
                                         work.flops / t / 1e12))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gac_check.bench.published")
    p.add_argument("reference", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    try:
        cases = published_cases(args.reference)
    except (BadInput, ValueError) as exc:
        print(f"published: {exc}", file=sys.stderr)
        return 2
    baselines.save(baselines.Baseline("a100", A100, {m.case: m for m in cases}), args.out)
    print(f"wrote {len(cases)} published cases to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
