"""GGUF files written by the ``gguf`` package's own GGUFWriter, with the stored types a test
chooses per tensor: real files, header and tensor data, as llama.cpp's quantizer lays them out.

Tensor data is zeros of each type's exact byte size (a check reads headers only; what the
bytes hold does not matter to it). ``types`` maps a GGUF tensor name to a ggml type name;
anything unnamed is F32 when 1-D, else ``default``.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

FTYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q5_0": 8, "Q2_K": 10, "Q4_K_S": 14,
             "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "IQ3_M": 27}


def llama_tensors(m: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, ne) of a llama model; ne[0] is the row length (the input features)."""
    h, hd = m["hidden"], m["head_dim"]
    q, kv = m["heads"] * hd, m["kv_heads"] * hd
    ffs = m["ff"] if isinstance(m["ff"], list) else [m["ff"]] * m["layers"]
    out = [("token_embd.weight", (h, m["vocab"]))]
    for i in range(m["layers"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (h, q)),
                (b + "attn_k.weight", (h, kv)), (b + "attn_v.weight", (h, kv)),
                (b + "attn_output.weight", (q, h)), (b + "ffn_norm.weight", (h,)),
                (b + "ffn_gate.weight", (h, ffs[i])), (b + "ffn_up.weight", (h, ffs[i])),
                (b + "ffn_down.weight", (ffs[i], h))]
    out += [("output_norm.weight", (h,))]
    return out + ([] if m.get("tied") else [("output.weight", (h, m["vocab"]))])


def write_gguf(path: Path, m: dict, ftype: str, types: dict[str, str], default: str = "F16",
               extra: list[tuple[str, tuple[int, ...]]] = (), arch: str = "llama",
               omit: tuple[str, ...] = ()) -> Path:
    """A llama-architecture GGUF at ``path`` with metadata as convert_hf_to_gguf.py writes it."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(m["layers"])
    w.add_context_length(64)
    w.add_embedding_length(m["hidden"])
    if isinstance(m["ff"], list):
        w.add_array(f"{arch}.feed_forward_length", m["ff"])
    else:
        w.add_feed_forward_length(m["ff"])
    if m.get("per_layer_heads"):  # one head count per layer, and no key_length to say head_dim
        w.add_array(f"{arch}.attention.head_count", [m["heads"]] * m["layers"])
    else:
        w.add_head_count(m["heads"])
        w.add_key_length(m["head_dim"])
        w.add_value_length(m["head_dim"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_rope_dimension_count(m["head_dim"])
    w.add_layer_norm_rms_eps(1e-5)
    if ftype is not None:
        w.add_file_type(FTYPE_IDS[ftype])
    w.add_vocab_size(m["vocab"])
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}".encode() for i in range(m["vocab"])])
    write_tensors(w, [*(t for t in llama_tensors(m) if t[0] not in omit), *extra], types,
                  default)
    return path


def write_tensors(w, tensors, types: dict[str, str], default: str = "F16") -> None:
    """Add zero tensors of their stored types (``types`` by name; vectors F32, the rest
    ``default``) to the writer ``w`` and write the file."""
    for name, ne in tensors:
        kind = types.get(name, "F32" if len(ne) == 1 else default)
        qt = gguf.GGMLQuantizationType[kind]
        shape = tuple(reversed(ne))  # numpy order
        if kind in ("F32", "F16"):
            w.add_tensor(name, np.zeros(shape, np.float32 if kind == "F32" else np.float16))
        else:
            w.add_tensor(name, np.zeros(gguf.quant_shape_to_byte_shape(shape, qt), np.uint8),
                         raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


#: A Llama whose MLP was pruned to 688, as llama.cpp's quantizer (0c1e57098) stores it at
#: Q4_K_M: 688 is a multiple of neither 256 (Q4_K, Q6_K) nor 32 (their fallbacks Q5_0,
#: Q8_0), so every ffn_down is F16 (tensor_type_fallback's second step); everything else
#: keeps the mix (attn_v and ffn_down of the "more bits" layers Q6_K, the head Q6_K).
PRUNED = {"hidden": 256, "ff": 688, "heads": 4, "kv_heads": 2, "head_dim": 64, "layers": 2,
          "vocab": 512}


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits (src/llama-quant.cpp), restated: the layers Q4_K_M gives Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_types(m: dict, down: str = "F16", down_more_bits: str = "F16") -> dict:
    """Q4_K_M's stored types for ``m``: Q4_K, the head Q6_K, attn_v and ffn_down Q6_K in the
    "more bits" layers; ``down`` / ``down_more_bits``: what ffn_down is stored as at the
    pruned width in the other and the "more bits" layers."""
    types = {"token_embd.weight": "Q4_K", "output.weight": "Q6_K"}
    for i in range(m["layers"]):
        b = f"blk.{i}."
        types |= {b + t: "Q4_K" for t in ("attn_q.weight", "attn_k.weight",
                                          "attn_output.weight", "ffn_gate.weight",
                                          "ffn_up.weight")}
        more = more_bits(i, m["layers"])
        types[b + "attn_v.weight"] = "Q6_K" if more else "Q4_K"
        types[b + "ffn_down.weight"] = down_more_bits if more else down
    return types
