"""SliceGPT (microsoft/TransformerCompression) on every family it ships an adapter for: Llama,
OPT, Phi-2 and Phi-3, as its save writes them and as ``load_sliced_model`` reads them back.

Read from its repository (src/slicegpt/adapters/*_adapter.py, layernorm_fusion.py, rotate.py,
hf_utils.py; none of its code is here):

- ``fuse_modules`` folds every norm into the linears after it and replaces all norms by a
  weightless ``RMSN(hidden_size)``, so a sliced state dict has no norm tensors at all; a
  LayerNorm's bias becomes a bias of those linears, which is how OPT's ``lm_head`` gains a
  ``bias`` its stock model does not have;
- ``slice_rotated_model`` cuts, per layer, the attention inputs' and MLP inputs' columns, the
  attention and MLP outputs' rows (and biases) and the shortcut Qs to the widths the sidecar
  records; OPT slices both its token and its position table (``embedding_dimensions`` 0 and
  1); Phi-2's blocks are parallel, so attention and MLP read one width, both outputs write one,
  there is no ``mlp_shortcut_Q`` and the sidecar's attention-output and MLP-input tables are
  empty;
- ``run_slicegpt.py`` saves ``torch.save(model.state_dict(), <name>_<s>.pt)`` and the slicing
  config as ``<name>_<s>.json``, with the base model's JSON files beside them.

The Llama case rotates a real dense model (:func:`rotate_and_slice`). For the other
families the sliced weights are drawn at random in the sliced model itself: the round trip
compares that model before and after a repair, so what matters is SliceGPT's names, shapes and
modules, which are the ones its loader builds.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers.models.opt.modeling_opt import OPTLearnedPositionalEmbedding

VOCAB = 96


class RMSN(nn.Module):
    """SliceGPT's weightless RMSNorm: it divides by the *dense* hidden size (mean_dim), so
    zero features appended to a sliced stream change nothing."""

    def __init__(self, mean_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.mean_dim, self.eps = mean_dim, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).sum(-1, keepdim=True) / self.mean_dim
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


@dataclass(frozen=True)
class Adapter:
    """What SliceGPT's adapter for one family names (relative to a decoder layer)."""

    family: str
    config: str  # the transformers config class
    model: str  # the transformers *ForCausalLM class
    layers: str  # the layer list, from the *ForCausalLM root
    embeddings: tuple[str, ...]
    attention_inputs: tuple[str, ...]
    attention_output: str
    mlp_inputs: tuple[str, ...]
    mlp_output: str
    norms: tuple[str, ...]  # first (and second) layer norm
    pre_head_norm: str
    parallel: bool = False
    lm_head_bias: bool = False  # a LayerNorm's bias fused into lm_head (OPT) or its own (Phi-2)
    base: tuple[tuple[str, object], ...] = ()  # the tiny base config

    def mlp(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.family == "opt":
            return layer.fc2(layer.activation_fn(layer.fc1(x)))
        return layer.mlp(x)


_SHARED = (("vocab_size", VOCAB), ("num_hidden_layers", 2), ("num_attention_heads", 4),
           ("max_position_embeddings", 64), ("tie_word_embeddings", False))
ADAPTERS = {a.family: a for a in (
    Adapter("llama", "LlamaConfig", "LlamaForCausalLM", "model.layers", ("model.embed_tokens",),
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn.o_proj",
            ("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj",
            ("input_layernorm", "post_attention_layernorm"), "model.norm",
            base=(*_SHARED, ("intermediate_size", 176), ("num_key_value_heads", 4))),
    Adapter("opt", "OPTConfig", "OPTForCausalLM", "model.decoder.layers",
            ("model.decoder.embed_tokens", "model.decoder.embed_positions"),
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn.out_proj",
            ("fc1",), "fc2", ("self_attn_layer_norm", "final_layer_norm"),
            "model.decoder.final_layer_norm", lm_head_bias=True,
            base=(*_SHARED, ("ffn_dim", 176), ("word_embed_proj_dim", None))),
    Adapter("phi", "PhiConfig", "PhiForCausalLM", "model.layers", ("model.embed_tokens",),
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn.dense",
            ("mlp.fc1",), "mlp.fc2", ("input_layernorm",), "model.final_layernorm",
            parallel=True, lm_head_bias=True,
            base=(*_SHARED, ("intermediate_size", 176), ("partial_rotary_factor", 0.5))),
    Adapter("phi3", "Phi3Config", "Phi3ForCausalLM", "model.layers", ("model.embed_tokens",),
            ("self_attn.qkv_proj",), "self_attn.o_proj", ("mlp.gate_up_proj",),
            "mlp.down_proj", ("input_layernorm", "post_attention_layernorm"), "model.norm",
            base=(*_SHARED, ("intermediate_size", 176), ("num_key_value_heads", 2),
                  ("pad_token_id", 0))),
)}


def _orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))[0]


def rotate_and_slice(dense: nn.Module, widths: list[int], seed: int = 0
                     ) -> tuple[dict[str, torch.Tensor], dict]:
    """rotate_and_slice with random orthogonal Qs (SliceGPT's PCA needs data we skip): norms
    fused into the next linears, each residual segment rotated by its own Q and cut to its
    width (``widths``: the embedding's, then per layer the attention output's and the MLP
    output's; the last MLP output keeps the full width, as with the default unsliced head)."""
    sd = {k: v.detach().double().clone() for k, v in dense.state_dict().items()}
    cfg = dense.config
    n, hidden = cfg.num_hidden_layers, cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)

    def fuse(norm: str, linears: list[str]) -> None:
        w = sd.pop(f"{norm}.weight")
        for lin in linears:
            sd[f"{lin}.weight"] = sd[f"{lin}.weight"] * w

    q_prev, d_prev = _orthogonal(hidden, gen), widths[0]
    sd["model.embed_tokens.weight"] = (sd["model.embed_tokens.weight"] @ q_prev)[:, :d_prev]
    conf = {"hidden_size": hidden, "layers_num": n, "do_slice_head": False,
            "parallel_blocks": False, "embedding_dimensions": {"0": d_prev},
            "attention_input_dimensions": {}, "attention_output_dimensions": {},
            "mlp_input_dimensions": {}, "mlp_output_dimensions": {},
            "head_dimension": hidden, "const_dimension": None}
    for i in range(n):
        b = f"model.layers.{i}"
        fuse(f"{b}.input_layernorm", [f"{b}.self_attn.{p}_proj" for p in "qkv"])
        fuse(f"{b}.post_attention_layernorm", [f"{b}.mlp.gate_proj", f"{b}.mlp.up_proj"])
        for p in "qkv":
            sd[f"{b}.self_attn.{p}_proj.weight"] = (sd[f"{b}.self_attn.{p}_proj.weight"]
                                                    @ q_prev)[:, :d_prev]
        q_attn, d_attn = _orthogonal(hidden, gen), widths[1 + 2 * i]
        d_mlp = widths[2 + 2 * i] if i < n - 1 else hidden
        sd[f"{b}.attn_shortcut_Q"] = (q_prev.T @ q_attn)[:d_prev, :d_attn]
        sd[f"{b}.self_attn.o_proj.weight"] = (q_attn.T @ sd[f"{b}.self_attn.o_proj.weight"])[
            :d_attn]
        for p in ("gate", "up"):
            sd[f"{b}.mlp.{p}_proj.weight"] = (sd[f"{b}.mlp.{p}_proj.weight"] @ q_attn)[:, :d_attn]
        q_mlp = _orthogonal(hidden, gen)
        sd[f"{b}.mlp_shortcut_Q"] = (q_attn.T @ q_mlp)[:d_attn, :d_mlp]
        sd[f"{b}.mlp.down_proj.weight"] = (q_mlp.T @ sd[f"{b}.mlp.down_proj.weight"])[:d_mlp]
        for key, v in (("attention_input", d_prev), ("attention_output", d_attn),
                       ("mlp_input", d_attn), ("mlp_output", d_mlp)):
            conf[f"{key}_dimensions"][str(i)] = v
        q_prev, d_prev = q_mlp, d_mlp
    fuse("model.norm", ["lm_head"])
    sd["lm_head.weight"] = sd["lm_head.weight"] @ q_prev
    return sd, conf


def get(root: nn.Module, path: str) -> nn.Module:
    return root.get_submodule(path)


def put(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def config_of(family: str, hidden: int):
    adapter = ADAPTERS[family]
    cls = getattr(transformers, adapter.config)
    kwargs = {k: v for k, v in adapter.base if v is not None}
    if family == "opt":
        kwargs["word_embed_proj_dim"] = hidden
    return cls(hidden_size=hidden, attn_implementation="eager", **kwargs)


def _sliced_forward(adapter: Adapter) -> Callable:
    """The compressed decoder layer's forward: the residual crosses from one sliced width to
    the next through the shortcut Qs (one Q for a parallel block)."""

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        residual = hidden_states
        normed = get(self, adapter.norms[0])(hidden_states)
        attn, _ = self.self_attn(hidden_states=normed, attention_mask=attention_mask, **kwargs)
        shortcut = residual @ self.attn_shortcut_Q.to(residual.dtype)
        if adapter.parallel:
            return shortcut + attn + adapter.mlp(self, normed)
        hidden = shortcut + attn
        mlp = adapter.mlp(self, get(self, adapter.norms[1])(hidden))
        return hidden @ self.mlp_shortcut_Q.to(hidden.dtype) + mlp

    return forward


def _compressed_layer_class(adapter: Adapter, layer: nn.Module) -> type:
    return type(f"Compressed{type(layer).__name__}", (type(layer),),
                {"forward": _sliced_forward(adapter)})


def _dims(conf: dict, key: str) -> dict[int, int]:
    return {int(i): v for i, v in conf[key].items()}


def skeleton(family: str, config, conf: dict) -> nn.Module:
    """``load_sliced_model``'s model before its ``load_state_dict``: replace_layers and
    fuse_modules (norms become RMSN, a fused LayerNorm bias becomes lm_head's), the shortcut
    Qs, and slice_rotated_model's widths from the slicing config."""
    adapter = ADAPTERS[family]
    model = getattr(transformers, adapter.model)(config)
    hidden = config.hidden_size
    emb = _dims(conf, "embedding_dimensions")
    att_in, mlp_out = _dims(conf, "attention_input_dimensions"), _dims(conf,
                                                                       "mlp_output_dimensions")
    att_out = mlp_in = mlp_out if adapter.parallel else {}
    if not adapter.parallel:
        att_out = _dims(conf, "attention_output_dimensions")
        mlp_in = _dims(conf, "mlp_input_dimensions")

    def resize(path: str, rows: int | None = None, cols: int | None = None) -> None:
        old = get(layer_root, path)
        out_f, in_f = rows or old.out_features, cols or old.in_features
        put(layer_root, path, nn.Linear(in_f, out_f, bias=old.bias is not None))

    for k, path in enumerate(adapter.embeddings):
        old = get(model, path)
        new = (OPTLearnedPositionalEmbedding(old.num_embeddings - 2, emb[k])
               if isinstance(old, OPTLearnedPositionalEmbedding)
               else nn.Embedding(old.num_embeddings, emb[k]))
        put(model, path, new)
    layers = get(model, adapter.layers)
    for i, layer_root in enumerate(layers):
        layer_root.__class__ = _compressed_layer_class(adapter, layer_root)
        for path in adapter.attention_inputs:
            resize(path, cols=att_in[i])
        resize(adapter.attention_output, rows=att_out[i])
        for path in adapter.mlp_inputs:
            resize(path, cols=att_in[i] if adapter.parallel else mlp_in[i])
        resize(adapter.mlp_output, rows=mlp_out[i])
        for path in adapter.norms:
            put(layer_root, path, RMSN(hidden))
        layer_root.attn_shortcut_Q = nn.Parameter(torch.zeros(att_in[i], att_out[i]))
        if not adapter.parallel:
            layer_root.mlp_shortcut_Q = nn.Parameter(torch.zeros(mlp_in[i], mlp_out[i]))
    put(model, adapter.pre_head_norm, RMSN(hidden))
    model.lm_head = nn.Linear(mlp_out[len(layers) - 1], config.vocab_size,
                              bias=adapter.lm_head_bias)
    return model


def load(path: Path, family: str, stem: str) -> nn.Module:
    """``load_sliced_model(model_name, path, sparsity=s)``: config.json, ``<stem>.json`` (the
    slicing config) and ``model.load_state_dict(torch.load(<stem>.pt))``, strict."""
    adapter = ADAPTERS[family]
    config = getattr(transformers, adapter.config).from_pretrained(path)
    conf = json.loads((path / f"{stem}.json").read_text())
    model = skeleton(family, config, conf)
    model.load_state_dict(torch.load(path / f"{stem}.pt", map_location="cpu"))
    return model.eval()


def slicing_config(family: str, hidden: int, widths: list[int]) -> dict:
    """The sidecar ``run_slicegpt.py`` writes for ``widths``: the embedding's, then per layer
    the attention output's and MLP output's (one per layer for parallel blocks); the last MLP
    output keeps the full width, as with the default unsliced head."""
    adapter = ADAPTERS[family]
    per = 1 if adapter.parallel else 2
    n = (len(widths) - 1) // per + 1
    conf = {"hidden_size": hidden, "layers_num": n, "do_slice_head": False,
            "parallel_blocks": adapter.parallel,
            "embedding_dimensions": {str(k): widths[0] for k in range(len(adapter.embeddings))},
            "attention_input_dimensions": {}, "attention_output_dimensions": {},
            "mlp_input_dimensions": {}, "mlp_output_dimensions": {},
            "head_dimension": hidden, "const_dimension": None}
    prev = widths[0]
    for i in range(n):
        conf["attention_input_dimensions"][str(i)] = prev
        if adapter.parallel:
            out = widths[1 + i] if i < n - 1 else hidden
        else:
            attn = widths[1 + 2 * i]
            out = widths[2 + 2 * i] if i < n - 1 else hidden
            conf["attention_output_dimensions"][str(i)] = attn
            conf["mlp_input_dimensions"][str(i)] = attn
        conf["mlp_output_dimensions"][str(i)] = out
        prev = out
    return conf


def build(root: Path, family: str, widths: list[int], hidden: int = 256,
          dtype: torch.dtype = torch.float16, seed: int = 0) -> tuple[Path, str, nn.Module]:
    """A SliceGPT save of a tiny ``family`` model sliced to ``widths``: the directory, the
    file stem, and the sliced model as the compressor left it (fp32, for reference logits)."""
    config = config_of(family, hidden)
    conf = slicing_config(family, hidden, widths)
    torch.manual_seed(seed)
    model = skeleton(family, config, conf)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    state = {k: v.to(dtype).contiguous() for k, v in model.state_dict().items()}
    stem = f"tiny-{family}_0.3"
    root.mkdir(parents=True)
    torch.save(state, root / f"{stem}.pt")
    (root / f"{stem}.json").write_text(json.dumps(conf))
    config.save_pretrained(root)
    return root, stem, load(root, family, stem)
