"""Run any checkpoint layout gac-check repairs as a stock transformers model, and write them.

Equivalence can only be proven on a model that runs. ASVD-layout directories load through
:mod:`gac_check.models.lowrank`; PaLU and SVD-LLM ship their own modeling code (remote code we never
run) and LLM-Pruner pickles whole models (which we never unpickle), so this module rebuilds
each as the stock architecture with the layout's modules swapped in from the tensor names and
shapes alone: a PaLU ``HeadwiseLowRank`` (VT then one U per head group), an SVD-LLM pair
(``X_v_proj`` then ``X_u_proj``) and linears resized to pruned shapes. Next to each loader is
the writer that turns a dense model into that layout (a truncated SVD per matrix or group, or
a channel prune), so the suites build real checkpoints of every format and round-trip them.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from gac_check.checkpoint.index import open_checkpoint
from gac_check.checkpoint.tensors import read_state
from gac_check.errors import BadInput
from gac_check.models.lowrank import (
    build_skeleton,
    causal_lm_names,
    factorize,
    is_rebuilt_buffer,
    match_prefix,
    swap_low_rank,
    tied_names,
)

PALU_VT = re.compile(r"^(.*)\.VT\.weight$")
SVDLLM_U = re.compile(r"^(.*)\.(\w+)_u_proj\.weight$")


class HeadwiseLowRank(nn.Module):
    """PaLU's K/V projection: ``VT`` to the concatenated group latents, one ``U.{g}`` each."""

    def __init__(self, in_features: int, ranks: list[int], group_out: list[int],
                 bias: bool) -> None:
        super().__init__()
        self.ranks = list(ranks)
        self.VT = nn.Linear(in_features, sum(ranks), bias=False)
        self.U = nn.ModuleList(nn.Linear(r, o, bias=bias) for r, o in zip(ranks, group_out,
                                                                          strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latents = torch.split(self.VT(x), self.ranks, dim=-1)
        return torch.cat([u(z) for u, z in zip(self.U, latents, strict=True)], dim=-1)


class _Chain(nn.Module):
    """``second(first(x))`` over linears registered elsewhere (SVD-LLM names the factors on the
    attention/MLP module itself, so they must not be registered a second time here)."""

    def __init__(self, first: nn.Linear, second: nn.Linear) -> None:
        super().__init__()
        self._pair = (first, second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pair[1](self._pair[0](x))


def load_model(model_dir: Path | str) -> nn.Module:
    """A ready-to-run model (eval, fp32) from a dense, ASVD, PaLU, SVD-LLM or pruned checkpoint.

    The architecture comes from config.json; every module the tensors say is shaped otherwise
    is swapped before a strict load, so a wrong repair fails loudly instead of loading
    half the weights.
    """
    model_dir = Path(model_dir)
    ckpt = open_checkpoint(model_dir)
    model = build_skeleton(model_dir, causal_lm_names(ckpt.tensors))
    swap_low_rank(model, ckpt.config.get("truncation_ranks") or {})
    state = match_prefix(model, read_state(ckpt))
    _swap_palu(model, state)
    _swap_svdllm(model, state)
    _resize_linears(model, state)
    state = match_prefix(model, state)
    # a tied name shares its Parameter with the rest of its group, so loading one fills all
    tied = tied_names(model.state_dict())
    loaded_groups = {tied[n] for n in state if n in tied}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not is_rebuilt_buffer(m)
               and not (m in tied and tied[m] in loaded_groups)]
    unexpected = [u for u in unexpected if not is_rebuilt_buffer(u)]
    if missing or unexpected:
        raise BadInput(f"tensors do not match the architecture (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})", model_dir)
    return model.float().eval()


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _swap_palu(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    for key in list(state):
        m = PALU_VT.match(key)
        if not m:
            continue
        module = m.group(1)
        us = []
        while f"{module}.U.{len(us)}.weight" in state:
            us.append(state[f"{module}.U.{len(us)}.weight"])
        bias = f"{module}.U.0.bias" in state
        _set(model, module, HeadwiseLowRank(state[key].shape[1], [u.shape[1] for u in us],
                                            [u.shape[0] for u in us], bias))


def _swap_svdllm(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    for key in list(state):
        m = SVDLLM_U.match(key)
        v_key = f"{m.group(1)}.{m.group(2)}_v_proj.weight" if m else ""
        if not m or v_key not in state:
            continue
        parent = model.get_submodule(m.group(1))
        u, v = state[key], state[v_key]
        has_bias = f"{m.group(1)}.{m.group(2)}_u_proj.bias" in state
        first = nn.Linear(v.shape[1], v.shape[0], bias=False)
        second = nn.Linear(u.shape[1], u.shape[0], bias=has_bias)
        setattr(parent, f"{m.group(2)}_v_proj", first)
        setattr(parent, f"{m.group(2)}_u_proj", second)
        setattr(parent, f"{m.group(2)}_proj", _Chain(first, second))


def _resize_linears(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Linears whose checkpoint weight has other shapes (pruned rows/columns) are rebuilt."""
    for name, mod in list(model.named_modules()):
        w = state.get(f"{name}.weight")
        if isinstance(mod, nn.Linear) and w is not None and tuple(w.shape) != tuple(
                mod.weight.shape):
            _set(model, name, nn.Linear(w.shape[1], w.shape[0],
                                        bias=f"{name}.bias" in state))


# ------------------------------------------------------------------------------- writers
def palu_state(model: nn.Module, group_size: int, ranks: dict[str, list[int]]
               ) -> dict[str, torch.Tensor]:
    """The PaLU-layout state dict: each named k/v projection factorised per head group.

    ``ranks`` maps a module (``model.layers.0.self_attn.k_proj``) to one r_g per group of
    ``group_size`` heads; W_g ~ U_g @ VT_g by truncated SVD, VT stacked over groups.
    """
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    head_dim = model.config.head_dim if getattr(model.config, "head_dim", None) else (
        model.config.hidden_size // model.config.num_attention_heads)
    rows = head_dim * group_size
    for module, group_ranks in ranks.items():
        w = state.pop(f"{module}.weight")
        bias = state.pop(f"{module}.bias", None)
        if w.shape[0] != rows * len(group_ranks):
            raise ValueError(f"{module} has {w.shape[0]} rows, not {len(group_ranks)} groups "
                             f"of {rows}")
        vts = []
        for g, r in enumerate(group_ranks):
            f = factorize(w[g * rows:(g + 1) * rows], r)
            state[f"{module}.U.{g}.weight"] = f.A.contiguous()
            vts.append(f.B)
            if bias is not None:
                state[f"{module}.U.{g}.bias"] = bias[g * rows:(g + 1) * rows].clone()
        state[f"{module}.VT.weight"] = torch.cat(vts).contiguous()
    return state


def svdllm_state(model: nn.Module, ranks: dict[str, int]) -> dict[str, torch.Tensor]:
    """The SVD-LLM-layout state dict: ``P.N_proj`` -> ``P.N_u_proj`` [out, r], ``P.N_v_proj``
    [r, in] (a bias, where there is one, goes with the u half, which produces the output)."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for module, rank in ranks.items():
        if not module.endswith("_proj"):
            raise ValueError(f"SVD-LLM only splits *_proj linears, not {module}")
        stem = module[: -len("_proj")]
        f = factorize(state.pop(f"{module}.weight"), rank)
        state[f"{stem}_u_proj.weight"] = f.A.contiguous()
        state[f"{stem}_v_proj.weight"] = f.B.contiguous()
        if f"{module}.bias" in state:
            state[f"{stem}_u_proj.bias"] = state.pop(f"{module}.bias")
    return state


def prune_intermediate(model: nn.Module, sizes: dict[int, int]) -> nn.Module:
    """LLM-Pruner-style channel pruning in place: layer i's MLP keeps its first ``sizes[i]``
    channels (gate/up rows, down columns); the config keeps the dense size, as LLM-Pruner's
    does."""
    layers = model.model.layers
    for i, keep in sizes.items():
        mlp = layers[i].mlp
        for name in ("gate_proj", "up_proj"):
            old = getattr(mlp, name)
            new = nn.Linear(old.in_features, keep, bias=old.bias is not None)
            new.weight.data = old.weight.data[:keep].clone()
            if old.bias is not None:
                new.bias.data = old.bias.data[:keep].clone()
            setattr(mlp, name, new)
        old = mlp.down_proj
        new = nn.Linear(keep, old.out_features, bias=old.bias is not None)
        new.weight.data = old.weight.data[:, :keep].clone()
        if old.bias is not None:
            new.bias.data = old.bias.data.clone()
        mlp.down_proj = new
    return model
