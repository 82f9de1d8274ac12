"""Checkpoint formats: detect which compressor wrote a directory and describe its DimSites."""
from __future__ import annotations

from gac_check.checkpoint import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.asvd import ASVD
from gac_check.formats.base import Format
from gac_check.formats.dense import Dense

#: Most specific first: a compressed checkpoint also looks like a (partial) dense one.
FORMATS: list[Format] = [ASVD(), Dense()]


def detect(ckpt: Checkpoint) -> Format:
    for fmt in FORMATS:
        if fmt.matches(ckpt):
            return fmt
    raise BadInput("is not a format gac-check recognises (no transformer layers found)",
                   ckpt.path)


__all__ = ["FORMATS", "Format", "detect"]
