"""A verdict per site and target: ``fast`` (the kernel named), ``fallback`` (the slower one it
lands on, and why) or ``refused`` (the engine will not load it, and what it would print), with
the smallest exact padding that makes it fast.

Each of the site's uses (:mod:`gac_check.targets.shards`) is judged by every selection of the
target's pack that applies to it: the first candidate, in the engine's order, whose conditions
hold is what runs. The site's verdict is the worst over its uses.

Loadability comes first (:mod:`gac_check.targets.loadability`): on a target whose engine has
no model class for the model, every site is ``refused`` with that reason and what would make
the model servable, whatever kernel it would have run.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gac_check.sites import DimSite, Role
from gac_check.targets import gguf
from gac_check.targets.loadability import Loadability, ModelKind, judge_load
from gac_check.targets.packs import Source
from gac_check.targets.selection import (
    FALLBACK,
    FAST,
    RANK,
    REFUSED,
    SM_OF_PROFILE,
    Outcome,
    fast_on,
    judge_uses,
    site_uses,
    worst,
)
from gac_check.targets.shards import ModelShape, Use, model_shape
from gac_check.targets.spec import Target

#: How far above a value the fixer looks for a fast size (then: padding cannot help).
SEARCH_SPAN = 4096

@dataclass
class TargetVerdict:
    """One site on one target (the JSON object under ``sites[].targets``)."""

    target: Target
    verdict: str
    kernel: str | None
    why: str
    source: Source | None
    fix_to: int | None = None
    #: a fast size exists but zero padding of this site is not exact (the reason), or no size
    #: in reach is fast; then what would help instead
    cannot_pad: str | None = None
    fast_at: int | None = None
    kernels: list[str] = field(default_factory=list)
    #: every use's outcome (failing gates and the kernels chosen): the per-projection detail
    uses: list[Outcome] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"target": self.target.spec, "verdict": self.verdict, "kernel": self.kernel,
                "fix_to": self.fix_to, "source": self.source.as_dict() if self.source else None,
                "why": self.why, "cannot_pad": self.cannot_pad,
                "uncertain": sorted({o.uncertain for o in self.uses if o.uncertain}),
                "uses": [o.as_dict() for o in self.uses]}

    @property
    def short(self) -> str:
        """``fast FLASH_ATTN``, ``fallback->XFORMERS``, ``refused``: the text table's cell."""
        if self.verdict == FAST:
            return f"fast {self.kernel or ''}".strip()
        if self.verdict == FALLBACK:
            return f"fallback {self.kernel or ''}".strip()
        return REFUSED


NO_RULE = "no rule of this engine's pack constrains this dimension"
#: A mixture-of-experts layer's sites: refused, never passed, unless a pack's MoE rule judges
#: them (vLLM v0.33.0's fused-MoE backends, SGLang v0.5.23's Triton runner, vLLM's shared
#: expert as a dense MLP).
MOE_ROLES = frozenset({Role.EXPERT, Role.SHARED_EXPERT, Role.EXPERTS})
#: the uses only an MoE rule of a pack judges: an MoE site is judged where one of them speaks
#: (a dense linear rule alone does not say the engine builds the layer that way)
MOE_USES = frozenset({"experts", "expert_count", "shared_expert"})
NOT_JUDGED_MOE = ("not judged for MoE: {engine}'s fused-MoE kernels and their shape rules under "
                  "tensor and expert parallelism are not in its rule pack yet, so gac-check "
                  "cannot say whether this layer loads or which kernel runs it")


def judge(site: DimSite, shape: ModelShape, target: Target, profile: str) -> TargetVerdict:
    """The site's verdict on ``target`` (fast, with no kernel, where no rule speaks; refused
    for a mixture-of-experts or latent-attention site whose kernels the pack does not model)."""
    sm = SM_OF_PROFILE.get(profile)
    su = site_uses(site, shape, target)
    outcomes = judge_uses(target, su, site.value, sm)
    if site.role in MOE_ROLES and not any(o.use in MOE_USES and not o.gate for o in outcomes):
        return _moe_verdict(target, outcomes)
    mla_uses = {u.name for u in su if u.component == "mla"}
    if mla_uses and not any(o.use in mla_uses for o in outcomes):
        return TargetVerdict(target, REFUSED, None, NOT_JUDGED_MLA.format(
            engine=target.engine, version=target.version), None,
            cannot_pad=f"no size of this latent-attention dimension is judged on {target.spec}")
    if not outcomes:
        return TargetVerdict(target, FAST, None, NO_RULE, None, fix_to=site.value)
    verdict = worst(outcomes)
    kernels = [o.kernel for o in outcomes if not o.gate and o.kernel]
    # a refusal at load time is the reason (the engine stops there, before any kernel);
    # otherwise the kernel's outcome is
    decisive = next((o for o in outcomes if o.verdict == verdict
                     and o.gate == (verdict == REFUSED)),
                    next(o for o in outcomes if o.verdict == verdict))
    kernel = decisive.kernel if verdict != FAST else "+".join(dict.fromkeys(kernels)) or None
    tv = TargetVerdict(target, verdict, kernel, decisive.why if verdict != FAST else "",
                       decisive.source, kernels=kernels,
                       uses=[o for o in outcomes if not o.gate or o.verdict != FAST])
    if verdict == FAST:
        tv.fix_to = site.value
        return tv
    fast_at = _smallest_fast(target, su, site.value, sm)
    tv.fast_at = fast_at
    if fast_at is None:
        tv.cannot_pad = _no_padding_helps(site, shape, target, decisive)
    elif site.inexact:
        tv.cannot_pad = f"fast at {fast_at}, but {site.inexact}"
    else:
        tv.fix_to = fast_at
    return tv


NOT_JUDGED_MLA = ("not judged for MLA: {engine} {version}'s multi-head latent attention backends "
                  "(which latent ranks and head sizes they take) are not in its rule pack, so "
                  "gac-check cannot say whether this layer loads or which backend runs it")


def _moe_verdict(target: Target, outcomes: list[Outcome]) -> TargetVerdict:
    """An MoE site no kernel rule of the pack judges is refused: with the engine's own reason
    where a loading rule refuses it (vLLM's fused-MoE layer under TP), else because nothing
    says which kernel runs it (a gate that passes is not a verdict on the kernel)."""
    not_judged = NOT_JUDGED_MOE.format(engine=target.engine)
    cannot = f"no size of this MoE dimension is judged on {target.spec}'s kernels"
    bad = next((o for o in outcomes if o.verdict == REFUSED), None)
    if bad is not None:
        return TargetVerdict(target, REFUSED, None, f"{bad.why}; and beyond loading, "
                             f"{not_judged}", bad.source, cannot_pad=cannot, uses=[bad])
    return TargetVerdict(target, REFUSED, None, not_judged, None, cannot_pad=cannot,
                         uses=outcomes)


def _smallest_fast(target: Target, su: list[Use], value: int, sm: int | None) -> int | None:
    """The smallest value above ``value`` whose every use is fast (brute force upward: the
    conditions are few and cheap, and a search needs no inverse of them)."""
    for v in range(value + 1, value + SEARCH_SPAN + 1):
        if fast_on(target, su, v, sm):
            return v
    return None


def _no_padding_helps(site: DimSite, shape: ModelShape, target: Target,
                      decisive: Outcome) -> str:
    """What would help where no padding of this site does: another TP size that loads, or a
    re-run of the compressor with uniform widths."""
    if decisive.selection.endswith("uniform-layers") or "uniform" in decisive.why:
        return ("the engine reads one width per model: re-run the compressor with the same "
                "width in every layer")
    if "importance matrix" in decisive.why:
        return ("no padding helps: quantize with an importance matrix (llama-quantize "
                "--imatrix), or choose another quant")
    if not target.pack.multi_gpu:
        return "no padding of this dimension makes it fast on this target"
    good = []
    for tp in (1, 2, 4, 8, 16):
        other = Target(target.spec, target.engine, target.version, tp, target.quant,
                       target.group, target.kv)
        sm = None
        outs = judge_uses(other, site_uses(site, shape, other), site.value, sm)
        if worst([o for o in outs if o.gate or o.selection.endswith("heads")]) == FAST:
            good.append(tp)
    if good and target.tp not in good:
        return f"no padding helps; it loads at tp={'/'.join(map(str, good))}"
    return "no padding of this dimension makes it fast on this target"


@dataclass
class SiteVerdicts:
    """Every site's verdicts on every target, and the joint search the repair pads by."""

    targets: tuple[Target, ...]
    profile: str
    shape: ModelShape
    by_site: dict[str, list[TargetVerdict]] = field(default_factory=dict)
    #: whether each target's engine builds the model at all (by spec)
    loads: dict[str, Loadability] = field(default_factory=dict)
    _memo: dict[tuple, int | None] = field(default_factory=dict, repr=False)
    #: (target, the site's context for that target alone, size) -> that target's next fast
    #: size: the joint search of every layer asks the same of targets blind to the layer
    _fast: dict[tuple, int | None] = field(default_factory=dict, repr=False)

    def of(self, site: DimSite) -> list[TargetVerdict]:
        return self.by_site.get(site.name, [])

    def smallest_fast(self, site: DimSite, start: int) -> int | None:
        """The smallest size >= ``start`` that is fast on every target (None: none in reach;
        ``start`` itself when nothing speaks about the site)."""
        verdicts = self.of(site)
        if all(v.why == NO_RULE for v in verdicts):
            return start
        if any(v.verdict != FAST and v.fast_at is None for v in verdicts):
            return None  # one target has no fast size in reach: no size is fast on all
        if start == site.value:  # each target's own smallest fast size bounds the joint one
            start = max([start, *(v.fast_at for v in verdicts if v.fast_at is not None)])
        key = (_context(site, self.shape, self.targets), start)
        if key not in self._memo:
            self._memo[key] = self._search(site, start)
        return self._memo[key]

    def _search(self, site: DimSite, start: int) -> int | None:
        sm = SM_OF_PROFILE.get(self.profile)
        per = [(t, site_uses(site, self.shape, t), (t.spec, _context(site, self.shape, (t,))))
               for t in self.targets]
        limit = start + SEARCH_SPAN
        v = start
        while True:  # leapfrog: each target's next fast size; a joint one is never skipped
            agreed = True
            for t, su, key in per:
                w = self._next_fast(t, su, v, sm, key)
                if w is None or w > limit:
                    return None
                if w != v:
                    v, agreed = w, False
            if agreed:
                return v


    def fast_values(self, site: DimSite, values: Iterable[int]) -> list[int]:
        """The sizes among ``values`` at which the site would be fast on every target: the
        candidates ``--realign --target`` lets the knapsack choose from."""
        sm = SM_OF_PROFILE.get(self.profile)
        per = [(t, site_uses(site, self.shape, t)) for t in self.targets]
        return [v for v in values
                if all(fast_on(t, su, v, sm) for t, su in per)]

    def refused_after(self, sites: list[DimSite],
                      sizes: dict[str, int]) -> list[tuple[DimSite, Target, str]]:
        """The sites a target would still refuse once each is padded to ``sizes`` (the rest
        as they are), with why: what a repair must not write. A target that does not build
        the model refuses every site (its reason is :attr:`loads`)."""
        sm = SM_OF_PROFILE.get(self.profile)
        out = []
        for site in sites:
            for tv in self.of(site):
                t = tv.target
                value = sizes.get(site.name, site.value)
                if value == site.value or not self.loads[t.spec].loads:
                    if tv.verdict == REFUSED:
                        out.append((site, t, "; ".join(x for x in (tv.why, tv.cannot_pad) if x)))
                    continue
                outs = judge_uses(t, site_uses(site, self.shape, t), value, sm)
                bad = next((o for o in outs if o.verdict == REFUSED), None)
                if bad is not None:
                    out.append((site, t, f"at {value}: {bad.why}"))
        return out

    def _next_fast(self, t: Target, su: list, v: int, sm: int | None,
                   key: tuple) -> int | None:
        """The smallest size in [v, v + SEARCH_SPAN] fast on ``t`` alone (None: none), kept
        per (target, its own context, v): the 80 layers a layer-blind target judges alike
        share it."""
        memo = (*key, v)
        if memo not in self._fast:
            self._fast[memo] = next((u for u in range(v, v + SEARCH_SPAN + 1)
                                     if fast_on(t, su, u, sm)), None)
        return self._fast[memo]

    def summary(self) -> dict[str, dict]:
        """``summary.targets``: each spec's model-level verdict with counts, what it was
        judged as (the resolved release, tp, quant, group, and the pack's hash), whether the
        engine loads the model, and what its pack does not model."""
        return {t.spec: {**model_verdict([v for vs in self.by_site.values() for v in vs
                                          if v.target is t]), **resolved(t),
                         "load": self.loads[t.spec].as_dict() if t.spec in self.loads else None,
                         "not_modelled": list(t.pack.notes)}
                for t in self.targets}


def _context(site: DimSite, shape: ModelShape, targets: tuple[Target, ...]) -> tuple:
    """What a site's verdicts depend on: sites of equal context (the same width in every
    layer of a uniform model) are judged once. llama.cpp's type mix depends on the layer
    index, so with a GGUF target the types the mix asks of the layer's tensors are part of
    the context (the mix gives most layers the same: they are judged once per mix, not per
    layer)."""
    lay = shape.layer(site.layer)
    kv = site.attrs.get("kv_heads")
    mix = (tuple(tuple(gguf.tensor_uses(t.pack, t.quant, site, shape))
                 for t in targets if t.pack.gguf_types)
           if site.role in gguf.PER_LAYER_ROLES else ())
    return (site.role, site.value, site.inexact, kv if isinstance(kv, int) else None,
            lay.heads, lay.kv_heads, lay.head_dim, lay.intermediate, mix)


def judge_all(sites: list[DimSite], targets: tuple[Target, ...], profile: str,
              dtype: str = "bfloat16", kind: ModelKind | None = None) -> SiteVerdicts:
    """Every site on every target; on a target that does not build the model (``kind``: the
    format, architecture and container), every site is refused with the reason."""
    shape = model_shape(sites, dtype)
    shape.per_layer_class = bool(kind and kind.blocks)  # only engines with such a class load it
    out = SiteVerdicts(targets, profile, shape)
    out.loads = {t.spec: judge_load(kind or ModelKind(), shape, t) for t in targets}
    seen: dict[tuple, TargetVerdict] = {}
    for site in sites:
        verdicts = []
        for t in targets:  # each target's verdict depends on the layer only for llama.cpp
            load = out.loads[t.spec]
            key = (t.spec, _context(site, shape, (t,)) if load.loads else None)
            if key not in seen:
                seen[key] = judge(site, shape, t, profile) if load.loads else not_loaded(load)
            verdicts.append(seen[key])
        out.by_site[site.name] = verdicts
    return out


def not_loaded(load: Loadability) -> TargetVerdict:
    """A site of a model the target does not build: refused with the model's reason (no
    kernel runs it, and no padding of one site helps)."""
    return TargetVerdict(load.target, REFUSED, None, f"the model does not load: {load.why}",
                         load.source, cannot_pad=f"to serve it: {load.remedy}")


def resolved(target: Target) -> dict:
    """What a spec resolved to: the engine release (the newest read where none was given),
    tp, quant, group and KV dtype, and which pack (its newest release and its sha256)."""
    pack = target.pack
    return {"engine": target.engine, "version": target.version, "tp": target.tp,
            "ep": target.ep, "quant": target.quant, "group": target.group, "kv": target.kv,
            "pack": {"file": f"{pack.engine}.json", "newest": pack.default_version,
                     "sha256": pack.sha256}}


def model_verdict(verdicts: list[TargetVerdict]) -> dict:
    """The worst of a target's site verdicts, with counts."""
    counts = {FAST: 0, FALLBACK: 0, REFUSED: 0}
    for v in verdicts:
        counts[v.verdict] += 1
    verdict = max((v.verdict for v in verdicts), key=RANK.__getitem__, default=FAST)
    return {"verdict": verdict, **counts}
