"""The names and shapes ``save_pretrained`` writes for a class built on the meta device.

transformers converts some checkpoint keys when it loads them (Gemma-3's saved
``language_model.model.`` is the module ``model.language_model.``) and reverts the conversion
when it saves; the class table (:mod:`.derive_table`) names tensors as they are saved, so a
parameter's module kind (linear, norm, ...) has to be carried to its saved name.
"""
from __future__ import annotations

import contextlib


def saved_shapes(model) -> dict[str, tuple[int, ...]]:
    """The tensors ``save_pretrained`` would write (key conversion reverted), by shape."""
    from transformers.core_model_loading import revert_weight_conversion

    state = model.state_dict()
    with contextlib.suppress(Exception):
        state = revert_weight_conversion(model, state)
    return {n: tuple(t.shape) for n, t in state.items()}


def saved_names(kinds: dict[str, str], saved: dict[str, tuple[int, ...]],
                renamed: dict[str, str]) -> dict[str, str]:
    """Parameter name -> the name ``save_pretrained`` writes it under: transformers' own
    renaming (``renamed``: Gemma-3's ``model.language_model.`` saved as
    ``language_model.model.``), itself, or the one saved name that differs only in its first
    component (NemotronH's ``model.`` is saved as ``backbone.``)."""
    tails: dict[str, list[str]] = {}
    for name in saved:
        tails.setdefault(name.split(".", 1)[-1], []).append(name)
    out = {}
    for name in kinds:
        match = tails.get(name.split(".", 1)[-1], [])
        out[name] = (renamed[name] if renamed.get(name) in saved else name
                     if name in saved or len(match) != 1 else match[0])
    return out


def renamed(model) -> dict[str, str]:
    """Parameter name -> the name transformers' key conversion saves it under, where the
    conversion only renames (the reverted state holds the same tensor objects)."""
    from transformers.core_model_loading import revert_weight_conversion

    state = model.state_dict()
    try:
        reverted = revert_weight_conversion(model, dict(state))
    except Exception:  # no conversion to revert: every name is saved as it is
        return {}
    saved = {id(t): n for n, t in reverted.items()}
    return {n: saved[id(t)] for n, t in state.items() if id(t) in saved}
