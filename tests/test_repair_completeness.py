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
