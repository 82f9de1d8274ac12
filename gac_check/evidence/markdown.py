"""``results.md``: the results document as the tables benchmarks/RESULTS.md takes, with the
provenance a committed figure needs (device, driver, clocks as read, software, command), so
committing a GPU run is a copy, not a transcription."""
from __future__ import annotations

_NAMED_ABOVE = ("commit", "source_digest")


def render(doc: dict) -> str:
    dev, sw = doc["device"], doc["software"]
    commit = sw.get("commit") or "not recorded: name the commit the tree was copied from"
    lines = [f"## GPU evidence: {dev.get('name')} ({doc['started_utc']})", "",
             f"- command: `{doc['command']}` (commit {commit}, source digest "
             f"{sw.get('source_digest')})",
             f"- device: {_kv(dev)}",
             f"- clocks before: {_kv(doc.get('clocks_before') or {})}",
             f"- clocks after: {_kv(doc.get('clocks_after') or {})}",
             f"- software: {_kv({k: v for k, v in sw.items() if k not in _NAMED_ABOVE})}",
             f"- total: {doc.get('seconds')} s of {doc['minutes']} min", "",
             "| stage | budget (s) | spent (s) | status |", "|---|---|---|---|"]
    lines += [f"| {n} | {s['budget_s']} | {s['spent_s']} | {s['status']} |"
              for n, s in doc["stages"].items()]
    lines += _latency(doc.get("latency")) + _slowpaths(doc.get("slowpaths"))
    return "\n".join(lines) + "\n"


def _kv(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "not read"


def _ms(form: dict, phase: str) -> tuple[str, str]:
    t = form.get(phase)
    if not t or "median_s" not in t:
        return "not timed", (t or {}).get("error", "")[:80]
    return f"{t['median_s'] * 1e3:.3f}", f"{t['tokens_per_s']:,.0f}"


def _latency(lat) -> list[str]:
    if not isinstance(lat, dict) or "forms" not in lat:
        return ["", f"Latency: {lat.get('error') if isinstance(lat, dict) else 'not run'}"]
    b, s = lat["prefill"]
    db, ds = lat["decode"]
    out = ["", f"End to end, {lat['layers']} layer(s), {lat['dtype']}, vocab {lat['vocab']}: "
           f"prefill {b} x {s} tokens, decode {db} tokens against {ds} cached (CUDA events, "
           "medians):", "",
           "| form | layer params | prefill (ms) | prefill tokens/s | decode (ms) | "
           "decode tokens/s | first layer's ranks / MLP width |", "|---|---|---|---|---|---|---|"]
    for name, f in lat["forms"].items():
        dims = ", ".join(f"{k.split('.')[-2]} {v}" if k.endswith(".rank") else f"MLP {v}"
                         for k, v in f["dims"].items())
        out.append(f"| {name} | {f['layer_params']:,} | {' | '.join(_ms(f, 'prefill'))} | "
                   f"{' | '.join(_ms(f, 'decode'))} | {dims} |")
    out += ["", "| phase | claim | measured speedup | held here |", "|---|---|---|---|"]
    for c in lat["claims"]:
        x = "not measured" if c["speedup"] is None else f"{c['speedup']:.2f}x"
        held = {True: "yes", False: "no", None: "not checked"}[c["held"]]
        out.append(f"| {c['phase']} | {c['claim']} | {x} | {held} |")
    return out


def _slowpaths(rows) -> list[str]:
    if not isinstance(rows, list):
        return ["", f"Slow paths: {rows.get('error') if isinstance(rows, dict) else 'not run'}"]
    out = ["", "| slow path vs its aligned neighbour | slower | work ratio | kernels |",
           "|---|---|---|---|"]
    for r in rows:
        if r["status"] != "timed":
            out.append(f"| {r['what']} | {r['status']} | | {r.get('reason', '')[:120]} |")
            continue
        kernels = " vs ".join(filter(None, (r["slow_backend"], r["fast_backend"])))
        out.append(f"| {r['what']} | {r['slower']:.2f}x | {r['work_ratio']:.3f} | "
                   f"{kernels} |")
    return out
