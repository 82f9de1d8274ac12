"""Mixture-of-experts layers: each routed expert's MLP width, the shared expert's, the expert
count, and the router, read from the names ``save_pretrained`` writes.

transformers (5.x) keeps a layer's experts fused in memory (``mlp.experts.gate_up_proj`` [E,
2I, H], ``mlp.experts.down_proj`` [E, H, I]) but its ``save_pretrained`` writes them back as one
module per expert, the names the Hub's checkpoints carry (``conversion_mapping.py``, reverted
on save); :mod:`gac_check.api.memory` indexes a model in memory under those saved names too. So
one reader serves both, for the three layouts in priority order:

- Mixtral (``MixtralForCausalLM``): ``block_sparse_moe.experts.N.w1/w3`` (gate, up: [I, H]),
  ``w2`` (down: [H, I]), router ``block_sparse_moe.gate`` [E, H]; ``intermediate_size``,
  ``num_local_experts``;
- DeepSeek-V2/V3 (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``; told from Qwen2-MoE,
  whose expert names they share, by their multi-head latent attention): ``mlp.shared_experts``
  (no gate), router ``mlp.gate`` and V3's ``e_score_correction_bias``;
  ``moe_intermediate_size``, ``n_routed_experts``, ``n_shared_experts``;
- Qwen2-MoE (``Qwen2MoeForCausalLM``, the layout Qwen3-MoE shares):
  ``mlp.experts.N.gate_proj/up_proj/down_proj``, router ``mlp.gate``, and a dense
  ``mlp.shared_expert`` with its one-row ``mlp.shared_expert_gate``;
  ``moe_intermediate_size``, ``num_experts``, ``shared_expert_intermediate_size``.

Expert-width pruning can leave experts of one layer at different widths, so each expert is a
site of its own. Expert pruning (llm-compressor's REAP edits ``num_experts``) must keep one
count in every layer, since every MoE class builds its layers from one config value: layers
of different counts, a router whose rows disagree with the experts, or expert indices with
gaps are refusals naming the layer. The tensors win over config.json; a value they contradict
is a note with both. The router is read (its rows on the count site, its columns on the hidden
site) and never padded: the count site is refused by ``--repair``, because a zero expert would
still be routed to.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput, NotRead
from gac_check.formats.layout import Linear, dense_linear
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

EXPERTS_NOT_PADDED = (
    "expert counts are reported, not padded: a zero expert would still be routed to (its "
    "router logit 0 can enter the top-k and take weight from the real experts)"
)
SHARED_NOT_PADDED = (
    "DeepSeek builds its shared experts n_shared_experts ({shared}) x moe_intermediate_size "
    "wide from the one config key the routed experts' width is written to: padded, they would "
    "not load; only a checkpoint with n_shared_experts = 1 has its expert widths padded"
)


@dataclass(frozen=True)
class MoeLayout:
    """Where one MoE family keeps its experts, router and shared expert, relative to a layer,
    and the config.json keys that record their sizes."""

    name: str
    block: str  # the sparse block's module: block_sparse_moe (Mixtral) or mlp (Qwen2-MoE)
    gate: str  # an expert's gate projection (rows: its width)
    up: str
    down: str  # columns: its width
    width_key: str
    count_key: str
    shared: str | None = None
    shared_gate: str | None = None
    shared_key: str | None = None
    #: a tensor-name fragment the checkpoint must also have (DeepSeek's experts carry
    #: Qwen2-MoE's names; its multi-head latent attention tells them apart)
    marker: str | None = None
    #: per-expert router tensors besides the router's weight (DeepSeek-V3's routing bias)
    router_extras: tuple[str, ...] = ()

    @property
    def router(self) -> str:
        return f"{self.block}.gate"


MIXTRAL = MoeLayout("mixtral", "block_sparse_moe", "w1", "w3", "w2", "intermediate_size",
                    "num_local_experts")
QWEN2_MOE = MoeLayout("qwen2_moe", "mlp", "gate_proj", "up_proj", "down_proj",
                      "moe_intermediate_size", "num_experts", "shared_expert",
                      "shared_expert_gate", "shared_expert_intermediate_size")
#: DeepSeek-V2/V3: Qwen2-MoE's expert names, ``n_shared_experts`` always-on experts fused
#: into one ``mlp.shared_experts`` MLP (``moe_intermediate_size x n_shared_experts`` wide, no
#: gate of its own; its config key: :func:`_deepseek_shared_site`), the router ``mlp.gate`` and V3's
#: per-expert ``e_score_correction_bias`` (added to the router's scores to pick the top-k).
DEEPSEEK_MOE = MoeLayout("deepseek_moe", "mlp", "gate_proj", "up_proj", "down_proj",
                         "moe_intermediate_size", "n_routed_experts", "shared_experts",
                         marker=".self_attn.kv_a_proj_with_mqa.",
                         router_extras=("e_score_correction_bias",))
#: In priority order: the first whose expert tensors (and marker) a checkpoint has is its
#: layout.
LAYOUTS = (MIXTRAL, DEEPSEEK_MOE, QWEN2_MOE)


@dataclass(frozen=True)
class MoeLayers:
    """A checkpoint's MoE layers: the layout, the layer-list prefix and, per layer, the expert
    indices present."""

    layout: MoeLayout
    prefix: str
    experts: dict[int, list[int]]

    def block(self, layer: int) -> str:
        return f"{self.prefix}.{layer}.{self.layout.block}"


#: One routed expert's gate weight in any layout: prefix, layer, block, expert, projection.
_EXPERT_GATE = re.compile(r"^(.*?layers)\.(\d+)\.([^.]+)\.experts\.(\d+)\.([^.]+)\.weight$")


def find_moe(ckpt: Checkpoint) -> MoeLayers | None:
    """The first layout (in :data:`LAYOUTS` order) whose per-expert tensors are present.

    One pass over the tensor names (tens of thousands in a large MoE checkpoint) collects
    every layout's expert gates and which markers occur, rather than a pass per layout and
    another per marker."""
    markers = {lay.marker for lay in LAYOUTS if lay.marker}
    seen: set[str] = set()
    # (block, gate projection) -> prefix -> layer -> expert indices
    gates: dict[tuple[str, str], dict[str, dict[int, set[int]]]] = {}
    for name in ckpt.tensors:
        seen.update(m for m in markers - seen if m in name)
        m = _EXPERT_GATE.match(name)
        if m:
            layers = gates.setdefault((m.group(3), m.group(5)), {}).setdefault(m.group(1), {})
            layers.setdefault(int(m.group(2)), set()).add(int(m.group(4)))
    for layout in LAYOUTS:
        if layout.marker and layout.marker not in seen:
            continue
        found = gates.get((layout.block, layout.gate))
        if found:
            prefix = max(found, key=lambda p: len(found[p]))
            return MoeLayers(layout, prefix, {i: sorted(e) for i, e in
                                              sorted(found[prefix].items())})
    return None


def moe_sites(ckpt: Checkpoint, shared: list[DimSite]) -> list[DimSite]:
    """The MoE sites of every MoE layer (none for a dense model); the experts' and router's
    hidden-width axes are added to the family's ``hidden`` site in ``shared``."""
    found = find_moe(ckpt)
    if found is None:
        return []
    _require_one_count(ckpt, found)
    hidden = next((s for s in shared if s.role is Role.HIDDEN and s.name == "hidden"), None)
    sites: list[DimSite] = []
    for layer, experts in found.experts.items():
        sites.append(_count_site(ckpt, found, layer, experts, hidden))
        layer_sites = [_expert_site(ckpt, found, layer, e, hidden) for e in experts]
        shared_site = _shared_site(ckpt, found, layer, hidden)
        if shared_site:
            layer_sites.append(shared_site)
        if shared_site and shared_site.inexact:  # DeepSeek's one key for both widths
            for site in layer_sites:
                site.inexact = shared_site.inexact
        sites += layer_sites
    return sites


def _require_one_count(ckpt: Checkpoint, found: MoeLayers) -> None:
    """Every MoE class builds each layer from one expert count, indexed 0..E-1."""
    for layer, experts in found.experts.items():
        if experts != list(range(len(experts))):
            raise BadInput(f"{found.block(layer)} has experts {_short(experts)}: the indices "
                           "must run 0..E-1 (renumber the experts kept after pruning, as "
                           "llm-compressor's REAP does), or no MoE class loads it", ckpt.path)
    counts = {layer: len(e) for layer, e in found.experts.items()}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"layer {i}: {n}" for i, n in list(counts.items())[:8])
        raise BadInput(f"the MoE layers keep different expert counts ({shown}); every MoE "
                       f"class (transformers' and the engines') builds each layer from one "
                       f"{found.layout.count_key}, so the model loads nowhere: prune the same "
                       "number of experts in every layer", ckpt.path)


def _short(values: list[int]) -> str:
    return "[" + ", ".join(map(str, values[:8])) + (", ...]" if len(values) > 8 else "]")


def _linear(ckpt: Checkpoint, module: str) -> Linear:
    lin = dense_linear(ckpt.shapes, module)
    if lin is None:
        raise NotRead(f"{module}.weight is missing or not a matrix: an MoE layer of this "
                       "layout has it", ckpt.path)
    return lin


def _count_site(ckpt: Checkpoint, found: MoeLayers, layer: int, experts: list[int],
                hidden: DimSite | None) -> DimSite:
    router = _linear(ckpt, f"{found.block(layer)}.gate")
    count = len(experts)
    if router.out_features != count:
        raise BadInput(f"{router.module} routes to {router.out_features} experts but the layer "
                       f"has {count}: the router's rows must be pruned with the experts",
                       ckpt.path)
    module = found.block(layer)
    axes = router.producer_axes(ckpt.shapes)
    for extra in found.layout.router_extras:  # one number per expert, read on the count
        name = f"{router.module}.{extra}"
        if name in ckpt.shapes:
            if ckpt.shapes[name] != (count,):
                raise BadInput(f"{name} has shape {list(ckpt.shapes[name])}, not one value "
                               f"per expert ([{count}])", ckpt.path)
            axes.append(TensorAxis(name, 0, AxisKind.BIAS))
    site = DimSite(f"{module}:experts", Role.EXPERTS, count, axes,
                   layer=layer, module=module, config_field=(found.layout.count_key,),
                   inexact=EXPERTS_NOT_PADDED)
    _note(site, ckpt.config, found.layout.count_key)
    _add_hidden(hidden, ckpt, consumers=(router,))
    return site


def _mlp_site(ckpt: Checkpoint, module: str, gate: str, up: str, down: str, role: Role,
              key: str | None, layer: int, hidden: DimSite | None) -> DimSite:
    """One gated MLP (an expert, or the shared expert): gate and up rows, down columns;
    ``key``: the config.json key that records its width, where one does."""
    g, u, d = (_linear(ckpt, f"{module}.{n}") for n in (gate, up, down))
    if g.out_features != u.out_features:
        raise BadInput(f"{g.module} makes {g.out_features} rows but {u.module} makes "
                       f"{u.out_features}: a gated MLP's two projections share one width",
                       ckpt.path)
    width = g.out_features
    axes = g.producer_axes(ckpt.shapes) + u.producer_axes(ckpt.shapes) + d.consumer_axes(
        ckpt.shapes)
    site = DimSite(f"{module}:intermediate", role, width, axes, layer=layer, module=module,
                   config_field=(key,) if key else None)
    if key:
        _note(site, ckpt.config, key)
    if d.in_features != width:
        site.notes.append(f"down takes {d.in_features} inputs, up makes {width}")
    _add_hidden(hidden, ckpt, consumers=(g, u), producers=(d,))
    return site


def _expert_site(ckpt: Checkpoint, found: MoeLayers, layer: int, expert: int,
                 hidden: DimSite | None) -> DimSite:
    lay = found.layout
    site = _mlp_site(ckpt, f"{found.block(layer)}.experts.{expert}", lay.gate, lay.up, lay.down,
                     Role.EXPERT, lay.width_key, layer, hidden)
    site.attrs["expert"] = expert
    return site


def _shared_site(ckpt: Checkpoint, found: MoeLayers, layer: int,
                 hidden: DimSite | None) -> DimSite | None:
    lay = found.layout
    if not lay.shared:
        return None
    module = f"{found.block(layer)}.{lay.shared}"
    if not any(n.startswith(module + ".") for n in ckpt.tensors):
        return None
    if lay.shared_key:
        site = _mlp_site(ckpt, module, "gate_proj", "up_proj", "down_proj",
                         Role.SHARED_EXPERT, lay.shared_key, layer, hidden)
    else:
        site = _deepseek_shared_site(ckpt, found, module, layer, hidden)
    gate = (dense_linear(ckpt.shapes, f"{found.block(layer)}.{lay.shared_gate}")
            if lay.shared_gate else None)
    if gate is not None:  # one logit per token: its only width is the hidden size
        _add_hidden(hidden, ckpt, consumers=(gate,))
    return site


def _deepseek_shared_site(ckpt: Checkpoint, found: MoeLayers, module: str, layer: int,
                          hidden: DimSite | None) -> DimSite:
    """DeepSeek's class builds its shared experts as one MLP ``moe_intermediate_size x
    n_shared_experts`` wide, so one config key records both it and the routed experts' width
    only where ``n_shared_experts`` is 1; elsewhere a padded expert width would change the
    shared experts' too, so neither is padded (the site's ``inexact``, which
    :func:`moe_sites` gives the layer's experts as well)."""
    lay = found.layout
    shared = ckpt.config.get("n_shared_experts")
    one = type(shared) is int and shared == 1
    site = _mlp_site(ckpt, module, "gate_proj", "up_proj", "down_proj", Role.SHARED_EXPERT,
                     lay.width_key if one else None, layer, hidden)
    if one:
        return site
    site.inexact = SHARED_NOT_PADDED.format(shared=shared)
    width = ckpt.config.get(lay.width_key)
    if type(shared) is int and type(width) is int and shared * width != site.value:
        site.notes.append(f"the config says {lay.width_key} x n_shared_experts = {width} x "
                          f"{shared} = {width * shared}, tensors have {site.value}")
    return site


def _add_hidden(hidden: DimSite | None, ckpt: Checkpoint, consumers: tuple[Linear, ...] = (),
                producers: tuple[Linear, ...] = ()) -> None:
    """The residual-stream axes of an expert, the router or the shared gate, on the hidden
    site (where ``--repair`` never pads: it is refused, so these are read, not edited)."""
    if hidden is None:
        return
    for lin in consumers:
        hidden.axes.extend(lin.consumer_axes(ckpt.shapes))
    for lin in producers:
        hidden.axes.extend(lin.producer_axes(ckpt.shapes))


def _note(site: DimSite, cfg: dict, key: str) -> None:
    declared = cfg.get(key)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared != site.value:
        site.notes.append(f"the config says {key}={declared}, tensors have {site.value}")


def moe_family(ckpt: Checkpoint) -> str | None:
    """The MoE layout's name (``mixtral``, ``qwen2_moe``) where the checkpoint has one: what
    ``--repair`` holds to the pairs tested end to end."""
    found = find_moe(ckpt)
    return found.layout.name if found else None


__all__ = ["LAYOUTS", "MIXTRAL", "QWEN2_MOE", "MoeLayout", "find_moe", "moe_family",
           "moe_sites"]
