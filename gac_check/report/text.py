"""The terminal summary: what will collapse on which GPU, by how much, and what the fix costs."""
from __future__ import annotations

from gac_check.analysis import CheckResult
from gac_check.contract import Finding


def render_text(result: CheckResult) -> str:
    ckpt, contract = result.checkpoint, result.contract
    lines = [
        f"gac-check {ckpt.path}",
        f"  format {result.format.description} ({ckpt.container}), {ckpt.params:,} parameters",
        f"  checked against: {contract.profile} contract ({contract.source} rules), "
        f"dtype {contract.dtype}",
        "",
    ]
    if result.findings:
        lines += _findings_table(result)
    notes = [(s.name, n) for s in result.sites for n in s.notes]
    if notes:
        lines += ["", "config and tensors disagree (tensor shapes were used):"]
        lines += [f"  {name}: {note}" for name, note in notes[:20]]
        if len(notes) > 20:
            lines.append(f"  ... and {len(notes) - 20} more")
    lines += ["", _summary(result)]
    return "\n".join(lines)


def _findings_table(result: CheckResult) -> list[str]:
    header = f"  {'site':<52} {'value':>6} {'fix':>6} {'sev':<7} {'slower':>7} {'pad params':>11}"
    rows = [header, "  " + "-" * (len(header) - 2)]
    layer = object()
    for f in sorted(result.findings, key=lambda f: (f.site.layer is None, f.site.layer or 0)):
        if f.site.layer != layer:
            layer = f.site.layer
            rows.append(f"  layer {layer}" if layer is not None else "  model-wide")
        rows.append(_row(result, f))
    rows += ["", "  rules:"]
    seen: dict[str, str] = {}
    for f in result.findings:
        for r in f.rules:
            seen.setdefault(r.id, f"{r.severity}: {r.why}")
    rows += [f"    {rid}: {why}" for rid, why in seen.items()]
    return rows


def _row(result: CheckResult, f: Finding) -> str:
    slower = f"{f.slowdown:.2f}x" if f.slowdown else "?"
    fix = str(f.repair_to) if f.site.inexact is None else "no*"
    pad = f"{result.padding_params(f):,}" if f.site.inexact is None else "-"
    name = f.site.name if len(f.site.name) <= 50 else "…" + f.site.name[-49:]
    return (f"    {name:<50} {f.site.value:>6} {fix:>6} {f.severity:<7} {slower:>7} {pad:>11}"
            f"  [{', '.join(r.id for r in f.rules)}]")


def _summary(result: CheckResult) -> str:
    n, bad = len(result.sites), len(result.findings)
    errors = sum(f.severity == "error" for f in result.findings)
    refused = sum(f.site.inexact is not None for f in result.findings)
    text = (f"{bad} of {n} sites misaligned ({errors} errors, {bad - errors} warnings); "
            f"zero-padding repair adds {result.repair_overhead_fraction:.2%} parameters")
    if refused:
        text += f"; {refused} site(s) marked no* cannot be padded exactly (see --format json)"
    return text
