"""Per-shard arithmetic: what each tensor-parallel rank holds, as pure functions.

A site's dimension enters one or more *uses*: a linear it is an output or input of, the
attention it sets the head size of, the model-level head counts. Each use maps a candidate
value of the dimension to the quantities a rule pack's conditions read (``shard_out``,
``heads_per_rank``, ...), so the fixer can try larger values and re-judge them.

Column-parallel linears (q, k, v, gate, up, the LM head) split their outputs over the ranks,
row-parallel ones (o, down) their inputs; fused projections (qkv, gate_up) are judged per
projection (each projection's shard must satisfy a kernel's output multiple, which implies
the fused one's). A low-rank rank and a PaLU latent are not split: the factors are run as
replicated linears, the rank being the output of one GEMM and the input of the other.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gac_check.sites import DimSite, Role


@dataclass
class LayerShape:
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate: int | None = None


@dataclass
class ModelShape:
    """The widths a target's arithmetic needs, gathered from the sites."""

    hidden: int | None = None
    vocab: int | None = None
    layers: dict[int, LayerShape] = field(default_factory=dict)

    @property
    def uniform(self) -> bool:
        """Whether every layer has the same widths and head counts (one config value each)."""
        seen = {(s.heads, s.kv_heads, s.head_dim, s.intermediate) for s in self.layers.values()}
        return len(seen) <= 1

    def layer(self, i: int | None) -> LayerShape:
        return self.layers.get(i, LayerShape()) if i is not None else LayerShape()


def model_shape(sites: list[DimSite]) -> ModelShape:
    shape = ModelShape()
    for s in sites:
        if s.role is Role.HIDDEN:
            shape.hidden = s.value
        elif s.role is Role.VOCAB:
            shape.vocab = s.value
        elif s.layer is not None:
            lay = shape.layers.setdefault(s.layer, LayerShape())
            if s.role is Role.HEADS:
                lay.heads = s.value
                kv = s.attrs.get("kv_heads")
                lay.kv_heads = kv if isinstance(kv, int) else s.value
            elif s.role is Role.HEAD_DIM:
                lay.head_dim = s.value
            elif s.role is Role.INTERMEDIATE:
                lay.intermediate = s.value
    return shape


def split(n: int, tp: int) -> int | None:
    """What one of ``tp`` ranks holds of ``n``; None when ``n`` does not divide evenly
    (the TP engines assert divisibility and refuse to load)."""
    return n // tp if n % tp == 0 else None


def kv_heads_per_rank(kv_heads: int, tp: int, rule: str = "replicate") -> int | None:
    """KV heads one rank holds. ``replicate`` (vLLM, SGLang, TensorRT-LLM): with fewer KV
    heads than ranks each rank holds one copy, which needs ``tp % kv_heads == 0``; otherwise
    they are split and need ``kv_heads % tp == 0``. ``divide``: only the split."""
    if kv_heads >= tp or rule != "replicate":
        return split(kv_heads, tp)
    return 1 if tp % kv_heads == 0 else None


def pad_to_multiple(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class Use:
    """One place a site's dimension is used: ``quantities(value)`` for a candidate value.

    ``undivided`` names the quantity that does not split evenly over the ranks at that value
    (then the engine refuses to load, whatever the kernel)."""

    component: str  # attention | linear | embedding | model | tensor
    name: str  # q_proj, gate_up_proj, down_proj, attention, heads, lm_head, ...
    quantities: Callable[[int], dict[str, int]]


def uses(site: DimSite, shape: ModelShape, tp: int, group: int | None,
         kv_rule: str = "replicate", vocab_pad: int = 1) -> list[Use]:
    """Every use of ``site``'s dimension at TP size ``tp`` (see the module docstring)."""
    lay = shape.layer(site.layer)
    g = {"group": group} if group is not None else {}
    base = {"tp": tp, "uniform_layers": int(shape.uniform)}
    role = site.role
    if role is Role.INTERMEDIATE:
        def col(v: int) -> dict[str, int]:
            return _shard({**base, **g, "out": v}, "shard_out", v, tp)

        def row(v: int) -> dict[str, int]:
            return _shard({**base, **g, "in": v}, "shard_in", v, tp)

        return [Use("linear", "gate_up_proj", col), Use("linear", "down_proj", row),
                Use("model", "layers", lambda v: dict(base))]
    if role in (Role.RANK, Role.KV_LATENT):
        return [Use("linear", "lowrank_out", lambda v: {**base, **g, "out": v, "shard_out": v}),
                Use("linear", "lowrank_in", lambda v: {**base, **g, "in": v, "shard_in": v})]
    if role is Role.HIDDEN:
        return [Use("linear", "hidden_in", lambda v: {**base, **g, "in": v, "shard_in": v}),
                Use("linear", "hidden_out", lambda v: {**base, **g, "out": v, "shard_out": v})]
    if role is Role.HEAD_DIM:
        heads = lay.heads or 0
        kv = lay.kv_heads or heads
        hpr = split(heads, tp) if heads else None
        kvpr = kv_heads_per_rank(kv, tp, kv_rule) if kv else None

        def attention(v: int) -> dict[str, int]:
            q = {**base, "head_dim": v, "heads": heads, "kv_heads": kv}
            if hpr is not None:
                q["heads_per_rank"] = hpr
            if kvpr is not None:
                q["kv_heads_per_rank"] = kvpr
            return q

        out = [Use("attention", "attention", attention)]
        if hpr:
            out += [Use("linear", "q_proj",
                        lambda v: {**base, **g, "out": heads * v, "shard_out": hpr * v}),
                    Use("linear", "o_proj",
                        lambda v: {**base, **g, "in": heads * v, "shard_in": hpr * v})]
        if kvpr:
            out.append(Use("linear", "kv_proj",
                           lambda v: {**base, **g, "out": kv * v, "shard_out": kvpr * v}))
        return out
    if role is Role.HEADS:
        kv = site.attrs.get("kv_heads")
        kv = kv if isinstance(kv, int) else site.value

        def heads_q(v: int) -> dict[str, int]:
            q = {**base, "heads": v, "kv_heads": kv}
            if (h := split(v, tp)) is not None:
                q["heads_per_rank"] = h
            if (k := kv_heads_per_rank(kv, tp, kv_rule)) is not None:
                q["kv_heads_per_rank"] = k
            return q

        return [Use("model", "heads", heads_q)]
    if role is Role.VOCAB:
        def vocab(v: int) -> dict[str, int]:
            padded = pad_to_multiple(v, vocab_pad)
            q = {**base, "vocab": padded, "out": padded}
            if (r := split(padded, tp)) is not None:
                q["vocab_per_rank"] = r
                q["shard_out"] = r
            return q

        return [Use("embedding", "lm_head", vocab)]
    return []


def _shard(q: dict[str, int], key: str, v: int, tp: int) -> dict[str, int]:
    part = split(v, tp)
    if part is not None:
        q[key] = part
    return q
