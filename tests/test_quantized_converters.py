"""What a quantized checkpoint runs as, and which tools read it (issue 39): llama.cpp targets
are refused for checkpoints llama.cpp's converter does not read (``conversion/base.py``
``ModelBase.dequant_model`` at the pinned llama.cpp 0c1e57098: bitsandbytes and AWQ raise
"Quant method is not yet supported"; compressed-tensors ``pack-quantized`` asserts
``strategy == "group"``), judged for those it does; bitsandbytes 8-bit is judged as LLM.int8()
runs (bitsandbytes 0.45.5 ``MatMul8bitLt.forward``: an int8 GEMM on per-token int8
activations), not as a float16 weight-only scheme. Real checkpoints, real CLI.
"""
from __future__ import annotations

import json

import pytest

from tests import helpers
from tests import quantized_models as qm

WRITERS = {
    "bnb_nf4": lambda r: qm.bnb_nf4(r, 688),
    "bnb_int8": lambda r: qm.bnb_int8(r, 688),
    "awq": lambda r: qm.awq_gemm(r, 640),
    "ct_w4a16_channel": lambda r: qm.compressed_tensors_w4a16_channel(r, 688),
    "ct_w4a16_group": lambda r: qm.compressed_tensors_w4a16(r, 688),
    "gptq": lambda r: qm.gptq(r, 688),
    "block_fp8": lambda r: qm.block_fp8(r, 688),
}


@pytest.mark.parametrize(("name", "says"), [
    ("bnb_nf4", "does not read bitsandbytes checkpoints"),
    ("bnb_int8", "does not read bitsandbytes checkpoints"),
    ("awq", "does not read awq checkpoints"),
    ("ct_w4a16_channel", "pack-quantized only with strategy group, not channel"),
])
def test_llama_cpp_is_refused_for_what_its_converter_does_not_read(tmp_path, name, says):
    root = WRITERS[name](tmp_path / name)
    run = helpers.gac(root, "--gpu", "h100", "--target", "llama.cpp,quant=Q4_K_M")
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], run.stderr
    assert "ModelBase.dequant_model @ llama.cpp 0c1e57098" in lines[0]


@pytest.mark.parametrize("name", ["ct_w4a16_group", "gptq", "block_fp8"])
def test_llama_cpp_judges_what_its_converter_reads(tmp_path, name):
    root = WRITERS[name](tmp_path / name)
    run = helpers.gac(root, "--gpu", "h100", "--target", "llama.cpp,quant=Q4_K_M",
                      "--format", "json")
    assert run.returncode in (0, 1), run.stderr
    assert json.loads(run.stdout)["summary"]["targets"]["llama.cpp,quant=Q4_K_M"]


def test_bitsandbytes_8bit_is_judged_as_llm_int8_runs(tmp_path):
    root = WRITERS["bnb_int8"](tmp_path / "int8")
    run = helpers.gac(root, "--gpu", "h100", "--format", "json")
    assert run.returncode in (0, 1), run.stderr
    doc = json.loads(run.stdout)
    q = doc["quantization"]
    assert (q["scheme"], q["activations"], q["activations_dynamic"]) == ("W8A8", "int8", True)
    assert doc["hardware"]["dtype"] == "int8"
    text = helpers.gac(root, "--gpu", "h100").stdout
    assert "W8A16" not in text and "LLM.int8()" in text
