"""The bench engine on the CPU: timing, workloads, the CLI's --bench, and the perf plugin's
session-start check. GPU paths are exercised by the perf suites on a GPU machine.

Checked by hand that these can fail: a timer that ignores ``inner`` (per-sample call batching)
fails test_timing_sees_a_real_difference; returning x @ W instead of x @ W.T fails the layout
test (shapes differ); measuring with --gpu h100 on this CPU must exit 4, not pass.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gac_check.bench import timing, workloads
from gac_check.bench.cases import case_key, parse_case_key
from gac_check.bench.device import measuring
from gac_check.bench.kernels import run
from gac_check.bench.peak import peak
from gac_check.errors import BadInput, HardwareMissing
from tests.helpers import gac, tiny_llama

ROOT = Path(__file__).resolve().parent.parent
FAST = timing.TimingConfig(samples=3, trials=2, warmup_s=0.0, min_warmup_calls=1)


def test_case_keys_roundtrip_and_refuse_ambiguity():
    key = workloads.sdpa(4, 2048, 32, 107, "float16", "flash").key
    assert key == "sdpa/B=4,S=2048,H=32,D=107,dtype=float16,backend=flash"
    kind, params = parse_case_key(key)
    assert kind == "sdpa" and params["D"] == "107"
    with pytest.raises(ValueError):
        case_key("gemm", {"x": "a,b"})
    with pytest.raises(BadInput):
        parse_case_key("no-slash")


def _spin(seconds: float):
    def fn():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    return fn


def test_timing_sees_a_real_difference():
    fast, slow = (timing.measure(_spin(s), "cpu", FAST) for s in (0.0004, 0.0012))
    assert len(fast.samples) == 6 and len(fast.trial_medians) == 2
    assert 2.0 < min(slow.samples) / min(fast.samples) < 4.0


def test_gemm_is_nn_linear_layout():
    work = workloads.gemm(3, 5, 7, "float32")
    assert work.flops == 2 * 3 * 5 * 7
    out = work.prepare("cpu").fn()
    assert out.shape == (3, 7)  # x [M, K] @ W[N, K].T


def test_inputs_are_random_not_zeros():
    x = workloads.randn((64, 64), "float32", "cpu")
    assert x.abs().min() > 0 and x.std() > 0.5


def test_lowrank_and_mlp_compute_the_right_thing():
    p = workloads.lowrank(4, 16, 3, 8, "float32").prepare("cpu")
    assert p.fn().shape == (4, 8)
    assert workloads.mlp(4, 16, 24, "float32").prepare("cpu").fn().shape == (4, 16)
    assert workloads.mlp(4, 16, 24, "float32", gated=False).prepare("cpu").fn().shape == (4, 16)


def test_sdpa_reports_the_dispatchers_backend_and_refuses_cuda_only_ones():
    prepared = workloads.sdpa(1, 32, 2, 24, "float32").prepare("cpu")
    assert prepared.backend in ("flash", "math")
    q = workloads.randn((1, 2, 32, 24), "float32", "cpu")
    assert torch.allclose(prepared.fn(), F.scaled_dot_product_attention(q, q, q), atol=1e-5)
    with pytest.raises(workloads.Unsupported, match="CUDA-only"):
        workloads.sdpa(1, 32, 2, 24, "float32", "efficient").prepare("cpu")
    with pytest.raises(workloads.Unsupported):
        workloads.sdpa(1, 32, 2, 24, "float32", "flash_attn").prepare("cpu")


def test_decoder_layer_and_model_prefill_decode_run():
    cfg = workloads.llama_config(64, 4, 2, 16, 128, layers=2, vocab=128)
    assert workloads.decoder_layer(cfg, 1, 8, "float32").prepare("cpu").fn()[0].shape[-1] == 64
    pre = workloads.model_forward(cfg, 1, 8, "float32", "prefill")
    assert pre.prepare("cpu").fn().logits.shape == (1, 8, 128)
    dec = workloads.model_forward(cfg, 1, 8, "float32", "decode").prepare("cpu")
    for _ in range(3):  # the cache is cropped back: every call sees 8 cached tokens
        out = dec.fn()
    assert workloads.kv_cache(out).get_seq_length() == 8


def test_run_records_tflops_and_peak_fraction():
    m = run(workloads.gemm(64, 64, 64, "float32"), "cpu", FAST, command="test")
    assert m.tflops == pytest.approx(m.flops / m.median_s / 1e12)
    assert m.peak_fraction == pytest.approx(m.tflops / peak("cpu").tflops)
    assert m.provenance.kind == "measured" and m.provenance.command == "test"
    assert peak("cpu").copy_gbs > 0


def test_measuring_refuses_absent_hardware():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(HardwareMissing, match="asks for an H100; this machine has no CUDA"):
        measuring("h100")


def _pytest(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           *args], cwd=ROOT, capture_output=True, text=True, env=env,
                          check=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without an H100")
@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_perf_tests_skip_with_the_reason_on_an_absent_gpu(workers):
    """`pytest suites --gpu h100` on a machine without one: the perf tests skip, naming what
    is missing and what is present; they never pass, and the run is green (exit 0)."""
    res = _pytest("suites/test_gemm_perf.py", "--gpu", "h100", "-rs", *workers)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "asks for an H100; this machine has no CUDA device" in res.stdout
    assert " passed" not in res.stdout and "Traceback" not in res.stdout + res.stderr


def test_cli_bench_times_the_models_sites(tmp_path):
    from gac_check.models.compress import compress_dir

    tiny_llama(intermediate_size=150, num_hidden_layers=1, num_key_value_heads=2,
               vocab_size=128).save_pretrained(tmp_path / "dense")
    compress_dir(tmp_path / "dense", tmp_path / "c", 0.7)
    res = gac(tmp_path / "c", "--gpu", "a100", "--bench", "--format", "json", "--fail-on",
              "never", cwd=ROOT, timeout=None)  # timing takes what it takes
    assert res.returncode == 0, res.stderr
    bench = json.loads(res.stdout)["bench"]
    timed = [s for s in bench["sites"] if s["original_s"]]
    assert timed and all(s["repaired"] > s["value"] and s["repaired_s"] > 0 for s in timed)
    assert bench["device"] == "cpu" and bench["dtype"] == "float32"
