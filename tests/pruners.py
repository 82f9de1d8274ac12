"""Two structured pruners' outputs, as their own code writes them: Torch-Pruning's LLM example
(VainF/Torch-Pruning examples/LLMs/prune_llm.py) and FLAP (CASIA-IVA-Lab/FLAP).

**Torch-Pruning.** The example prunes with ``tp.pruner.BasePruner`` (local, one ratio for
hidden size and heads, whole heads, ``round_to=4``), sets config.json's ``hidden_size``,
``num_attention_heads`` and ``intermediate_size`` from the pruned modules, and calls
``save_pretrained``. torch-pruning 1.6.1's pruner does not finish on transformers 5 (its
dependency graph loops through the rotary embedding's concatenations in
``DependencyGraph.get_all_groups``; it runs on 4.48.3, the version its README shows), so the
builder removes the rows and columns with torch-pruning's own pruning functions
(``tp.prune_linear_out_channels`` and the like) at the widths the real pruner chose on the same
model, recorded from a run under transformers 4.48.3 in tests/data/torch_pruning_qwen2.json,
then applies the example's config updates and saves. Its users load it with
``AutoModelForCausalLM.from_pretrained`` (the example's README).

**FLAP.** ``main.py`` loads the model with FLAP's own ``models/hf_llama/modeling_llama.py``
(head_dim fixed at 128; ``o_proj`` and ``down_proj`` with a bias), ``lib/prune.py``'s
``compress`` removes whole heads (q/k/v rows, o columns) and MLP channels per layer, writing
the bias compensation into ``o_proj.bias`` and ``down_proj.bias``, and ``main.py`` saves with
``model.save_pretrained`` under transformers 4.28.0 (its INSTALL.md): ``pytorch_model.bin`` (a
state dict, rotary ``inv_freq`` buffers included) and config.json at the dense sizes (no
layer's head count or MLP width is recorded anywhere). Its code does not run here: ``main.py``
moves the model to ``cuda:0``, ``get_llm`` indexes 32 layers, and the calibration reads
wikitext2 from the network; so the builder applies ``compress``'s row and column selection and
bias compensation to a tiny Llama with FLAP's shapes and saves what transformers 4.28's
save_pretrained writes. Nothing loads that output (FLAP/issues/7): FLAP's own modeling builds
every layer from config.json's ``num_attention_heads``, as transformers' does.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tests.compressors import Built

#: What the real Torch-Pruning run wrote (shapes and config.json), for the builder to match.
RECORDED = Path(__file__).parent / "data" / "torch_pruning_qwen2.json"
#: The base model of that run (tests/data/torch_pruning_qwen2.json, "made_with").
TP_BASE = dict(vocab_size=96, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
               num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
               attn_implementation="eager")


def _drop(n: int, keep: int, gen: torch.Generator) -> list[int]:
    """The indices a pruner removes: ``n - keep`` of ``range(n)``."""
    return sorted(torch.randperm(n, generator=gen)[: n - keep].tolist())


def _heads_rows(heads: list[int], head_dim: int) -> list[int]:
    return [h * head_dim + d for h in heads for d in range(head_dim)]


def torch_pruning_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    """The example's pruning of the recorded run's base, in memory, as the example leaves it."""
    import torch_pruning as tp

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**TP_BASE)).eval()
    want = json.loads(RECORDED.read_text())["config"]
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    hidden = _drop(cfg.hidden_size, want["hidden_size"], gen)
    tp.prune_embedding_out_channels(model.model.embed_tokens, hidden)
    tp.prune_linear_in_channels(model.lm_head, hidden)
    norms = [model.model.norm] + [m for layer in model.model.layers
                                  for m in (layer.input_layernorm,
                                            layer.post_attention_layernorm)]
    keep = [i for i in range(cfg.hidden_size) if i not in set(hidden)]
    for norm in norms:
        norm.weight = nn.Parameter(norm.weight.data[keep].clone())
    groups = cfg.num_key_value_heads
    per_group = cfg.num_attention_heads // groups
    kept_per_group = want["num_attention_heads"] // groups
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            tp.prune_linear_in_channels(lin, hidden)
        for lin in (attn.o_proj, mlp.down_proj):
            tp.prune_linear_out_channels(lin, hidden)
        # whole query heads, the same number out of every KV group (prune_num_heads, GQA)
        heads = [g * per_group + h for g in range(groups)
                 for h in _drop(per_group, kept_per_group, gen)]
        rows = _heads_rows(heads, head_dim)
        tp.prune_linear_out_channels(attn.q_proj, rows)
        tp.prune_linear_in_channels(attn.o_proj, rows)
        channels = _drop(cfg.intermediate_size, want["intermediate_size"], gen)
        tp.prune_linear_out_channels(mlp.gate_proj, channels)
        tp.prune_linear_out_channels(mlp.up_proj, channels)
        tp.prune_linear_in_channels(mlp.down_proj, channels)
    # the example's "Update model attributes" (its GQA branch: KV heads stay)
    cfg.hidden_size = model.lm_head.in_features
    for layer in model.model.layers:
        attn = layer.self_attn
        cfg.num_attention_heads = attn.q_proj.out_features // attn.head_dim
        attn.num_key_value_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        cfg.intermediate_size = layer.mlp.gate_proj.out_features
    return model


def build_torch_pruning(root: Path, seed: int = 0) -> Built:
    """``model.save_pretrained(args.save_model)``, as the example saves (no tokenizer here)."""
    model = torch_pruning_qwen2(seed)
    model.save_pretrained(root)
    config = json.loads((root / "config.json").read_text())
    config.pop("head_dim", None)  # Qwen2Config records none (the real run's config.json)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return Built(root, lambda p: AutoModelForCausalLM.from_pretrained(p).eval(), model)


# ------------------------------------------------------------------------------------- FLAP
#: FLAP's modeling_llama fixes head_dim at 128 (``LlamaAttention.__init__``).
FLAP_HEAD_DIM = 128
FLAP_BASE = dict(vocab_size=96, hidden_size=512, intermediate_size=688, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, head_dim=FLAP_HEAD_DIM,
                 tie_word_embeddings=False, attn_implementation="eager")
#: Per layer: the heads and MLP channels FLAP's AL-AM structure kept (they differ per layer).
FLAP_KEPT = ((3, 517), (2, 600))


def flap_state_dict(seed: int = 0) -> tuple[dict[str, torch.Tensor], dict]:
    """compress(layer, attn_mask, mlp_mask, ..., bias=True) on every layer of a Llama with
    FLAP's shapes: the kept rows and columns, and the bias compensation
    ``(mean_input * ~mask) @ W.T`` in o_proj.bias and down_proj.bias (the means are drawn: no
    calibration data here). Returns the state dict FLAP's model holds and the config.json
    transformers 4.28 writes for it (the dense sizes)."""
    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(**FLAP_BASE)).eval()
    gen = torch.Generator().manual_seed(seed)
    sd = {k: v.clone() for k, v in base.state_dict().items()}
    for i, (heads, channels) in enumerate(FLAP_KEPT):
        p = f"model.layers.{i}"
        head_mask = torch.zeros(FLAP_BASE["num_attention_heads"], dtype=torch.bool)
        head_mask[torch.randperm(len(head_mask), generator=gen)[:heads]] = True
        attn_mask = head_mask.repeat_interleave(FLAP_HEAD_DIM)
        mlp_mask = torch.zeros(FLAP_BASE["intermediate_size"], dtype=torch.bool)
        mlp_mask[torch.randperm(len(mlp_mask), generator=gen)[:channels]] = True
        for mask, rows, out in ((attn_mask, ("q_proj", "k_proj", "v_proj"), "o_proj"),
                                (mlp_mask, ("gate_proj", "up_proj"), "down_proj")):
            sub = "self_attn" if out == "o_proj" else "mlp"
            mean_inp = torch.randn(len(mask), generator=gen)
            w_out = sd[f"{p}.{sub}.{out}.weight"]
            sd[f"{p}.{sub}.{out}.bias"] = (mean_inp * ~mask) @ w_out.T
            sd[f"{p}.{sub}.{out}.weight"] = w_out[:, torch.where(mask)[0]].contiguous()
            for r in rows:
                sd[f"{p}.{sub}.{r}.weight"] = sd[f"{p}.{sub}.{r}.weight"][
                    torch.where(mask)[0]].contiguous()
        sd[f"{p}.self_attn.rotary_emb.inv_freq"] = 1.0 / (10000 ** (
            torch.arange(0, FLAP_HEAD_DIM, 2).float() / FLAP_HEAD_DIM))
    config = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
              "hidden_act": "silu", "hidden_size": FLAP_BASE["hidden_size"],
              "initializer_range": 0.02, "intermediate_size": FLAP_BASE["intermediate_size"],
              "max_position_embeddings": 2048, "model_type": "llama",
              "num_attention_heads": FLAP_BASE["num_attention_heads"],
              "num_hidden_layers": FLAP_BASE["num_hidden_layers"], "pad_token_id": 0,
              "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "torch_dtype": "float16",
              "transformers_version": "4.28.0", "use_cache": True,
              "vocab_size": FLAP_BASE["vocab_size"]}
    return sd, config


def build_flap(root: Path, seed: int = 0) -> Path:
    """FLAP's ``save_pretrained`` output: pytorch_model.bin (fp16, as get_llm loads) and the
    dense config.json."""
    sd, config = flap_state_dict(seed)
    root.mkdir(parents=True)
    torch.save({k: v.to(torch.float16) for k, v in sd.items()}, root / "pytorch_model.bin")
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return root


def load_flap(path: Path) -> LlamaForCausalLM:
    """The model FLAP holds after pruning (its modeling_llama: per-layer q/k/v/o and MLP
    widths, o_proj and down_proj with a bias), rebuilt on transformers' Llama from a
    pytorch_model.bin this test wrote: what runs the saved weights, since no loader does."""
    sd = torch.load(path / "pytorch_model.bin", weights_only=True)
    model = LlamaForCausalLM(LlamaConfig(**FLAP_BASE)).eval()
    for i, layer in enumerate(model.model.layers):
        for sub, names, biased in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj"),
                                    "o_proj"),
                                   (layer.mlp, ("gate_proj", "up_proj", "down_proj"),
                                    "down_proj")):
            kind = "self_attn" if sub is layer.self_attn else "mlp"
            for name in names:
                out, inp = sd[f"model.layers.{i}.{kind}.{name}.weight"].shape
                setattr(sub, name, nn.Linear(inp, out, bias=name == biased))
    sd = {k: v.float() for k, v in sd.items() if not k.endswith("inv_freq")}
    model.load_state_dict(sd, strict=True)
    return model.eval()
