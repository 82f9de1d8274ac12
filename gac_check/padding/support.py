"""Which (format, family) pairs ``--repair`` writes: those whose output is tested end to end.

A repair that exits 0 with a checkpoint its loader rejects is the worst thing this tool can
do, because users trust exit 0. So a pair is repaired only where tests load the output with
the compressor's own loading call (tests/compressors.py, tests/slicegpt.py) or gac-check's
stock-model loaders (the equivalence suites) and compare logits; every other pair is refused
before anything is written. docs/formats.md has the same table with what each cell means.
A dense or table-read (``derived``) checkpoint with a ``model_type`` is held to that type
instead: repaired only where padding/families.py's ``PROVEN`` says its own class loads the
output with equal logits (tests/test_repair_families.py); a table-read one is also held to its
class's shapes before writing (padding/class_proof.py).
"""
from __future__ import annotations

from gac_check.padding.families import PROVEN

#: format -> families whose repaired output is loaded and compared in the tests. ``llama``
#: covers every model with Llama's module names (Llama, Mistral, Qwen2); ``mixtral`` and
#: ``qwen2_moe`` are the mixture-of-experts layouts (gac_check/formats/moe.py), repaired and
#: reloaded with transformers' own classes in tests/test_moe.py; ``gpt_oss`` its fused experts
#: (gac_check/formats/gpt_oss.py, tests/test_gpt_oss.py).
REPAIRABLE: dict[str, frozenset[str]] = {
    "slicegpt": frozenset({"llama", "opt", "phi", "phi3"}),
    "llm-pruner": frozenset({"llama"}),
    # FLAP's output, rebuilt with its biases and loaded strictly in tests/test_pruners.py
    "flap": frozenset({"llama"}),
    "svd-llm": frozenset({"llama"}),
    "asvd": frozenset({"llama", "bert"}),
    "palu": frozenset({"llama"}),
    "dense": frozenset({"llama", "bert", "mixtral", "qwen2_moe", "gpt_oss"}),
    "mla": frozenset({"deepseek", "deepseek_moe"}),
    # DeciLM / Nemotron-NAS block_configs (formats/decilm.py): Llama's modules per layer,
    # rebuilt per block from OUT's block_configs in tests/test_decilm.py
    "decilm": frozenset({"llama"}),
    "per-layer": frozenset({"llama"}),
}


def unsupported(fmt: str, family: str | None, model_type: object = None) -> str | None:
    """Why ``--repair`` refuses this pair, or None when it is tested end to end.

    A dense checkpoint is judged by its config's ``model_type``, where it has one: repaired
    only where that type's repair is proven in its own class (padding/families.py), since
    one module layout ("llama") covers types whose classes build differently."""
    if fmt in ("dense", "derived") and isinstance(model_type, str):
        return _dense_unsupported(model_type, fmt)
    tested = REPAIRABLE.get(fmt, frozenset())
    if family in tested:
        return None
    what = f"the {family} family" if family else "an architecture gac-check does not know"
    return (f"is a {fmt} checkpoint of {what}; --repair writes {fmt} checkpoints only of "
            f"families whose repaired output is tested in the compressor's own loader "
            f"({', '.join(sorted(tested)) or 'none'}), so it refuses rather than write one "
            "that may not load (the check above still holds)")


def _dense_unsupported(model_type: str, fmt: str = "dense") -> str | None:
    if model_type in PROVEN:
        return None
    how = "dense" if fmt == "dense" else "transformers-class-table (format derived)"
    return (f"is a {how} checkpoint of model_type {model_type!r}; --repair refuses it "
            "rather than write a checkpoint its own class may not load: no test builds it in "
            "its own class, repairs it and loads the output strictly with equal logits "
            "(tests/test_repair_families.py; the check above still holds; docs/repair.md "
            "lists the families --repair writes)")


def gguf_instead(ftype: str) -> str:
    """Why a GGUF file is not repaired in place, and the commands that do it: its quantized
    blocks cannot be zero-padded exactly without dequantizing, and a padded HF model converted
    and quantized again gets the nominal types at the padded widths."""
    return (f"is a GGUF file ({ftype}); --repair does not rewrite GGUF files. "
            "Repair the Hugging Face model it was made from, then convert and quantize again: "
            f"gac-check HF_DIR --repair OUT --target llama.cpp,quant={ftype}; "
            "python convert_hf_to_gguf.py OUT --outtype f16 --outfile OUT-f16.gguf; "
            f"llama-quantize OUT-f16.gguf OUT-{ftype}.gguf {ftype}")
