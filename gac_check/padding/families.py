"""The repair plan of each model family, as data: which config.json key records each padded
width, and which families ``--repair`` writes for because their padded output is proven in
their own transformers class.

The sites (gac_check/formats) say which producer rows and consumer columns move together
(gate/up rows with down columns, q/k/v rows with o columns, a fused qkv's three runs, each
expert's bank, a router's rows over its experts); the plan pads them all at once. What the
sites cannot say is the name a family's config gives a width: Qwen2-MoE records its experts'
width as ``moe_intermediate_size``, Cohere2-MoE as ``intermediate_size``, OPT its MLP as
``ffn_dim``. A width padded in the tensors but not in config.json builds a class that does not
fit them, so a padded site whose key config.json lacks is refused (padding/plan.py), and the
keys below correct the sites' defaults per ``model_type``.

:data:`PROVEN` lists the ``model_type`` values whose dense checkpoints ``--repair`` writes:
each is built tiny from its own config class with misaligned widths, repaired by the CLI,
loaded strictly with ``AutoModelForCausalLM.from_pretrained`` and compared logit for logit
(tests/test_repair_families.py, which also holds this table to that suite). Every other
``model_type`` is refused before anything is written, in one line saying no test proves it
(padding/support.py). Widths that cannot be padded exactly at all (a norm or RoPE over the
padded axis: hidden, a RoPE head_dim, MLA's normed latents) are refused per site, with why,
by the sites' ``inexact`` in every family.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from gac_check.sites import DimSite, Role

#: model_type -> {role: the config.json key that records that role's width}, where it is not
#: the key the site names (formats/moe.py's layout default, formats/architectures.py's family)
WIDTH_KEYS: dict[str, dict[Role, str]] = {
    # Cohere2MoeExperts builds gate_up_proj / down_proj from config.intermediate_size
    # (transformers 5.24 models/cohere2_moe/modeling_cohere2_moe.py, Cohere2MoeExperts.__init__)
    "cohere2_moe": {Role.EXPERT: "intermediate_size"},
    # BioGptDecoderLayer builds fc1 / fc2 from config.intermediate_size (transformers 5.24
    # models/biogpt/modeling_biogpt.py), where OPT's fc1 / fc2 layout names ffn_dim
    "biogpt": {Role.INTERMEDIATE: "intermediate_size"},
}

#: model_type values whose dense repair is proven in their own class (see module docstring);
#: ``bert`` (BertModel, no causal LM head) in suites/test_repair_equivalence.py and tests/
PROVEN: frozenset[str] = frozenset({
    "arcee", "bert", "cohere", "cohere2", "cohere2_moe", "cwm", "ernie4_5", "exaone4", "gemma",
    "gemma2", "gemma3_text", "gpt_oss", "granite", "granite_swa", "internlm3", "iquestcoder",
    "jais2", "llama", "mellum", "ministral3", "mistral", "mixtral", "nemotron", "olmo", "opt",
    "phi", "phi3", "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3",
    "stablelm", "vaultgemma",
    # read through the class table (format derived): config key found and shapes held to the
    # class by padding/class_proof.py, logits proven in tests/test_repair_derived.py and the
    # slow sweep of tests/test_repair_families.py
    "falcon", "gpt2", "gpt_neox", "granitemoe", "olmoe", "starcoder2",
    "apertus", "apertus1p5_text", "aria_text", "beam", "bert-generation", "big_bird",
    "biogpt", "deberta", "deberta-v2", "ernie", "ernie4_5_moe", "exaone", "exaone_moe",
    "flex_olmo", "flint", "roformer", "rwkv", "sarvam_moe", "solar_open", "trocr", "xglm",
    "glm", "glm4", "glm4_moe", "gpt-sw3", "gpt_bigcode", "granitemoe_swa", "granitemoeshared",
    "hyperclovax", "jetmoe", "kolibri1", "laguna", "lara_mini", "llama4_text", "megatron-bert",
    "minimax_m2", "minimax_m3_vl_text", "modernbert", "nanochat", "olmo2", "olmo3", "persimmon",
    # proven on the zoo's tiny build (gac_check/testing/zoo.py), which their defaults need
    "camembert", "data2vec-text", "gpt_neo", "helium", "hunyuan_v1_dense", "hunyuan_v1_moe",
    "ministral", "modernbert-decoder", "roberta", "xlm-roberta",
    "xlm-roberta-xl", "afmoe", "electra", "hy_v3", "lfm3", "minimax", "qwen3_5", "qwen3_5_moe",
    "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next", "rembert",
    "ctrl", "diffllama", "cpmant",
    # hybrids on the zoo's tiny build: the MLP / experts padded, the recurrent mixers aligned
    "bamba", "falcon_h1", "granitemoehybrid", "inkling_text", "kimi_linear", "nemotron_h",
    "recurrent_gemma", "zamba", "zamba2",
    # composites (text_config / towers: formats/derive_composite.py), the text model's MLP
    # padded under text_config's key, on the zoo's tiny build (tests/test_composite_models.py)
    "fuyu", "gemma3", "git", "got_ocr2", "moss_transcribe_diarize", "phi4_multimodal",
    "mimo_v2_flash", "prophetnet", "qwen4_exp", "qwen4_exp_text", "xmod", "roc_bert",
    # the same, once the class proof counted layers as their config class does (ALBERT, Dory,
    # Doge) and the zoo built GPT-J's RoPE inside its heads (a forward that ran: BART's family
    # too)
    "albert", "bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "codegen",
    "doge", "dory", "gptj", "marian", "mbart", "mvp", "pegasus",
    # a text model saved alone (Emu3ForCausalLM, MllamaForCausalLM): read as dense Llama
    # modules, loaded by the class config.json's architectures names
    "emu3_text_model", "mllama_text_model",
    # its every bias sits under roberta_prelayernorm.: no longer taken for a norm by its name
    "roberta-prelayernorm",
    # read by another branch (its H and L modules' MLPs), proven on the zoo's tiny build
    "hrm_text",
})

def width_key(model_type: object, role: Role) -> str | None:
    """The config.json key ``model_type`` records ``role``'s width under, where the table
    says (None: the site's own key holds)."""
    return WIDTH_KEYS.get(model_type, {}).get(role) if isinstance(model_type, str) else None


def with_width_keys(sites: Iterable[DimSite], config: Mapping) -> list[DimSite]:
    """The sites with the config key their family records each width under
    (:data:`gac_check.padding.families.WIDTH_KEYS`), where it is not the site's default."""
    out = []
    for site in sites:
        key = width_key(config.get("model_type"), site.role)
        out.append(site if key is None or site.config_field == (key,)
                   else replace(site, config_field=(key,)))
    return out


def unrecorded(site: DimSite, config: Mapping) -> str | None:
    """Why a site whose width config.json names a key for cannot be padded: config.json has
    no such key, so OUT's config would build the old width and its class would not load the
    padded tensors. None where the key is there (or the site names none)."""
    if not site.config_field:
        return None
    node: object = config
    for key in site.config_field:
        if not isinstance(node, Mapping) or key not in node:
            where = ".".join(site.config_field)
            return (f"config.json has no {where}, the key that records this width, so OUT's "
                    "config would still build the old width and its class could not load "
                    "the padded tensors")
        node = node[key]
    return None
