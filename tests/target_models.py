"""Checkpoints of realistic shapes for the deployment-target tests, as sparse files.

A check reads headers only, so a Llama-70B-shaped model (widths like 28672) is a header and a
hole: nothing large touches the disk. ``intermediate`` may be one width or one per layer (a
per-layer pruned model).
"""
from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ST_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def llama_shapes(hidden: int, intermediate: int | Sequence[int], heads: int, kv_heads: int,
                 head_dim: int, layers: int, vocab: int) -> dict[str, list[int]]:
    widths = ([intermediate] * layers if isinstance(intermediate, int) else list(intermediate))
    out: dict[str, list[int]] = {"model.embed_tokens.weight": [vocab, hidden]}
    for n, inter in enumerate(widths):
        b = f"model.layers.{n}"
        out |= {
            f"{b}.self_attn.q_proj.weight": [heads * head_dim, hidden],
            f"{b}.self_attn.k_proj.weight": [kv_heads * head_dim, hidden],
            f"{b}.self_attn.v_proj.weight": [kv_heads * head_dim, hidden],
            f"{b}.self_attn.o_proj.weight": [hidden, heads * head_dim],
            f"{b}.mlp.gate_proj.weight": [inter, hidden],
            f"{b}.mlp.up_proj.weight": [inter, hidden],
            f"{b}.mlp.down_proj.weight": [hidden, inter],
            f"{b}.input_layernorm.weight": [hidden],
            f"{b}.post_attention_layernorm.weight": [hidden],
        }
    out |= {"model.norm.weight": [hidden], "lm_head.weight": [vocab, hidden]}
    return out


def write_sparse(path: Path, shapes: Mapping[str, Sequence[int]],
                 dtype: str = "bfloat16") -> None:
    """A safetensors file that is a real header and a hole of the data's length: realistic
    widths (28672, 29568) for header-only checks at no disk cost."""
    header: dict[str, object] = {}
    pos = 0
    for name, shape in shapes.items():
        n = BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": ST_DTYPE[dtype], "shape": list(shape),
                        "data_offsets": [pos, pos + n]}
        pos += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        fh.truncate(8 + len(blob) + pos)


def sparse_llama(root: Path, *, hidden: int = 4096, intermediate: int | Sequence[int] = 11008,
                 heads: int = 32, kv_heads: int | None = None, head_dim: int | None = None,
                 layers: int = 2, vocab: int = 32000, dtype: str = "bfloat16") -> Path:
    """A LlamaForCausalLM directory whose one safetensors file is a header and a hole."""
    kv_heads = kv_heads or heads
    head_dim = head_dim or hidden // heads
    root.mkdir(parents=True, exist_ok=True)
    shapes = llama_shapes(hidden, intermediate, heads, kv_heads, head_dim, layers, vocab)
    write_sparse(root / "model.safetensors", shapes, dtype)
    inter = intermediate if isinstance(intermediate, int) else max(intermediate)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": inter,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "num_hidden_layers": layers, "vocab_size": vocab,
              "torch_dtype": dtype, "rope_theta": 10000.0}
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return root
