"""The text of a GGUF file's stored types against its ftype's mix: the fallbacks folded by
tensor kind, then bits per weight and size, stored against nominal (llama.cpp issue 26616)."""
from __future__ import annotations

import re

from gac_check.targets.gguf_file import GgufTypes, TensorType, padded_row

_LAYER = re.compile(r"^blk\.(\d+)\.")


def _fold(types: GgufTypes, tensors: list[TensorType]) -> list[tuple[str, list[int],
                                                                     TensorType]]:
    rows: dict[tuple, tuple[str, list[int], TensorType]] = {}
    for t in tensors:
        m = _LAYER.match(t.name)
        pattern = _LAYER.sub("blk.*.", t.name) if m else t.name
        key = (pattern, t.row, t.requested, t.stored, t.why)
        row = rows.setdefault(key, (pattern, [], t))
        if m:
            row[1].append(int(m[1]))
    return list(rows.values())


def _layers(xs: list[int]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{xs[0]}-{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 1 else (
        ",".join(map(str, xs)))


def gguf_lines(types: GgufTypes) -> list[str]:
    nominal = types.bits[types.default]
    out = ["", f"GGUF tensor types (llama.cpp {types.version}, {types.ftype}: nominal "
           f"{types.default}, {nominal:.2f} bits per weight):"]
    fell = types.fallbacks
    out.append(f"  {len(fell)} of {len(types.tensors)} tensors fell back from the mix"
               + (":" if fell else ""))
    for pattern, layers, t in _fold(types, fell):
        out.append(f"    {pattern:<28} layers {_layers(layers):<8} row {t.row:>6}  "
                   f"{t.requested} -> {t.stored}; padded to {padded_row(t)} it keeps "
                   f"{t.requested}")
        out.append(f"      {t.why}")
    stored, mix = types.bytes_of("stored"), types.bytes_of("requested")
    out.append(f"  bits per weight: {types.bpw:.2f} stored, {types.mix_bpw:.2f} for the mix at "
               f"these widths with no fallback, {nominal:.2f} {types.default} nominal")
    out.append(f"  size: {stored / 2**20:,.2f} MiB stored, {mix / 2**20:,.2f} MiB without the "
               f"fallbacks ({(stored - mix) / mix:+.1%})" if mix else "")
    odd = types.disagreements
    if odd:
        out.append(f"  {len(odd)} tensor(s) hold another type than llama.cpp {types.version} "
                   "stores at their widths:")
        out += [f"    {t.name}: {t.why}" for t in odd[:10]]
        if len(odd) > 10:
            out.append(f"    ... and {len(odd) - 10} more")
    return out
