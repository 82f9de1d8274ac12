"""Every format gac-check reads, checked in memory and from the directory its tool saves, judges
the same (issue 30: "in memory and on disk judge the same dtype with the same reasons").

Each case builds the model the way its compressor's (or its family's) own code leaves it in
memory, saves it the way that tool saves it, and checks both on an H100 with ``--target vllm``.
The two ``--format json`` documents must be equal but for where the model lives (``model_dir``,
``container``): the format, the dtype judged and why (source and note), every site (name, role,
value, notes, tensors, exact-repair refusal), every finding and its rules, and every target
verdict with its reason. The builders are the ones the per-format tests use (tests/compressors.py,
tests/pruners.py, tests/per_layer_models.py, tests/decilm_models.py, tests/quantized_models.py
and the MoE / MLA test modules); nothing here rebuilds a layout.

What the model in memory is, per case:

- a transformers module (dense families, ASVD, PaLU, Torch-Pruning, MoE, MLA): the module;
- a whole pickled model (SVD-LLM, LLM-Pruner): the module ``torch.load(...)['model']`` returns,
  the object the compressor pickled (its own config inside, no config.json for SVD-LLM), with
  the config.json LLM-Pruner copies beside it as ``config=``; every engine refuses the pickle
  as a file, so the in-memory target verdicts are held to its ``save_pretrained`` copy's;
- a compressor that holds a state dict and a config (LLM-Pruner ``--channel_wise`` through a
  ``save_pretrained``-style copy, FLAP, transformers' ``per_layer_config``, quantizers): that
  state dict with ``config=``, as ``gac_check.check(state, config=...)`` takes it;
- DeciLM / Nemotron-NAS: transformers has no DeciLM class (it is ``trust_remote_code``), so the
  module is the one vLLM's DeciLM class builds from config.json (tests/decilm_models.py), which
  carries no ``.config``: it is passed as ``config=``;
- SliceGPT: no model in memory can be judged alone, because its slicing config is a file beside
  the weights, not part of the module; the check refuses it with one line (asserted below).
"""
from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import gac_check
from gac_check.errors import BadInput
from gac_check.report.json_report import to_json
from gac_check.testing.models import tiny_llama, tiny_mistral, tiny_qwen2
from tests import compressors as C
from tests import decilm_models, per_layer_models, pruners, quantized_models, slicegpt
from tests.helpers import tiny_bert
from tests.test_config_lies import _channel_pruned
from tests.test_decilm import MIXED
from tests.test_deepseek_moe import build as deepseek_moe
from tests.test_gpt_oss import _gpt_oss
from tests.test_mla import TINY as MLA_TINY
from tests.test_moe import _mixtral, _qwen2_moe

TARGET = "vllm"


@dataclass
class Pair:
    """A model in memory (``config``: what ``gac_check.check`` is given beside it, if anything)
    and the directory its tool saved it to."""

    model: object
    saved: Path
    config: object = None
    #: for a pickled whole model, which every engine refuses as a file (``pickled_model``:
    #: "save the model with save_pretrained (safetensors) and judge that"): that copy of the
    #: module, against which the in-memory target verdicts are held
    served: Path | None = None


Build = Callable[[Path], Pair]


def _pretrained(make: Callable[[], torch.nn.Module]) -> Build:
    """A transformers model and its ``save_pretrained`` directory."""
    def build(root: Path) -> Pair:
        model = make()
        model.save_pretrained(root)
        return Pair(model, root)
    return build


def _built(make: Callable[[Path], C.Built], module: Callable[[C.Built], object]) -> Build:
    def build(root: Path) -> Pair:
        built = make(root)
        return Pair(module(built), built.path)
    return build


def _pickled(make: Callable[[Path], C.Built]) -> Build:
    """The whole model as the compressor pickled it (dtype as saved: the test loaders upcast),
    with the config.json beside the pickle where the compressor copies one (the config a
    user's ``gac_check.check(model, config=...)`` passes: the module's own is another)."""
    def build(root: Path) -> Pair:
        built = make(root)
        pickle = next(p for p in built.path.iterdir() if p.suffix in (".pt", ".bin"))
        model = C.load_pickled(pickle)[0]
        config_json = built.path / "config.json"
        config = json.loads(config_json.read_text()) if config_json.exists() else None
        # a copy is saved: save_pretrained rewrites the config it saves (its dtype to the
        # weights', its architectures), and the module is judged as the compressor left it
        copy.deepcopy(model).save_pretrained(root.parent / "served")
        return Pair(model, built.path, config, root.parent / "served")
    return build


def _channel_wise(root: Path) -> Pair:
    state, cfg = _channel_pruned()
    root.mkdir()
    save_file(state, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(cfg))
    return Pair(state, root, cfg)


def _flap(root: Path) -> Pair:
    """FLAP holds its model in float16 (get_llm) and saves that state dict."""
    state, config = pruners.flap_state_dict()
    pruners.build_flap(root)
    return Pair({k: v.to(torch.float16) for k, v in state.items()}, root, config)


def _decilm(root: Path) -> Pair:
    decilm_models.write_decilm(root, MIXED)
    model = decilm_models.decilm_model(root).to(torch.bfloat16)  # the dtype it was saved in
    return Pair(model, root, json.loads((root / "config.json").read_text()))


def _per_layer(root: Path) -> Pair:
    per_layer_models.write_per_layer(root)
    config = json.loads((root / "config.json").read_text())
    return Pair(per_layer_models.per_layer_state(0, config), root, config)


def _quantized(write: Callable[[Path, int], Path], intermediate: int = 680) -> Build:
    """A quantizer's state dict as it holds it before its save (the packed tensors and the
    config with its quantization_config), and the directory it saved."""
    def build(root: Path) -> Pair:
        write(root, intermediate)
        config = json.loads((root / "config.json").read_text())
        return Pair(load_file(str(root / "model.safetensors")), root, config)
    return build


def _stock(family: str) -> Callable[[], torch.nn.Module]:
    cls = {"opt": transformers.OPTForCausalLM, "phi": transformers.PhiForCausalLM}[family]
    return lambda: cls(slicegpt.config_of(family, 64))


MISALIGNED = dict(intermediate_size=170, num_key_value_heads=2)

CASES: dict[str, Build] = {
    "llama": _pretrained(lambda: tiny_llama(0, **MISALIGNED)),
    "llama-bf16-tied": _pretrained(lambda: tiny_llama(0, dtype=torch.bfloat16,
                                                      tie_word_embeddings=True, **MISALIGNED)),
    "mistral": _pretrained(lambda: tiny_mistral(0, intermediate_size=170)),
    "qwen2": _pretrained(lambda: tiny_qwen2(0, intermediate_size=170)),
    "opt": _pretrained(_stock("opt")),
    "phi": _pretrained(_stock("phi")),
    "bert": _pretrained(lambda: tiny_bert(0, masked_lm=True, intermediate_size=150)),
    "asvd": _built(C.build_asvd, lambda b: b.model),
    "palu": _built(C.build_palu, lambda b: b.model),
    "svd-llm": _pickled(C.build_svdllm),
    "svd-llm-fp16-config": _pickled(lambda r: C.build_svdllm(r, config_dtype=torch.float16)),
    "llm-pruner-hf_prune": _pickled(lambda r: C.build_llm_pruner(r, gqa=False)),
    "llm-pruner-llama3": _pickled(lambda r: C.build_llm_pruner(r, gqa=True)),
    "llm-pruner-no-config-json": _pickled(
        lambda r: C.build_llm_pruner(r, gqa=True, config_json=False)),
    "llm-pruner-channel-wise": _channel_wise,
    "torch-pruning": _built(pruners.build_torch_pruning, lambda b: b.model),
    "flap": _flap,
    "decilm": _decilm,
    "per-layer-config": _per_layer,
    "mixtral": _pretrained(_mixtral),
    "qwen2-moe": _pretrained(_qwen2_moe),
    "deepseek-v2-moe": _pretrained(lambda: deepseek_moe("v2")),
    "deepseek-v3-moe": _pretrained(lambda: deepseek_moe("v3")),
    "gpt-oss": _pretrained(_gpt_oss),
    "mla": _pretrained(lambda: transformers.DeepseekV2ForCausalLM(
        transformers.DeepseekV2Config(**MLA_TINY))),
    "gptq": _quantized(quantized_models.gptq),
    "awq": _quantized(quantized_models.awq_gemm, 640),
    "fp8-block": _quantized(quantized_models.block_fp8),
    "fp8-compressed-tensors": _quantized(quantized_models.compressed_tensors_fp8),
}


def judged(result: gac_check.CheckResult) -> dict:
    """Everything a check says but where the model lives."""
    doc = to_json(result)
    del doc["model_dir"], doc["container"], doc["config_source"]
    return doc


def assert_judged_alike(in_memory: gac_check.CheckResult, on_disk: gac_check.CheckResult
                        ) -> None:
    assert in_memory.checkpoint.container == "in-memory"
    assert on_disk.sites and in_memory.format.name == on_disk.format.name
    assert in_memory.dtype_choice == on_disk.dtype_choice
    assert [(s.name, s.role, s.value, s.notes) for s in in_memory.sites] == [
        (s.name, s.role, s.value, s.notes) for s in on_disk.sites]
    assert in_memory.findings == on_disk.findings
    assert judged(in_memory) == judged(on_disk)




@pytest.mark.parametrize("case", sorted(CASES))
def test_the_model_in_memory_is_judged_as_its_saved_directory(case: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    pair = CASES[case](tmp_path / "saved")
    in_memory = gac_check.check(pair.model, gpu="h100", target=TARGET, config=pair.config)
    if pair.served is None:
        assert_judged_alike(in_memory, gac_check.check(pair.saved, gpu="h100", target=TARGET))
        return
    assert_judged_alike(gac_check.check(pair.model, gpu="h100", config=pair.config),
                        gac_check.check(pair.saved, gpu="h100"))
    served = gac_check.check(pair.served, gpu="h100", target=TARGET)
    assert verdicts(in_memory) == verdicts(served)


def verdicts(result: gac_check.CheckResult) -> dict:
    """Each site's verdict, kernel and reason on each target, and the model's."""
    doc = judged(result)
    return {"model": doc["summary"]["targets"], **{
        s["name"]: [(t["verdict"], t.get("kernel"), t["why"]) for t in s["targets"]]
        for s in doc["sites"]}}


def test_a_slicegpt_model_in_memory_is_refused_for_its_slicing_config(tmp_path: Path) -> None:
    """SliceGPT's slicing config is a file beside the weights; the module cannot say it, so the
    check refuses it (one line) while the saved directory is checked."""
    built = C.build_slicegpt(tmp_path / "sliced", [179, 179, 179, 179], hidden=256)
    assert gac_check.check(built.path, gpu="h100", target=TARGET).format.name == "slicegpt"
    with pytest.raises(BadInput, match=r"SliceGPT.*save it") as refused:
        gac_check.check(built.model, gpu="h100", target=TARGET, config={
            **built.model.config.to_dict()})
    assert "\n" not in str(refused.value)
