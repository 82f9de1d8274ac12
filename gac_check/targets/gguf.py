"""llama.cpp: which GGUF type each tensor of a site gets under an ftype, from the pack's data.

llama.cpp's quantizer picks a type per tensor (the ftype's *mix*: ``Q4_K_M`` stores some
layers' attn_v and ffn_down in Q6_K and the output head in Q6_K), then checks the tensor's row
length (``ne[0]``, its input features) against the type's block: a row that is not a multiple
quietly falls back to a larger type (Q4_K -> Q5_0, Q6_K -> Q8_0, ...), and a row that is not
a multiple of 32 either lands in F16 or, in older builds, is refused. A site is ``fast`` when
every tensor it sets the row length of gets the type the mix asks for, ``fallback`` when one
gets a fallback type, ``refused`` when the quantizer refuses. The rules are data
(``packs/llama.cpp.json``); tests/test_targets_llamacpp_oracle.py holds them to llama.cpp's
own quantizer.
"""
from __future__ import annotations

from dataclasses import dataclass

from gac_check.sites import DimSite, Role
from gac_check.targets.packs import Pack, Source
from gac_check.targets.shards import ModelShape

#: Tensors whose row length is the hidden size (GGUF names).
HIDDEN_ROWS = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
FLOATS = frozenset({"F32", "F16", "BF16"})
#: Sites whose tensors' types depend on their layer index (ffn_down, attn_output).
PER_LAYER_ROLES = frozenset({Role.INTERMEDIATE, Role.HEAD_DIM})


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's "use more bits" layers: the first and last eighth, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer_ok(rule: dict, i: int, n: int) -> bool:
    which = rule.get("layers", "all")
    if which == "all":
        return True
    if which == "more_bits":
        return more_bits(i, n)
    if which == "first_eighth":
        return i < n // 8
    if which == "first_sixteenth":
        return i < n // 16
    if which.startswith("first:"):
        return i < int(which.split(":", 1)[1])
    raise ValueError(f"unknown layer predicate {which!r}")


def mix_type(pack: Pack, ftype: str, tensor: str, layer: int, n_layer: int, gqa: int) -> str:
    """The type the ftype's mix asks for (at an aligned row length)."""
    spec = pack.ftypes[ftype]
    default = spec["default"]
    if default in FLOATS:
        return default
    if tensor == "output":
        head = pack.gguf["output_head"]
        if default in head["keep"]:
            return default
        low = pack.gguf.get("requires_imatrix", {}).get("ftypes", [])
        return head["low_iquant_type"] if ftype in low else head["type"]
    chosen = default
    for rule in spec.get("tensors", []):
        if rule["match"] != tensor or not _layer_ok(rule, layer, n_layer):
            continue
        if gqa < rule.get("gqa_min", 0) or gqa > rule.get("gqa_max", 1 << 30):
            continue
        chosen = rule["type"]
        break
    bump = pack.gguf.get("bump_70b")
    if bump and tensor == bump["match"] and n_layer == bump["n_layer"] and chosen in bump["from"]:
        chosen = bump["type"]
    return chosen


@dataclass(frozen=True)
class Stored:
    """What one tensor ends up as: ``type`` None means the quantizer refuses."""

    requested: str
    type: str | None
    why: str
    source: Source


def stored_type(pack: Pack, version: str, ftype: str, tensor: str, requested: str,
                row: int) -> Stored:
    """The type llama.cpp stores a tensor in, for a row length of ``row``."""
    types = pack.gguf_types
    default = pack.ftypes[ftype]["default"]
    chosen = requested
    if tensor == "output" and default not in FLOATS and row % types[default].block:
        head = pack.gguf["output_head"]  # quietly Q8_0 for a head D's block does not divide
        chosen = head["unaligned"]
        if row % types[chosen].block == 0:
            return Stored(requested, chosen, f"row {row} is not a multiple of {default}'s block "
                          f"{types[default].block}: the output head is stored {chosen}",
                          _src(head["source"]))
    t = types[chosen]
    if row % t.block == 0:
        return Stored(requested, chosen, "", t.source)
    overrides = pack.gguf.get("fallback_by_version", {}).get(version, {})
    fallback = overrides.get(chosen, t.fallback)
    why = f"row {row} is not a multiple of {chosen}'s block {t.block}"
    if fallback is not None and row % types[fallback].block == 0:
        src = _src(overrides["source"]) if chosen in overrides else t.source
        return Stored(requested, fallback, f"{why}: llama.cpp falls back to {fallback}", src)
    if fallback is not None:  # the replacement does not divide either: F16 (PR #9074)
        return Stored(requested, "F16", f"{why} nor of {fallback}'s {types[fallback].block}: "
                      "stored as F16", _src(pack.gguf["second_step_f16"]["source"]))
    rule = pack.gguf["no_fallback"][version]
    if rule["verdict"] == "refused":
        return Stored(requested, None, f"{rule['message']} ({why}; no smaller block to fall "
                      "back to)", _src(rule["source"]))
    return Stored(requested, rule["type"], f"{why}: stored as {rule['type']}",
                  _src(rule["source"]))


def _src(raw: dict) -> Source:
    return Source(raw["repo"], raw["file"], raw["function"], raw["ref"], raw.get("issue"))


@dataclass(frozen=True)
class TensorUse:
    """The GGUF tensors a site sets the row length of, with the types the mix asks for."""

    tensor: str
    requested: tuple[str, ...]
    row: int = 0  # the row per unit of the site (heads for attn_output), multiplied in

    def rows(self, value: int) -> int:
        return value * self.row if self.row else value


def tensor_uses(pack: Pack, ftype: str, site: DimSite, shape: ModelShape) -> list[TensorUse]:
    """Which tensors' rows a site sets: hidden -> token_embd, output and every layer's q, k,
    v, gate, up; an MLP width -> its ffn_down; head_dim -> attn_output (heads x head_dim);
    a low-rank rank -> the second factor's row (stored in the ftype's default type)."""
    n = len(shape.layers) or 1
    first = shape.layers[min(shape.layers)] if shape.layers else None
    gqa = (first.heads // first.kv_heads) if first and first.heads and first.kv_heads else 1

    def requested(tensor: str, layers: list[int]) -> tuple[str, ...]:
        return tuple(sorted({mix_type(pack, ftype, tensor, i, n, gqa) for i in layers}))

    if site.role is Role.HIDDEN:
        layers = sorted(shape.layers) or [0]
        out = [TensorUse("token_embd", requested("token_embd", [0]))]
        if shape.vocab:
            out.append(TensorUse("output", requested("output", [0])))
        return out + [TensorUse(t, requested(t, layers)) for t in HIDDEN_ROWS]
    if site.role is Role.INTERMEDIATE and site.layer is not None:
        return [TensorUse("ffn_down", requested("ffn_down", [site.layer]))]
    if site.role is Role.HEAD_DIM and site.layer is not None:
        heads = shape.layer(site.layer).heads or 1
        return [TensorUse("attn_output", requested("attn_output", [site.layer]), row=heads)]
    if site.role in (Role.RANK, Role.KV_LATENT):
        return [TensorUse("lowrank", (pack.ftypes[ftype]["default"],))]
    return []


def imatrix_refusal(pack: Pack, tensor: str, stored: str | None) -> tuple[str, Source] | None:
    """The quantizer refuses a whole file, before writing it, when a tensor other than the
    embeddings and the head is to be stored in a very low-bit type and no importance matrix
    is given (a tensor that fell back to a larger type does not count)."""
    rule = pack.gguf.get("requires_imatrix")
    if rule and stored in rule["types"] and tensor not in ("token_embd", "output"):
        return (f"{rule['message']}: {tensor} would be {stored} (gac-check has no imatrix "
                "option)", _src(rule["source"]))
    return None
