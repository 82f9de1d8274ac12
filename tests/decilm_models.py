"""DeciLM / Nemotron-NAS checkpoints for the tests: config.json with ``block_configs`` and the
tensors each block has, as real safetensors (``sparse=False``: random weights written with
safetensors' own writer) or as a header and a hole (``sparse=True``, realistic widths).

A block is given as in config.json (``attention(4)``, ``ffn(2.0)``, ``NO_OP``, ``LINEAR``);
the tensors follow the config unless ``widths`` overrides a layer's MLP width or KV heads, or
``tensors`` adds or removes names (a checkpoint that contradicts its config).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gac_check.targets.blocks import ffn_width
from tests.target_models import write_sparse

NO_OP = {"no_op": True, "replace_with_linear": False}
LINEAR = {"no_op": False, "replace_with_linear": True}


def attention(n_heads_in_group: int) -> dict:
    """A full attention block as Puzzle writes it (the inert keys at their off values)."""
    return {"n_heads_in_group": n_heads_in_group, "no_op": False, "replace_with_linear": False,
            "sparsify": None, "window_length": None, "num_sink_tokens": None,
            "use_prefill_window_in_sink_attention": False, "unshifted_sink": False}


def ffn(ffn_mult: float) -> dict:
    return {"ffn_mult": ffn_mult, "no_op": False, "replace_with_linear": False, "sparsify": None}


def modelopt_attention(kv_heads: int | None, no_op: bool = False) -> dict:
    """An attention block as ModelOpt's Puzzletron writes it (AttentionConfig: the KV heads
    themselves, no n_heads_in_group; its other fields at their off values)."""
    return {"no_op": no_op, "replace_with_linear": False, "sparsify": None,
            "weights_precision": "bf16", "num_key_value_heads": kv_heads, "llama4": None,
            "mamba": None}


def kv_heads_of(attn: Mapping, heads: int) -> int:
    """The KV heads a full attention entry declares: heads // n_heads_in_group, else
    num_key_value_heads (ModelOpt's)."""
    group = attn.get("n_heads_in_group")
    return heads // group if group else attn["num_key_value_heads"]


def explicit_ffn(width: int, ffn_mult: float | None = None) -> dict:
    """A full FFN block as ModelOpt's Puzzletron writes it (FFNConfig: the width itself, its
    other fields at their off values), with an ``ffn_mult`` beside it where given."""
    out = {"no_op": False, "replace_with_linear": False, "sparsify": None,
           "weights_precision": "bf16", "moe": None, "intermediate_size": width}
    return out | ({"ffn_mult": ffn_mult} if ffn_mult is not None else {})


def built_width(mlp: Mapping, hidden: int) -> int:
    """The width vLLM v0.33.0's DeciLMDecoderLayer builds for a full FFN entry: ffn_mult's
    (rounded up to 256) where the entry has one, else intermediate_size as given."""
    if mlp.get("ffn_mult") is not None:
        return ffn_width(mlp["ffn_mult"], hidden)
    return mlp["intermediate_size"]


def block(attn: Mapping, mlp: Mapping) -> dict:
    return {"attention": dict(attn), "ffn": dict(mlp)}


def decilm_shapes(blocks: Sequence[Mapping], *, hidden: int, heads: int, vocab: int,
                  widths: Mapping[int, Mapping[str, int]] | None = None
                  ) -> dict[str, list[int]]:
    """Every tensor of the checkpoint the blocks describe; ``widths[i]`` overrides layer i's
    ``intermediate`` or ``kv_heads``."""
    hd = hidden // heads
    out: dict[str, list[int]] = {"model.embed_tokens.weight": [vocab, hidden]}
    for i, b in enumerate(blocks):
        base, over = f"model.layers.{i}", (widths or {}).get(i, {})
        attn, mlp = b["attention"], b["ffn"]
        if attn.get("replace_with_linear"):
            out |= {f"{base}.input_layernorm.weight": [hidden],
                    f"{base}.self_attn.linear_attn.weight": [hidden, hidden]}
        elif not attn.get("no_op"):
            kv = over.get("kv_heads", kv_heads_of(attn, heads))
            out |= {f"{base}.input_layernorm.weight": [hidden],
                    f"{base}.self_attn.q_proj.weight": [heads * hd, hidden],
                    f"{base}.self_attn.k_proj.weight": [kv * hd, hidden],
                    f"{base}.self_attn.v_proj.weight": [kv * hd, hidden],
                    f"{base}.self_attn.o_proj.weight": [hidden, heads * hd]}
        if mlp.get("replace_with_linear"):
            out |= {f"{base}.post_attention_layernorm.weight": [hidden],
                    f"{base}.mlp.linear_mlp.weight": [hidden, hidden]}
        elif not mlp.get("no_op"):
            inter = over.get("intermediate", built_width(mlp, hidden))
            out |= {f"{base}.post_attention_layernorm.weight": [hidden],
                    f"{base}.mlp.gate_proj.weight": [inter, hidden],
                    f"{base}.mlp.up_proj.weight": [inter, hidden],
                    f"{base}.mlp.down_proj.weight": [hidden, inter]}
    return out | {"model.norm.weight": [hidden], "lm_head.weight": [vocab, hidden]}


def decilm_config(blocks: Sequence[Mapping], *, hidden: int, heads: int, vocab: int) -> dict:
    """config.json as Nemotron-NAS writes it (no global intermediate_size or KV heads)."""
    return {"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas",
            "block_configs": [dict(b) for b in blocks], "hidden_size": hidden,
            "num_attention_heads": heads, "num_hidden_layers": len(blocks),
            "vocab_size": vocab, "hidden_act": "silu", "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def write_decilm(root: Path, blocks: Sequence[Mapping], *, hidden: int = 256, heads: int = 4,
                 vocab: int = 512, sparse: bool = False,
                 widths: Mapping[int, Mapping[str, int]] | None = None,
                 tensors: Callable[[dict[str, list[int]]], dict[str, list[int]]] | None = None,
                 config: Callable[[dict], dict] | None = None) -> Path:
    """A DeciLM directory under ``root``; ``tensors`` and ``config`` edit what is written."""
    root.mkdir(parents=True, exist_ok=True)
    shapes = decilm_shapes(blocks, hidden=hidden, heads=heads, vocab=vocab, widths=widths)
    shapes = tensors(shapes) if tensors else shapes
    cfg = decilm_config(blocks, hidden=hidden, heads=heads, vocab=vocab)
    (root / "config.json").write_text(json.dumps(config(cfg) if config else cfg, indent=2))
    if sparse:
        write_sparse(root / "model.safetensors", shapes)
    else:
        import torch
        from safetensors.torch import save_file

        gen = torch.Generator().manual_seed(0)
        save_file({n: torch.randn(s, generator=gen).to(torch.bfloat16)
                   for n, s in shapes.items()}, str(root / "model.safetensors"))
    return root


def decilm_model(root: Path, mlp_widths: Mapping[int, int] | None = None):
    """The model a DeciLM directory describes, built per layer from its config.json alone the
    way vLLM's DeciLMDecoderLayer builds it (vllm/model_executor/models/nemotron_nas.py,
    v0.33.0) out of transformers' own Llama modules, and its safetensors (or its
    ``pytorch_model.bin`` state dict) loaded strictly (a tensor the config does not build
    fails the load).

    A full attention is ``LlamaAttention`` with num_attention_heads // n_heads_in_group KV
    heads, a full FFN ``LlamaMLP`` of ``built_width`` (ffn_mult's, else intermediate_size),
    each behind its ``LlamaRMSNorm``; a no-op block has no modules and leaves the residual
    stream as it is; a linear replacement is one bias-free hidden x hidden ``linear_attn`` /
    ``linear_mlp`` behind its norm. ``mlp_widths`` gives layers the width their tensors have
    where the config contradicts them (the model before ``--repair``: tensors win)."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaAttention,
        LlamaMLP,
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
    )

    cfg = json.loads((root / "config.json").read_text())
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    base = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads,
                       head_dim=hidden // heads, vocab_size=cfg["vocab_size"],
                       rms_norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"],
                       max_position_embeddings=cfg["max_position_embeddings"],
                       hidden_act=cfg["hidden_act"], attention_bias=False, mlp_bias=False,
                       intermediate_size=1)

    def layer_config(**change: int) -> LlamaConfig:
        out = LlamaConfig(**{**base.to_dict(), **change})
        out._attn_implementation = "eager"
        return out

    class Replacement(torch.nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name
            self.add_module(name, torch.nn.Linear(hidden, hidden, bias=False))

        def forward(self, x):
            return getattr(self, self.name)(x)

    class Layer(torch.nn.Module):
        def __init__(self, i: int, entry: Mapping) -> None:
            super().__init__()
            attn, mlp = entry["attention"], entry["ffn"]
            if not attn.get("no_op"):
                self.input_layernorm = LlamaRMSNorm(hidden, eps=base.rms_norm_eps)
                kv = None if attn.get("replace_with_linear") else kv_heads_of(attn, heads)
                self.self_attn = (Replacement("linear_attn") if kv is None
                                  else LlamaAttention(layer_config(num_key_value_heads=kv), i))
            if not mlp.get("no_op"):
                self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=base.rms_norm_eps)
                if mlp.get("replace_with_linear"):
                    self.mlp = Replacement("linear_mlp")
                else:
                    width = (mlp_widths or {}).get(i) or built_width(mlp, hidden)
                    self.mlp = LlamaMLP(layer_config(intermediate_size=width))

        def forward(self, x, position_embeddings, mask):
            if hasattr(self, "self_attn"):
                h = self.input_layernorm(x)
                if isinstance(self.self_attn, Replacement):
                    x = x + self.self_attn(h)
                else:
                    x = x + self.self_attn(h, position_embeddings, mask)[0]
            if hasattr(self, "mlp"):
                x = x + self.mlp(self.post_attention_layernorm(x))
            return x

    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(cfg["vocab_size"], hidden)
            self.layers = torch.nn.ModuleList(Layer(i, e)
                                              for i, e in enumerate(cfg["block_configs"]))
            self.norm = LlamaRMSNorm(hidden, eps=base.rms_norm_eps)
            self.rotary_emb = LlamaRotaryEmbedding(base)

    class DeciLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Inner()
            self.lm_head = torch.nn.Linear(hidden, cfg["vocab_size"], bias=False)

        def forward(self, ids):
            x = self.model.embed_tokens(ids)
            n = ids.shape[1]
            pos = self.model.rotary_emb(x, torch.arange(n)[None])
            mask = torch.full((n, n), float("-inf"), dtype=x.dtype).triu(1)[None, None]
            for layer in self.model.layers:
                x = layer(x, pos, mask)
            return self.lm_head(self.model.norm(x))

    model = DeciLM().double()  # float64: the comparison sees padding, not summation order
    pickled = root / "pytorch_model.bin"  # a state dict torch.save wrote (this test's own)
    state = (torch.load(pickled, weights_only=True) if pickled.exists()
             else load_file(str(root / "model.safetensors")))
    weights = {n: t.double() for n, t in state.items()}
    model.load_state_dict(weights, strict=True)
    return model.eval()
