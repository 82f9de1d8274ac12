"""The ``--format json`` object (schema ``gac-check/1``), whose keys docs/design.md fixes
("The check JSON").

Per misaligned site, ``slowdown`` is the figure with its provenance (value, source: published,
measured, estimate or bench, hardware, dtype, shape, coverage, citation, note; value null where
no data cover the shape). ``expected_slowdown`` keeps its old meaning for older readers, but
only for figures read from data at the site's shape: it is null for estimates and unmeasured
shapes, so a number quoted from it is never an unmarked extrapolation.

With ``--target``, every site carries ``targets``: one object per target given (``target``,
``verdict``: fast, fallback or refused, ``kernel``, ``fix_to``: the smallest size that makes
it fast or null where padding cannot, ``source``: the pack rule's citation; also ``why`` and
``cannot_pad``), and ``summary.targets`` maps each spec to its model-level verdict with counts.

``summary.tensors`` and ``summary.params_accounted`` say what the check read: every tensor
(``read``) and where it went (``in_sites``, ``auxiliary``, ``no_dimension``), in tensors and in
parameters; a check that read less than everything refuses instead of reporting.
"""
from __future__ import annotations

from gac_check.analysis import CheckResult

SCHEMA = "gac-check/1"


def to_json(result: CheckResult) -> dict:
    ckpt, contract, choice = result.checkpoint, result.contract, result.dtype_choice
    findings = result.by_site
    refusals = result.refusals
    verdicts = contract.targets
    sites = []
    for site in result.sites:
        f = findings.get(site.name)
        sites.append({
            "name": site.name,
            "role": site.role.value,
            "value": site.value,
            "layer": site.layer,
            "aligned": f is None,
            "severity": f.severity if f else None,
            "rules": [r.id for r in f.rules] if f else [],
            "repair_to": f.repair_to if f else None,
            "optimal_to": f.optimal_to if f else None,
            "expected_slowdown": f.slowdown if f else None,
            "slowdown": f.figure.as_dict() if f and f.figure else None,
            "padding_params": result.padding_params(f) if f else 0,
            "exact_repair": site.name not in refusals and site.inexact is None,
            "refusal": refusals.get(site.name, site.inexact),
            "notes": site.notes,
            "tensors": site.tensors,
            "targets": [v.as_dict() for v in verdicts.of(site)] if verdicts else [],
        })
    misaligned = len(result.findings)
    extra = {"gguf": result.gguf.as_dict()} if result.gguf is not None else {}
    return {
        "schema": SCHEMA,
        "model_dir": ckpt.source,
        "format": result.format.name,
        "container": ckpt.container,
        "config_source": ckpt.config_source,
        "quantization": ckpt.quantization.as_dict() if ckpt.quantization else None,
        "hardware": {"profile": contract.profile, "dtype": contract.dtype,
                     "contract_source": contract.source,
                     "dtype_source": choice.source if choice else None,
                     "dtype_note": choice.note if choice else None},
        "rules": [{"id": r.id, "severity": r.severity, "why": r.why,
                   "roles": sorted(x.value for x in r.roles), "source": r.source}
                  for r in contract.rules],
        "sites": sites,
        "summary": {
            "sites": len(result.sites),
            "misaligned": misaligned,
            "errors": sum(f.severity == "error" for f in result.findings),
            "warnings": sum(f.severity == "warning" for f in result.findings),
            "misaligned_fraction": misaligned / len(result.sites) if result.sites else 0.0,
            "params": ckpt.params,
            "quantization": (f"{ckpt.quantization.method} {ckpt.quantization.scheme}"
                             if ckpt.quantization else None),
            **_accounted(result),
            "repair_overhead_fraction": result.repair_overhead_fraction,
            "targets": verdicts.summary() if verdicts else {},
        },
        **extra,
    }


def _accounted(result: CheckResult) -> dict:
    books = result.accounting
    if books is None:  # a result built by hand, not by the check
        return {}
    return {"tensors": books.tensors.as_dict(), "params_accounted": books.params.as_dict()}
