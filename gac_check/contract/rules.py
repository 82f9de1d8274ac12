"""The Shape Contract: which dimensions a hardware profile wants, per role and dtype.

Rules come from the vendors' documents and the published A100 measurements (see
shared/reference/alignment-rules.md) until a measured sweep for the profile exists. A rule is
"error" when a kernel refuses the shape or a large slowdown was measured, "warning" when the
size is merely not the optimal multiple.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gac_check.sites import DimSite, Role

ERROR, WARNING = "error", "warning"
SEVERITY_RANK = {WARNING: 1, ERROR: 2}

GEMM_ROLES = frozenset({Role.RANK, Role.INTERMEDIATE, Role.KV_LATENT, Role.HIDDEN, Role.VOCAB})
#: FlashAttention-2 compiled head_dim buckets; other sizes run the next one with predication.
FA2_BUCKETS = (32, 64, 96, 128, 192, 256)
#: FlashAttention-3 (Hopper) buckets.
FA3_BUCKETS = (64, 96, 128, 192, 256)

#: Published A100 fp16 GEMM throughput by the largest power of two dividing the swept
#: dimension (K sweep 4000..4100, median TFLOP/s; shared/reference/published-a100-gemm-
#: alignment-sweep.tsv): odd 56.8, 2|4 107.1-107.5, 8 153.2, 16 173.4.
A100_GEMM_SLOWDOWN = {1: 3.05, 2: 1.62, 4: 1.61, 8: 1.13}
#: Published A100 SDPA (fp16, B=4 S=2048 H=32): head_dim off a multiple of 8 is 1.33-1.46x
#: (median 1.38x) slower than the next multiple of 8.
A100_SDPA_SLOWDOWN = 1.38


def elements_per_16_bytes(dtype: str) -> int:
    """Tensor Core / TMA alignment is 16 bytes; in elements that depends on the dtype."""
    if dtype in ("float32", "tfloat32"):
        return 4
    if dtype == "float64":
        return 2
    if dtype.startswith(("float8", "int8", "uint8")):
        return 16
    return 8


@dataclass(frozen=True)
class Rule:
    """One requirement: ``value % modulus == 0`` (or ``value`` in ``allowed``) for ``roles``."""

    id: str
    roles: frozenset[Role]
    severity: str
    why: str
    modulus: int = 1
    allowed: tuple[int, ...] = ()
    max_value: int | None = None
    slowdown: float | None = None  # expected slowdown when violated, where measured
    #: finer figures by the largest power of two dividing the value (odd sizes are worst)
    slowdown_by_pow2: tuple[tuple[int, float], ...] = ()
    source: str = "published"

    def expected_slowdown(self, value: int) -> float | None:
        pow2 = value & -value if value else 0
        return dict(self.slowdown_by_pow2).get(pow2, self.slowdown)

    def violated_by(self, value: int) -> bool:
        if self.max_value is not None and value > self.max_value:
            return True
        if self.allowed:
            return value not in self.allowed
        return value % self.modulus != 0

    def target(self, value: int) -> int:
        """Smallest size >= value that satisfies this rule."""
        if self.allowed:
            return next((a for a in self.allowed if a >= value), value)
        return -(-value // self.modulus) * self.modulus


@dataclass
class Finding:
    """A site that breaks at least one rule, with the fix and what the fix costs."""

    site: DimSite
    rules: list[Rule]
    repair_to: int  # smallest size clearing every error rule (minimal strategy)
    optimal_to: int  # smallest size clearing every rule (optimal strategy)

    @property
    def severity(self) -> str:
        return max((r.severity for r in self.rules), key=SEVERITY_RANK.__getitem__)

    @property
    def slowdown(self) -> float | None:
        known = [s for r in self.rules if (s := r.expected_slowdown(self.site.value))]
        return max(known) if known else None


@dataclass
class Contract:
    """The rules for one hardware profile and dtype."""

    profile: str
    dtype: str
    rules: list[Rule] = field(default_factory=list)
    source: str = "published"

    def rules_for(self, site: DimSite) -> list[Rule]:
        return [r for r in self.rules if site.role in r.roles]

    def violations(self, site: DimSite) -> list[Rule]:
        return [r for r in self.rules_for(site) if r.violated_by(site.value)]

    def target(self, site: DimSite, severities: tuple[str, ...] = (ERROR,)) -> int:
        """Smallest value >= the site's that satisfies all its rules of those severities."""
        rules = [r for r in self.rules_for(site) if r.severity in severities]
        value = site.value
        for _ in range(64):  # rules are monotone targets; a fixed point comes fast
            nxt = max([value, *(r.target(value) for r in rules if r.violated_by(value))])
            if nxt == value:
                return value
            value = nxt
        return value

    def check(self, sites: list[DimSite]) -> list[Finding]:
        findings = []
        for site in sites:
            broken = self.violations(site)
            if broken:
                findings.append(Finding(site, broken, self.target(site),
                                        self.target(site, (ERROR, WARNING))))
        return findings


def gpu_rules(dtype: str, profile: str) -> list[Rule]:
    """Published GPU rules; A100 slowdown figures attach where the published sweeps have them."""
    align = elements_per_16_bytes(dtype)
    # The generic GPU contract is built from the published A100 sweeps, so it quotes them too.
    a100 = profile in ("a100", "gpu")
    hopper = profile in ("h100", "h200")
    buckets = FA3_BUCKETS if hopper else FA2_BUCKETS
    attn_half = dtype in ("float16", "bfloat16")
    rules = [
        Rule("gemm-align-16B", GEMM_ROLES, ERROR,
             f"Tensor Core GEMMs need K/N multiples of 16 bytes ({align} x {dtype}); cuBLAS "
             "silently takes a slower kernel" + ("; Hopper TMA requires it" if hopper else ""),
             modulus=align, slowdown=A100_GEMM_SLOWDOWN[2] if a100 else None,
             slowdown_by_pow2=tuple(A100_GEMM_SLOWDOWN.items()) if a100 else ()),
        Rule("gemm-optimal-32B", GEMM_ROLES, WARNING,
             f"MMA tiles reduce in 32-byte steps: multiples of {2 * align} reach full "
             "throughput "
             "(A100: 173 vs 153 TFLOP/s)", modulus=2 * align,
             slowdown=A100_GEMM_SLOWDOWN[8] if a100 else None),
        Rule("attn-head-dim-align", frozenset({Role.HEAD_DIM}), ERROR,
             f"SDPA's efficient and cuDNN backends need head_dim % {align}; flash pads it on "
             "every call", modulus=align, slowdown=A100_SDPA_SLOWDOWN if a100 else None),
        Rule("attn-head-dim-max", frozenset({Role.HEAD_DIM}), ERROR,
             "FlashAttention and SDPA's flash backend take head_dim <= 256", max_value=256,
             modulus=1),
    ]
    if attn_half:
        rules.append(Rule(
            "attn-head-dim-bucket", frozenset({Role.HEAD_DIM}), WARNING,
            f"FlashAttention compiles head_dim {', '.join(map(str, buckets))}; other sizes run "
            "the next bucket with predication", allowed=buckets))
    return rules


def cpu_rules(dtype: str) -> list[Rule]:
    """Seen on this project's Xeon machines: no GEMM staircase, an SDPA one."""
    return [Rule("cpu-sdpa-head-dim-8", frozenset({Role.HEAD_DIM}), WARNING,
                 "CPU SDPA: head_dim one below a multiple of 8 ran 1.1-1.2x slower (fp32); bf16 "
                 "spiked 2.1-2.4x at some sizes", modulus=8, slowdown=1.15)]
