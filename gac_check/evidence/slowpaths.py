"""Stage d: each slow path torch alone reaches, timed against its fast neighbour.

A pair is a misaligned shape and the aligned shape a repair pads it to, timed interleaved on
the device present (:func:`gac_check.bench.kernels.run_interleaved`): SDPA at head_dims that
fused backends refuse or predicate, by backend (the dispatcher's own choice and each forced
one; a refusal is recorded with torch's reason); GEMMs with K or N off the 8-element alignment
of Tensor Core kernels; and the low-rank pair at the compressor's ranks against the ranks
padded to 8 and to 64. ``slower`` is t(slow) / t(fast): what the padding buys including its
extra work, the figure the report's "slower" column means.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from gac_check.bench import timing, workloads
from gac_check.bench.kernels import run_interleaved
from gac_check.evidence.budget import StageClock
from gac_check.evidence.sizes import Sizes
from gac_check.models.compress import asvd_rank

CONFIG = {"cuda": timing.TimingConfig(samples=10, trials=3, warmup_s=0.02),
          "cpu": timing.TimingConfig(samples=3, trials=1, warmup_s=0.0, min_warmup_calls=1)}


@dataclass(frozen=True)
class Pair:
    what: str
    slow: workloads.Workload
    fast: workloads.Workload


def _up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def pairs(sizes: Sizes, kind: str) -> list[Pair]:
    """The pairs at ``sizes``: head_dims, GEMM sides and ranks off alignment, and their fix."""
    dt = sizes.dtype
    b, s, h = sizes.sdpa_shape
    m, hid, inter = sizes.tokens, sizes.hidden, sizes.inter
    backends = ("default", "flash", "efficient", "cudnn") if kind == "cuda" else ("default",)
    head_dims = (107, 125, 250) if kind == "cuda" else (13,)
    out = [Pair(f"sdpa {be} head_dim {d} vs {_up(d, 8)}", workloads.sdpa(b, s, h, d, dt, be),
                workloads.sdpa(b, s, h, _up(d, 8), dt, be))
           for be in backends for d in head_dims]
    for odd in (hid + 1, hid + 4):
        out.append(Pair(f"gemm K {odd} vs {_up(odd, 8)}", workloads.gemm(m, odd, hid, dt),
                        workloads.gemm(m, _up(odd, 8), hid, dt)))
        out.append(Pair(f"gemm N {odd} vs {_up(odd, 8)}", workloads.gemm(m, hid, odd, dt),
                        workloads.gemm(m, hid, _up(odd, 8), dt)))
    down = sizes.pruned_inter + (1 if sizes.pruned_inter % 2 == 0 else 0)
    out.append(Pair(f"gemm K {down} (MLP down) vs {_up(down, 8)}",
                    workloads.gemm(m, down, hid, dt), workloads.gemm(m, _up(down, 8), hid, dt)))
    kv = sizes.kv_heads * sizes.head_dim
    for n in (hid, kv, inter):
        r = asvd_rank(n, hid, sizes.ratio)
        for to in sorted({_up(r, 8), _up(r, 64)} - {r}):
            out.append(Pair(f"lowrank {hid}->{n} rank {r} vs {to}",
                            workloads.lowrank(m, hid, r, n, dt),
                            workloads.lowrank(m, hid, to, n, dt)))
    return out


def run(sizes: Sizes, kind: str, clock: StageClock, log) -> list[dict]:
    rows = []
    for pair in pairs(sizes, kind):
        if clock.expired():
            rows.append({"what": pair.what, "status": "stopped at budget"})
            continue
        rows.append(_time(pair, kind))
        print(f"slowpaths: {_line(rows[-1])}", file=log, flush=True)
    return rows


def _time(pair: Pair, kind: str) -> dict:
    row: dict = {"what": pair.what, "slow": pair.slow.key, "fast": pair.fast.key}
    started = time.monotonic()
    try:
        slow, fast = run_interleaved([pair.slow, pair.fast], kind, CONFIG[kind],
                                     "gac-check evidence", with_peak=False)
    except workloads.Unsupported as exc:
        row.update(status="refused", reason=str(exc))
        return row
    except RuntimeError as exc:  # accepted by the dispatcher's checks, failed in the kernel
        row.update(status="failed", reason=str(exc)[:300])
        return row
    row.update(status="timed", slow_s=slow.median_s, fast_s=fast.median_s,
               slower=slow.median_s / fast.median_s,
               work_ratio=pair.slow.flops / pair.fast.flops,
               slow_backend=slow.backend, fast_backend=fast.backend,
               seconds=round(time.monotonic() - started, 2))
    return row


def _line(row: dict) -> str:
    if row["status"] != "timed":
        return f"{row['what']}: {row['status']} {row.get('reason', '')}".strip()
    return (f"{row['what']}: {row['slower']:.2f}x slower ({row['slow_s'] * 1e6:.1f} vs "
            f"{row['fast_s'] * 1e6:.1f} us; {row['slow_backend'] or ''}"
            f"{' vs ' + row['fast_backend'] if row['fast_backend'] else ''})")
