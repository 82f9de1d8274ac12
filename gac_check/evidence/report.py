"""Stage e: the HTML report of the compressed forms, with slowdowns measured on this device.

The two compressed checkpoints of stage c (``lowrank`` and ``pruned``) are checked against the
device's contract, which now reads the sweeps stage a measured (``GAC_BASELINES_DIR`` is the
output folder), and, while the stage's time lasts, each site is timed at its own shape and its
repaired one (``--bench``): on the hardware the contract names those timings become the
report's "slower" column. One HTML page and its run document, as ``gac-check A B --report``
writes them.
"""
from __future__ import annotations

from pathlib import Path

from gac_check.evidence.budget import StageClock
from gac_check.report.json_report import to_json
from gac_check.report.outputs import plan as plan_outputs
from gac_check.report.zoo import write_zoo

MODELS = ("lowrank", "pruned")


def run(work: Path, profile: str, out_html: Path, clock: StageClock, log) -> dict:
    from gac_check.api.flows import check

    dirs = [work / m for m in MODELS if (work / m / "config.json").is_file()]
    if not dirs:
        return {"error": "no compressed form was made (stage c stopped before them)"}
    results = [check(d, profile) for d in dirs]
    benched = not clock.expired()
    if benched:
        from gac_check.bench.model_bench import bench_findings
        from gac_check.contract.evidence import adopt_bench

        for result in results:
            report = bench_findings(result)
            adopt_bench(result.findings, report, result.contract)
            print(f"report: {result.checkpoint.path.name}: --bench {report.precedence}",
                  file=log, flush=True)
    docs = [to_json(r) for r in results]
    write_zoo(plan_outputs(str(out_html), None, dirs[0], force=True), docs, "never")
    return {"html": out_html.name, "models": [d.name for d in dirs], "bench": benched,
            "sites": {d.name: doc["summary"] for d, doc in zip(dirs, docs, strict=True)},
            "slowdowns": {d.name: _slowdowns(doc) for d, doc in zip(dirs, docs, strict=True)}}


def _slowdowns(doc: dict) -> list[dict]:
    """Each distinct misaligned site's figure and where it came from (first layer's names)."""
    seen: dict[tuple, dict] = {}
    for site in doc["sites"]:
        if site["aligned"]:
            continue
        key = (site["role"], site["value"])
        fig = site.get("slowdown") or {}
        seen.setdefault(key, {"role": site["role"], "value": site["value"],
                              "repair_to": site["repair_to"], "slower": fig.get("value"),
                              "source": fig.get("source")})
    return list(seen.values())
