"""No call of ours into transformers or torch is deprecated.

pyproject's ``filterwarnings`` turns a DeprecationWarning or FutureWarning into an error where
the warning is attributed to a gac_check module, but that catches only what the library warns
about with a stacklevel pointing at us. transformers' renamed keywords warn from inside torch's
module call (``past_key_values`` -> ``cache``: the FutureWarning's module is
``torch.nn.modules.module``), and its renamed outputs only log a line
(``output.past_key_values``). So this test drives each of our calls into transformers with
both warning categories raised as errors *and* transformers' logger watched for deprecations.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from gac_check.bench import workloads
from gac_check.models.compress import compress_dir
from gac_check.models.loaders import load_model
from gac_check.testing.models import FAMILIES, build, tiny_llama


class _Deprecations(logging.Handler):
    """Collects transformers' log lines that announce a deprecation."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "deprecat" in record.getMessage().lower():
            self.lines.append(record.getMessage())


@pytest.fixture
def strict():
    """Deprecations are errors, and transformers' deprecation log lines are collected
    (its ``warning_once`` cache cleared first, so an earlier test cannot have used them up)."""
    once = getattr(logging.Logger, "warning_once", None)
    if hasattr(once, "cache_clear"):
        once.cache_clear()
    handler = _Deprecations()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            warnings.simplefilter("error", FutureWarning)
            yield handler
    finally:
        logger.removeHandler(handler)
    assert not handler.lines, handler.lines


def test_model_workloads_prefill_and_decode(strict):
    cfg = workloads.llama_config(64, 4, 2, 16, 128, layers=1, vocab=128)
    workloads.decoder_layer(cfg, 1, 8, "float32").prepare("cpu").fn()
    workloads.model_forward(cfg, 1, 8, "float32", "prefill").prepare("cpu").fn()
    decode = workloads.model_forward(cfg, 1, 8, "float32", "decode").prepare("cpu")
    assert workloads.kv_cache(decode.fn()).get_seq_length() == 8


def test_building_saving_compressing_and_loading(strict, tmp_path: Path):
    for family in FAMILIES:
        build(family, {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 40,
                       "num_hidden_layers": 1, "num_attention_heads": 2})
    tiny_llama(num_hidden_layers=1).save_pretrained(tmp_path / "dense")
    compress_dir(tmp_path / "dense", tmp_path / "asvd", 0.8)
    for name in ("dense", "asvd"):
        load_model(tmp_path / name)
