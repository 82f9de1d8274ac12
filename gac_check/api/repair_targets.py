"""``--repair --target``: what a repair pads to for the targets, and what it refuses to write.

A repair is worth writing only if the targets it was asked for will serve OUT. So, before a
byte is written, the plan is judged as OUT would be: a target whose engine does not build
the model (a compressor's custom modules, a pickled whole model, an unknown architecture) or
that would still refuse a padded site refuses the repair, saying why. Layers of different MLP
widths, and routed experts of different widths (a fused-MoE layer holds its experts in one
tensor of one width), are the one load blocker padding can remove: ``--uniform`` pads every
layer's MLP, and every routed expert of every layer, to the widest (exact zero padding, then
to what every target runs fast), and without it the refusal offers it with its cost.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gac_check.analysis import CheckResult, model_kind
from gac_check.api.refusals import refuse_unloadable
from gac_check.contract.rules import Contract
from gac_check.contract.select import assemble
from gac_check.errors import BadInput
from gac_check.padding.plan import STRATEGIES, RepairPlan, plan
from gac_check.sites import Role
from gac_check.targets.blocks import ffn_width
from gac_check.targets.loadability import CONFIG, LAYERS, ModelKind, layer_widths
from gac_check.targets.shards import model_shape


@dataclass
class TargetedPlan:
    """The repair plan, and the contract OUT will be judged by (the uniform one with
    ``--uniform``: every layer's MLP at one width, every routed expert at one width)."""

    plan: RepairPlan
    contract: Contract
    widths: dict[str, int]


def plan_for_targets(before: CheckResult, strategy: str, uniform: bool) -> TargetedPlan:
    """The plan ``--repair`` carries out; :class:`BadInput` (nothing written) where a target
    would still refuse OUT, with what would help. ``uniform`` pads every layer's MLP to one
    width and every routed expert to one (with or without targets)."""
    ckpt = before.checkpoint
    # OUT's kind: without the config values the tensors contradict (the plan records them)
    kind = model_kind(ckpt, before.format)
    # block_configs refused only for MLP widths no ffn_mult builds: the plan writes the one
    # that builds OUT's, so the engine's DeciLM class builds every layer of OUT
    ffn_mults = bool(kind.blocks) and all(b.repairable for b in kind.blocks)
    blocked = refuse_unloadable(
        before, "--repair: {spec} would still refuse OUT: {why}; no padding changes that. "
        "To serve it: {remedy}. Nothing was written (drop --target {spec} to repair for the "
        "rest)", removable=lambda load: load.blocker == CONFIG or (
            load.blocker == LAYERS and (ffn_mults or _mlp_only(before))))
    recorded = [v for v in blocked if v.blocker == CONFIG]  # the plan records head_dim
    blocked = [v for v in blocked if v.blocker != CONFIG]
    if blocked and not uniform and not ffn_mults:
        experts = len(layer_widths(model_shape(before.sites))["expert"]) > 1
        what = ("the expert-width pruning with one width for every expert of every layer, or "
                "add --uniform to pad every routed expert of every layer" if experts else
                "the compressor with the same width in every layer, or add --uniform to pad "
                "every layer")
        raise BadInput(f"--repair: {', '.join(v.target.spec for v in blocked)} would still "
                       f"refuse OUT: {blocked[0].why}; re-run {what} to the widest "
                       f"({_uniform_cost(before, kind, strategy)}; exact zero padding). "
                       "Nothing was written", ckpt.path)
    widths: dict[str, int] = {}
    contract = before.contract
    if recorded:
        contract = assemble(contract.profile, contract.dtype, before.targets, before.sites,
                            kind)
    if uniform and _uneven(before):
        widths, contract = _uniform(before, kind, strategy)
    repair_plan = plan(before.sites, contract, strategy, shapes=ckpt.shapes,
                       config=ckpt.config, widths=widths)
    if ffn_mults and contract.targets is not None:
        contract = _as_repaired(before, kind, repair_plan)
    if contract.targets is not None:
        sizes = {r.site.name: r.target for r in repair_plan.repairs}
        still = contract.targets.refused_after(before.sites, sizes)
        if still:
            site, target, why = still[0]
            more = f" (and {len(still) - 1} more)" if len(still) > 1 else ""
            raise BadInput(f"--repair: {target.spec} would still refuse OUT at {site.name}"
                           f"{more}: {why}. Nothing was written (drop --target {target.spec} "
                           "to repair for the rest)", ckpt.path)
    return TargetedPlan(repair_plan, contract, widths)


def _as_repaired(before: CheckResult, kind: ModelKind, repair_plan: RepairPlan) -> Contract:
    """The contract OUT will be judged by: its block_configs as the repair writes them, each
    layer's MLP conflict gone where what OUT's entry declares (ffn_mult's width, its
    intermediate_size) is OUT's width."""
    sizes = {r.site.name: r.target for r in repair_plan.repairs}
    written = {(e.path[1], e.path[-1]): e.new for e in repair_plan.config_edits
               if e.path[0] == "block_configs"}
    mlp = {s.layer: s for s in before.sites if s.role is Role.INTERMEDIATE}
    hidden = before.checkpoint.config["hidden_size"]
    blocks = []
    for b in kind.blocks:
        site = mlp.get(b.layer)
        mult = written.get((b.layer, "ffn_mult"), b.ffn_mult)
        explicit = written.get((b.layer, "intermediate_size"), b.width)
        width = sizes.get(site.name, site.value) if site else None
        declared = {ffn_width(mult, hidden) if mult is not None else None, explicit} - {None}
        if width is not None and declared == {width}:
            b = dataclasses.replace(b, ffn_mult=mult, width=explicit, intermediate=width,
                                    mlp_conflict=None, conflicts=tuple(
                                        c for c in b.conflicts if c != b.mlp_conflict))
        blocks.append(b)
    return assemble(before.contract.profile, before.contract.dtype, before.targets,
                    before.sites, dataclasses.replace(kind, blocks=tuple(blocks)))


def _mlp_only(before: CheckResult) -> bool:
    """Whether the layers differ only in their MLP widths (head counts cannot be padded)."""
    widths = layer_widths(model_shape(before.sites))
    return len(widths["heads"]) <= 1 and len(widths["head_dim"]) <= 1


#: The widths a class builds from one config value, each padded to its own one width: a
#: dense layer's MLP, and the routed experts (another key: Mixtral's intermediate_size,
#: Qwen2-MoE's and DeepSeek's moe_intermediate_size, gpt-oss's one fused width per layer).
UNIFORM_ROLES = (Role.INTERMEDIATE, Role.EXPERT)


def _uneven(before: CheckResult) -> bool:
    """Whether the layers' MLPs, or the routed experts, are of more than one width."""
    widths = layer_widths(model_shape(before.sites))
    return len(widths["intermediate"]) > 1 or len(widths["expert"]) > 1


def _uniform(before: CheckResult, kind: ModelKind,
             strategy: str) -> tuple[dict[str, int], Contract]:
    """Each uneven role's width (every layer's MLP, every routed expert): the widest, then
    the smallest size at or above it that the contract and every target take, judged on the
    model as it will be (one width per role). A role already of one width is left to the
    contract, as without ``--uniform``."""
    uneven = [role for role in UNIFORM_ROLES
              if len({s.value for s in before.sites if s.role is role}) > 1]
    stuck = next((s for s in before.sites if s.role in uneven and s.inexact), None)
    if stuck is not None:  # padded, the others would still not share its width
        raise BadInput(f"--uniform: {stuck.name} cannot be padded exactly ({stuck.inexact}), "
                       "so its layers' widths cannot be made one; re-run the pruning with "
                       "one width. Nothing was written", before.checkpoint.path)
    widest = {role: max(s.value for s in before.sites if s.role is role) for role in uneven}
    sites = [dataclasses.replace(s, value=widest[s.role]) if s.role in widest else s
             for s in before.sites]
    contract = assemble(before.contract.profile, before.contract.dtype, before.targets, sites,
                        kind)
    widths: dict[str, int] = {}
    for role in uneven:
        to = max(contract.target(s, STRATEGIES[strategy]) for s in sites if s.role is role)
        widths.update({s.name: to for s in before.sites if s.role is role})
    return widths, contract


def _uniform_cost(before: CheckResult, kind: ModelKind, strategy: str) -> str:
    widths, _ = _uniform(before, kind, strategy)
    ckpt = before.checkpoint
    sites = {s.name: s for s in before.sites}
    added = sum((to - sites[n].value) * sites[n].params_per_unit(dict(ckpt.shapes))
                for n, to in widths.items())
    to = " and ".join(map(str, sorted(set(widths.values()))))
    share = added / ckpt.params if ckpt.params else 0.0
    return f"to {to}: +{added:,} parameters, {share:.2%}"


def uniform_note(before: CheckResult, widths: dict[str, int]) -> str:
    """What ``--uniform`` padded to, per role, for the repair's notes."""
    roles = {s.name: s.role for s in before.sites}
    said = {Role.INTERMEDIATE: "every layer's MLP", Role.EXPERT: "every routed expert"}
    parts = [f"{said[role]} padded to {to}" for role in UNIFORM_ROLES
             for to in sorted({w for n, w in widths.items() if roles[n] is role})]
    return ("--uniform: " + ", ".join(parts) + ", so an engine that builds every layer (and "
            "every fused-MoE layer's experts) from one width loads OUT")
