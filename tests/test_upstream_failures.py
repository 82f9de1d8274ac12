"""What a team sees when its own pipeline failed upstream (issue 41): the compression step
died, so ``build/model`` is missing, empty, holds only config.json, a truncated shard or a
half-written config. The model suite, the plugin and the CLI each say so in one line, never a
traceback through gac-check's readers."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from gac_check.testing.equivalence import check_checkpoint
from gac_check.testing.models import tiny_llama
from tests.helpers import gac_process, pytest_here


@pytest.fixture(scope="module", autouse=True)
def _imported(tmp_path_factory) -> None:
    """Import what the suite imports out here first: an in-process pytest run drops the
    modules first imported inside it, and torch cannot import some of them twice."""
    tmp = tmp_path_factory.mktemp("warm")
    tiny_llama(intermediate_size=172).save_pretrained(tmp / "model")
    check_checkpoint(tmp / "model", tmp / "out", "h100", "float16")


def _write_half(root, kind: str):
    """``build/model`` as a failed step leaves it (``kind``), under ``root``."""
    model = root / "build" / "model"
    if kind == "missing":
        model.parent.mkdir(parents=True, exist_ok=True)
        return model
    model.mkdir(parents=True)
    if kind == "empty":
        return model
    whole = root / "whole"
    tiny_llama(intermediate_size=172).save_pretrained(whole)
    shutil.copy(whole / "config.json", model / "config.json")
    if kind == "truncated shard":
        (model / "model.safetensors").write_bytes((whole / "model.safetensors").read_bytes()[:3000])
    if kind == "half-written config":
        shutil.copy(whole / "model.safetensors", model / "model.safetensors")
        (model / "config.json").write_text(json.dumps(json.loads(
            (whole / "config.json").read_text()))[:40])
    return model


KINDS = {"missing": "no such directory here (did the step that writes it fail?)",
         "empty": "holds no checkpoint",
         "config only": "holds no checkpoint", "truncated shard": "is truncated",
         "half-written config": "config.json: is not valid JSON"}
SUITE = ("--pyargs", "gac_check.testing.model_suite", "--gpu", "h100", "--gac-dtype",
         "float16")
TEST_FILE = """
def test_structure(gac_models, gac_check_model):
    assert not [f for f in gac_check_model(gac_models[0]).findings if f.severity == "error"]
"""


def _no_traceback(lines: list[str]) -> None:
    """pytest's long traceback names each frame as ``file.py:LINE: Exception``."""
    frames = [line for line in lines if re.search(r"\.py:\d+: ", line)]
    assert not frames, frames


@pytest.mark.parametrize("kind", KINDS)
def test_the_model_suite_says_it_in_one_line(pytester, kind):
    model = _write_half(pytester.path, kind)
    result = pytest_here(pytester, *SUITE, "--gac-model", "build/model")
    result.assert_outcomes(failed=1)
    said = [line for line in result.stdout.lines if line.startswith("build/model")
            or line.startswith(str(model))]
    assert len(said) == 1 and (KINDS[kind] in said[0] or "No such file" in said[0]), \
        result.stdout.lines
    _no_traceback(result.stdout.lines)


@pytest.mark.parametrize("kind", ["missing", "config only", "truncated shard"])
def test_a_plugin_test_says_it_in_one_line(pytester, kind):
    _write_half(pytester.path, kind)
    pytester.makepyfile(test_gate=TEST_FILE)
    result = pytest_here(pytester, "--gpu", "h100", "--model", "build/model")
    result.assert_outcomes(failed=1)
    _no_traceback(result.stdout.lines)
    result.stdout.fnmatch_lines([f"*build/model*{KINDS[kind]}*"])


@pytest.mark.parametrize("kind,job", [(kind, ()) for kind in KINDS] + [
    ("missing", ("--repair", "out")), ("truncated shard", ("--repair", "out")),
    ("half-written config", ("--target", "vllm"))], ids=str)
def test_the_cli_says_it_in_one_line(tmp_path, kind, job):
    _write_half(tmp_path, kind)
    done = gac_process("build/model", "--gpu", "h100", *job, cwd=tmp_path,
                       env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and KINDS[kind] in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
