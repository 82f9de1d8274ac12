"""GGUF files (llama.cpp): the same family sites as a Hugging Face Llama, over ggml's names.

llama.cpp's converter (``convert_hf_to_gguf.py``) renames every tensor (``model.layers.3.mlp.
down_proj.weight`` -> ``blk.3.ffn_down.weight``) and stores ``ne`` in reverse; the checkpoint
reader turns ``ne`` back into torch's order, so a GGUF linear is a dense ``[out, in]`` weight
and the Llama family's sites (MLP width, head_dim and heads per layer, hidden, vocabulary)
are built by the same code over the names below. Only the llama-style architectures whose
tensors are exactly these are read; a tensor of any other name is a refusal, never skipped.
"""
from __future__ import annotations

import re

from gac_check.checkpoint.gguf_header import GgufArray
from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.architectures import Family, family_sites
from gac_check.formats.base import Format
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

#: The Llama family in llama.cpp's tensor names (src/llama-arch.cpp, LLM_TENSOR_NAMES).
GGUF_LLAMA = Family(
    "llama", ("llama",), r"^(blk)\.(\d+)\.",
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down", "ffn_gate", True,
    ("attn_norm", "ffn_norm"), "token_embd", "output_norm",
    intermediate_key="intermediate_size",
)
#: The architectures whose GGUF tensors are all named below (llama.cpp's LLM_ARCH_* names).
ARCHITECTURES = ("llama", "qwen2", "qwen3")
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
#: Per layer: the linears (weights; qwen2's q/k/v biases), and what carries no width of its own.
LAYER_WEIGHTS = frozenset({"attn_q.weight", "attn_k.weight", "attn_v.weight",
                           "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                           "ffn_down.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias"})
LAYER_AUXILIARY = {"attn_norm.weight": "norm", "ffn_norm.weight": "norm",
                   "attn_q_norm.weight": "per-head q norm", "attn_k_norm.weight":
                   "per-head k norm", "rope_freqs.weight": "rotary frequencies"}
TOP_WEIGHTS = frozenset({"token_embd.weight", "output.weight"})
TOP_AUXILIARY = {"output_norm.weight": "norm", "rope_freqs.weight": "rotary frequencies"}


class Gguf(Format):
    name = "gguf"
    description = "llama.cpp GGUF"

    def matches(self, ckpt: Checkpoint) -> bool:
        return ckpt.gguf is not None

    def sites(self, ckpt: Checkpoint) -> list[DimSite]:
        assert ckpt.gguf is not None
        arch = ckpt.gguf.architecture
        if arch not in ARCHITECTURES:
            raise BadInput(f"is a GGUF of architecture {arch!r}; gac-check reads "
                           f"{', '.join(ARCHITECTURES)}", ckpt.path)
        auxiliary = _accounted_names(ckpt)
        layers = _complete_layers(ckpt)
        sites = [s for s in family_sites(ckpt, GGUF_LLAMA, "blk", layers, self.linear_of(ckpt))
                 if s.role is not Role.VOCAB]
        if layers and not any(s.role is Role.HEAD_DIM for s in sites):
            raise BadInput("gives no head_dim (no attention.key_length, and no single "
                           "attention.head_count to divide the width by): its attention cannot "
                           "be checked", ckpt.path)
        _head_and_vocab(ckpt, sites)
        _per_layer_widths(ckpt, sites)
        for s in sites:
            s.notes = [n.replace("the config says", "the GGUF metadata says") for n in s.notes]
        _account(ckpt, sites, auxiliary)
        return sites

    def linear_of(self, ckpt: Checkpoint):
        return lambda module: self.linear(ckpt, module)


def _accounted_names(ckpt: Checkpoint) -> dict[str, str]:
    """The tensors that carry no width of their own, by name -> what they are; a name that is
    neither that nor a known weight is refused (the first, and how many)."""
    auxiliary: dict[str, str] = {}
    unknown = []
    for name in ckpt.tensors:
        m = _LAYER.match(name)
        rest = m[2] if m else name
        known, aux = (LAYER_WEIGHTS, LAYER_AUXILIARY) if m else (TOP_WEIGHTS, TOP_AUXILIARY)
        if rest in aux:
            auxiliary[name] = aux[rest]
        elif rest not in known:
            unknown.append(name)
    if unknown:
        raise BadInput(f"holds {len(unknown)} tensor(s) gac-check does not read in a "
                       f"{ckpt.gguf.architecture if ckpt.gguf else ''} GGUF, the first "
                       f"{sorted(unknown)[0]!r}: refused rather than checked without them",
                       ckpt.path)
    return auxiliary


def _complete_layers(ckpt: Checkpoint) -> list[int]:
    """The layer indices, each with every linear the family has, as many as block_count says:
    a layer without its attn_k would lose its attention sites without a word."""
    assert ckpt.gguf is not None
    layers = sorted({int(m[1]) for n in ckpt.tensors if (m := _LAYER.match(n))})
    count = ckpt.gguf.arch_value("block_count")
    if layers != list(range(len(layers))) or (isinstance(count, int) and count != len(layers)):
        raise BadInput(f"says block_count={count!r}, its tensors have layers "
                       f"{layers[:3]}{'...' if len(layers) > 3 else ''} ({len(layers)})",
                       ckpt.path)
    required = ["token_embd.weight", *(f"blk.{i}.{m}.weight" for i in layers
                                       for m in GGUF_LLAMA.required())]
    missing = [n for n in required if n not in ckpt.tensors]
    if missing:
        raise BadInput(f"lacks {len(missing)} tensor(s) its layers must have, the first "
                       f"{missing[0]!r}", ckpt.path)
    return layers


def _head_and_vocab(ckpt: Checkpoint, sites: list[DimSite]) -> None:
    """The vocabulary (token_embd's and the output head's rows), and the head's columns on
    the hidden site: the family code knows the head as ``lm_head``."""
    shapes = ckpt.shapes
    tables = [t for t in ("token_embd.weight", "output.weight") if len(shapes.get(t, ())) == 2]
    if not tables:
        return
    hidden = next((s for s in sites if s.role is Role.HIDDEN), None)
    if hidden is not None and "output.weight" in tables:
        hidden.axes.append(TensorAxis("output.weight", 1, AxisKind.CONSUMER))
    site = DimSite("vocab", Role.VOCAB, shapes[tables[0]][0],
                   [TensorAxis(t, 0, AxisKind.PRODUCER) for t in tables],
                   config_field=("vocab_size",), inexact=(
                       "padded vocabulary rows produce logits for tokens the tokenizer does "
                       "not have; stock generation could sample them"))
    sites.append(site)


def _per_layer_widths(ckpt: Checkpoint, sites: list[DimSite]) -> None:
    """A per-layer ``feed_forward_length`` array held to each layer's tensors, as config.json's
    one value is."""
    assert ckpt.gguf is not None
    declared = ckpt.gguf.arch_value("feed_forward_length")
    if not isinstance(declared, GgufArray) or declared.values is None:
        return
    for s in sites:
        if s.role is Role.INTERMEDIATE and s.layer is not None:
            if s.layer >= len(declared.values):
                s.notes.append(f"the GGUF metadata's feed_forward_length has no entry for "
                               f"layer {s.layer}")
            elif declared.values[s.layer] != s.value:
                s.notes.append(f"the GGUF metadata says feed_forward_length[{s.layer}]="
                               f"{declared.values[s.layer]}, tensors have {s.value}")


def _account(ckpt: Checkpoint, sites: list[DimSite], auxiliary: dict[str, str]) -> None:
    """Record the tensors that carry no width of their own, so that the general accounting
    (formats/accounting.py) finds every other tensor in a site or refuses the file: a linear
    no site read (a layer missing its partner tensors) is never a silent pass."""
    in_sites = {t for s in sites for t in s.tensors}
    ckpt.auxiliary.update({n: what for n, what in auxiliary.items() if n not in in_sites})
