"""Per-shard arithmetic: what each tensor-parallel rank holds, as pure functions.

A site's dimension enters one or more *uses*: a linear it is an output or input of, the
attention it sets the head size of, the model-level head counts. Each use maps a candidate
value of the dimension to the quantities a rule pack's conditions read (``shard_out``,
``heads_per_rank``, ...), so the fixer can try larger values and re-judge them.

Column-parallel linears (q, k, v, gate, up, the LM head) split their outputs over the ranks,
row-parallel ones (o, down) their inputs; fused projections (qkv, gate_up) are what the
kernels see, so their per-rank width is the fused one ((heads/tp + 2 kv/tp) x head_dim,
2 x intermediate/tp), while TP divides each part. KV heads fewer than the ranks are
replicated (one per rank) where the engine does so. A low-rank rank and a PaLU latent are
not split: the factors are run as replicated linears, the rank being the output of one GEMM
and the input of the other.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gac_check.sites import DimSite, Role
from gac_check.targets.mla import is_mla, mla_quantities


@dataclass
class LayerShape:
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate: int | None = None
    #: a mixture-of-experts layer: its experts, not a dense MLP (built from their own key)
    moe: bool = False
    #: the distinct widths of its routed experts, in the order met (the fused-MoE layers
    #: hold every expert at one width)
    expert_widths: tuple[int, ...] = ()
    #: a latent-attention layer's sizes (kv_lora_rank, q_lora_rank, the head parts), which
    #: DeepSeek's classes build every layer from, one config value each
    mla: tuple[tuple[str, int], ...] = ()


@dataclass
class ModelShape:
    """The widths a target's arithmetic needs, gathered from the sites."""

    hidden: int | None = None
    vocab: int | None = None
    layers: dict[int, LayerShape] = field(default_factory=dict)
    #: activations in float16 (some kernels, ExLlama, take nothing else)
    act_fp16: bool = False
    #: the model class builds each layer from its own config entry (DeciLM's block_configs),
    #: so layers of different widths load as uniform ones do
    per_layer_class: bool = False

    @property
    def uniform(self) -> bool:
        """Whether every layer has the same widths and head counts (one config value each). An
        MoE layer's MLP is its experts, which the classes build from another key than the dense
        layers' intermediate_size (DeepSeek's first_k_dense_replace, Qwen2-MoE's
        mlp_only_layers), so the dense widths are compared among the dense layers."""
        attention = {(s.heads, s.kv_heads, s.head_dim, s.mla) for s in self.layers.values()}
        dense = {s.intermediate for s in self.layers.values() if not s.moe}
        return len(attention) <= 1 and len(dense) <= 1

    def layer(self, i: int | None) -> LayerShape:
        return self.layers.get(i, LayerShape()) if i is not None else LayerShape()


def model_shape(sites: list[DimSite], dtype: str = "bfloat16") -> ModelShape:
    shape = ModelShape(act_fp16=dtype == "float16")
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
            elif s.role is Role.EXPERTS:
                lay.moe = True
            elif s.role is Role.EXPERT and s.value not in lay.expert_widths:
                lay.expert_widths += (s.value,)
            if is_mla(s):
                mla = s.attrs["mla"]
                lay.mla = tuple(sorted((k, v) for k, v in mla.items() if k != "dim"))  # type: ignore[union-attr]
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
    """One place a site's dimension is used: ``quantities(value)`` for a candidate value."""

    component: str  # attention | linear | embedding | model | tensor
    name: str  # qkv_proj, gate_up_proj, down_proj, attention, heads, lm_head, ...
    quantities: Callable[[int], dict[str, int]]
    #: a GGUF tensor (gac_check.targets.gguf.TensorUse) for component "tensor"
    tensor: object = None


def padded_vocab(vocab: int, tp: int, multiple: int, widen_by_tp: bool = False) -> int:
    """The vocabulary the engine allocates: padded to ``multiple``; where the engine widens the
    padding to ``multiple x tp`` when that does not divide by ``tp`` (SGLang from v0.5.23),
    padded to that instead, so that every rank holds the same share."""
    padded = pad_to_multiple(vocab, multiple)
    if widen_by_tp and padded % tp:
        return pad_to_multiple(vocab, multiple * tp)
    return padded


def uses(site: DimSite, shape: ModelShape, tp: int, group: int | None,
         kv_rule: str = "replicate", vocab_pad: int = 1, vocab_pad_tp: bool = False,
         ep: int = 1, moe_tp: int | None = None) -> list[Use]:
    """Every use of ``site``'s dimension at TP size ``tp`` (and expert-parallel size ``ep``;
    ``moe_tp``: the MoE layer's own TP size where the engine says, else vLLM's rule).

    Quantities a use leaves out (the other dimension of a GEMM) are judged at the site that
    determines them. Fused projections carry their fused per-rank width (what the kernel
    sees) as ``shard_out`` and one part's full width as ``part_out`` (what TP divides)."""
    lay = shape.layer(site.layer)
    base = {"tp": tp, "uniform_layers": int(shape.uniform or shape.per_layer_class),
            "act_fp16": int(shape.act_fp16)}
    if group is not None:
        base["group"] = group
    role = site.role
    if is_mla(site):  # the MLA backends' own sizes (targets/mla.py), and the latent's GEMMs
        own = [Use(c, n, f) for c, n, f in mla_quantities(site, base)]
        own.append(Use("model", "layers", lambda v: dict(base)))  # one size for every layer
        if role is Role.KV_LATENT:
            own += uses(DimSite(site.name, role, site.value, site.axes), shape, tp, group)
        return own
    if role in (Role.INTERMEDIATE, Role.SHARED_EXPERT):
        def gate_up(v: int) -> dict[str, int]:
            q = {**base, "part_out": v, "out": 2 * v}
            _put(q, "part_shard_out", split(v, tp))  # one of gate, up on one rank
            return _put(q, "shard_out", split(2 * v, tp) if v % tp == 0 else None)

        def down(v: int) -> dict[str, int]:
            return _put({**base, "in": v}, "shard_in", split(v, tp))

        mlp = [Use("linear", "gate_up_proj", gate_up), Use("linear", "down_proj", down)]
        if role is Role.SHARED_EXPERT:  # a dense MLP beside the experts, from its own key
            return [*mlp, Use("model", "shared_expert", lambda v: dict(base))]
        return [*mlp, Use("model", "layers", lambda v: dict(base))]
    if role is Role.EXPERT:
        mtp = moe_tp if moe_tp is not None else (1 if ep > 1 else tp)
        return [Use("model", "experts", lambda v: expert_quantities(base, v, mtp, ep,
                                                                          shape.hidden))]
    if role is Role.EXPERTS:
        return [Use("model", "expert_count", lambda v: {**base, "experts": v, "ep": ep})]
    if role in (Role.RANK, Role.KV_LATENT):
        return [Use("linear", "lowrank_out", lambda v: {**base, "out": v, "shard_out": v}),
                Use("linear", "lowrank_in", lambda v: {**base, "in": v, "shard_in": v})]
    if role is Role.HIDDEN:
        return [Use("linear", "hidden_in", lambda v: {**base, "in": v, "shard_in": v}),
                Use("linear", "hidden_out", lambda v: {**base, "out": v, "shard_out": v})]
    if role is Role.HEAD_DIM:
        heads = lay.heads or 0
        kv = lay.kv_heads or heads
        hpr = split(heads, tp) if heads else None
        kvpr = kv_heads_per_rank(kv, tp, kv_rule) if kv else None

        def attention(v: int) -> dict[str, int]:
            q = {**base, "head_dim": v, "heads": heads, "kv_heads": kv}
            _put(q, "heads_per_rank", hpr)
            return _put(q, "kv_heads_per_rank", kvpr)

        out = [Use("attention", "attention", attention)]
        if hpr and kvpr:
            out += [Use("linear", "qkv_proj",
                        lambda v: {**base, "out": (heads + 2 * kv) * v,
                                   "shard_out": (hpr + 2 * kvpr) * v}),
                    Use("linear", "o_proj",
                        lambda v: {**base, "in": heads * v, "shard_in": hpr * v})]
        return out
    if role is Role.HEADS:
        kv = site.attrs.get("kv_heads")
        kv = kv if isinstance(kv, int) else site.value

        def heads_q(v: int) -> dict[str, int]:
            q = {**base, "heads": v, "kv_heads": kv}
            _put(q, "heads_per_rank", split(v, tp))
            return _put(q, "kv_heads_per_rank", kv_heads_per_rank(kv, tp, kv_rule))

        return [Use("model", "heads", heads_q)]
    if role is Role.VOCAB:
        def vocab(v: int) -> dict[str, int]:
            padded = padded_vocab(v, tp, vocab_pad, vocab_pad_tp)
            q = {**base, "vocab": padded, "part_out": padded}
            return _put(q, "vocab_per_rank", split(padded, tp))

        return [Use("embedding", "lm_head", vocab)]
    return []


def expert_quantities(base: dict[str, int], width: int, moe_tp: int,
                      ep: int, hidden: int | None = None) -> dict[str, int]:
    """One expert's width as the fused-MoE layer holds it: every rank holds ``width / moe_tp``
    of each of its experts; ``moe_tp`` is ``tp`` without expert parallelism, 1 with vLLM's
    (``FusedMoEParallelConfig.make``: whole experts per rank), ``tp / ep`` with SGLang's
    (``derive_parallel_widths``)."""
    q = {**base, "expert_width": width, "moe_tp": moe_tp, "ep": ep}
    _put(q, "hidden", hidden)  # vLLM's block FP8 refines its scales by it
    return _put(q, "expert_shard", split(width, moe_tp))


def _put(q: dict[str, int], key: str, value: int | None) -> dict[str, int]:
    """Set ``key`` where the arithmetic gives a value (a shard exists only when TP divides)."""
    if value is not None:
        q[key] = value
    return q
