"""Dense Hugging Face checkpoints (Llama, Mistral, Qwen2, BERT): only family sites."""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.formats.architectures import find_family
from gac_check.formats.base import Format


class Dense(Format):
    name = "dense"
    description = "dense Hugging Face model"

    def matches(self, ckpt: Checkpoint) -> bool:
        return find_family(ckpt, strict=False) is not None
