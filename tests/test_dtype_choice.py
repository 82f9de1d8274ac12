"""config.json's dtype against the weights': both pruners copy the base config (float32) beside
fp16 weights. The check says so and uses the stricter dtype, so repairs hold where the model
runs (SliceGPT's 179 needs 184 in fp16, not fp32's 180)."""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from tests import helpers
from tests.compressors import build_llm_pruner, build_slicegpt

NOTE = ("the config says float32, the weights are float16: checked against float16, the "
        "stricter of the two")


#: the CLI, with the time a repair (writing a whole model) may take
gac = partial(helpers.gac, timeout=300)


@pytest.fixture(scope="module")
def sliced(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dtype")
    return build_slicegpt(root / "sliced", [179, 179, 179, 179], hidden=256).path


def streams(doc: dict) -> set[int]:
    return {s["value"] for s in doc["sites"] if s["role"] == "hidden"} - {256}


def test_check_says_which_dtype_and_why(sliced):
    text = gac(sliced, "--gpu", "gpu")
    assert NOTE in text.stdout and "dtype float16 (from stricter of the config and weights)" \
        in text.stdout
    doc = json.loads(gac(sliced, "--gpu", "gpu", "--format", "json").stdout)
    hw = doc["hardware"]
    assert (hw["dtype"], hw["dtype_source"]) == ("float16", "stricter of the config and weights")
    assert hw["dtype_note"].startswith(NOTE)
    assert {s["repair_to"] for s in doc["sites"] if s["value"] == 179} == {184}


@pytest.mark.parametrize(("flag", "target"), [((), 184), (("--dtype", "float32"), 180)])
def test_repair_pads_for_the_dtype_checked(sliced, tmp_path, flag, target):
    out = tmp_path / "fixed"
    run = gac(sliced, "--repair", out, "--gpu", "gpu", *flag)
    assert run.returncode == 0, run.stderr
    conf = json.loads((out / "tiny-llama_0.3.json").read_text())
    assert conf["attention_input_dimensions"]["0"] == target
    provenance = json.loads((out / "gac-repair.json").read_text())
    assert any(NOTE[:40] in n for n in provenance["notes"])  # either way, said once
    assert ("--dtype float32" in run.stdout) == bool(flag)


def test_llm_pruner_516_is_an_error_in_the_weights_dtype(tmp_path):
    """516 is a multiple of 4 (fine in fp32), not of 8: the fp16 weights need 520."""
    built = build_llm_pruner(tmp_path / "pruned", gqa=True, mlp_keep=516)
    doc = json.loads(gac(built.path, "--gpu", "gpu", "--format", "json").stdout)
    inter = [s for s in doc["sites"] if s["role"] == "intermediate"]
    assert {(s["value"], s["severity"], s["repair_to"]) for s in inter} == {(516, "error", 520)}
    as_config = json.loads(gac(built.path, "--gpu", "gpu", "--dtype", "float32", "--format",
                               "json").stdout)
    assert {s["severity"] for s in as_config["sites"] if s["role"] == "intermediate"} != {"error"}
