"""A deployment target: ``ENGINE[@VERSION][,tp=N][,ep=N][,quant=Q][,group=G][,kv=DTYPE]``.

``vllm,tp=4,quant=awq``, ``tensorrt-llm,tp=2``, ``llama.cpp,quant=Q4_K_M``, ``transformers``.
Anything the engine's pack does not know (engine, version, quantization, option) is bad input:
one line naming what is known. ``ep=N`` is expert parallelism as the engine runs it: vLLM's
``--enable-expert-parallel`` divides the MoE layers' experts over N ranks, the TP ranks times the
data-parallel ones, so N is a multiple of ``tp`` (N / tp data-parallel replicas); SGLang's
``--ep-size N`` splits the ``tp`` ranks into N expert groups of tp / N ranks each, so N divides
``tp``.
"""
from __future__ import annotations

from dataclasses import dataclass

from gac_check.errors import BadInput
from gac_check.targets.packs import Pack, find_pack

OPTIONS = ("tp", "quant", "group", "kv", "ep")
KV_DTYPES = ("auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class Target:
    """One deployment: an engine release, its TP size, quantization, group and KV dtype."""

    spec: str  # as the user gave it
    engine: str
    version: str
    tp: int = 1
    quant: str = "none"
    group: int | None = None
    kv: str = "auto"
    #: the expert-parallel size (1: none): the ranks the MoE layers' experts are divided over
    ep: int = 1
    #: The options the spec gave (``quant``, ``group``...), as opposed to the pack's defaults.
    given: frozenset[str] = frozenset()

    @property
    def pack(self) -> Pack:
        return find_pack(self.engine)


def parse_target(spec: str) -> Target:
    """Parse a ``--target`` value; :class:`BadInput` (one line) for anything unknown."""
    text = spec.strip()
    if not text:
        raise BadInput("--target needs ENGINE[@VERSION][,tp=N][,ep=N][,quant=Q][,group=G]"
                       "[,kv=DTYPE]")
    head, *opts = [p.strip() for p in text.split(",")]
    engine, _, version = head.partition("@")
    pack = find_pack(engine)
    if version and version not in pack.versions:
        raise BadInput(f"--target {spec}: {pack.engine} version {version!r} is not in its rule "
                       f"pack (known: {', '.join(pack.versions)})")
    values: dict[str, str] = {}
    for opt in opts:
        key, eq, value = opt.partition("=")
        key = key.strip().lower()
        if not eq or key not in OPTIONS or not value.strip():
            raise BadInput(f"--target {spec}: unknown option {opt!r} (known: "
                           f"{', '.join(o + '=' for o in OPTIONS)})")
        if key in values:
            raise BadInput(f"--target {spec}: {key}= given twice")
        values[key] = value.strip()
    tp = _positive(values.get("tp", "1"), "tp", spec)
    if tp > 1 and not pack.multi_gpu:
        raise BadInput(f"--target {spec}: {pack.engine} has no tensor parallelism in its rule "
                       "pack; use tp=1")
    ep = _expert_parallel(values.get("ep", "1"), tp, pack, spec)
    quant = _quant(values.get("quant", pack.default_quant), pack, spec)
    group = values.get("group")
    group_n = None
    if group is not None:
        group_n = -1 if group == "-1" else _positive(group, "group", spec)
    elif quant in pack.default_group:
        group_n = pack.default_group[quant]
    kv = values.get("kv", "auto").lower()
    if kv not in KV_DTYPES:
        raise BadInput(f"--target {spec}: unknown kv={kv} (known: {', '.join(KV_DTYPES)})")
    return Target(text, pack.engine, version or pack.default_version, tp, quant, group_n, kv,
                  ep, frozenset(values))


def _expert_parallel(value: str, tp: int, pack: Pack, spec: str) -> int:
    """``ep=N``: N ranks share the experts; vLLM makes them the TP x DP ranks
    (``FusedMoEParallelConfig.make``), so N is a multiple of tp; SGLang splits the TP ranks
    into N groups (``derive_parallel_widths``), so N divides tp."""
    ep = _positive(value, "ep", spec)
    if ep > 1 and not pack.expert_parallel:
        raise BadInput(f"--target {spec}: {pack.engine} has no expert parallelism in its rule "
                       "pack; drop ep=")
    if pack.expert_parallel_within_tp:
        if tp % ep:
            raise BadInput(f"--target {spec}: ep={ep} does not divide tp={tp}: {pack.title}'s "
                           "expert-parallel groups split the TP ranks (moe_tp_size = tp / ep, "
                           "derive_parallel_widths), so ep is a divisor of tp (ep=2 with tp=4: "
                           "2 groups of 2)")
        return ep
    if ep > 1 and ep % tp:
        raise BadInput(f"--target {spec}: ep={ep} is not a multiple of tp={tp}: the expert-"
                       "parallel ranks are the TP ranks times the data-parallel replicas "
                       f"(ep = tp x dp: ep={tp}, {2 * tp}, ...)")
    return ep


def _positive(value: str, key: str, spec: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1 or str(n) != value.lstrip("+"):
        raise BadInput(f"--target {spec}: {key}= must be a positive integer, not {value!r}")
    return n


def _quant(value: str, pack: Pack, spec: str) -> str:
    by_lower = {q.lower(): q for q in pack.quants}
    if value.lower() not in by_lower:
        raise BadInput(f"--target {spec}: {pack.engine} does not know quant={value} (known: "
                       f"{', '.join(pack.quants)})")
    return by_lower[value.lower()]
