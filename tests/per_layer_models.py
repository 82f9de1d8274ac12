"""transformers ``per_layer_config`` checkpoints for the tests, built from real transformers
modules, and the forward pass that proves a repaired one equivalent.

transformers v5.24.0 cannot build ``LlamaForCausalLM`` from a config with per-layer
overrides (``AmbiguousGlobalPerLayerAttributeError``), but ``config.per_layer_config[i]`` is
a real ``LlamaConfig`` for layer ``i``: each layer here is a ``LlamaDecoderLayer`` built from
it, exactly as the classes that read per_layer_config build theirs. A block that ``skip``
names is absent from the checkpoint (its linears and the norm in front of it); in the forward
pass it adds nothing to the residual stream, which is what skipping a block means
(transformers' Llama does not implement ``skip``: it would build the block).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, LlamaConfig, MistralConfig, Qwen2Config
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)
from transformers.models.mistral.modeling_mistral import (
    MistralDecoderLayer,
    MistralRMSNorm,
    MistralRotaryEmbedding,
)
from transformers.models.qwen2.modeling_qwen2 import (
    Qwen2DecoderLayer,
    Qwen2RMSNorm,
    Qwen2RotaryEmbedding,
)


class Arch(NamedTuple):
    """One architecture's transformers classes, as its per-layer model is built from them."""

    name: str  # config.json's architectures[0]
    model_type: str
    config: type
    layer: type
    norm: type
    rope: type


ARCHS = {a.model_type: a for a in (
    Arch("LlamaForCausalLM", "llama", LlamaConfig, LlamaDecoderLayer, LlamaRMSNorm,
         LlamaRotaryEmbedding),
    Arch("MistralForCausalLM", "mistral", MistralConfig, MistralDecoderLayer, MistralRMSNorm,
         MistralRotaryEmbedding),
    Arch("Qwen2ForCausalLM", "qwen2", Qwen2Config, Qwen2DecoderLayer, Qwen2RMSNorm,
         Qwen2RotaryEmbedding))}

#: The norm in front of each block: absent with the block.
NORM = {"self_attn": "input_layernorm", "mlp": "post_attention_layernorm"}
#: Layer 1 pruned to an MLP of 107 and 4 KV heads; layer 2 without its MLP.
PRUNED = {"1": {"intermediate_size": 107, "num_key_value_heads": 4}, "2": {"skip": ["mlp"]}}


def base_config(layers: int = 3, arch: str = "llama", **over: object) -> dict:
    """The global config: hidden 64, 8 heads of 8, MLP 128, vocabulary 256."""
    return {"architectures": [ARCHS[arch].name], "model_type": arch, "hidden_size": 64,
            "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 128,
            "num_hidden_layers": layers, "vocab_size": 256, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "hidden_act": "silu", **over}


def skipped(layer_cfg: object) -> tuple[str, ...]:
    """The state-dict prefixes a layer's skipped blocks leave out (the block and its norm);
    transformers sets ``skip`` on a layer's config only where its entry has one."""
    blocks = getattr(layer_cfg, "skip", [])
    return tuple(f"{b}." for b in blocks) + tuple(f"{NORM[b]}." for b in blocks)


def per_layer_state(seed: int, config: Mapping) -> dict[str, torch.Tensor]:
    """The state dict of the model ``config`` describes (its per_layer_config included)."""
    torch.manual_seed(seed)
    arch = ARCHS[config["model_type"]]
    cfg = arch.config(**config)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    state = {"model.embed_tokens.weight": torch.randn(vocab, hidden),
             "model.norm.weight": 1 + 0.1 * torch.randn(hidden),
             "lm_head.weight": torch.randn(vocab, hidden) / hidden ** 0.5}
    for i in range(config["num_hidden_layers"]):
        layer_cfg = cfg.per_layer_config[i]
        layer = arch.layer(layer_cfg, i)
        for norm in NORM.values():
            nn.init.normal_(getattr(layer, norm).weight, 1.0, 0.1)
        gone = skipped(layer_cfg)
        state |= {f"model.layers.{i}.{k}": v.detach().clone()
                  for k, v in layer.state_dict().items() if not k.startswith(gone)}
    return state


def write_per_layer(root: Path, per_layer: Mapping | None = PRUNED, *, seed: int = 0,
                    layers: int = 3, arch: str = "llama",
                    tensors: Callable[[dict], dict] | None = None,
                    config: Callable[[dict], dict] | None = None) -> Path:
    """A safetensors checkpoint whose tensors follow ``per_layer`` (None: no per-layer
    config); ``tensors`` and ``config`` edit the state dict and config.json after the fact
    (a checkpoint whose config contradicts its tensors)."""
    cfg = base_config(layers, arch) | ({"per_layer_config": dict(per_layer)} if per_layer else {})
    state = per_layer_state(seed, cfg)
    root.mkdir(parents=True, exist_ok=True)
    save_file((tensors or (lambda s: s))(state), str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps((config or (lambda c: c))(cfg), indent=2))
    return root


class Skipped(nn.Module):
    """A block ``skip`` names: it adds nothing to the residual stream."""

    def __init__(self, attention: bool) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object):
        zero = torch.zeros_like(hidden_states)
        return (zero, None) if self.attention else zero


def per_layer_forward(root: Path, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the checkpoint at ``root``: every layer its architecture's decoder layer
    (``LlamaDecoderLayer``, ``MistralDecoderLayer``, ``Qwen2DecoderLayer``) built from
    transformers' own ``config.per_layer_config[i]`` (its rotary embedding too: a layer may
    have its own head_dim) and loaded strictly (only a skipped block's tensors may be
    missing), in float64."""
    cfg = AutoConfig.from_pretrained(root, attn_implementation="sdpa")
    arch = ARCHS[cfg.model_type]
    state = {k: v.double() for k, v in load_file(str(root / "model.safetensors")).items()}
    h = state["model.embed_tokens.weight"][ids]
    positions = torch.arange(ids.shape[1])[None]
    for i in range(cfg.num_hidden_layers):
        layer_cfg = cfg.per_layer_config[i]
        cos_sin = arch.rope(layer_cfg).double()(h, positions)  # the layer's own head_dim
        layer = arch.layer(layer_cfg, i).double()
        prefix = f"model.layers.{i}."
        own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        missing, unexpected = layer.load_state_dict(own, strict=False)
        gone = skipped(layer_cfg)
        assert not unexpected and all(m.startswith(gone) for m in missing), (missing, unexpected)
        for block in getattr(layer_cfg, "skip", []):
            setattr(layer, block, Skipped(block == "self_attn"))
        h = layer(h, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)
        h = h[0] if isinstance(h, tuple) else h
    norm = arch.norm(cfg.hidden_size, eps=cfg.rms_norm_eps).double()
    norm.weight.data = state["model.norm.weight"]
    return norm(h) @ state["lm_head.weight"].T
