"""Experts that do not all hold the same tensors: which expert indices hold each one.

LongCat-Flash routes to ``n_routed_experts`` real experts and ``zero_expert_num`` identity
("zero-compute") experts. Its fused ``gate_up_proj`` is built for all of them, its
``down_proj`` for the real ones only (transformers 5.24 ``LongcatFlashExperts.__init__``), so
saved per expert, indices past ``n_routed_experts`` hold gate and up but no down. The table
records, for each per-expert pattern whose expert count differs from its siblings', that
count's label (``count``: ``experts`` or ``experts_total``); at check time an expert holds a
pattern only below the count config.json gives (:func:`held`). The router's rows over every
expert, real and identity, are ``experts_total`` (a label of :mod:`.derive_table`).
"""
from __future__ import annotations

import re
from collections.abc import Callable

_EXPERT = re.compile(r"^(.*?)\.(\d+)\.(.*?)\.(\d+)\.(.*)$")


def counts(shapes: tuple[dict, dict], label: Callable[[int, int], str],
           pattern: Callable[[str], str], tensors: dict[str, dict]) -> None:
    """Record ``count`` on per-expert patterns whose expert count (in the first layer that
    holds them) differs from another per-expert pattern's in the same module."""
    per: list[dict[str, int]] = []
    for sizes in shapes:
        seen: dict[str, set[int]] = {}
        first: dict[str, int] = {}
        for name in sizes:
            found = _EXPERT.match(name)
            if found and "{e}" in pattern(name):
                pat, layer = pattern(name), int(found.group(2))
                if first.setdefault(pat, layer) == layer:
                    seen.setdefault(pat, set()).add(int(found.group(4)))
        per.append({p: len(e) for p, e in seen.items()})
    (ca, cb) = per
    modules: dict[str, set[tuple[int, int]]] = {}
    for p in ca.keys() & cb.keys():
        modules.setdefault(p.split("{e}")[0], set()).add((ca[p], cb[p]))
    for p in ca.keys() & cb.keys():
        if p in tensors and len(modules[p.split("{e}")[0]]) > 1:
            tensors[p]["count"] = label(ca[p], cb[p])


def held(tensor: dict, config: dict, keys: dict[str, str], experts: set[int]) -> set[int]:
    """The expert indices among ``experts`` (those the checkpoint's layer has) that hold
    ``tensor``: all of them, or those below config.json's count for its ``count`` label."""
    count = tensor.get("count")
    if count is None:
        return experts
    n = config.get(keys.get("experts", ""))
    if count == "experts_total":
        zero = config.get("zero_expert_num")
        n = n + zero if isinstance(n, int) and isinstance(zero, int) else None
    if not isinstance(n, int) or count not in ("experts", "experts_total"):
        return experts  # config.json cannot say: every expert is held to every tensor
    return {e for e in experts if e < n}
