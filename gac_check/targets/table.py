"""The rules of every shipped pack as one Markdown table (docs/targets.md embeds it; a test
holds the page to the packs): ``python -m gac_check.targets.table``."""
from __future__ import annotations

from gac_check.targets.packs import Candidate, Condition, Pack, Selection, Source, packs


def _cond(c: Condition) -> str:
    return c.describe().replace("|", "\\|")


def _versions(pack: Pack, since: str | None, until: str | None) -> str:
    if since is None and until is None:
        return "all read"
    a, b = since or pack.versions[0], until or pack.versions[-1]
    return a if a == b else f"{a} – {b}"


def _gpu(c: Candidate) -> str:
    if c.sm_min is None and c.sm_max is None:
        return ""
    if c.sm_min == c.sm_max:
        return f"sm{c.sm_min}"
    return f"sm{c.sm_min or ''}+" if c.sm_max is None else f"sm{c.sm_min or 0}–{c.sm_max}"


def _src(s: Source) -> str:
    text = f"`{s.file}` {s.function} @ {s.ref}"
    return (text + (f" ({s.issue})" if s.issue else "")).replace("|", "\\|")


def _rows(pack: Pack, sel: Selection) -> list[str]:
    rows = []
    span = _versions(pack, sel.since, sel.until)
    quant = ", ".join(sel.quant)
    for c in sel.candidates:
        verdict = "refused" if c.refuse else ("fast" if c.fast else "fallback")
        when = "; ".join(_cond(w) for w in c.when) or "always"
        if c.only_if:
            verdict, when = "not taken", f"only with {c.only_if}"
        if c.pads:
            when += "; pads " + ", ".join(f"{n} to % {m}" for n, m in c.pads)
        vs = _versions(pack, c.since, c.until) if (c.since or c.until) else span
        rows.append(f"| {pack.engine} | {sel.id} | {sel.component} | {quant} | "
                    f"{'gate' if sel.gate else c.kernel} | {verdict} | {when} | {_gpu(c)} | "
                    f"{vs} | {_src(c.source)} |")
    other = sel.otherwise_kernel or ""
    rows.append(f"| {pack.engine} | {sel.id} | {sel.component} | {quant} | "
                f"otherwise {other}".rstrip() + f" | {sel.otherwise_verdict} | "
                f"{sel.otherwise_message.replace('|', '/')[:160] or '-'} |  | {span} | "
                f"{_src(sel.otherwise_source)} |")
    return rows


def _gguf_rows(pack: Pack) -> list[str]:
    rows = []
    span = _versions(pack, None, None)
    for name, t in pack.gguf_types.items():
        if t.block == 1:
            continue
        fb = t.fallback or "none (F16 or refused, by version)"
        overrides = {v: o[name] for v, o in pack.gguf.get("fallback_by_version", {}).items()
                     if name in o}
        if overrides:
            fb += "; " + ", ".join(f"{o} at {v}" for v, o in overrides.items())
        rows.append(f"| {pack.engine} | type {name} | tensor | * | {name} | fast | row % "
                    f"{t.block} == 0 |  | {span} | {_src(t.source)} |")
        rows.append(f"| {pack.engine} | type {name} | tensor | * | otherwise {fb} | fallback | "
                    "row not a multiple of the block |  | "
                    f"{span} | {_src(t.source)} |")
    for name, f in pack.ftypes.items():
        mix = "; ".join(f"{r['match']} -> {r['type']}"
                        + (f" ({r['layers']})" if r.get("layers") else "")
                        + (f" (gqa >= {r['gqa_min']})" if r.get("gqa_min") else "")
                        for r in f.get("tensors", []))
        s = f["source"]
        rows.append(f"| {pack.engine} | ftype {name} | tensor | {name} | mix: default "
                    f"{f['default']}{'; ' + mix if mix else ''} | - | - |  | {span} | "
                    f"{_src(Source(s['repo'], s['file'], s['function'], s['ref']))} |")
    return rows


def markdown_table() -> str:
    head = ["| engine | rule | component | quant | kernel / backend (engine order) | verdict "
            "| when | GPU | versions | source |", "|---|---|---|---|---|---|---|---|---|---|"]
    body = []
    for pack in packs().values():
        for sel in pack.selections:
            body += _rows(pack, sel)
        body += _gguf_rows(pack)
    return "\n".join(head + body)


if __name__ == "__main__":
    print(markdown_table())
