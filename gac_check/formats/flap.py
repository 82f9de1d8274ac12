"""FLAP (CASIA-IVA-Lab/FLAP): LLM-Pruner's layout plus a bias compensation, told by its biases.

FLAP removes whole heads and MLP channels per layer, as LLM-Pruner's block-wise pruning does,
and adds the removed channels' mean contribution back as a bias on ``o_proj`` and
``down_proj`` (its ``compress(..., bias=True)``), linears that have none in Llama; its
``save_pretrained`` keeps the dense config.json. So its sites are LLM-Pruner's, and the
biases name it: every layer has ``o_proj.bias`` and ``down_proj.bias`` and no q / gate bias
(a Llama with ``attention_bias`` or ``mlp_bias`` has them on every projection). Told apart, the
report names the tool that wrote the model, and says nothing of LLM-Pruner's ``--channel_wise``
(FLAP never narrows the hidden size). docs/formats.md, "Torch-Pruning and FLAP".
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.formats.architectures import find_family
from gac_check.formats.llm_pruner import LLMPruner


class FLAP(LLMPruner):
    name = "flap"
    description = ("FLAP structured pruning (per-layer heads / MLP channels removed, their mean "
                   "output kept as o_proj / down_proj biases; config.json keeps the dense sizes)")
    hidden_advice = ""

    def matches(self, ckpt: Checkpoint) -> bool:
        return compensated(ckpt) and super().matches(ckpt)


def compensated(ckpt: Checkpoint) -> bool:
    """Every layer's o_proj and down_proj carry a bias, and its q_proj and gate_proj none."""
    found = find_family(ckpt, strict=False)
    if not found:
        return False
    fam, prefix, layers = found
    if not (fam.q and fam.o and fam.down and fam.gate):
        return False
    shapes = ckpt.shapes

    def biased(i: int, module: str) -> bool:
        return f"{prefix}.{i}.{module}.bias" in shapes

    return bool(layers) and all(biased(i, fam.o) and biased(i, fam.down)
                                and not biased(i, fam.q) and not biased(i, fam.gate)
                                for i in layers)
