"""The uses of a multi-head latent attention site: what the engines' MLA backends read.

An MLA engine does not run attention at the q/k head size a transformers module does. vLLM's
decode backends attend over the latent itself: the head size they are selected by is
``kv_lora_rank + qk_rope_head_dim`` (``MLAAttention.__init__``), the latent site's use
``mla_decode``, which also carries the latent and the rope part apart (SGLang's FlashAttention 3
decode runs them as the V and q/k heads of one call). Its prefill expands the latent and runs
FlashAttention over the (qk_nope_head_dim, qk_rope_head_dim, v_head_dim) triple, with the q/k
head ``qk_head_dim`` (nope + rope), the use ``mla_prefill`` of the q/k and v head-size sites.
The triple is judged whole on the v site, the one ``--repair`` can pad; the q/k site leaves v
out (a condition on an absent quantity holds, docs/targets.md), so it speaks only of its own
(nope, rope) pair and a v the repair will fix never refuses it. Each use maps a candidate value
of its site to every MLA size, the candidate put in place of the site's own, so the fixer can
re-judge larger values.
"""
from __future__ import annotations

from collections.abc import Callable

from gac_check.sites import DimSite, Role

Quantities = Callable[[int], dict[str, int]]


def is_mla(site: DimSite) -> bool:
    return isinstance(site.attrs.get("mla"), dict)


def _sizes(site: DimSite, value: int) -> dict[str, int]:
    """The layer's MLA sizes with ``value`` in place of this site's dimension."""
    mla = dict(site.attrs["mla"])  # type: ignore[arg-type]
    dim = mla.pop("dim")
    if dim == "qk_head_dim":  # the rope part is fixed; a larger q/k head is a larger nope
        mla["qk_nope_head_dim"] = value - mla["qk_rope_head_dim"]
    else:
        mla[dim] = value
    return mla


def mla_quantities(site: DimSite, base: dict[str, int]) -> list[tuple[str, str, Quantities]]:
    """(component, use, quantities) of an MLA site, beside the role's ordinary linear uses."""
    def decode(v: int) -> dict[str, int]:
        s = _sizes(site, v)
        return {**base, "mla_head_size": s["kv_lora_rank"] + s["qk_rope_head_dim"],
                "kv_lora_rank": s["kv_lora_rank"], "qk_rope_head_dim": s["qk_rope_head_dim"]}

    def prefill(v: int) -> dict[str, int]:
        s = _sizes(site, v)
        q = {**base, "qk_nope_head_dim": s["qk_nope_head_dim"],
             "qk_rope_head_dim": s["qk_rope_head_dim"],
             "qk_head_dim": s["qk_nope_head_dim"] + s["qk_rope_head_dim"]}
        if site.attrs["mla"]["dim"] == "v_head_dim":  # type: ignore[index]
            q["v_head_dim"] = s["v_head_dim"]
        return q

    if site.role is Role.KV_LATENT:
        return [("mla", "mla_decode", decode)]
    if site.role is Role.HEAD_DIM:
        return [("mla", "mla_prefill", prefill)]
    return []
