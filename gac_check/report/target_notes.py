"""Which "not modelled" notes of the targets' packs a check prints: those that apply to the
model's own layout, scheme and targets, each once and short; the others are counted in one
line that points to docs/targets.md, where all of them are (issue 39: every ``--target vllm``
run printed about fifteen paragraphs, most about schemes and layouts the model did not have).

What a note applies to is the pack's own ``note_scope`` (:class:`gac_check.targets.packs
.NoteScope`); the facts it is matched against are read from the check: the sites' roles (experts,
per-layer widths), the checkpoint's tensors (multi-head latent attention), each target's
``quant``, ``tp``, ``ep`` and ``kv``, and the GPU profile's compute capability.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gac_check.analysis import CheckResult
from gac_check.sites import Role
from gac_check.targets.packs import Pack
from gac_check.targets.spec import Target
from gac_check.targets.verdicts import SM_OF_PROFILE

MOE_ROLES = (Role.EXPERT, Role.SHARED_EXPERT, Role.EXPERTS)
#: Widths a per-layer pruned model varies from layer to layer (the same site in each layer).
PER_LAYER_ROLES = (Role.INTERMEDIATE, Role.EXPERT, Role.HEADS, Role.HEAD_DIM)
LAYER_INDEX = re.compile(r"\.\d+\.")
#: DeepSeek-V2/V3's compressed KV projection: only a multi-head latent attention model has it.
MLA_TENSOR = "kv_a_proj_with_mqa.weight"


@dataclass(frozen=True)
class TargetNotes:
    """The notes a check prints (engine, line) and how many it leaves to docs/targets.md."""

    shown: list[tuple[str, str]]
    left: int


def _model_facts(result: CheckResult) -> set[str]:
    facts = {"always"}
    roles = {s.role for s in result.sites}
    if roles & set(MOE_ROLES):
        facts.add("moe")
    if any(n.endswith(MLA_TENSOR) for n in result.checkpoint.tensors):
        facts.add("mla")
    widths: dict[str, set[int]] = {}  # one site name across layers: its values
    for s in result.sites:
        if s.layer is not None and s.role in PER_LAYER_ROLES:
            widths.setdefault(LAYER_INDEX.sub(".*.", s.name), set()).add(s.value)
    if any(len(v) > 1 for v in widths.values()):
        facts.add("per_layer")
    return facts


def _target_facts(targets: list[Target], sm: int | None) -> set[str]:
    facts: set[str] = set()
    for t in targets:
        facts.add(f"quant:{t.quant}")
        facts.update(f for f, on in (("tp", t.tp > 1), ("ep", t.ep > 1),
                                     ("kv", "kv" in t.given)) if on)
    if sm is not None:
        facts.add(f"gpu:sm{sm}")
    return facts


def _holds(fact: str, facts: set[str], sm: int | None) -> bool:
    if fact.startswith("quant:"):
        return any(f.startswith(fact) for f in facts if f.startswith("quant:"))
    if fact.startswith("gpu:sm"):
        return sm is not None and sm >= int(fact.removeprefix("gpu:sm"))
    return fact in facts


def _applies(alternatives: tuple[str, ...], facts: set[str], sm: int | None) -> bool:
    return any(all(_holds(f, facts, sm) for f in alt.split("+")) for alt in alternatives)


def target_notes(result: CheckResult) -> TargetNotes:
    verdicts = result.contract.targets
    sm = SM_OF_PROFILE.get(verdicts.profile)
    model = _model_facts(result)
    engines: dict[str, Pack] = {t.engine: t.pack for t in verdicts.targets}
    shown: list[tuple[str, str]] = []
    left = 0
    for engine, pack in engines.items():
        facts = model | _target_facts([t for t in verdicts.targets if t.engine == engine], sm)
        for note in pack.notes:
            scope = next((s for s in pack.note_scope if note.startswith(s.starts)), None)
            if scope and _applies(scope.applies, facts, sm):
                line = scope.short or note
                if (engine, line) not in shown:
                    shown.append((engine, line))
            else:
                left += 1
    return TargetNotes(shown, left)


__all__ = ["TargetNotes", "target_notes"]
