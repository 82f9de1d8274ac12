"""The terminal summary: what will collapse on which GPU, by how much, and what the fix costs.

Findings that differ only by layer are folded into one row ("layers 0-31"), so an 80-layer
model prints a screenful, not 560 lines; the JSON output keeps every site. Every slowdown figure
points into a legend ("[1]") that says where it was measured (hardware, dtype, shapes covered,
citation); an estimate is marked "~", a shape no data cover "n/m" (not measured).

Where a ``--target`` does not load the model at all, the text says so once, in the verdict
that ends it (with the one action that would serve it), and draws each site by its own rules,
as the HTML report does: both read the check document through :mod:`gac_check.report
.deployment`, so they cannot disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gac_check.analysis import CheckResult, FindingGroup
from gac_check.contract.rules import Finding


@dataclass
class _Own:
    """The sites as their own rules judge them (:func:`gac_check.report.deployment.own_sites`)
    and the verdict's lines, where a target does not load the model; empty where all do."""

    blocked: set[str] = field(default_factory=set)
    sites: dict[str, dict] = field(default_factory=dict)  # by name
    verdict: list[str] = field(default_factory=list)

    def judged(self, f: Finding) -> dict | None:
        """The site's own judgement, or None where nothing is blocked (the finding stands)."""
        return self.sites.get(f.site.name) if self.blocked else None

    def keeps(self, f: Finding) -> bool:
        own = self.judged(f)
        return own is None or not own["aligned"]


def _own(result: CheckResult, doc: dict | None) -> _Own:
    """What :mod:`gac_check.report.deployment` reads from the check document: imported, and
    the document built, only where a target is named (a plain check reads no targets code)."""
    verdicts = result.contract.targets
    if not verdicts or all(load.loads for load in verdicts.loads.values()):
        return _Own()
    from gac_check.report import deployment
    from gac_check.report.json_report import to_json

    doc = doc or to_json(result)
    sites = deployment.own_sites(doc)
    misaligned = sum(not s["aligned"] for s in sites)
    return _Own(set(deployment.blocked(doc)), {s["name"]: s for s in sites},
                [*deployment.verdict_lines(doc, sites), deployment.sites_line(doc, misaligned)])


def render_text(result: CheckResult, doc: dict | None = None) -> str:
    """The summary a person reads; ``doc``, the check's JSON document where the caller has it
    already (else it is built where a target that does not load the model needs it)."""
    own = _own(result, doc)
    ckpt, contract = result.checkpoint, result.contract
    lines = [
        f"gac-check {ckpt.source}",
        f"  format: {result.format.description} ({ckpt.container}), {ckpt.params:,} parameters"
        + (" (logical)" if ckpt.quantization else ""),
        *_config_line(ckpt),
        *_read(result),
        f"  checked against: {contract.profile} contract ({contract.source} rules), "
        f"dtype {contract.dtype}" + _dtype_source(result),
        "",
    ]
    if result.dtype_choice and result.dtype_choice.note:
        lines.insert(-1, f"  dtype: {result.dtype_choice.note}")
    q = ckpt.quantization
    if q is not None:
        lines.insert(2, f"  quantized: {q.describe()}")
        lines[-1:-1] = [f"  packing: {note}" for note in q.notes[:10]]
        if len(q.notes) > 10:
            lines.insert(-1, f"  packing: ... and {len(q.notes) - 10} more")
    if any(own.keeps(f) for f in result.findings):
        lines += _findings_table(result, own)
    elif own.blocked:
        lines.append("  no site is misaligned by its own rules (the verdict below says what each "
                     "target makes of the model)")
    notes = [(s.name, n) for s in result.sites for n in s.notes]
    if notes:
        lines += ["", "notes (where the config and the tensors disagree, the tensors win; where "
                  "a site compresses nothing, what to do):"]
        lines += [f"  {name}: {note}" for name, note in notes[:20]]
        if len(notes) > 20:
            lines.append(f"  ... and {len(notes) - 20} more")
    lines += _targets_summary(result, own)
    if result.gguf is not None:  # llama.cpp's rule pack is read only for a GGUF file
        from gac_check.report.gguf_types import gguf_lines

        lines += gguf_lines(result.gguf)
    lines += ["", "verdict:", *(f"  {line}" for line in own.verdict)] if own.verdict \
        else ["", result.summary().line]
    return "\n".join(lines)


def _read(result: CheckResult) -> list[str]:
    """What the check read: every tensor, and where each went (docs/formats.md, Accounting)."""
    books = result.accounting
    if books is None:
        return []
    t = books.tensors
    return [f"  read: all {t.read:,} tensors ({books.params.read:,} parameters): "
            f"{t.in_sites:,} in sites, {t.auxiliary:,} auxiliary, {t.no_dimension:,} with no "
            "dimension"]


def _targets_summary(result: CheckResult, own: _Own) -> list[str]:
    """Per --target: the model-level verdict (the worst of its sites), with counts."""
    verdicts = result.contract.targets
    if not verdicts:
        return []
    out = ["", "targets (the worst of the sites; fix: what --repair --target pads to):"]
    for spec, v in verdicts.summary().items():
        t = next(t for t in verdicts.targets if t.spec == spec)
        out.append(f"  {spec:<28} {v['verdict']:<8} {v['fast']} fast, {v['fallback']} "
                   f"fallback, {v['refused']} refused  ({t.engine} {t.version}, tp={t.tp}, "
                   f"quant={t.quant}" + (f", group={t.group}" if t.group else "") + ")")
        load = verdicts.loads.get(spec)
        if load is not None and not load.loads:  # why and the remedy: once, in the verdict
            out.append(f"    does not load the model, so it refuses every site for that one "
                       f"reason (the verdict below says why and what would serve it) "
                       f"[{load.source}]")
        elif load is not None and load.why:  # a per-layer class: what it builds, per layer
            out.append(f"    loads: {load.why} [{load.source}]")
    from gac_check.report.target_notes import target_notes  # targets only where asked

    notes = target_notes(result)
    out += ["", "not modelled by these verdicts, where they apply to this model and targets:"]
    out += [f"  {engine}: {note}" for engine, note in notes.shown]
    if notes.left:
        out.append(f"  {notes.left} more about other schemes, layouts and GPUs, and where the "
                   "rules were read: docs/targets.md, \"Not modelled yet\"")
    return out


def _config_line(ckpt) -> list[str]:
    """Where "the config" of the notes was read, where that is not the config.json a model
    directory has (or a GGUF's metadata, which the format line names): a whole pickled
    model's own config, or a module's in memory."""
    if ckpt.config_source in ("config.json", "the GGUF metadata"):
        return []
    return [f"  config: {ckpt.config_source}"]


def _dtype_source(result: CheckResult) -> str:
    choice = result.dtype_choice
    return f" (from {choice.source})" if choice else ""


def _cells(result: CheckResult, f: Finding, own: _Own) -> list[str]:
    """One cell per --target that loads the model: the short verdict and kernel (``fast
    awq_marlin``); one that does not refuses every site, which the verdict says once."""
    verdicts = result.contract.targets
    return [v.short for v in verdicts.of(f.site)
            if v.target.spec not in own.blocked] if verdicts else []


def _columns(result: CheckResult, own: _Own) -> list:
    return [t for t in result.targets if t.spec not in own.blocked]


def _target_widths(result: CheckResult, own: _Own) -> list[int]:
    return [max([len(t.spec), *(len(c[i]) for f in result.findings
                                 if (c := _cells(result, f, own)))]) for i, t in
            enumerate(_columns(result, own))]


def _rules(f: Finding, own: _Own) -> list:
    """The rules the site breaks by itself (a blocked target's is the verdict's)."""
    judged = own.judged(f)
    return f.rules if judged is None else [r for r in f.rules if r.id in judged["rules"]]


def _findings_table(result: CheckResult, own: _Own) -> list[str]:
    rows: list[FindingGroup] = [g for g in result.groups if own.keeps(g.first)]
    # "0-2,4,7-11" is wider than the heading: the column grows, the columns after it stay put
    wide = max([10, *(len(_ranges(row.layers)) for row in rows)])
    widths = _target_widths(result, own)
    targets = "".join(f"{t.spec:<{w}}  " for t, w in zip(_columns(result, own), widths,
                                                          strict=True))
    header = (f"  {'site':<44} {'layers':<{wide}} {'value':>6} {'fix':>6} {'severity':<8} "
              f"{'slower':>11} {'+params':>10}  {targets}rules")
    out = [header, "  " + "-" * (len(header) - 2)]
    refusals = _refusals(result, own)
    legend: dict[str, int] = {}
    for row in rows:
        f = row.first
        refused = f.site.name in refusals
        judged = own.judged(f)
        severity = judged["severity"] if judged else f.severity
        name = row.pattern if len(row.pattern) <= 44 else "…" + row.pattern[-43:]
        fix = "no*" if refused else (str(f.repair_to) if f.repair_to > f.site.value
                                     else f"({f.optimal_to})")
        slower = "-"
        if f.figure is not None:
            mark = legend.setdefault(f.figure.basis, len(legend) + 1)
            slower = f"{f.figure.short} [{mark}]"
        pad = "-" if refused else f"{_pad(result, row, own, refusals):,}"
        cells = "".join(f"{c:<{w}}  " for c, w in zip(_cells(result, f, own), widths,
                                                        strict=True))
        out.append(f"  {name:<44} {_ranges(row.layers):<{wide}} {f.site.value:>6} {fix:>6} "
                   f"{severity:<8} {slower:>11} {pad:>10}  {cells}"
                   f"{', '.join(r.id for r in _rules(f, own))}")
    out += ["", "  fix: what --repair pads to; (N): only --strategy optimal pads, to N"]
    if legend:
        out += ["  slower: time at the value over time at the fix, where measured; ~ estimate, "
                "n/m not measured at this shape:"]
        out += [f"    [{i}] {basis}" for basis, i in legend.items()]
    out += ["", "  rules broken:"]
    seen: dict[str, str] = {}
    for f in result.findings:
        for r in _rules(f, own):
            seen.setdefault(r.id, f"{r.severity}: {r.why}")
    out += [f"    {rid}: {why}" for rid, why in seen.items()]
    if refusals:
        out += ["", "  no* = --repair leaves these as they are:"]
        out += [f"    {why}" for why in sorted(set(refusals.values()))]
    return out


def _pad(result: CheckResult, row: FindingGroup, own: _Own, refusals: dict[str, str]) -> int:
    """Parameters zero padding adds over the row's sites that --repair pads (the group's own
    sum, unless a blocked target's refusal, dropped, left sites out of it)."""
    if not own.blocked:
        return row.pad
    return sum(result.padding_params(f) for f in row.findings if f.site.name not in refusals)


def _refusals(result: CheckResult, own: _Own) -> dict[str, str]:
    """Why --repair leaves a site as it is, less a blocked target's remedy (the verdict's)."""
    if not own.blocked:
        return result.refusals
    return {name: s["refusal"] for name, s in own.sites.items() if s.get("refusal")}


def _ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    if not layers:
        return "-"
    xs = sorted(set(layers))
    parts, start = [], xs[0]
    for a, b in zip(xs, [*xs[1:], None], strict=True):
        if b != a + 1:
            parts.append(f"{start}-{a}" if a != start else str(a))
            start = b
    return ",".join(parts)
