"""``gac-check MODEL_DIR --bench``: time the model's own misaligned sites against their repaired
sizes on the device present.

Each finding becomes the kernels its site feeds: a rank or an MLP intermediate (or a PaLU
latent) is the GEMMs of every 2-D tensor that carries it, in nn.Linear's layout (the low-rank
pair A then B; gate/up then down); a head_dim is SDPA over the model's heads. The original and
the repaired shapes are timed interleaved. Identical shapes are timed once (a 32-layer model has
a few distinct sites, not 32 x 7). The model figure sums the sites' kernel times over every
site: it is the speedup of the kernels the repair touches, not an end-to-end latency.
"""
from __future__ import annotations

from dataclasses import dataclass

from gac_check.bench import device as devices
from gac_check.bench import timing, workloads
from gac_check.bench.kernels import run_interleaved
from gac_check.sites import AxisKind, Role

GEMM_SITE_ROLES = (Role.RANK, Role.INTERMEDIATE, Role.KV_LATENT)
#: Tokens per GEMM (prefill) and sequence length for SDPA, per device kind.
TOKENS = {"cpu": 128, "cuda": 4096}
CONFIG = {"cpu": timing.TimingConfig(samples=7, trials=3, warmup_s=0.02),
          "cuda": timing.TimingConfig(samples=20, trials=3)}


@dataclass
class SiteTiming:
    name: str
    role: str
    value: int
    repaired: int
    original_s: float | None
    repaired_s: float | None
    note: str = ""
    kernels: str = ""  # what was timed at the original size (case keys)

    @property
    def speedup(self) -> float | None:
        if self.original_s is None or not self.repaired_s:
            return None
        return self.original_s / self.repaired_s


@dataclass
class BenchReport:
    device: str
    dtype: str
    tokens: int
    sites: list[SiteTiming]
    hardware: str = ""  # the device's name (GPU model, CPU model)
    profile: str = ""  # its hardware profile: a100/h100/h200, gpu for another GPU, cpu
    #: whether these timings became the sites' expected slowdowns (contract.evidence says)
    precedence: str = ""

    @property
    def timed(self) -> list[SiteTiming]:
        return [s for s in self.sites if s.speedup is not None]

    @property
    def model_speedup(self) -> float | None:
        timed = self.timed
        if not timed:
            return None
        return sum(s.original_s for s in timed) / sum(s.repaired_s for s in timed)


def bench_dtype(device: str, model_dtype: str) -> str:
    """GPU: the model's half type. CPU: float32 (half types run emulated on most CPUs, and one
    dtype per process is the rule)."""
    if device == "cpu":
        return "float32"
    return model_dtype if model_dtype in ("float16", "bfloat16") else "float16"


def site_workloads(finding, shapes: dict[str, tuple[int, ...]], config: dict, to: int,
                   tokens: int, dtype: str) -> list[workloads.Workload]:
    """The kernels of one site at size ``to`` (its own value gives the original)."""
    site = finding.site
    if site.role == Role.HEAD_DIM:
        heads = max([a.blocks for a in site.axes if a.kind == AxisKind.PRODUCER]
                    + [int(config.get("num_attention_heads", 1))])
        return [workloads.sdpa(1, tokens, heads, to, dtype)]
    out = []
    delta = to - site.value
    for ax in site.axes:
        shape = shapes.get(ax.tensor)
        if shape is None or len(shape) != 2 or ax.kind not in (AxisKind.PRODUCER,
                                                               AxisKind.CONSUMER):
            continue
        n, k = shape
        if ax.axis == 0:
            n += delta * ax.blocks
        else:
            k += delta * ax.blocks
        out.append(workloads.gemm(tokens, k, n, dtype))
    return out


def bench_findings(result, here: devices.Device | None = None) -> BenchReport:
    """Time every finding's site at its value and at its repaired size, on ``here`` (default:
    the device present)."""
    here = here or devices.present()
    kind = here.kind
    dtype = bench_dtype(kind, result.contract.dtype)
    tokens = TOKENS[kind]
    shapes, config = result.checkpoint.shapes, result.checkpoint.config
    cache: dict[str, float] = {}
    sites = []
    for f in result.findings:
        to = f.fix_to  # the size the contract's expected slowdown compares with, too
        row = SiteTiming(f.site.name, f.site.role.value, f.site.value, to, None, None)
        sites.append(row)
        if f.site.role not in (*GEMM_SITE_ROLES, Role.HEAD_DIM):
            row.note = f"not benchmarked: no kernel model for role {f.site.role.value}"
            continue
        if to <= f.site.value:
            row.note = "nothing to repair"
            continue
        if f.site.role == Role.HEAD_DIM and to > 256:
            row.note = "head_dim above 256: no fused SDPA kernel to compare"
            continue
        orig = site_workloads(f, shapes, config, f.site.value, tokens, dtype)
        rep = site_workloads(f, shapes, config, to, tokens, dtype)
        if not orig:
            row.note = "no 2-D tensors carry this site"
            continue
        todo = [w for w in orig + rep if w.key not in cache]
        for m in run_interleaved(todo, kind, CONFIG[kind], "gac-check --bench",
                                 with_peak=False) if todo else []:
            cache[m.case] = m.median_s
        row.original_s = sum(cache[w.key] for w in orig)
        row.repaired_s = sum(cache[w.key] for w in rep)
        row.kernels = "; ".join(w.key for w in orig[:2]) + (
            f"; and {len(orig) - 2} more" if len(orig) > 2 else "")
    return BenchReport(kind, dtype, tokens, sites, here.name, here.profile)


def render(report: BenchReport) -> str:
    lines = [f"bench on {report.hardware or report.device} ({report.dtype}, {report.tokens} "
             "tokens per GEMM / sequence length for SDPA): original -> repaired",
             f"{'site':<48} {'role':<13} {'size':>11} {'orig ms':>9} {'rep ms':>9} speedup"]
    for s in report.sites:
        size = f"{s.value}->{s.repaired}"
        if s.speedup is None:
            lines.append(f"{s.name:<48} {s.role:<13} {size:>11}  {s.note}")
        else:
            lines.append(f"{s.name:<48} {s.role:<13} {size:>11} {s.original_s * 1e3:>9.3f} "
                         f"{s.repaired_s * 1e3:>9.3f} {s.speedup:.2f}x")
    total = report.model_speedup
    lines.append("model (sum over the timed sites' kernels): "
                 + (f"{total:.2f}x" if total else "no site could be timed"))
    return "\n".join([*lines, report.precedence] if report.precedence else lines)
