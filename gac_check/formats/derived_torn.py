"""A torn checkpoint: a tensor the class builds beside others of its part that are saved.

:mod:`.derived` judges a model by its tensors, so a checkpoint with one tensor deleted (a
router, a down projection) would be judged by what is left of it; its own class would not
load it. Which tensors go together is the class table's (:mod:`.derive_table`): the parts
of a layer, the experts that hold each tensor (:mod:`.derive_experts`), X-MOD's languages
(:mod:`.derive_adapters`), a tower part a config flag turns off (:mod:`.derived_towers`).
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.formats import derive_adapters as adapters
from gac_check.formats import derived_towers as towers
from gac_check.formats.derive_experts import held
from gac_check.formats.derive_names import layer_part, lookup


def torn_tensor(entry: dict, ckpt: Checkpoint) -> str | None:
    """The first tensor the class builds that the checkpoint lacks, in a part it does hold:
    every top-level tensor (the output head may be tied to the embedding) and, in each layer,
    every tensor of each part that layer has (for each expert it has). A torn checkpoint
    (one router deleted) would otherwise be judged by what is left of it. Where one child
    holds different modules in different layers (NemotronH's ``mixer``: Mamba, attention or
    MLP), the table's ``layers`` kind says which of its tensors go together; a tower part a
    config flag turns off (the table's ``optional``) is asked for only where one of its
    tensors is there."""
    tied = towers.tied(entry, ckpt.config)
    layers: dict[int, dict[tuple[str, str, bool], set[int | None]]] = {}
    kinds: dict[tuple[int, tuple[str, str, bool]], set[int | None]] = {}
    for name in ckpt.shapes:
        pattern, layer, expert = lookup(entry["tensors"], adapters.pattern(name))
        tensor = entry["tensors"].get(pattern)  # a tensor under its own name is top-level
        if tensor is not None and layer is not None and "{i}" in pattern:
            part = _part(pattern, tensor)
            layers.setdefault(layer, {}).setdefault(part, set()).add(expert)
            kinds.setdefault((layer, part), set()).add(tensor.get("layers"))
    switched = {"", *towers.parts_present(entry, ckpt)}  # "": a part no flag turns off
    for pattern, tensor in entry["tensors"].items():
        if "{i}" in pattern or tensor.get("optional", "") not in switched:
            continue  # a layer's (below), or a tower part its config turns off
        if pattern not in ckpt.shapes and tensor.get("tied") not in ckpt.shapes and not (
                tied and tensor["kind"] != "embedding" and "vocab" in tensor["axes"]):
            return pattern
    layered = [(p, t) for p, t in entry["tensors"].items() if "{i}" in p]
    for layer, parts in sorted(layers.items()):
        for pattern, tensor in layered:
            part = _part(pattern, tensor)
            experts = parts.get(part)
            if (experts is None or tensor.get("layers") not in kinds[(layer, part)]
                    or tensor.get("optional", "") not in switched):
                continue  # a part this layer does not have, another kind, one turned off
            names = ([pattern.replace("{e}", str(e)) for e in
                      sorted(held(tensor, ckpt.config, entry["keys"], experts - {None}))]
                     if "{e}" in pattern else [pattern])
            for name in (lang for n in names for lang in
                         adapters.names(n.replace("{i}", str(layer), 1), ckpt.config)):
                if name not in ckpt.shapes:
                    return name
    return None


def _part(pattern: str, tensor: dict) -> tuple[str, str, bool]:
    """A layer part within its stack: a tower's layer 3 is not the language model's."""
    return (pattern.split("{i}", 1)[0], *layer_part(pattern, tensor))
