"""Re-recording a baseline after the software stack changed (issue 22, "tests that bite"):
the re-measured case replaces the stored one, the file takes the new stack (warned once, with
the field that changed), cases and peaks not re-measured stay, and another device is refused
with the file left as it was. Real files, through baselines.update as --gac-update-baselines
calls it.

Each test fails on one of the "rerecord" mutants in benchmarks/hand_mutants.py.
"""
from __future__ import annotations

import warnings

import pytest

from gac_check.bench import baselines
from gac_check.bench.baselines import Fingerprint, Measurement, Provenance
from gac_check.errors import BadInput

OLD = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", torch="2.13.0", cuda="12.8",
                  cudnn="91000", driver="570.1")
NEW = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", torch="2.14.0", cuda="12.8",
                  cudnn="91000", driver="570.1")
A, B = "gemm/M=64,K=1024,N=1024,dtype=float16", "gemm/M=64,K=1000,N=1024,dtype=float16"


def case(key: str, t: float) -> Measurement:
    return Measurement.from_samples(key, [t, t * 1.01, t * 0.99],
                                    Provenance("measured", "2026-11-25T00:00:00Z", "test"))


@pytest.fixture
def recorded(tmp_path):
    path = tmp_path / "h100.json"
    baselines.update(path, "h100", OLD, [case(A, 1.0), case(B, 2.0)],
                     peak={"gflops": 100.0, "gbps": 50.0})
    return path


def test_the_remeasured_case_replaces_the_stored_one(recorded):
    with pytest.warns(baselines.BaselineDriftWarning, match=r"torch: '2.13.0' vs '2.14.0'"):
        baselines.update(recorded, "h100", NEW, [case(A, 3.0)], peak={"gflops": 120.0})
    back = baselines.load(recorded)
    assert back.fingerprint == NEW
    assert back.cases[A].median_s == pytest.approx(3.0)
    assert back.cases[B].median_s == pytest.approx(2.0)  # not re-measured: kept
    assert back.peak == {"gflops": 120.0, "gbps": 50.0}


def test_a_second_rerecording_on_the_new_stack_warns_nothing(recorded):
    with pytest.warns(baselines.BaselineDriftWarning):
        baselines.update(recorded, "h100", NEW, [case(A, 3.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        baselines.update(recorded, "h100", NEW, [case(B, 4.0)])
    back = baselines.load(recorded)
    assert (back.cases[A].median_s, back.cases[B].median_s) == pytest.approx((3.0, 4.0))


@pytest.mark.parametrize("field", ["torch", "cuda", "cudnn", "driver"])
def test_each_stack_field_is_named_in_the_warning(recorded, field):
    changed = Fingerprint(**{**OLD.__dict__, field: "new"})
    with pytest.warns(baselines.BaselineDriftWarning) as seen:
        baselines.update(recorded, "h100", changed, [case(A, 1.0)])
    assert len(seen) == 1 and f"{field}: " in str(seen[0].message)
    assert getattr(baselines.load(recorded).fingerprint, field) == "new"


def test_another_device_is_refused_and_the_file_left_as_it_was(recorded):
    before = recorded.read_bytes()
    other = Fingerprint(**{**NEW.__dict__, "capability": "10.0"})
    with pytest.raises(BadInput, match="different device"):
        baselines.update(recorded, "h100", other, [case(A, 9.0)], peak={"gflops": 1.0})
    assert recorded.read_bytes() == before


def test_rerecording_without_new_cases_keeps_every_case(recorded):
    with pytest.warns(baselines.BaselineDriftWarning):
        baselines.update(recorded, "h100", NEW, [])
    back = baselines.load(recorded)
    assert set(back.cases) == {A, B} and back.fingerprint == NEW
