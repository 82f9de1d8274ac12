"""The plan against the tensors (gac_check/padding/completeness.py): an axis that holds a padded
site's old size in its scope is either padded, named by another site, or the repair is
refused."""
from __future__ import annotations

from gac_check.contract.select import for_hardware
from gac_check.padding.completeness import unpadded_axes
from gac_check.padding.plan import plan
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

CONTRACT = for_hardware("gpu", "float16")
SHAPES = {"m.up.weight": (12, 64), "m.down.weight": (64, 12), "m.scale": (12,),
          "m.gate.weight": (64, 12)}


def rank_site(*extra: TensorAxis) -> DimSite:
    return DimSite("m:rank", Role.RANK, 12, [TensorAxis("m.up.weight", 0, AxisKind.PRODUCER),
                                             TensorAxis("m.down.weight", 1, AxisKind.CONSUMER),
                                             *extra], module="m")


def test_an_axis_no_site_names_is_reported() -> None:
    p = plan([rank_site()], CONTRACT, shapes=SHAPES)
    assert sorted(unpadded_axes(p, SHAPES)) == [("m.gate.weight", 1, "m:rank"),
                                                ("m.scale", 0, "m:rank")]


def test_padding_it_or_another_site_naming_it_clears_it() -> None:
    padded = rank_site(TensorAxis("m.scale", 0, AxisKind.NORM))
    other = DimSite("m:other", Role.INTERMEDIATE, 12,
                    [TensorAxis("m.gate.weight", 1, AxisKind.CONSUMER)], module="m",
                    inexact="not padded here")
    p = plan([padded, other], CONTRACT, shapes=SHAPES)
    assert unpadded_axes(p, SHAPES) == []


def test_a_hidden_width_is_looked_for_outside_the_layers_too() -> None:
    """The residual stream runs through the embeddings, the final norm and the head, which
    sit outside the layer list: a tensor there that holds the old hidden width and that no
    site names is reported, as one in a layer the site reaches is; a layer the site does not
    reach is not its scope."""
    shapes = {"model.embed_tokens.weight": (96, 60), "model.layers.0.mlp.up.weight": (24, 60),
              "model.norm.weight": (60,), "model.layers.0.extra.weight": (60,),
              "model.layers.1.other.weight": (60,)}
    hidden = DimSite("hidden", Role.HIDDEN, 60, [
        TensorAxis("model.embed_tokens.weight", 1, AxisKind.PRODUCER),
        TensorAxis("model.layers.0.mlp.up.weight", 1, AxisKind.CONSUMER)])
    p = plan([hidden], CONTRACT, shapes=shapes)
    assert p.repairs and p.repairs[0].site is hidden  # 60 is padded on this contract
    assert sorted(unpadded_axes(p, shapes)) == [("model.layers.0.extra.weight", 0, "hidden"),
                                                ("model.norm.weight", 0, "hidden")]
