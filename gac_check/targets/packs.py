"""Rule packs: each engine's kernel and backend choices as versioned data (docs/targets.md).

A pack (``gac_check/targets/packs/<engine>.json``, schema ``gac-check-pack/1``) lists the
engine's *selections*: for a component (attention, a linear, the embedding, the whole model),
the kernels it tries in the engine's own order, each with the conditions it needs, the
releases it holds for and where in the engine's source the condition is. Loading validates
every rule and refuses one without a citation, so a pack can never ship an unsourced rule.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from gac_check.errors import BadInput
from gac_check.targets.source import Source

SCHEMA = "gac-check-pack/1"
COMPONENTS = ("attention", "linear", "embedding", "model", "tensor", "mla")
OPERATORS = ("multiple_of", "max", "min", "in", "not_in", "equals")
QUANTITIES = frozenset({
    "head_dim", "heads", "kv_heads", "heads_per_rank", "kv_heads_per_rank", "tp", "in",
    "out", "shard_in", "shard_out", "group", "vocab", "vocab_per_rank", "row",
    "uniform_layers", "part_out", "part_shard_out", "act_fp16",
    # mixture of experts: one expert's width, the MoE layer's own TP size (1 under expert
    # parallelism), the width one rank holds, the expert count and the expert-parallel size
    "expert_width", "moe_tp", "expert_shard", "experts", "ep",
    # the model's hidden size, where an MoE rule reads it (vLLM's block FP8 refinement)
    "hidden",
    # multi-head latent attention (gac_check/targets/mla.py)
    "mla_head_size", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank",
    "qk_head_dim",
})
SOURCE_KEYS = ("repo", "file", "function", "ref")
#: The shipped packs, read as files beside this module (as :mod:`gac_check.bench.published`
#: reads its tables): gac-check is installed as files, and ``importlib.resources``' readers
#: cost every target run 4 ms of imports (zipfile, threading) to list one directory.
PACKS_DIR = Path(__file__).resolve().parent / "packs"
GGUF_EXTRAS = ("fallback_by_version", "no_fallback", "second_step_f16", "output_head",
               "requires_imatrix", "bump_70b")


class PackError(ValueError):
    """A pack that breaks the schema: a bug in the shipped data, caught by the tests."""


@dataclass(frozen=True)
class Condition:
    """``quantity OP operand``; ``any`` holds when one of its alternatives does, ``all`` when
    every one does (a backend that takes a list of size combinations)."""

    quantity: str = ""
    op: str = ""
    operand: object = None
    message: str | None = None
    any: tuple[Condition, ...] = ()
    all: tuple[Condition, ...] = ()

    def holds(self, q: dict[str, int]) -> bool:
        if self.any:
            return any(c.holds(q) for c in self.any)
        if self.all:
            return all(c.holds(q) for c in self.all)
        if self.quantity not in q:
            return True  # judged at the site that determines it (docs/targets.md)
        x = q[self.quantity]
        arg = self.operand
        if isinstance(arg, str):
            if arg not in q:
                return True
            arg = q[arg]
        if self.op == "multiple_of":
            return arg > 0 and x % arg == 0  # type: ignore[operator]
        if self.op == "max":
            return x <= arg  # type: ignore[operator]
        if self.op == "min":
            return x >= arg  # type: ignore[operator]
        if self.op == "in":
            return x in arg  # type: ignore[operator]
        if self.op == "not_in":
            return x not in arg  # type: ignore[operator]
        return x == arg

    def describe(self, q: dict[str, int] | None = None) -> str:
        if self.any:
            return " or ".join(c.describe(q) for c in self.any)
        if self.all:
            return "(" + " and ".join(c.describe() for c in self.all) + ")"
        op = {"multiple_of": "%", "max": "<=", "min": ">=", "in": "in", "not_in": "not in",
              "equals": "=="}[self.op]
        arg = self.operand
        if isinstance(arg, list):
            arg = "{" + ", ".join(map(str, arg)) + "}"
        text = (f"{self.quantity} % {arg} == 0" if self.op == "multiple_of"
                else f"{self.quantity} {op} {arg}")
        if q is not None and self.quantity in q:
            text += f" ({self.quantity} = {q[self.quantity]})"
        return text


@dataclass(frozen=True)
class Candidate:
    kernel: str
    fast: bool
    when: tuple[Condition, ...]
    source: Source
    sm_min: int | None = None
    sm_max: int | None = None
    since: str | None = None
    until: str | None = None
    refuse: bool = False
    message: str | None = None
    uncertain: str | None = None
    #: a configuration gac-check does not offer (FP8 activations, 8-bit weights, an optional
    #: package): listed to keep the engine's order, never taken for a stock deployment
    only_if: str | None = None
    #: what a padding kernel pads at load and on every call: quantity -> multiple
    pads: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Selection:
    id: str
    component: str
    quant: tuple[str, ...]
    kv: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    otherwise_verdict: str
    otherwise_kernel: str | None
    otherwise_message: str
    otherwise_source: Source
    uses: tuple[str, ...] = ()  # which uses (linear names) it judges; empty = all
    #: a gate (TP divisibility, uniform layers) only speaks when it fails; its kernel is not
    #: the site's kernel
    gate: bool = False
    since: str | None = None  # the releases the whole selection holds for (None: open)
    until: str | None = None

    def applies(self, quant: str, kv: str, use: str) -> bool:
        return (("*" in self.quant or quant in self.quant)
                and (not self.kv or kv in self.kv)
                and (not self.uses or use in self.uses))


@dataclass(frozen=True)
class GgufType:
    name: str
    block: int
    fallback: str | None
    source: Source


#: What a pack note can say it applies to (``note_scope``): a model with experts, with
#: multi-head latent attention or per-layer widths; a target with tp > 1, ep > 1 or a kv=;
#: ``quant:P`` a target whose quant starts with P; ``gpu:smNN`` a GPU of that capability or
#: newer; ``always``. ``a+b`` needs both. A note with no scope applies to none in particular.
NOTE_FACTS = ("always", "moe", "mla", "per_layer", "tp", "ep", "kv")


@dataclass(frozen=True)
class NoteScope:
    """When one of the pack's ``notes`` (the one starting with ``starts``) applies to a
    check, and the line that says it short (else the note itself)."""

    starts: str
    applies: tuple[str, ...]
    short: str = ""


def _note_scopes(raw: dict, name: str, notes: tuple[str, ...]) -> tuple[NoteScope, ...]:
    scopes = []
    for entry in raw.get("note_scope") or ():
        starts = entry.get("starts", "")
        if sum(n.startswith(starts) for n in notes) != 1 or not starts:
            raise PackError(f"{name}: note_scope {starts!r} starts no note or several")
        for alt in entry.get("applies", ()):
            for fact in alt.split("+"):
                if fact not in NOTE_FACTS and not fact.startswith(("quant:", "gpu:sm")):
                    raise PackError(f"{name}: note_scope fact {fact!r} is not one of "
                                    f"{', '.join(NOTE_FACTS)}, quant:P, gpu:smNN")
        scopes.append(NoteScope(starts, tuple(entry.get("applies", ())),
                                entry.get("short", "")))
    return tuple(scopes)


@dataclass(frozen=True)
class Pack:
    engine: str
    title: str
    repo: str
    versions: tuple[str, ...]
    quants: tuple[str, ...]
    default_quant: str
    default_group: dict[str, int]
    selections: tuple[Selection, ...]
    tp: dict = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    note_scope: tuple[NoteScope, ...] = ()
    gguf_types: dict[str, GgufType] = field(default_factory=dict)
    ftypes: dict[str, dict] = field(default_factory=dict)
    multi_gpu: bool = True
    #: the engine's expert parallelism is in the pack (``ep=`` in a target spec): its source
    expert_parallel: Source | None = None
    #: SGLang's ``--ep-size`` splits the TP ranks (the MoE layer's TP size is tp / ep); vLLM's
    #: ``--enable-expert-parallel`` spans the TP x DP ranks (its MoE TP size is 1)
    expert_parallel_within_tp: bool = False
    #: GGUF extras: fallback_by_version, no_fallback, output_head, requires_imatrix, bump_70b
    gguf: dict = field(default_factory=dict)
    #: sha256 of the pack file as shipped: which rules a verdict came from (the check JSON)
    sha256: str = ""

    @property
    def default_version(self) -> str:
        return self.versions[-1]

    def version_index(self, version: str) -> int:
        return self.versions.index(version)


def _source(raw: object, where: str) -> Source:
    if not isinstance(raw, dict) or any(not isinstance(raw.get(k), str) or not raw.get(k)
                                        for k in SOURCE_KEYS):
        raise PackError(f"{where}: every rule needs a source with {', '.join(SOURCE_KEYS)}")
    return Source(raw["repo"], raw["file"], raw["function"], raw["ref"], raw.get("issue"))


def _condition(raw: dict, where: str) -> Condition:
    if "any" in raw:
        return Condition(any=tuple(_condition(c, where) for c in raw["any"]),
                         message=raw.get("message"))
    if "all" in raw:
        return Condition(all=tuple(_condition(c, where) for c in raw["all"]),
                         message=raw.get("message"))
    quantity = raw.get("quantity")
    if quantity not in QUANTITIES:
        raise PackError(f"{where}: unknown quantity {quantity!r}")
    ops = [o for o in OPERATORS if o in raw]
    if len(ops) != 1:
        raise PackError(f"{where}: a condition needs exactly one of {', '.join(OPERATORS)}")
    arg = raw[ops[0]]
    if isinstance(arg, str) and arg not in QUANTITIES:
        raise PackError(f"{where}: unknown quantity {arg!r}")
    return Condition(quantity, ops[0], arg, raw.get("message"))


def _candidate(raw: dict, where: str, versions: tuple[str, ...]) -> Candidate:
    where = f"{where} {raw.get('kernel')}"
    span = raw.get("versions") or {}
    for key in ("from", "to"):
        if span.get(key) is not None and span[key] not in versions:
            raise PackError(f"{where}: version {span[key]!r} is not in the pack's versions")
    gpu = raw.get("gpu") or {}
    return Candidate(
        kernel=raw["kernel"], fast=bool(raw.get("fast", False)),
        when=tuple(_condition(c, where) for c in raw.get("when", [])),
        source=_source(raw.get("source"), where), sm_min=gpu.get("sm_min"),
        sm_max=gpu.get("sm_max"), since=span.get("from"), until=span.get("to"),
        refuse=bool(raw.get("refuse", False)), message=raw.get("message"),
        uncertain=raw.get("uncertain"), only_if=raw.get("only_if"),
        pads=tuple(_pads(raw.get("pads") or {}, where)))


def _pads(raw: dict, where: str) -> list[tuple[str, int]]:
    for quantity, multiple in raw.items():
        if quantity not in QUANTITIES or not isinstance(multiple, int) or multiple < 1:
            raise PackError(f"{where}: pads needs quantity: positive multiple")
    return sorted(raw.items())


def parse_pack(raw: dict, name: str = "pack") -> Pack:
    """Validate one pack's JSON; :class:`PackError` names what is wrong."""
    if raw.get("schema") != SCHEMA:
        raise PackError(f"{name}: schema must be {SCHEMA!r}")
    versions = tuple(raw.get("versions") or ())
    if not versions:
        raise PackError(f"{name}: a pack names the releases it was read from")
    selections = []
    for s in raw.get("selections", []):
        where = f"{name} {s.get('id')}"
        if s.get("component") not in COMPONENTS:
            raise PackError(f"{where}: component must be one of {', '.join(COMPONENTS)}")
        other = s.get("otherwise") or {}
        if other.get("verdict") not in ("refused", "fallback"):
            raise PackError(f"{where}: otherwise.verdict must be refused or fallback")
        selections.append(Selection(
            id=s["id"], component=s["component"], quant=tuple(s.get("quant") or ("*",)),
            kv=tuple(s.get("kv") or ()),
            candidates=tuple(_candidate(c, where, versions) for c in s["candidates"]),
            otherwise_verdict=other["verdict"], otherwise_kernel=other.get("kernel"),
            otherwise_message=other.get("message", ""),
            otherwise_source=_source(other.get("source"), f"{where} otherwise"),
            uses=tuple(s.get("uses") or ()), gate=bool(s.get("gate", False)),
            since=(s.get("versions") or {}).get("from"), until=(s.get("versions") or {}).get("to")))
        for v in (selections[-1].since, selections[-1].until):
            if v is not None and v not in versions:
                raise PackError(f"{where}: version {v!r} is not in the pack's versions")
    tp = raw.get("tp") or {}
    for key, rule in tp.items():
        _source(rule.get("source") if isinstance(rule, dict) else None, f"{name} tp.{key}")
    widen = (tp.get("vocab_padding") or {}).get("times_tp_when_indivisible")
    if widen is not None:
        _source(widen.get("source"), f"{name} tp.vocab_padding.times_tp_when_indivisible")
        if widen.get("from") not in versions:
            raise PackError(f"{name}: times_tp_when_indivisible.from is not in the versions")
    types = {}
    for tname, t in (raw.get("types") or {}).items():
        types[tname] = GgufType(tname, int(t["block"]), t.get("fallback"),
                                _source(t.get("source"), f"{name} type {tname}"))
    for tname, t in types.items():
        if t.fallback is not None and t.fallback not in types:
            raise PackError(f"{name}: {tname} falls back to unknown type {t.fallback}")
    ftypes = raw.get("ftypes") or {}
    for fname, f in ftypes.items():
        _source(f.get("source"), f"{name} ftype {fname}")
        for t in [f.get("default"), *(r["type"] for r in f.get("tensors", []))]:
            if t not in types:
                raise PackError(f"{name} ftype {fname}: unknown type {t!r}")
    gguf = {k: raw[k] for k in GGUF_EXTRAS if k in raw}
    for key, rule in gguf.items():
        for sub in ([rule] if "source" in rule else rule.values()):
            _source(sub.get("source"), f"{name} {key}")
    quants = tuple(raw.get("quants") or ("none",))
    ep = raw.get("expert_parallel")
    ep_source = _source(ep.get("source"), f"{name} expert_parallel") if ep else None
    return Pack(
        engine=raw["engine"], title=raw.get("title", raw["engine"]), repo=raw.get("repo", ""),
        versions=versions, quants=quants, default_quant=raw.get("default_quant", quants[0]),
        default_group=dict(raw.get("default_group") or {}), selections=tuple(selections),
        tp=tp, aliases=tuple(raw.get("aliases") or ()), notes=tuple(raw.get("notes") or ()),
        note_scope=_note_scopes(raw, name, tuple(raw.get("notes") or ())),
        gguf_types=types, ftypes=ftypes, multi_gpu=bool(raw.get("multi_gpu", True)), gguf=gguf,
        expert_parallel=ep_source, expert_parallel_within_tp=bool(ep and ep.get("within_tp")))


@cache
def packs() -> dict[str, Pack]:
    """Every shipped pack, by engine id."""
    out = {}
    for entry in sorted(PACKS_DIR.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            data = entry.read_bytes()
            pack = parse_pack(json.loads(data.decode("utf-8")), entry.name)
            out[pack.engine] = replace(pack, sha256=hashlib.sha256(data).hexdigest())
    return out


def find_pack(engine: str) -> Pack:
    """The pack for an engine id or alias; BadInput listing the known ones."""
    pack = _by_name().get(engine.strip().lower())
    if pack is not None:
        return pack
    raise BadInput(f"unknown engine {engine!r} in --target (known: {', '.join(packs())})")


@cache
def _by_name() -> dict[str, Pack]:
    """Each engine id and alias to its pack (the first pack that claims it): every verdict
    asks a target for its pack, thousands of times a check."""
    out: dict[str, Pack] = {}
    for pack in packs().values():
        for name in (pack.engine, *pack.aliases):
            out.setdefault(name, pack)
    return out
