"""The published Shape Contract: rules, targets and profile resolution."""
from __future__ import annotations

import pytest

from gac_check.contract.rules import ERROR, WARNING
from gac_check.contract.select import for_hardware
from gac_check.errors import BadInput
from gac_check.profiles import resolve_profile
from gac_check.sites import DimSite, Role


def site(role: Role, value: int) -> DimSite:
    return DimSite(f"x:{role.value}", role, value, [])


@pytest.mark.parametrize(("value", "minimal", "optimal"), [
    (107, 112, 112), (1843, 1848, 1856), (153, 160, 160), (8806, 8808, 8816), (4096, 4096, 4096),
])
def test_gemm_targets_fp16(value, minimal, optimal):
    c = for_hardware("a100", "float16")
    s = site(Role.RANK, value)
    assert c.target(s) == minimal
    assert c.target(s, (ERROR, WARNING)) == optimal


def test_dtype_sets_the_alignment():
    assert for_hardware("h100", "float32").target(site(Role.RANK, 153)) == 156
    assert for_hardware("h100", "float8_e4m3fn").target(site(Role.RANK, 153)) == 160
    assert for_hardware("h100", "float8_e4m3fn").target(site(Role.RANK, 161)) == 176


def test_head_dim_rules_and_buckets():
    c = for_hardware("a100", "float16")
    f = c.check([site(Role.HEAD_DIM, 107), site(Role.HEAD_DIM, 112), site(Role.HEAD_DIM, 128)])
    by_value = {x.site.value: x for x in f}
    assert by_value[107].severity == ERROR and by_value[107].repair_to == 112
    assert by_value[107].optimal_to == 128  # next FlashAttention bucket
    assert by_value[112].severity == WARNING  # aligned, but not a compiled bucket
    assert 128 not in by_value
    assert by_value[107].slowdown == pytest.approx(1.39, abs=0.005)  # A100 table: 107 vs 112


def test_head_dim_over_256_is_an_error():
    f = for_hardware("h100", "bfloat16").check([site(Role.HEAD_DIM, 320)])
    assert [r.id for r in f[0].rules] == ["attn-head-dim-max", "attn-head-dim-bucket"]


def test_published_slowdown_depends_on_residue():
    c = for_hardware("a100", "float16")
    # sizes inside the published K/N sweep (4000-4100); 1843 is outside it: no figure
    odd, even = c.check([site(Role.RANK, 4001), site(Role.RANK, 4002)])
    assert odd.slowdown == pytest.approx(3.06, abs=0.01)
    assert even.slowdown == pytest.approx(1.61, abs=0.01)


def test_heads_have_no_alignment_rule():
    assert for_hardware("a100", "float16").check([site(Role.HEADS, 7)]) == []


def test_published_cpu_contract_ignores_gemm_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path))  # no measured sweep: published rules
    c = for_hardware("cpu", "float32")
    assert c.check([site(Role.RANK, 107)]) == []
    assert c.check([site(Role.HEAD_DIM, 107)])[0].severity == WARNING


def test_auto_without_gpu_is_the_generic_gpu_contract_not_cpu():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: auto resolves to it")
    assert resolve_profile("auto") == "gpu"
    assert resolve_profile("CPU") == "cpu"


def test_unknown_profile_is_bad_input():
    with pytest.raises(BadInput, match="unknown hardware profile"):
        resolve_profile("v100")


def test_the_32_byte_rule_quotes_the_profiles_own_sweep() -> None:
    """An H100 check cites the H100 sweep, never the A100's; the quoted medians are the
    packaged sweeps' own (multiples of 16 vs multiples of 8 only, fp16 K)."""
    import statistics
    from importlib.resources import files

    from gac_check.contract.rules import PUBLISHED_K_SWEEP, gpu_rules

    for gpu, (at16, at8) in PUBLISHED_K_SWEEP.items():
        text = files("gac_check.data").joinpath(f"published-{gpu}-gemm-alignment-sweep.tsv")
        k = {int(r.split("\t")[0]): float(r.split("\t")[1])
             for r in text.read_text().splitlines() if r[:1].isdigit()}
        assert round(statistics.median(v for d, v in k.items() if d % 16 == 0), 1) == at16
        assert round(statistics.median(v for d, v in k.items() if d % 16 and d % 8 == 0),
                     1) == at8
    for profile, gpu in (("h100", "H100"), ("h200", "H100"), ("a100", "A100"), ("gpu", "A100")):
        (rule,) = [r for r in gpu_rules("float16", profile) if r.id == "gemm-optimal-32B"]
        assert f"published {gpu} fp16" in rule.why and ({"A100", "H100"} - {gpu}).pop() \
            not in rule.why
