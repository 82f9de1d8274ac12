"""The text summary of a repair: what was padded, refused, written, and what the re-check found."""
from __future__ import annotations

from gac_check.contract.rules import ERROR
from gac_check.padding.write import RepairReport


def render_repair(report: RepairReport) -> str:
    """The text summary ``gac-check --repair`` prints."""
    p = report.plan
    lines = [f"repair ({p.strategy}, {p.profile} contract, {p.dtype}) -> {report.out}",
             f"  padded {len(p.repairs)} sites, adding {p.padding_params:,} parameters "
             f"({p.overhead_fraction:.2%}); wrote {len(report.files)} files "
             f"in {report.seconds:.1f}s"]
    folded: dict[tuple, int] = {}
    for r in p.repairs:
        key = (r.site.role.value, r.site.value, r.target)
        folded[key] = folded.get(key, 0) + 1
    lines += [f"    {n} x {role} {a} -> {b}" for (role, a, b), n in sorted(folded.items())]
    lines += [f"  config.json: {'.'.join(e.path)} recorded as {e.new} (it recorded none, and "
              "the one a model class derives does not fit the tensors)"
              for e in p.config_edits if e.old is None]
    if p.refused:
        lines.append(f"  refused {len(p.refused)} sites (left as they are):")
        reasons: dict[str, list[str]] = {}
        for r in p.refused:
            reasons.setdefault(r.reason, []).append(r.site.name)
        for why, names in reasons.items():
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            lines.append(f"    {', '.join(names[:3])}{more}: {why}")
    lines += [f"  note: {n}" for n in report.notes]
    errors = sum(f.severity == ERROR for f in report.remaining)
    lines.append(f"  re-check of {report.out.name}: {len(report.remaining)} sites still "
                 f"misaligned ({errors} errors, {len(report.remaining) - errors} warnings)")
    left: dict[str, list[str]] = {}  # --target: what padding could not make fast, and why
    for f in report.remaining:
        for r in f.rules:
            if r.id.startswith("target:"):
                left.setdefault(r.why, []).append(f.site.name)
    for why, names in left.items():
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        lines.append(f"    {', '.join(names[:3])}{more}: {why}")
    return "\n".join(lines)
