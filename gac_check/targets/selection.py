"""One use of a site judged by a rule pack: each selection of the target's pack that applies to
the use walks its candidates in the engine's order, and the first whose conditions hold is what
runs (``fast``, ``fallback`` with why, or ``refused`` with what the engine prints).

Split from :mod:`gac_check.targets.verdicts`, which makes a site's verdict (the worst over its
uses) and searches for the smallest fast size: this module only answers "what does the pack say
of this use at this size on this capability", the question the size searches ask thousands of
times and the vLLM oracle asks per capability (``sm``: the compute capability as an int, None
for no GPU).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache

from gac_check.profiles import PROFILES, capability
from gac_check.sites import DimSite, Role
from gac_check.targets import gguf
from gac_check.targets.packs import Candidate, Pack, Selection, Source, find_pack
from gac_check.targets.shards import ModelShape, Use, pad_to_multiple, uses
from gac_check.targets.spec import Target

FAST, FALLBACK, REFUSED = "fast", "fallback", "refused"
RANK = {FAST: 0, FALLBACK: 1, REFUSED: 2}
#: Each profile's compute capability, what every GPU-dependent engine rule reads
#: (gac_check.profiles: the generic profile is judged as an A100's sm80).
SM_OF_PROFILE = {key: capability(key) for key in PROFILES}


@dataclass(frozen=True)
class Outcome:
    """What one selection decides for one use at one value."""

    verdict: str
    kernel: str | None
    why: str
    source: Source
    selection: str
    gate: bool = False
    use: str = ""  # the linear, attention or tensor judged (qkv_proj, down_proj, ffn_down)
    uncertain: str | None = None  # the deciding rule's own caveat, from the pack
    #: the per-shard widths the rule read (shard_in, shard_out, head_dim, vocab_per_rank, ...)
    shard: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict:
        return {"use": self.use, "rule": self.selection, "verdict": self.verdict,
                "kernel": self.kernel, "uncertain": self.uncertain, **dict(self.shard)}


#: The per-use quantities the check JSON reports (what a reader needs to see the shard).
DETAIL = ("in", "out", "shard_in", "shard_out", "head_dim", "heads_per_rank",
          "kv_heads_per_rank", "vocab", "vocab_per_rank", "expert_shard", "experts", "ep")


def _version_ok(pack: Pack, c: Candidate | Selection, version: str) -> bool:
    i = pack.version_index(version)
    if c.since is not None and i < pack.version_index(c.since):
        return False
    return not (c.until is not None and i > pack.version_index(c.until))


def _gpu_ok(c: Candidate, sm: int | None) -> bool:
    if c.sm_min is None and c.sm_max is None:
        return True
    if sm is None:
        return False
    return (c.sm_min is None or sm >= c.sm_min) and (c.sm_max is None or sm <= c.sm_max)


def _failed(c: Candidate, q: dict[str, int], sm: int | None) -> str | None:
    """The first reason candidate ``c`` does not run (None: it runs)."""
    if not _gpu_ok(c, sm):
        want = [f"sm >= {c.sm_min}" if c.sm_min else "", f"sm <= {c.sm_max}" if c.sm_max else ""]
        have = f"sm_{sm}" if sm else "no GPU"
        return f"{c.kernel} needs {' and '.join(w for w in want if w)} ({have})"
    for cond in c.when:
        if not cond.holds(q):
            text = cond.message or f"{c.kernel} needs {cond.describe(q)}"
            return text if cond.message is None else f"{text} ({cond.describe(q)})"
    return None


def select(pack: Pack, sel: Selection, target: Target, q: dict[str, int],
           sm: int | None) -> Outcome:
    """Walk one selection's candidates in the engine's order."""
    first_fast_why = None
    gpu_why = None  # a fast kernel this GPU cannot run explains a fallback only if no other
    for c in sel.candidates:
        if not _version_ok(pack, c, target.version) or c.only_if:
            continue
        why = _failed(c, q, sm)
        if why is None:
            if c.refuse:
                return Outcome(REFUSED, None, c.message or c.kernel, c.source, sel.id, sel.gate,
                               uncertain=c.uncertain)
            if c.fast:
                return Outcome(FAST, c.kernel, "", c.source, sel.id, sel.gate,
                               uncertain=c.uncertain)
            why = "; ".join(w for w in (first_fast_why or gpu_why, _padding(c, q),
                                         c.uncertain and f"uncertain: {c.uncertain}") if w)
            return Outcome(FALLBACK, c.kernel, why, c.source, sel.id, sel.gate,
                           uncertain=c.uncertain)
        if c.fast and not _gpu_ok(c, sm):
            gpu_why = gpu_why or why
        elif c.fast and first_fast_why is None:
            first_fast_why = why
    message = sel.otherwise_message
    first_fast_why = first_fast_why or gpu_why
    why = f"{message} ({first_fast_why})" if first_fast_why and message else (
        message or first_fast_why or "")
    return Outcome(REFUSED if sel.otherwise_verdict == REFUSED else FALLBACK,
                   sel.otherwise_kernel, why, sel.otherwise_source, sel.id, sel.gate)


#: The GEMM side a per-shard quantity is: what a padding kernel's message calls it.
GEMM_SIDE = {"shard_in": "K", "shard_out": "N"}


def _padding(c: Candidate, q: dict[str, int]) -> str:
    """What a padding kernel pads, in this use's numbers: ``it pads K 2750 -> 2752``."""
    done = [f"{GEMM_SIDE.get(name, name)} {q[name]} -> {pad_to_multiple(q[name], m)}"
            for name, m in c.pads if name in q and q[name] % m]
    return (f"it pads {', '.join(done)}: the weight once at load, and on every call the "
            "activations (K) or the output it slices back (N)") if done else ""


def judge_uses(target: Target, site_uses: list[Use], value: int,
               sm: int | None) -> list[Outcome]:
    out = []
    for use, q, o in _outcomes(target, site_uses, value, sm):
        if q is None:
            out.append(replace(o, use=use.name))
        else:
            out.append(replace(o, use=use.name, shard=tuple((k, q[k]) for k in DETAIL if k in q)))
    return out


def fast_on(target: Target, site_uses: list[Use], value: int, sm: int | None) -> bool:
    """``worst(judge_uses(...)) == FAST``, stopping at the first outcome that is not fast and
    labelling none: the size searches ask this of thousands of sizes."""
    return all(o.verdict == FAST for _, _, o in _outcomes(target, site_uses, value, sm))


def _outcomes(target: Target, site_uses: list[Use], value: int,
              sm: int | None) -> Iterator[tuple[Use, dict[str, int] | None, Outcome]]:
    """Each use's outcomes with the quantities they were judged on (None: a GGUF tensor's)."""
    pack = target.pack
    for use in site_uses:
        if use.component == "tensor":
            yield use, None, _gguf_outcome(target.engine, target.version, target.quant,
                                           use.tensor, value)  # type: ignore[arg-type]
            continue
        q = use.quantities(value)
        for sel in pack.selections:
            if (sel.component == use.component and sel.applies(target.quant, target.kv, use.name)
                    and _version_ok(pack, sel, target.version)):
                yield use, q, select(pack, sel, target, q, sm)


@lru_cache(maxsize=1 << 16)
def _gguf_outcome(engine: str, version: str, quant: str, tu: gguf.TensorUse,
                  value: int) -> Outcome:
    """One GGUF tensor: the type llama.cpp stores it in against the type its mix asks for.
    Kept per (release, quant, tensor use, size): the size search asks the same of each of
    the 80 layers whose tensor the mix gives the same types."""
    pack = find_pack(engine)
    sel = f"{pack.engine}-{tu.tensor}"
    row = tu.rows(value)
    stored = [gguf.stored_type(pack, version, quant, tu.tensor, r, row)
              for r in tu.requested]
    for s in stored:
        refusal = gguf.imatrix_refusal(pack, tu.tensor, s.type)
        if refusal:
            return Outcome(REFUSED, None, refusal[0], refusal[1], sel)
    bad = next((s for s in stored if s.type is None), None)
    if bad is not None:
        return Outcome(REFUSED, None, f"{tu.tensor}: {bad.why}", bad.source, sel)
    moved = next((s for s in stored if s.type != s.requested), None)
    if moved is not None:
        return Outcome(FALLBACK, f"{moved.type} (for {moved.requested})",
                       f"{tu.tensor}: {moved.why}", moved.source, sel)
    kinds = "/".join(tu.requested)
    return Outcome(FAST, kinds, "", stored[0].source, sel)


def worst(outcomes: list[Outcome]) -> str:
    return max((o.verdict for o in outcomes), key=RANK.__getitem__, default=FAST)


def site_uses(site: DimSite, shape: ModelShape, target: Target) -> list[Use]:
    if target.pack.gguf_types:  # llama.cpp: the GGUF tensors whose rows the site sets
        out = [Use("tensor", tu.tensor, lambda v: {}, tu)
               for tu in gguf.tensor_uses(target.pack, target.quant, site, shape)]
        if site.role is Role.INTERMEDIATE:  # one feed_forward_length per file (the loader)
            uniform = {"uniform_layers": int(shape.uniform)}  # not per size: 80 layers each
            out.append(Use("model", "layers", lambda v: dict(uniform)))
        return out
    tp_rules = target.pack.tp
    kv_rule = (tp_rules.get("kv_heads") or {}).get("rule", "replicate")
    padding = tp_rules.get("vocab_padding") or {}
    widen = padding.get("times_tp_when_indivisible")
    widen_here = bool(widen) and (target.pack.version_index(target.version)
                                  >= target.pack.version_index(widen["from"]))
    moe_tp = target.tp // target.ep if target.pack.expert_parallel_within_tp else None
    return uses(site, shape, target.tp, target.group, kv_rule, int(padding.get("multiple", 1)),
                widen_here, target.ep, moe_tp)
