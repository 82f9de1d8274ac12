"""``gac-check MODEL_DIR`` on good checkpoints, through the real CLI (:func:`tests.helpers.gac`).

Two real transformers Llamas saved with ``save_pretrained``: one whose only problem is the
FlashAttention head_dim bucket (a warning in bf16: head_dim 16), one with an MLP of 170 (an
error: not a multiple of 16 bytes). Exit codes, the JSON contract and the text summary follow
from those, and the input directory is never written.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import gac, llm_pruner, save_llm_pruner, snapshot, tiny_llama

JSON_KEYS = {"schema", "model_dir", "format", "hardware", "sites", "summary"}
SITE_KEYS = {"name", "role", "value", "aligned", "rules", "repair_to", "tensors"}
SUMMARY_KEYS = {"sites", "misaligned", "misaligned_fraction", "params",
                "repair_overhead_fraction"}


def llama(path: Path, intermediate: int, dtype: torch.dtype) -> Path:
    tiny_llama(dtype=dtype, vocab_size=128, intermediate_size=intermediate,
               num_key_value_heads=2).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    return {"warn": llama(root / "warn", 256, torch.bfloat16),
            "error": llama(root / "error", 170, torch.bfloat16)}


@pytest.mark.parametrize(("model", "fail_on", "code"), [
    ("warn", "error", 0), ("warn", "warning", 1), ("warn", "never", 0),
    ("error", "error", 1), ("error", "warning", 1), ("error", "never", 0),
])
def test_exit_codes_follow_fail_on(models, model: str, fail_on: str, code: int) -> None:
    before = snapshot(models[model])
    proc = gac(models[model], "--gpu", "h100", "--fail-on", fail_on)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert proc.stderr == ""
    assert snapshot(models[model]) == before


def test_json_has_the_contract_keys(models) -> None:
    proc = gac(models["error"], "--gpu", "a100", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) >= JSON_KEYS and out["schema"] == "gac-check/1"
    assert out["model_dir"] == str(models["error"].resolve()) and out["format"] == "dense"
    assert out["hardware"]["profile"] == "a100" and out["hardware"]["dtype"] == "bfloat16"
    assert set(out["summary"]) >= SUMMARY_KEYS
    for site in out["sites"]:
        assert set(site) >= SITE_KEYS
    bad = {s["name"]: s for s in out["sites"] if not s["aligned"]}
    inter = bad["model.layers.1.mlp:intermediate"]
    assert inter["value"] == 170 and inter["repair_to"] == 176
    assert "gemm-align-16B" in inter["rules"]
    assert "model.layers.1.mlp.down_proj.weight" in inter["tensors"]
    summary = out["summary"]
    assert summary["sites"] == len(out["sites"]) and summary["misaligned"] == len(bad)
    assert summary["misaligned_fraction"] == pytest.approx(len(bad) / len(out["sites"]))
    # padding 170 -> 176 in gate/up rows and down columns of both layers
    added = 2 * 6 * 3 * 64
    assert summary["repair_overhead_fraction"] == pytest.approx(added / summary["params"])


def test_text_names_profile_dtype_and_the_problem(models) -> None:
    proc = gac(models["error"], "--gpu", "h100")
    assert proc.returncode == 1
    text = proc.stdout
    assert "h100" in text and "bfloat16" in text
    assert "170" in text and "176" in text and "gemm-align-16B" in text


def test_auto_without_gpu_uses_the_generic_gpu_contract(models) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: auto means its own profile")
    out = json.loads(gac(models["warn"], "--format", "json").stdout)
    assert out["hardware"]["profile"] == "gpu"  # never the laptop's CPU contract


def test_cpu_profile_only_when_asked(models) -> None:
    proc = gac(models["error"], "--gpu", "cpu", "--format", "json")
    out = json.loads(proc.stdout)
    assert out["hardware"]["profile"] == "cpu"
    assert proc.returncode == 0  # the CPU has no GEMM staircase: 170 is fine there


def test_llm_pruner_odd_mlp_is_flagged(tmp_path: Path) -> None:
    """A pickled LLM-Pruner model: its 141-wide MLPs (like 8806) are errors on a GPU."""
    pytest.importorskip("gac_check.checkpoint.pickled.torchzip")
    model = llm_pruner(range(1, 3), 0.2, drop_heads=1)
    save_llm_pruner(model, tmp_path)
    proc = gac(tmp_path, "--gpu", "a100", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["format"] == "llm-pruner"
    bad = {s["name"]: s for s in out["sites"] if not s["aligned"]}
    for i in (1, 2):
        site = bad[f"model.layers.{i}.mlp:intermediate"]
        assert site["value"] == 141 and "gemm-align-16B" in site["rules"]
        assert site["notes"] == ["the config says intermediate_size=176, tensors have 141"]
    assert "model.layers.0.mlp:intermediate" not in bad
    text = gac(tmp_path, "--gpu", "a100").stdout
    assert "LLM-Pruner" in text and "intermediate_size=176, tensors have 141" in text


#: what a plain check of a safetensors directory must not import: torch costs more than the
#: whole check (bench_check.py); the other readers and the targets are others' costs (issue 32)
NOT_IMPORTED = ("torch", "transformers", "jinja2", "gac_check.checkpoint.pickled.model",
                "gac_check.checkpoint.gguf_header", "gac_check.targets.spec",
                "gac_check.targets.packs", "gac_check.checkpoint.quantized.reader",
                "gac_check.checkpoint.quantized.layout", "gac_check.report.run",
                "gac_check.report.json_report")


def test_plain_check_imports_no_torch(models) -> None:
    """Imports are most of a plain check's time: it loads only what a safetensors check needs."""
    probe = ("import runpy, sys; sys.argv = ['gac-check', sys.argv[1]]\n"
             "try:\n    runpy.run_module('gac_check.cli', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             f"print(sorted(m for m in {NOT_IMPORTED!r} if m in sys.modules),"
             " file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe, str(models["warn"])],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr
    assert "checked against: gpu" in proc.stdout  # auto with no GPU: the generic contract


def test_version_names_the_installed_distribution() -> None:
    from importlib.metadata import version

    run = gac("--version")
    assert (run.returncode, run.stdout.strip()) == (0, f"gac-check {version('gac-check')}")


def test_help_explains_every_option_and_names_report_merge() -> None:
    """--help is the first manual a user reads: no option without its text."""
    import argparse

    from gac_check.cli.main import build_parser

    parser = build_parser()
    bare = [a.option_strings or [a.dest] for a in parser._actions
            if not a.help or a.help == argparse.SUPPRESS]
    assert not bare
    assert "report merge" in parser.format_help()
