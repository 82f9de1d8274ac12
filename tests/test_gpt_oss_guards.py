"""gpt-oss's interleaved gate/up axis keeps its unit (gac_check/formats/gpt_oss.py,
gac_check/sites.py): one unit of the expert width is two columns of ``gate_up_proj`` and two
entries of its bias, so what one more unit costs is what transformers' own GptOssExperts
grows by when its intermediate_size grows by one, and the axis's segment spans both columns.
Seen red under its mutant (the unit dropped from the parameter count)."""
from __future__ import annotations

from pathlib import Path

from gac_check.analysis import check
from gac_check.sites import Role
from tests.test_gpt_oss import _gpt_oss


def _expert_params(width: int) -> int:
    return sum(p.numel() for p in _gpt_oss(width).model.layers[0].mlp.experts.parameters())


def test_one_unit_of_an_interleaved_expert_width_costs_what_transformers_adds(
        tmp_path: Path) -> None:
    model = _gpt_oss(45)
    model.save_pretrained(tmp_path / "m")
    result = check(tmp_path / "m", "gpu")
    site = next(s for s in result.sites if s.role is Role.EXPERT and s.layer == 0)
    assert site.value == 45
    assert site.params_per_unit(result.checkpoint.shapes) == _expert_params(46) - _expert_params(45)
    gate_up = next(a for a in site.axes if a.tensor.endswith("experts.gate_up_proj"))
    assert gate_up.segments(site.value) == [(0, 90)]  # 45 gate and 45 up columns, interleaved
