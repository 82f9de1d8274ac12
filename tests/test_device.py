"""One answer to "which device is this, and which baseline file belongs to it"
(:mod:`gac_check.bench.device`), used by the perf tests, the baseline recording and the model
bench alike.

There is no GPU on CI, so the tests below pretend one at the two places the device module asks
the machine (the driver's profile and torch's device name). A caller that answered the
question on its own again would ask the real machine, find no GPU, and turn these tests red.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gac_check.bench import device
from gac_check.errors import HardwareMissing
from gac_check.profiles import cpu_profile_key

UNLISTED = "NVIDIA L40S"  # a GPU without a profile of its own
UNLISTED_KEY = "gpu-nvidia-l40s"


def pretend_gpu(monkeypatch: pytest.MonkeyPatch, profile: str, name: str) -> None:
    monkeypatch.setattr(device, "cuda_profile", lambda: profile)
    monkeypatch.setattr(device, "cuda_name", lambda: name)


@pytest.mark.parametrize("name, key", [
    ("NVIDIA L40S", "gpu-nvidia-l40s"),
    ("NVIDIA GeForce RTX 4090", "gpu-nvidia-geforce-rtx-4090"),
    ("Tesla T4 (MIG 1g.5gb)", "gpu-tesla-t4-mig-1g-5gb"),
])
def test_an_unlisted_gpu_gets_a_key_of_its_name(name, key):
    assert device.gpu_key(name) == key


def test_the_present_device(monkeypatch):
    pretend_gpu(monkeypatch, "h100", "NVIDIA H100 80GB HBM3")
    assert device.present() == device.Device("cuda", "h100", "h100")
    assert device.present().name == "NVIDIA H100 80GB HBM3"
    pretend_gpu(monkeypatch, "gpu", UNLISTED)
    assert device.present() == device.Device("cuda", "gpu", UNLISTED_KEY)
    pretend_gpu(monkeypatch, None, "")
    assert device.present() == device.Device("cpu", "cpu", cpu_profile_key())


@pytest.mark.parametrize("present, requested, key", [
    ("gpu", "auto", UNLISTED_KEY), ("gpu", "gpu", UNLISTED_KEY), ("h100", "gpu", "h100"),
    ("h100", "h100", "h100"), ("h100", None, "h100"), (None, "auto", cpu_profile_key()),
    ("h200", "cpu", cpu_profile_key()),
])
def test_measuring_picks_the_device_asked_for(monkeypatch, present, requested, key):
    pretend_gpu(monkeypatch, present, UNLISTED)
    assert device.measuring(requested).key == key


@pytest.mark.parametrize("present, requested, has", [
    (None, "h100", "no CUDA device"), (None, "gpu", "no CUDA device"),
    ("gpu", "h100", f"a {UNLISTED_KEY}"), ("a100", "h100", "a A100"),
])
def test_measuring_refuses_an_absent_device_naming_what_is_here(monkeypatch, present,
                                                               requested, has):
    pretend_gpu(monkeypatch, present, UNLISTED)
    with pytest.raises(HardwareMissing, match=f"--gpu {requested} asks for .*; this machine "
                       f"has {has}$"):
        device.measuring(requested)


# ------------------------------------------------- the three callers give the same answer
def test_the_perf_tests_use_it(monkeypatch):
    from gac_check.plugin.perf import perf_target

    pretend_gpu(monkeypatch, "gpu", UNLISTED)
    assert perf_target("auto") == perf_target("gpu") == device.measuring("auto")
    assert perf_target("auto").key == UNLISTED_KEY


def test_the_baseline_recording_uses_it(monkeypatch, tmp_path, capsys):
    """``gac-check baseline record`` on the pretended GPU records into its key's file; the
    measuring itself (there is no GPU to time) is replaced by a note of where it would go."""
    from gac_check.bench import sweep
    from gac_check.cli.main import main

    pretend_gpu(monkeypatch, "gpu", UNLISTED)
    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(sweep, "record", lambda plan, kind, key, out, *a: calls.append(
        (plan.device, kind, key, out)) or [])
    assert main(["baseline", "record", "--smoke"]) == 0
    assert calls == [("cuda", "cuda", UNLISTED_KEY, tmp_path / f"{UNLISTED_KEY}.json")]
    assert f"recorded {tmp_path / UNLISTED_KEY}.json" in capsys.readouterr().out


def test_the_model_bench_uses_it(monkeypatch, tmp_path):
    """``gac-check MODEL --bench`` says which device its figures speak for from the same
    answer (an aligned model: no site to time, so nothing runs on the pretended GPU)."""
    from gac_check.analysis import check
    from gac_check.bench.model_bench import bench_findings
    from tests.helpers import tiny_llama

    tiny_llama(hidden_size=256, intermediate_size=512, vocab_size=128).save_pretrained(
        tmp_path / "m")
    result = check(tmp_path / "m", "gpu", "float16")
    assert result.findings == []
    pretend_gpu(monkeypatch, "gpu", UNLISTED)
    report = bench_findings(result)
    assert (report.device, report.hardware, report.profile) == ("cuda", UNLISTED, "gpu")


def test_a_contract_profile_reads_its_own_baseline_file():
    """``--gpu cpu``'s measured rules come from this CPU's file; a GPU profile's from its own."""
    assert device.contract_key("cpu") == cpu_profile_key()
    assert device.contract_key("h100") == "h100"


def test_no_other_module_names_devices_or_keys():
    """The question is answered in bench/device.py only: no other module builds a
    ``gpu-<name>`` key or reads torch's device name to pick a profile or a file."""
    root = Path(__file__).resolve().parents[1] / "gac_check"
    owners = {"bench/device.py", "profiles.py"}  # profiles: the driver's view, no file key
    # fingerprints and the run document record the name; they choose nothing by it
    recorders = {"bench/baselines.py", "report/run.py"}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        if rel not in owners:
            assert '"gpu-"' not in text, f"{rel} builds a baseline key of its own"
        if rel not in owners | recorders:
            assert "get_device_name" not in text, f"{rel} names the device on its own"
