"""Per-language adapters (X-MOD): one bottleneck MLP per language in every layer.

``XmodOutput`` holds an ``adapter_modules`` dict keyed by language code (config.json's
``languages``), each an ``XmodAdapter``: ``dense1`` (hidden -> hidden //
``adapter_reduction_factor``) and ``dense2`` back (transformers 5.24
``XmodAdapter.__init__``). The table is derived with the default languages (``en_XX``), so a
language segment is named ``{lang}`` in table patterns (:func:`pattern`): a checkpoint's
every language is held to the same tensors. The bottleneck width is a GEMM width of its
own (``adapter``), judged; config.json records only the factor, never the width, so it is
reported, not padded (:data:`ADAPTER_NOT_PADDED`).
"""
from __future__ import annotations

import re

_LANGUAGE = re.compile(r"\.adapter_modules\.[^.]+\.")
ADAPTER_NOT_PADDED = ("an adapter's bottleneck is hidden_size // adapter_reduction_factor: "
                      "config.json holds no key for the width itself, so it is reported, "
                      "not padded")

#: RoCBert's map_inputs_layer reads its embeddings side by side (:mod:`.derive_config`)
CONCAT_NOT_PADDED = ("the concatenated input embeddings' width is hidden_size plus the "
                     "pronunciation and shape embedding widths: it is reported, not padded")


def pattern(name: str) -> str:
    """``...adapter_modules.de_DE.dense1.weight`` -> ``...adapter_modules.{lang}.dense1...``."""
    return _LANGUAGE.sub(".adapter_modules.{lang}.", name)


def names(name: str, config: dict) -> list[str]:
    """``name`` for every language config.json lists, where it has a ``{lang}`` segment (none
    listed: the pattern itself, which no checkpoint holds, so the accounting refuses)."""
    languages = config.get("languages")
    if "{lang}" not in name or not isinstance(languages, list):
        return [name]
    return [name.replace("{lang}", str(lang)) for lang in languages]
