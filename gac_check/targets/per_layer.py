"""transformers' per-layer configs (``per_layer_config``) on the engines: which classes read them.

transformers 5.x lets config.json carry ``per_layer_config``, a sparse map from layer index to
overrides (``{"1": {"intermediate_size": 107}, "2": {"skip": ["mlp"]}}``); the config then
refuses a global read of any attribute a layer overrides
(``AmbiguousGlobalPerLayerAttributeError``, transformers v5.24.0
src/transformers/integrations/heterogeneity/configuration_utils.py,
``HeterogeneousConfigMixin.__getattribute__``). Only the model classes written for it read
``config.per_layer_config[i]``; Llama's, Qwen2's and Mistral's build every layer from the
global values, in transformers (``LlamaForCausalLM(config)`` raises that error, checked on
5.24.0) as in the engines:

- vLLM v0.33.0 reads ``per_layer_config`` in its Gemma4, Gemma4-MTP, Gemma4-DSpark,
  EmbeddingGemma2, DomynEdge and Step3p5 classes and in
  ``ModelArchConfigConvertorBase.get_per_layer_hf_configs``
  (vllm/transformers_utils/model_arch_config_convertor.py), whose per-layer geometry the
  Transformers modeling backend (``--model-impl transformers``,
  vllm/model_executor/models/transformers/base.py) sizes each layer's attention from; that
  backend builds transformers' own class, which for Llama cannot be built from such a config.
  llama.py, qwen2.py and mistral.py do not read it: their decoder layers read
  ``config.intermediate_size``;
- SGLang v0.5.23 reads it only to flatten Gemma4's two attention shapes
  (python/sglang/srt/utils/hf_transformers/config.py, ``_gemma4_attention_shapes``, which
  refuses ``skip`` and any other attribute), not in its Llama or Qwen2 classes.

A ``skip`` entry is built by none of those classes either: the skipped block is built and its
weights are missing. This module holds what the format (:mod:`gac_check.formats.per_layer`)
hands the targets and the classes read, with their citations.
"""
from __future__ import annotations

from dataclasses import dataclass

from gac_check.targets.source import Source


@dataclass(frozen=True)
class LayerDiff:
    """One layer that is not what the global config builds: ``differs`` says how (from its
    tensors, with per_layer_config's value where the tensors contradict it)."""

    layer: int
    differs: str


def _vllm(file: str, function: str) -> Source:
    return Source("vllm-project/vllm", f"vllm/model_executor/models/{file}", function, "v0.33.0",
                  "vllm-project/vllm#31454")


def _sglang(file: str, function: str) -> Source:
    return Source("sgl-project/sglang", f"python/sglang/srt/models/{file}", function, "v0.5.23")


_TRANSFORMERS = Source("huggingface/transformers",
                       "src/transformers/integrations/heterogeneity/configuration_utils.py",
                       "HeterogeneousConfigMixin.__getattribute__ "
                       "(AmbiguousGlobalPerLayerAttributeError)", "v5.24.0")
_LLAMA_LAYER = "LlamaDecoderLayer.__init__ (config.intermediate_size)"
#: engine -> architecture -> the class read to build every layer from the global config
GLOBAL_CLASSES: dict[str, dict[str, Source]] = {
    "vllm": {"LlamaForCausalLM": _vllm("llama.py", _LLAMA_LAYER),
             "MistralForCausalLM": _vllm("mistral.py", "MistralDecoderLayer (a "
                                         + _LLAMA_LAYER + ")"),
             "Qwen2ForCausalLM": _vllm("qwen2.py",
                                       "Qwen2DecoderLayer.__init__ (config.intermediate_size)")},
    "sglang": {"LlamaForCausalLM": _sglang("llama.py", _LLAMA_LAYER),
               "MistralForCausalLM": _sglang("mistral.py", "MistralForCausalLM (a "
                                             "LlamaForCausalLM)"),
               "Qwen2ForCausalLM": _sglang("qwen2.py", "Qwen2DecoderLayer.__init__ "
                                           "(config.intermediate_size)")},
    "transformers": {arch: _TRANSFORMERS for arch in
                     ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")},
}
#: What each engine's classes do with per_layer_config, as read.
READS: dict[str, str] = {
    "vllm": "vLLM v0.33.0 reads per_layer_config only in its Gemma4, Gemma4-MTP, "
            "Gemma4-DSpark, EmbeddingGemma2, DomynEdge and Step3p5 classes and, for each "
            "layer's attention, in its Transformers modeling backend, which builds "
            "transformers' own LlamaForCausalLM and so fails as transformers does",
    "sglang": "SGLang v0.5.23 reads per_layer_config only to flatten Gemma4's attention shapes",
    "transformers": "transformers v5.24.0 refuses a global read of a per-layer attribute "
                    "(AmbiguousGlobalPerLayerAttributeError), so LlamaForCausalLM(config) "
                    "fails; only classes written for it (Gemma4, Dots3Note, Step3p7, ...) "
                    "read per_layer_config[i]",
}


def not_built(engine: str, version: str, arch: str, layers: tuple[LayerDiff, ...]) -> str:
    """Why ``engine``'s class for ``arch`` does not build these layers, each layer named."""
    shown = "; ".join(f"layer {d.layer}: {d.differs}" for d in layers[:4])
    more = f"; and {len(layers) - 4} more layers" if len(layers) > 4 else ""
    return (f"{engine} {version}'s {arch} builds every layer from config.json's global "
            f"values and ignores per_layer_config and its skip ({READS[engine]}); these layers "
            f"are not what it builds: {shown}{more}")
