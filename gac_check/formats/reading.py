"""Reading a checkpoint into sites: the hand-written formats first, then the class table.

The compressor formats and hand-written families (:data:`.FORMATS`) know layouts no
transformers class builds (ASVD, SVD-LLM, PaLU, SliceGPT, LLM-Pruner) and carry the repairs
proven so far; where they find no layers, or leave a tensor of a plain Hugging Face model
unread, the layout table derived from transformers' own classes (:mod:`.derived`) reads the
model instead. A compressor format's refusal stands: its tensors are not a stock class's
(LLM-Pruner's safetensors layout, known only by its widths, excepted: :func:`_widths_only`),
except where the layers that format read are an encoder tower's in the class table (a
multimodal model's vision tower is no pruned language model: formats/derived_towers.py).
"""
from __future__ import annotations

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import NotRead
from gac_check.formats import detect
from gac_check.formats.accounting import Accounting, account, require_accounted
from gac_check.formats.base import Format
from gac_check.formats.derived import Derived
from gac_check.sites import DimSite


def read_sites(ckpt: Checkpoint) -> tuple[Format, list[DimSite], Accounting]:
    """The format, its sites and where every tensor went; a refusal (BadInput) when no
    reader accounts for every tensor. Only :class:`NotRead` hands the model to the table: any
    other refusal of the hand-written readers is about a layout they know, and stands."""
    fmt: Format | None = None
    try:
        fmt = detect(ckpt)
        sites = fmt.sites(ckpt)
        accounting = account(ckpt, sites)
        require_accounted(accounting, ckpt)
        return fmt, sites, accounting
    except NotRead:
        table = Derived()
        plain = (fmt is None or fmt.name == "dense" or _widths_only(fmt, ckpt)
                 or table.family_in_tower(ckpt))
        if ckpt.gguf is not None or not plain or not table.matches(ckpt):
            raise
    sites = table.sites(ckpt)
    accounting = account(ckpt, sites, fixed=table.fixed(ckpt),
                         ssm=table.ssm_parameters(ckpt))
    require_accounted(accounting, ckpt)
    return table, sites, accounting


def _widths_only(fmt: Format, ckpt: Checkpoint) -> bool:
    """LLM-Pruner's safetensors output is recognised only by layer widths that disagree
    with config.json, which a stock class with layers of different kinds shows as well
    (Kimi-Linear's delta-attention q_proj beside its latent attention's head count,
    Inkling's sliding-window heads): where that reader leaves a tensor unread, the class
    table may read the model. A pickled LLM-Pruner model stays its reader's."""
    return fmt.name == "llm-pruner" and ckpt.pickled_model is None
