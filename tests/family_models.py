"""Tiny models of any transformers causal-LM family, built from the family's own config class
with every MLP / expert width misaligned (173 by default): what tests/test_repair_families.py
repairs and loads back in the same class.

Only sizes are set, by the key each config class has (``hidden_size`` or ``n_embd`` or
``d_model``, ``intermediate_size`` or ``ffn_dim`` or ``n_inner`` or ``moe_intermediate_size``
...); everything else is the class's default, so the model is the family's as transformers
builds it. Special token ids are cleared: the defaults point past a 128-token vocabulary.
"""
from __future__ import annotations

from pathlib import Path

#: every config key that records an MLP or expert width in some family
WIDTH_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "moe_intermediate_size", "d_ff",
              "ffn_hidden_size", "shared_expert_intermediate_size", "decoder_ffn_dim",
              "inner_hidden_size", "dff", "dim_ff")
#: the tiny sizes, under every name a family's config may give them
SIZES = {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "n_embd": 64, "n_layer": 2, "n_head": 4, "d_model": 64, "n_positions": 64,
         "num_layers": 2, "num_heads": 4, "decoder_layers": 2, "decoder_attention_heads": 4,
         "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
         "num_experts_per_tok": 2, "tie_word_embeddings": False, "pad_token_id": None,
         "bos_token_id": 1, "eos_token_id": 2}
#: PROVEN types this module's sizes do not build (a default they need: pad_token_id, head_dim,
#: rope parameters); their repair is proven on gac_check.testing.zoo's tiny build instead
#: (tests/test_repair_derived.py)
ZOO_BUILT = frozenset({"camembert", "data2vec-text", "gpt_neo", "helium", "hunyuan_v1_dense",
                       "hunyuan_v1_moe", "ministral", "modernbert-decoder", "roberta",
                       "xlm-roberta", "xlm-roberta-xl", "afmoe", "electra", "hy_v3", "lfm3",
                       "minimax", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text",
                       "qwen3_next", "rembert", "inkling_text", "kimi_linear", "recurrent_gemma",
                       "zamba", "zamba2", "bamba", "falcon_h1", "granitemoehybrid",
                       "nemotron_h", "fuyu", "gemma3", "git", "got_ocr2",
                       "moss_transcribe_diarize", "phi4_multimodal", "mimo_v2_flash",
                       "prophetnet", "qwen4_exp", "qwen4_exp_text", "xmod", "roc_bert",
                       "albert", "bart", "bigbird_pegasus", "blenderbot", "blenderbot-small",
                       "codegen", "doge", "dory", "gptj", "marian", "mbart", "mvp", "pegasus",
                       "emu3", "mllama", "roberta-prelayernorm", "hrm_text"})
#: ZOO_BUILT types whose build saves its text model under another model_type (PROVEN's)
SAVED_AS = {"emu3": "emu3_text_model", "mllama": "mllama_text_model"}
#: a model above this many parameters has a size key the table does not set: not built
MAX_PARAMS = 12_000_000


def config(model_type: str, width: int = 173, **overrides: object):
    """``model_type``'s own config class with the tiny sizes it has keys for, each width key
    it has set to ``width``, then ``overrides``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    probe = cls()
    kwargs = {k: v for k, v in SIZES.items() if hasattr(probe, k)}
    kwargs.update({k: width for k in WIDTH_KEYS if isinstance(getattr(probe, k, None), int)})
    if hasattr(probe, "n_inner"):  # GPT-2-style: None builds 4 x n_embd, no width key
        kwargs["n_inner"] = width
    kwargs.update(overrides)
    return cls(**kwargs)


def build(model_type: str, width: int = 173, seed: int = 0, **overrides: object):
    """The family's causal LM from :func:`config`, seeded, in eval mode, with eager experts
    (transformers' grouped GEMM refuses an expert width of 173: its strides are not 16-byte
    multiples). Raises ValueError when the tiny config still builds a big model."""
    import torch

    cfg = config(model_type, width, **overrides)
    auto = _auto(model_type)
    with torch.device("meta"):
        n = sum(p.numel() for p in auto.from_config(cfg).parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"{n:,} parameters at the tiny sizes: a size key SIZES lacks")
    torch.manual_seed(seed)
    model = auto.from_config(cfg).eval()
    if getattr(model, "_can_set_experts_implementation", lambda: False)():
        model.set_experts_implementation("eager")
    return model


def load(path: Path):
    """OUT loaded strictly by transformers' Auto class, eager experts; raises AssertionError
    naming the keys when any is missing, unexpected or mismatched."""
    import json

    saved = json.loads((Path(path) / "config.json").read_text())
    auto = _auto(saved["model_type"], saved.get("architectures"))
    model, info = auto.from_pretrained(path, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{path} does not load strictly: {bad}"
    if getattr(model, "_can_set_experts_implementation", lambda: False)():
        model.set_experts_implementation("eager")
    return model.eval()


def _auto(model_type: str, architectures: list[str] | None = None):
    """The causal-LM Auto class, or the masked-LM one for an encoder with no causal head
    (DeBERTa, CamemBERT, ...: read through the class table); for a text model saved alone
    under a type no Auto class maps (Emu3's ``emu3_text_model``), the built-in class its
    config.json's ``architectures`` names, as its user loads it."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    own = getattr(transformers, (architectures or [""])[0], None)
    if model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES and isinstance(own, type) \
            and issubclass(own, transformers.PreTrainedModel):
        return own
    return AutoModelForMaskedLM
