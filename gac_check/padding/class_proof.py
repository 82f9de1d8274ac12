"""A table-read repair held to the family's own class before anything is written.

For a checkpoint read through the derived class table (:mod:`gac_check.formats.derived`) the
sites say which producer rows, biases and consumer columns carry an MLP or expert width (a
``Conv1D``'s transposed layout, a fused gate_up's two runs, each expert's bank), but not which
config.json key records that width: GPT-2 calls it ``n_inner``, Falcon ``ffn_hidden_size``,
Cohere2-MoE its experts' ``intermediate_size``. Rather than a hand list per family, the key is
found from the class itself: OUT's config.json is tried with each key that holds the old width
set to the padded one (the table's key first), the class is built from it on the meta device
(no weights, no memory, built-in classes only) and every parameter it builds is compared with
the shape the repair writes. The first config whose class builds exactly those shapes is the
one written; when none does, the repair is refused in one line naming the tensor the class
would build otherwise, and nothing is written. Exact logits are proven per family in
tests/test_repair_families.py, which is what ``PROVEN`` (padding/families.py) records.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from itertools import product

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.padding.plan import ConfigEdit, RepairPlan

#: config keys whose value builds that many layers / experts: bounded by the tensors' own
#: count before a class is built from them (a hostile count would build forever)
_COUNTS = re.compile(r"^(?:num_hidden_layers|num_layers|n_layers?|num_experts|num_local_experts|"
                     r"n_routed_experts|moe_num_experts)$")
#: no count above this is read even by its config class (which may make a list per layer)
_MOST = 1 << 20


def derived_widths(repair_plan: RepairPlan) -> set[tuple[int, int]]:
    """(old, new) of every padded width read from the class table."""
    return {(r.site.value, r.target) for r in repair_plan.repairs if "derived" in r.site.attrs}


def prove_on_class(repair_plan: RepairPlan, ckpt: Checkpoint) -> RepairPlan:
    """``repair_plan`` with the config.json edits under which the checkpoint's own class builds
    every tensor at the shape the repair writes; BadInput (nothing written) where no key that
    holds a padded width does. A plan that pads no table-read width is returned as it is."""
    moves = sorted(derived_widths(repair_plan))
    if not moves:
        return repair_plan
    _bound_counts(ckpt)
    written = _written_shapes(repair_plan, ckpt)
    kept = [e for e in repair_plan.config_edits if not _is_move(e, moves)]
    first = None
    for edits in _candidates(repair_plan, ckpt.config, moves):
        wrong = _misfit(ckpt, [*kept, *edits], written)
        if wrong is None:
            return replace(repair_plan, config_edits=[*kept, *edits])
        first = first or wrong
    shown = ", ".join(f"{o} -> {n}" for o, n in moves)
    raise BadInput(f"cannot repair: no config.json key that holds the padded width ({shown}) "
                   f"makes its own class build what the repair would write ({first}); "
                   "refusing rather than write a checkpoint its class cannot load", ckpt.path)


def _is_move(edit: ConfigEdit, moves: list[tuple[int, int]]) -> bool:
    return len(edit.path) == 1 and edit.index is None and (edit.old, edit.new) in moves


def _candidates(repair_plan: RepairPlan, config: Mapping,
                moves: list[tuple[int, int]]) -> Iterator[list[ConfigEdit]]:
    """Config edits to try, most likely first: the plan's own (the table's key), then per
    padded width each key holding the old value alone, then all of them together; a key
    holding twice the old value (RecurrentGemma's MLP is ``intermediate_size // 2`` wide,
    ``RecurrentGemmaMlp.__init__``) set to twice the new one, last."""
    yield [e for e in repair_plan.config_edits if _is_move(e, moves)]
    per_move = []
    for old, new in moves:
        keys = sorted(k for k, v in config.items()
                      if v == old and isinstance(v, int) and not isinstance(v, bool))
        options = [[k] for k in keys] + ([keys] if len(keys) > 1 else [])
        edits = [[ConfigEdit((k,), None, old, new) for k in ks] for ks in options]
        edits += [[ConfigEdit((k,), None, v, 2 * new)] for k, v in sorted(config.items())
                  if isinstance(v, int) and not isinstance(v, bool) and v // 2 == old]
        per_move.append(edits)
    for combo in product(*per_move):
        yield [e for edits in combo for e in edits]


def _written_shapes(repair_plan: RepairPlan, ckpt: Checkpoint) -> dict[str, tuple[int, ...]]:
    return {n: (repair_plan.edits[n].new_shape if n in repair_plan.edits else tuple(s))
            for n, s in ckpt.shapes.items()}


def _misfit(ckpt: Checkpoint, edits: list[ConfigEdit],
            written: Mapping[str, tuple[int, ...]]) -> str | None:
    """The first tensor the class built from the edited config.json makes at another shape
    than the repair writes (None: every one fits)."""
    from gac_check.formats.derive_table import built_shapes

    try:
        built = built_shapes(_config(ckpt.config, edits))
    except Exception as e:  # a config its class will not build is no proof
        return f"the class does not build from it: {type(e).__name__}"
    for name in sorted(set(built) & set(written)):
        if built[name] != written[name]:
            return f"{name} would be {built[name]}, the repair writes {written[name]}"
    if not set(built) & set(written):
        return "the class builds none of the checkpoint's tensors"
    return None


def _config(config: Mapping, edits: list[ConfigEdit]):
    """OUT's config.json (the edits applied) as its own built-in config class."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    data = {k: v for k, v in config.items() if k != "auto_map"}
    for e in edits:
        node = data
        for key in e.path[:-1]:
            node = node[key]
        node[e.path[-1]] = e.new
    cls = CONFIG_MAPPING[data["model_type"]]
    # config.json as transformers itself reads it (configuration_utils.py,
    # ``_dict_from_json_file``): its ``{"__float__": "Infinity"}`` tags decoded, or a Mamba
    # config's time_step_limit (0, inf) fails the class's own validation
    return cls.from_dict(cls._decode_special_floats(data))


def _bound_counts(ckpt: Checkpoint) -> None:
    """Refuse a layer or expert count in config.json beyond what the tensors number (their
    names' indices; for experts also a fused bank's leading axis): the class would be built
    at that count. A count is taken as its config class reads it (Dory's ``num_hidden_layers``
    counts attention and MLP sub-layers, halved by DoryConfig), and one that builds no module
    per unit (:func:`_shared`) is no count of tensors; neither is read above :data:`_MOST`."""
    indices = [int(i) for name in ckpt.shapes for i in re.findall(r"\.(\d+)\.", name)]
    layers = max(indices, default=0) + 1
    experts = max([layers, *(n for s in ckpt.shapes.values() for n in s)])
    over = [(key, value, layers if "layer" in key else experts)
            for key, value in ckpt.config.items()
            if _COUNTS.search(key) and isinstance(value, int) and not isinstance(value, bool)]
    over = [(key, value, most) for key, value, most in over if value > most]
    read = _read(ckpt.config) if over and all(v <= _MOST for _, v, _ in over) else None
    probe = {**ckpt.config, **{key: most for key, _, most in over}}  # every count bounded
    for key, value, most in over:
        as_read = getattr(read, key, value) if read is not None else value
        if value <= _MOST and ((isinstance(as_read, int) and as_read <= most)
                               or _shared(probe, key, most)):
            continue
        raise BadInput(f"config.json's {key}={value} is more than the checkpoint's "
                       f"tensors number ({most}); refusing to build its class at "
                       "that size", ckpt.path)


def _read(config: Mapping):
    """config.json as its config class reads it (no module built); None where it does not."""
    try:
        return _config(config, [])
    except Exception:  # a config its class rejects is refused by the proof itself
        return None


def _shared(config: Mapping, key: str, most: int) -> bool:
    """Whether the class builds no module per ``key`` beyond what the tensors number: the
    same tensors at ``most`` and ``most + 1`` (ALBERT shares one layer group across its
    ``num_hidden_layers``; Doge builds no expert unless ``is_moe``), so the config's value is
    no count of tensors. ``config`` holds every count at most the tensors' own, so no probe
    builds more than they number."""
    try:
        names = [set(_built(config, key, n)) for n in (most, most + 1)]
    except Exception:  # a class that does not build at the tensors' count: not shown shared
        return False
    return names[0] == names[1]


def _built(config: Mapping, key: str, count: int) -> dict[str, tuple[int, ...]]:
    from gac_check.formats.derive_table import built_shapes

    return built_shapes(_config({**config, key: count}, []))
