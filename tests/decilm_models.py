"""DeciLM / Nemotron-NAS checkpoints for the tests: config.json with ``block_configs`` and the
tensors each block has, as real safetensors (``sparse=False``: random weights written with
safetensors' own writer) or as a header and a hole (``sparse=True``, realistic widths).

A block is given as in config.json (``attention(4)``, ``ffn(2.0)``, ``NO_OP``, ``LINEAR``);
the tensors follow the config unless ``widths`` overrides a layer's MLP width or KV heads, or
``tensors`` adds or removes names (a checkpoint that contradicts its config).
"""
from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gac_check.targets.blocks import ffn_width

NO_OP = {"no_op": True, "replace_with_linear": False}
LINEAR = {"no_op": False, "replace_with_linear": True}


def attention(n_heads_in_group: int) -> dict:
    """A full attention block as Puzzle writes it (the inert keys at their off values)."""
    return {"n_heads_in_group": n_heads_in_group, "no_op": False, "replace_with_linear": False,
            "sparsify": None, "window_length": None, "num_sink_tokens": None,
            "use_prefill_window_in_sink_attention": False, "unshifted_sink": False}


def ffn(ffn_mult: float) -> dict:
    return {"ffn_mult": ffn_mult, "no_op": False, "replace_with_linear": False, "sparsify": None}


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
            kv = over.get("kv_heads", heads // attn["n_heads_in_group"])
            out |= {f"{base}.input_layernorm.weight": [hidden],
                    f"{base}.self_attn.q_proj.weight": [heads * hd, hidden],
                    f"{base}.self_attn.k_proj.weight": [kv * hd, hidden],
                    f"{base}.self_attn.v_proj.weight": [kv * hd, hidden],
                    f"{base}.self_attn.o_proj.weight": [hidden, heads * hd]}
        if mlp.get("replace_with_linear"):
            out |= {f"{base}.post_attention_layernorm.weight": [hidden],
                    f"{base}.mlp.linear_mlp.weight": [hidden, hidden]}
        elif not mlp.get("no_op"):
            inter = over.get("intermediate", ffn_width(mlp["ffn_mult"], hidden))
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
        _write_sparse(root / "model.safetensors", shapes)
    else:
        import torch
        from safetensors.torch import save_file

        gen = torch.Generator().manual_seed(0)
        save_file({n: torch.randn(s, generator=gen).to(torch.bfloat16)
                   for n, s in shapes.items()}, str(root / "model.safetensors"))
    return root


def _write_sparse(path: Path, shapes: Mapping[str, list[int]]) -> None:
    header: dict[str, object] = {}
    pos = 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        fh.truncate(8 + len(blob) + pos)
