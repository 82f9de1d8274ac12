"""The Format interface every checkpoint adapter implements."""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.formats.architectures import Family, family_sites, find_family
from gac_check.formats.gpt_oss import fused_sites
from gac_check.formats.layout import Linear, dense_linear
from gac_check.formats.moe import moe_sites
from gac_check.sites import DimSite
from gac_check.targets.blocks import LayerBlocks
from gac_check.targets.per_layer import LayerDiff


class Format:
    """A checkpoint layout. Subclasses say how they store linears and which extra sites they have.

    ``sites`` combines the family's shared sites (built over this format's linears) with the
    format's own (ranks, latents) and a mixture-of-experts layer's (:mod:`.moe`; gpt-oss's
    fused experts: :mod:`.gpt_oss`), so a new
    format overrides only ``matches``, ``linear`` and ``own_sites``.
    """

    name = "dense"
    description = "dense Hugging Face model"

    def matches(self, ckpt: Checkpoint) -> bool:
        raise NotImplementedError

    def linear(self, ckpt: Checkpoint, module: str) -> Linear | None:
        return dense_linear(ckpt.shapes, module)

    def own_sites(self, ckpt: Checkpoint) -> list[DimSite]:
        return []

    def blocks(self, ckpt: Checkpoint) -> tuple[LayerBlocks, ...]:
        """Per layer, what its config builds, where each layer has its own (DeciLM's
        block_configs); empty where one width builds every layer."""
        return ()

    def per_layer(self, ckpt: Checkpoint) -> tuple[LayerDiff, ...]:
        """The layers that are not what the global config builds, where config.json says
        each layer's own (transformers' per_layer_config); empty otherwise."""
        return ()

    def head_dims(self, ckpt: Checkpoint, fam: Family, prefix: str) -> dict[int, int]:
        """Layers whose head_dim is their own, not the model's (transformers'
        per_layer_config); empty where one head_dim splits every layer."""
        return {}

    def sites(self, ckpt: Checkpoint) -> list[DimSite]:
        found = find_family(ckpt, strict=False)
        shared: list[DimSite] = []
        if found:
            fam, prefix, layers = found
            shared = family_sites(ckpt, fam, prefix, layers, lambda m: self.linear(ckpt, m),
                                  layer_head_dims=self.head_dims(ckpt, fam, prefix))
        return (self.own_sites(ckpt) + shared + moe_sites(ckpt, shared)
                + fused_sites(ckpt, shared))
