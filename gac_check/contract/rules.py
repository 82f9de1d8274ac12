"""The Shape Contract: which dimensions a hardware profile wants, per role and dtype.

Rules come from the vendors' documents (see shared/reference/alignment-rules.md) until a
measured sweep for the profile exists. A rule is "error" when a kernel refuses the shape or a
large slowdown was measured, "warning" when the size is merely not the optimal multiple. What a
broken rule costs at a site's own shape is not a property of the rule: the contract's evidence
(:mod:`gac_check.contract.evidence`) reads it from data that cover that shape, or says it has
none.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gac_check.contract.slowdown import Slowdown
from gac_check.profiles import GENERIC_SM, GPU_BY_KEY, capability
from gac_check.sites import DimSite, Role
from gac_check.targets.blocks import recordable

if TYPE_CHECKING:  # targets are imported only where a check names one
    from gac_check.targets.verdicts import SiteVerdicts

ERROR, WARNING = "error", "warning"
SEVERITY_RANK = {WARNING: 1, ERROR: 2}
#: ``--fail-on``: the least severity that fails a gate ("never": none does).
FAIL_ON = ("error", "warning", "refused", "fallback", "never")
#: ``--fail-on`` values that gate on the deployment targets' verdicts alone
TARGET_GATES = {"refused": ("refused",), "fallback": ("fallback", "refused")}

GEMM_ROLES = frozenset({Role.RANK, Role.INTERMEDIATE, Role.KV_LATENT, Role.HIDDEN, Role.VOCAB,
                        Role.EXPERT, Role.SHARED_EXPERT, Role.SSM, Role.INDEXER})
#: FlashAttention-2 compiled head_dim buckets; other sizes run the next one with predication.
FA2_BUCKETS = (32, 64, 96, 128, 192, 256)
#: FlashAttention-3 (Hopper) buckets.
FA3_BUCKETS = (64, 96, 128, 192, 256)



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
    #: The padding rescue this rule's modulus buys at the shapes of the sweep it was read from
    #: (what the perf suites expect to see there); never quoted for a site of another shape.
    slowdown: float | None = None
    #: finer figures by the largest power of two dividing the value (odd sizes are worst)
    slowdown_by_pow2: tuple[tuple[int, float], ...] = ()
    source: str = "published"
    #: a deployment target's verdict (fallback or refused) where the rule is one: what
    #: ``--fail-on refused`` and ``--fail-on fallback`` gate on
    verdict: str | None = None

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
    #: what the contract's data say this size costs against ``fix_to``, with provenance
    expected: Slowdown | None = None
    #: ``--bench`` on this profile's hardware: the site's own kernels; takes precedence
    bench: Slowdown | None = None

    @property
    def severity(self) -> str:
        return max((r.severity for r in self.rules), key=SEVERITY_RANK.__getitem__)

    @property
    def fix_to(self) -> int:
        """The size a slowdown figure compares with: the repair, else the optimal size."""
        return self.repair_to if self.repair_to > self.site.value else self.optimal_to

    @property
    def figure(self) -> Slowdown | None:
        return self.bench or self.expected

    @property
    def slowdown(self) -> float | None:
        """The figure's value where data at this shape give it; None for an estimate or an
        unmeasured shape (the figure says which)."""
        fig = self.figure
        return fig.value if fig is not None and fig.measured else None


class SlowdownSource(Protocol):
    """What a contract reads expected slowdowns from (gac_check.contract.evidence.Evidence)."""

    def figure(self, role: Role, value: int, to: int, dtype: str,
               target_of: Callable[[int], int]) -> Slowdown: ...


def fails(findings: list[Finding], fail_on: str = ERROR) -> bool:
    """Whether ``findings`` fail a gate at ``fail_on``: the CLI's exit 1, the API's "fail".
    ``refused`` fails only on a target that will not load a site, ``fallback`` also on a
    slower kernel; ``error`` and ``warning`` on every rule at or above that severity."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
    if fail_on in TARGET_GATES:
        return any(r.verdict in TARGET_GATES[fail_on] for f in findings for r in f.rules)
    least = SEVERITY_RANK.get(fail_on)
    return least is not None and any(SEVERITY_RANK[f.severity] >= least for f in findings)


@dataclass
class Contract:
    """The rules for one hardware profile and dtype."""

    profile: str
    dtype: str
    rules: list[Rule] = field(default_factory=list)
    source: str = "published"
    evidence: SlowdownSource | None = None  # where expected slowdowns come from
    #: the deployment targets' verdicts per site (gac_check.targets), judged with the model's
    #: own shapes when the contract was assembled (contract.select.assemble)
    targets: SiteVerdicts | None = None

    def rules_for(self, site: DimSite) -> list[Rule]:
        return [r for r in self.rules if site.role in r.roles]

    def violations(self, site: DimSite) -> list[Rule]:
        broken = [r for r in self.rules_for(site) if r.violated_by(site.value)]
        return broken + self._target_rules(site)

    def _target_rules(self, site: DimSite) -> list[Rule]:
        """A fallback or refused verdict on a target is an error-level rule of the site."""
        if self.targets is None:
            return []
        from gac_check.targets.verdicts import FAST

        return [Rule(f"target:{v.target.spec}", frozenset({site.role}), ERROR,
                     f"{v.target.spec}: {v.verdict}"
                     + (f" to {v.kernel}" if v.kernel and v.verdict != "refused" else "")
                     + (f": {v.why}" if v.why else "")
                     + (f"; {v.cannot_pad}" if v.cannot_pad else ""),
                     source=str(v.source) if v.source else "target", verdict=v.verdict)
                for v in self.targets.of(site) if v.verdict != FAST]

    def target(self, site: DimSite, severities: tuple[str, ...] = (ERROR,)) -> int:
        """Smallest value >= the site's that satisfies all its rules of those severities and,
        where padding can make it so, is fast on every target; then the smallest at or above
        that its config can record (a DeciLM MLP: a width some ffn_mult builds)."""
        return recordable(site, self._fast_target(site, severities))

    def _fast_target(self, site: DimSite, severities: tuple[str, ...]) -> int:
        value = self._target(site.role, site.value, severities)
        if self.targets is None or ERROR not in severities:
            return value
        for _ in range(64):  # each step is the smallest size both the rules and targets take
            nxt = self.targets.smallest_fast(site, value)
            if nxt is None:
                return value
            nxt = self._target(site.role, nxt, severities)
            if nxt == value:
                return value
            value = nxt
        return value

    def _target(self, role: Role, value: int, severities: tuple[str, ...]) -> int:
        rules = [r for r in self.rules if role in r.roles and r.severity in severities]
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
                f = Finding(site, broken, self.target(site), self.target(site, (ERROR, WARNING)))
                f.expected = self._expected(f)
                findings.append(f)
        return findings

    def _expected(self, f: Finding) -> Slowdown | None:
        if self.evidence is None:
            return None
        severities = (ERROR,) if f.fix_to == f.repair_to else (ERROR, WARNING)
        role = f.site.role
        return self.evidence.figure(role, f.site.value, f.fix_to, self.dtype,
                                    lambda u: self._target(role, u, severities))


#: Median fp16 GEMM throughput (TFLOP/s) at K a multiple of 16 and at K a multiple of 8 only,
#: in each GPU's published K sweep (gac_check/data/published-*-gemm-alignment-sweep.tsv).
PUBLISHED_K_SWEEP = {"a100": (173.4, 153.2), "h100": (346.3, 345.4)}
#: whose sweep speaks for a profile: the H200 shares the H100's Hopper kernels; the generic GPU
#: contract quotes the A100's
K_SWEEP_FOR = {"a100": "a100", "gpu": "a100", "h100": "h100", "h200": "h100"}


def _k_sweep_figure(profile: str) -> str:
    """The published figure behind the 32-byte rule, from the profile's own GPU: an H100 check
    must not quote the A100 (whose gain the H100 sweep does not show), and a GPU no sweep was
    published for quotes none."""
    gpu = K_SWEEP_FOR.get(profile)
    if gpu is None:
        title = GPU_BY_KEY[profile].title if profile in GPU_BY_KEY else profile
        return (f"no K sweep is published for {title}; the rule is the MMA instruction's "
                "k-step (PTX ISA mma.sync k16 for 16-bit, k32 for 8-bit)")
    at16, at8 = PUBLISHED_K_SWEEP[gpu]
    return (f"published {gpu.upper()} fp16 K sweep: {at16:g} vs {at8:g} TFLOP/s at multiples "
            "of 16 vs 8" + ("; on this GPU the gain is within noise" if at16 < 1.02 * at8
                            else ""))


#: TMA (sm90 and newer: Hopper, Blackwell) takes a tensor map whose global strides are
#: multiples of 16 bytes (CUDA Driver API, cuTensorMapEncodeTiled: "globalStrides ... must be a
#: multiple of 16"): a misaligned K is not a slower kernel there but no TMA kernel at all.
TMA_FROM_SM = 90


def attention_buckets(sm: int) -> tuple[tuple[int, ...], str] | None:
    """The FlashAttention head_dim buckets published for a capability, with their source;
    None where none are published (Blackwell: FlashAttention-2's README lists Ampere, Ada and
    Hopper, FlashAttention-3's README Hopper only)."""
    if sm == 90:
        return FA3_BUCKETS, "FlashAttention-3 (hopper/, Hopper only) compiles"
    if 80 <= sm < 90:
        return FA2_BUCKETS, ("FlashAttention-2 (README: Ampere, Ada or Hopper, e.g. A100, "
                             "RTX 3090, RTX 4090) compiles")
    return None


def gpu_rules(dtype: str, profile: str) -> list[Rule]:
    """Published GPU rules for the profile's compute capability (the evidence adds what each
    costs where a sweep shows it); a rule nothing publishes for that GPU is left out."""
    align = elements_per_16_bytes(dtype)
    sm = capability(profile) or GENERIC_SM
    tma = sm >= TMA_FROM_SM
    buckets = attention_buckets(sm)
    attn_half = dtype in ("float16", "bfloat16")
    rules = [
        Rule("gemm-align-16B", GEMM_ROLES, ERROR,
             f"Tensor Core GEMMs need K/N multiples of 16 bytes ({align} x {dtype}); cuBLAS "
             "silently takes a slower kernel"
             + (f"; TMA (sm_{sm}) requires it" if tma else ""), modulus=align),
        Rule("gemm-optimal-32B", GEMM_ROLES, WARNING,
             f"MMA tiles reduce in 32-byte steps: multiples of {2 * align} reach full "
             f"throughput ({_k_sweep_figure(profile)})", modulus=2 * align),
        Rule("attn-head-dim-align", frozenset({Role.HEAD_DIM}), ERROR,
             f"SDPA's efficient and cuDNN backends need head_dim % {align}; flash pads it on "
             "every call", modulus=align),
        Rule("attn-head-dim-max", frozenset({Role.HEAD_DIM}), ERROR,
             "FlashAttention and SDPA's flash backend take head_dim <= 256", max_value=256,
             modulus=1),
    ]
    rules += ssm_rules()
    if attn_half and buckets is not None:
        sizes, who = buckets
        rules.append(Rule(
            "attn-head-dim-bucket", frozenset({Role.HEAD_DIM}), WARNING,
            f"{who} head_dim {', '.join(map(str, sizes))}; other sizes run the next bucket "
            "with predication", allowed=sizes))
    return rules


def ssm_rules() -> list[Rule]:
    """The SSM kernels' published limits (docs/formats.md "Hybrid and SSM models"): the CUDA
    kernels transformers' and mamba_ssm's fast paths call refuse other sizes."""
    return [
        Rule("ssm-conv-width", frozenset({Role.SSM_CONV}), ERROR,
             "causal-conv1d 1.6.1 (csrc/causal_conv1d.cpp, causal_conv1d_fwd) takes a conv "
             "width of 2 to 4 only (vLLM 0.33.0's Triton causal_conv1d_fn loads 4 taps at "
             "most)", allowed=(2, 3, 4)),
        Rule("ssm-state-max", frozenset({Role.SSM_STATE}), ERROR,
             "mamba_ssm 2.3.2 (csrc/selective_scan/selective_scan.cpp, selective_scan_fwd) "
             "takes a state size <= 256", max_value=256),
    ]


def cpu_rules(dtype: str) -> list[Rule]:
    """Seen on this project's Xeon machines: no GEMM staircase, an SDPA one."""
    return [Rule("cpu-sdpa-head-dim-8", frozenset({Role.HEAD_DIM}), WARNING,
                 "CPU SDPA: head_dim one below a multiple of 8 ran 1.1-1.2x slower (fp32); bf16 "
                 "spiked 2.1-2.4x at some sizes", modulus=8, slowdown=1.15)]
