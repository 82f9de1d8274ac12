"""Checkpoint formats: detect which compressor wrote a directory and describe its DimSites."""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import NotRead
from gac_check.formats.asvd import ASVD
from gac_check.formats.base import Format
from gac_check.formats.decilm import DeciLM
from gac_check.formats.dense import Dense
from gac_check.formats.flap import FLAP
from gac_check.formats.llm_pruner import LLMPruner
from gac_check.formats.mla import MLA
from gac_check.formats.palu import PaLU
from gac_check.formats.per_layer import PerLayer
from gac_check.formats.slicegpt import SliceGPT
from gac_check.formats.svdllm import SVDLLM

#: Most specific first: a compressed checkpoint also looks like a (partial) dense one. Formats
#: with their own tensor names or config keys come before those recognised by shapes alone
#: (LLM-Pruner: a dense layout whose sizes disagree with config.json or vary across layers;
#: FLAP, LLM-Pruner's layout with its bias compensation, just before it);
#: multi-head latent attention is told by its own tensor names (kv_a_proj_with_mqa).
#: DeciLM / Nemotron-NAS first: its block_configs decide what every layer is, so a layout
#: another format would read (a compressor's tensors over such a model) is refused by the
#: accounting rather than read as uniform layers.
#: transformers' per_layer_config before it: it is told by its own config key, and refuses a
#: config that also has block_configs (which DeciLM would read without it).
#: A GGUF file is told by its container, before any of them (and its format, which reads
#: llama.cpp's rule pack, is imported only then).
FORMATS: list[Format] = [PerLayer(), DeciLM(), PaLU(), SVDLLM(), ASVD(), SliceGPT(), MLA(),
                         FLAP(), LLMPruner(), Dense()]


def detect(ckpt: Checkpoint) -> Format:
    if ckpt.gguf is not None:
        from gac_check.formats.gguf import Gguf

        return Gguf()
    for fmt in FORMATS:
        if fmt.matches(ckpt):
            return fmt
    raise NotRead("is not a format gac-check recognises (no transformer layers found)",
                   ckpt.path)


__all__ = ["FORMATS", "Format", "detect"]
