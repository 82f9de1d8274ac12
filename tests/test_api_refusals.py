"""Refusals of the public API (``gac_check.check`` / ``realign``) at their edges: an argument
that would be silently ignored, an OUT that would destroy an input even with ``force``, and a
budget exactly at the feasibility boundary (equal: allowed; one parameter less: refused)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import gac_check
from gac_check.api.refusals import require_feasible
from gac_check.checkpoint.index import open_checkpoint
from gac_check.errors import BadInput
from gac_check.ranks.candidates import rank_menus
from gac_check.ranks.factors import rank_alignment
from gac_check.sites import Role
from tests import compressors as C
from tests import helpers


@pytest.fixture(scope="module")
def asvd(tmp_path_factory) -> Path:
    return C.build_asvd(tmp_path_factory.mktemp("asvd") / "model").path


@pytest.mark.parametrize("as_what", ["str", "Path", "Checkpoint"])
def test_config_with_a_directory_is_refused_not_ignored(asvd, as_what) -> None:
    """A directory (or its index) has its own config.json: a config= beside it would be
    silently ignored, so it is refused."""
    model = {"str": str(asvd), "Path": asvd, "Checkpoint": open_checkpoint(asvd)}[as_what]
    with pytest.raises(BadInput, match="config= is for a model in memory"):
        gac_check.check(model, "h100", config={"hidden_size": 64})


@pytest.mark.parametrize("where", ["base", "inside base", "around base"])
def test_realign_never_writes_over_its_base_even_with_force(asvd, tmp_path, where) -> None:
    base = tmp_path / "dense"
    helpers.tiny_llama().save_pretrained(base)
    before = helpers.tree_digest(base)
    out = {"base": base, "inside base": base / "out", "around base": tmp_path}[where]
    with pytest.raises(BadInput, match="must not be the input"):
        gac_check.realign(asvd, out, base=base, gpu="h100", force=True, progress=False)
    assert helpers.tree_digest(base) == before


def _budget_for(spend: int, dense: int) -> str:
    """A decimal fraction whose floor(fraction * dense) is exactly ``spend``."""
    fraction = spend / dense
    for _ in range(64):
        if math.floor(float(repr(fraction)) * dense) == spend:
            return repr(fraction)
        fraction = math.nextafter(fraction, 1 if math.floor(fraction * dense) < spend else 0)
    raise AssertionError(spend)


def test_a_budget_exactly_the_cheapest_aligned_choice_is_feasible(asvd) -> None:
    result = gac_check.check(asvd, "h100")
    align = rank_alignment(result.contract)
    shapes = result.checkpoint.shapes
    sizes = []
    for site in result.sites:
        if site.role is Role.RANK:
            b, a = (ax.tensor for ax in site.axes)
            sizes.append((shapes[a][0], shapes[b][1]))
    assert sizes
    dense = sum(m * n for m, n in sizes)
    least = sum(min(align * (m + n), m * n) for m, n in sizes)
    menus = rank_menus(result.sites, shapes, result.contract, align, True)
    require_feasible(result, _budget_for(least, dense), menus)  # equal: allowed
    with pytest.raises(BadInput, match=f"fewer than the cheapest choice aligned \\({least:,}"):
        require_feasible(result, _budget_for(least - 1, dense), menus)
