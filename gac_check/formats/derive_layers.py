"""Layers of one class that are not alike: each tensor's labels per layer kind.

:mod:`.derive_table` names a tensor pattern's axes from the first layer that holds it and
assumed every layer alike. MiMo-V2-Flash's sliding-window layers hold twice the key/value
heads of its full-attention ones (``MiMoV2FlashAttention.__init__``, transformers 5.24:
``num_key_value_heads * 2 if is_swa``), so one pattern has other widths in other layers.
Where the class's config lists each layer's kind (``layer_types``) and a pattern's labels
differ by kind, the table records them per kind (``by_kind``); at check time config.json's
``layer_types`` says which a layer's tensor is held to (:func:`resolve`), and a layer whose
kind it does not say is a refusal, never a guess.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from gac_check.errors import BadInput

_LAYER = re.compile(r"\.(\d+)\.")


def by_kind(config, shapes: tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]],
            label: Callable[[int, int], str], pattern: Callable[[str], str],
            tensors: dict[str, dict]) -> None:
    """Record ``by_kind`` on each pattern whose labels differ across the layer kinds of
    ``config.layer_types`` (``label`` names an axis from its two builds' sizes)."""
    kinds = getattr(config, "layer_types", None)
    if not isinstance(kinds, list):
        return
    sa, sb = shapes
    seen: dict[str, dict[str, list[str]]] = {}
    for name in sorted(set(sa) & set(sb)):
        found = _LAYER.search(name)
        if not found or int(found.group(1)) >= len(kinds) or len(sa[name]) != len(sb[name]):
            continue
        axes = [label(x, y) for x, y in zip(sa[name], sb[name], strict=True)]
        seen.setdefault(pattern(name), {}).setdefault(str(kinds[int(found.group(1))]), axes)
    for pat, per in seen.items():
        if pat in tensors and len({tuple(a) for a in per.values()}) > 1:
            tensors[pat]["by_kind"] = per


def resolve(tensor: dict, config: dict, name: str, layer: int | None, path) -> dict:
    """``tensor`` with the labels of ``layer``'s kind (config.json's ``layer_types``)."""
    per = tensor.get("by_kind")
    if not per or layer is None:
        return tensor
    kinds = config.get("layer_types")
    kind = kinds[layer] if isinstance(kinds, list) and layer < len(kinds) else None
    if kind not in per:
        raise BadInput(f"{name}: its class builds it with other widths in each kind of layer "
                       f"({', '.join(sorted(per))}), and config.json's layer_types does not "
                       f"say layer {layer}'s kind: refusing to guess it", path)
    return {**tensor, "axes": per[kind]}
