"""``gac_check.check`` of a model in memory finds what the check of its saved directory finds.

A compressor's own test suite checks the model it just built, without saving it: the index is
built from the module's tensors and config (:mod:`gac_check.api.memory`). Each pair below is a
real transformers model (or a reference-compressed low-rank one) checked in memory and after
``save_pretrained``; only where the model lives may differ.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import gac_check
from gac_check.errors import BadInput
from gac_check.models.compress import compress_dir, compress_state
from gac_check.models.lowrank import swap_low_rank
from gac_check.report.json_report import to_json
from tests import compressors as C
from tests.helpers import tiny_bert, tiny_llama

#: an MLP of 170 and 2 of 4 kv heads: errors on a GPU contract, so there is something to find
MISALIGNED = dict(intermediate_size=170, num_key_value_heads=2)


def same_check(in_memory: gac_check.CheckResult, on_disk: gac_check.CheckResult) -> None:
    assert in_memory.findings == on_disk.findings
    got, want = to_json(in_memory), to_json(on_disk)
    assert got["container"] == "in-memory" and got["model_dir"].startswith("<in-memory ")
    for doc in (got, want):
        del doc["container"], doc["model_dir"], doc["config_source"]
    assert got == want


@pytest.mark.parametrize("build", [
    lambda: tiny_llama(0, **MISALIGNED),
    lambda: tiny_llama(0, dtype=torch.bfloat16, tie_word_embeddings=True, **MISALIGNED),
    lambda: tiny_bert(0, masked_lm=True, intermediate_size=150),
], ids=["llama", "llama-bf16-tied", "bert-mlm-tied"])
def test_a_module_checks_as_its_saved_directory(build, tmp_path):
    model = build()
    model.save_pretrained(tmp_path)
    on_disk = gac_check.check(tmp_path, gpu="h100")
    assert on_disk.findings  # something to find, so equality means something
    same_check(gac_check.check(model, gpu="h100"), on_disk)


def low_rank(dense, ratio: float):
    """A real low-rank module: the dense model's linears swapped for their truncated SVDs, as
    ASVD's own modeling code builds it (truncation_ranks in its config)."""
    state, ranks = compress_state(dense, ratio)
    swap_low_rank(dense, ranks)
    dense.load_state_dict(state, strict=False)
    dense.config.truncation_ranks = ranks
    return dense, ranks


def test_a_compressed_module_checks_as_its_saved_directory(tmp_path):
    model, ranks = low_rank(tiny_llama(1, **MISALIGNED), 0.7)
    assert any(r % 8 for r in ranks.values())
    model.save_pretrained(tmp_path / "saved")
    on_disk = gac_check.check(tmp_path / "saved", gpu="a100", dtype="float16",
                              target="vllm,tp=2")
    assert on_disk.format.name == "asvd" and on_disk.findings
    same_check(gac_check.check(model, gpu="a100", dtype="float16", target="vllm,tp=2"),
               on_disk)


def test_a_state_dict_with_its_config_checks_as_the_compressor_wrote_it(tmp_path):
    """The reference compressor's directory (its config.json is the full dict, with
    truncation_ranks) against its state dict and ranks in memory."""
    dense = tiny_llama(2, **MISALIGNED)
    dense.save_pretrained(tmp_path / "dense")
    compress_dir(tmp_path / "dense", tmp_path / "c", 0.6)
    state, ranks = compress_state(dense, 0.6)
    config = {**dense.config.to_dict(), "truncation_ranks": ranks}
    same_check(gac_check.check(state, gpu="gpu", config=config),
               gac_check.check(tmp_path / "c", gpu="gpu"))


def test_what_memory_cannot_say_is_refused_with_one_line():
    model = tiny_llama(0)
    with pytest.raises(BadInput, match="needs its config"):
        gac_check.check(model.state_dict())
    with pytest.raises(BadInput, match="must be a dict or a transformers PretrainedConfig"):
        gac_check.check(model.state_dict(), config=42)
    with pytest.raises(BadInput, match="cannot check a int"):
        gac_check.check(7)
    sliced = {**model.state_dict(), "model.layers.0.attn_shortcut_Q": torch.eye(64)}
    with pytest.raises(BadInput, match=r"SliceGPT.*save it") as refused:
        gac_check.check(sliced, config=model.config)
    assert "\n" not in str(refused.value)


def test_the_package_loads_the_api_on_first_use_and_a_directory_check_imports_no_torch(
        tmp_path):
    tiny_llama(0, **MISALIGNED).save_pretrained(tmp_path)
    code = ("import sys, gac_check\n"
            "assert 'gac_check.api' not in sys.modules\n"
            f"result = gac_check.check({str(tmp_path)!r}, gpu='h100')\n"
            "assert result.findings and 'torch' not in sys.modules, sorted(sys.modules)\n"
            "assert gac_check.repair.__module__ == 'gac_check.api.flows'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr


def test_a_fix_needs_a_directory(tmp_path):
    with pytest.raises(BadInput, match="--repair rewrites a model directory, not a LlamaFor"):
        gac_check.repair(tiny_llama(0), tmp_path / "out")
    with pytest.raises(BadInput, match="--realign needs the weights, which a remote check"):
        gac_check.realign("hf://org/model", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _as_saved(built: C.Built, name: str = "pytorch_model.bin"):
    """The pickled module as ``torch.load`` returns it (the test loader upcasts to compare
    logits in fp32, which no user's model does)."""
    return C.load_pickled(built.path / name)[0]


@pytest.mark.parametrize(("build", "module"), [
    (lambda root: C.build_svdllm(root, config_dtype=torch.float16), lambda b: b.model),
    (lambda root: C.build_llm_pruner(root, gqa=True), _as_saved),
    (lambda root: C.build_asvd(root), lambda b: b.model),
    (lambda root: C.build_palu(root), lambda b: b.model),
], ids=["svd-llm-fp16-config", "llm-pruner", "asvd", "palu"])
def test_every_compressors_module_judges_what_its_saved_file_does(build, module, tmp_path):
    """The module its own loader returns and the file it saved: the same dtype (a whole pickled
    model's own config counts where there is no config.json) and the same findings (issue 30:
    SVD-LLM's file was judged in float32, its module in float16)."""
    built = build(tmp_path / "model")
    on_disk = gac_check.check(built.path, gpu="h100")
    in_memory = gac_check.check(module(built), gpu="h100")
    assert on_disk.findings
    assert in_memory.dtype_choice.dtype == on_disk.dtype_choice.dtype
    assert [(f.site.name, f.site.value, f.severity, f.repair_to) for f in in_memory.findings] \
        == [(f.site.name, f.site.value, f.severity, f.repair_to) for f in on_disk.findings]
