"""How a saved tensor name is turned into the class table's pattern, looked up again, and
which part of its layer it belongs to.

A layer's index becomes ``{i}`` and a further list index ``{e}`` (an expert's, or one of a
list of like modules: ALBERT's ``albert_layers``, LongCat-Flash's two ``mlps``). An index
into an ``nn.Sequential`` is a position, not a list entry: CTRL's ``ffn.0`` is the MLP's up
projection and ``ffn.2`` its down projection (``ffn.1`` is the ReLU), so folding both into
``ffn.{e}`` made them one tensor with two shapes and refused the model ("hidden width
disagrees"). The deriver keeps such positions literal (:func:`pattern` with the class's
Sequential modules) and the check, which has no class, tries the folded name first and then
the literal ones (:func:`lookup`).
"""
from __future__ import annotations

import re
from itertools import product

_INDEX = re.compile(r"\.(\d+)\.")


def sequential_modules(model) -> frozenset[str]:
    """The names of the model's ``nn.Sequential`` modules (positions, not lists)."""
    import torch.nn as nn

    return frozenset(n for n, m in model.named_modules() if isinstance(m, nn.Sequential))


def pattern(name: str, sequential: frozenset[str] = frozenset()) -> str:
    """``model.layers.3.mlp.experts.7.w1.weight`` -> ``model.layers.{i}.mlp.experts.{e}.w1
    .weight``: the first list index is the layer's, later ones a list's; an index into one
    of ``sequential`` stays as it is (GIT's ``visual_projection.0`` / ``.1``, a linear and
    its norm, stay two tensors)."""
    owners = {_shape(s) for s in sequential}
    out, pos, layer = [], 0, True
    for m in _INDEX.finditer(name):
        out.append(name[pos:m.start()])
        if _shape(name[:m.start()]) in owners:
            out.append(m.group(0))
        else:
            out.append(".{i}." if layer else ".{e}.")
            layer = False
        pos = m.end()
    out.append(name[pos:])
    return "".join(out)


def _shape(module: str) -> str:
    """A module name with every index a wildcard and its first component dropped (a saved
    name's prefix may differ from the module's: ``backbone.`` for ``model.``)."""
    return re.sub(r"\.\d+(?=\.|$)", ".#", module).split(".", 1)[-1]


def lookup(tensors: dict, name: str) -> tuple[str, int | None, int | None]:
    """(the table's pattern for ``name``, its layer, its expert): the folded pattern if the
    table has it, else the first with some later indices kept literal (a Sequential's
    positions); the folded one, which the table lacks, when none matches."""
    found = _INDEX.findall(name)
    layer = int(found[0]) if found else None
    folded = _INDEX.sub(".{i}.", name, count=1)
    folded = _INDEX.sub(".{e}.", folded)
    if folded in tensors or len(found) < 2:
        return folded, layer, int(found[1]) if len(found) > 1 else None
    head = _INDEX.sub(".{i}.", name, count=1)
    parts = re.split(r"(\.\d+\.)", head)  # text, index, text, ...
    slots = range(1, len(parts), 2)
    for keep in product((False, True), repeat=len(slots)):
        trial = list(parts)
        for slot, literal in zip(slots, keep, strict=True):
            if not literal:
                trial[slot] = ".{e}."
        candidate = "".join(trial)
        if candidate in tensors:
            experts = [int(parts[s].strip(".")) for s, k in zip(slots, keep, strict=True)
                       if not k]
            return candidate, layer, experts[0] if experts else None
    return folded, layer, int(found[1])


def layer_part(pattern: str, tensor: dict) -> tuple[str, bool]:
    """Which part of a layer a tensor belongs to: the layer's child module, and whether it is
    the mixture-of-experts form of it (experts, router, shared expert) or the plain one, since
    one class builds some layers dense and others MoE under the same child's name."""
    child = pattern.split("{i}.", 1)[1].split(".", 1)[0]
    moe = "{e}" in pattern or "expert" in pattern or "experts" in tensor["axes"]
    return child, moe
