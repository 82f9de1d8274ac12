"""Build a working transformers model from an ASVD-layout checkpoint (ours or ASVD's).

ASVD ships its own modeling files behind ``auto_map``, which would need trust_remote_code; we
never set that. Instead we build the stock architecture from config.json, swap each module
named in ``truncation_ranks`` for a :class:`LowRankLinear` whose parameter names match the
checkpoint (``X.BLinear.weight``, ``X.ALinear.weight``), and load the tensors strictly.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from gac_check.errors import BadInput

T = TypeVar("T")


class LowRankLinear(nn.Module):
    """``y = A(B(x))``: B maps in -> r, A maps r -> out (and carries the bias)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.BLinear = nn.Linear(in_features, rank, bias=False)
        self.ALinear = nn.Linear(rank, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ALinear(self.BLinear(x))


def model_class(config, causal_lm: bool):
    """The stock transformers class named by config.architectures; without one, the causal-LM
    or bare auto class, as the tensor names suggest."""
    import transformers

    for arch in config.architectures or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModelForCausalLM if causal_lm else transformers.AutoModel


def build_skeleton(model_dir: Path, causal_lm: bool = False):
    """The stock model for config.json with random weights (no hub, no remote code)."""
    from transformers import AutoConfig

    if not (Path(model_dir) / "config.json").is_file():
        raise BadInput("has no config.json; the architecture is built from it", model_dir)
    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        # transformers' messages run to paragraphs of install advice; the first line says why
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BadInput(f"config.json is not a usable transformers config: {reason}",
                       model_dir) from exc
    cls = model_class(config, causal_lm)
    if cls.__name__.startswith("AutoModel"):
        return cls.from_config(config)
    return cls._from_config(config)


def swap_low_rank(model: nn.Module, ranks: dict[str, int]) -> None:
    """Replace each named nn.Linear by a LowRankLinear of the given rank, in place."""
    for name, rank in ranks.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child, None)
        if not isinstance(old, nn.Linear | LowRankLinear):
            raise BadInput(f"truncation_ranks names {name!r}, which is not a linear layer")
        setattr(parent, child, LowRankLinear(old.in_features, old.out_features, int(rank),
                                             bias=_has_bias(old)))


def _has_bias(module: nn.Module) -> bool:
    if isinstance(module, LowRankLinear):
        return module.ALinear.bias is not None
    return module.bias is not None


@dataclass(frozen=True)
class Factors:
    """W ~ A @ B with A [out, r] (sqrt of singular values folded into both) and B [r, in]."""

    A: torch.Tensor
    B: torch.Tensor


def factorize(weight: torch.Tensor, rank: int, dtype: torch.dtype | None = None) -> Factors:
    """Factors in ``dtype`` (default: the weight's), rounded once from the float64 SVD."""
    U, S, Vh = torch.linalg.svd(weight.double(), full_matrices=False)
    root = S[:rank].sqrt()
    A = U[:, :rank] * root
    B = root[:, None] * Vh[:rank]
    dtype = dtype or weight.dtype
    return Factors(A.to(dtype), B.to(dtype))


def causal_lm_names(names) -> bool:
    """Whether tensor names come from a causal-LM wrapper (``lm_head``, ``model.`` prefix)."""
    return any(n == "lm_head.weight" or n.startswith("model.") for n in names)


def match_prefix(model: nn.Module, state: dict[str, T]) -> dict[str, T]:
    """Checkpoints saved from a bare BertModel lack the ``bert.`` prefix of a task model, and
    vice versa; align the names to the model we built."""
    own = set(model.state_dict())
    if all(k in own for k in state):
        return state
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and all(f"{prefix}.{k}" in own for k in state):
        return {f"{prefix}.{k}": v for k, v in state.items()}
    stripped = {k.removeprefix(f"{prefix}."): v for k, v in state.items()}
    return stripped if all(k in own for k in stripped) else state


def is_rebuilt_buffer(name: str) -> bool:
    """Buffers rebuilt at init (rotary inv_freq, position_ids) need no tensor."""
    return name.endswith(("position_ids", "inv_freq"))


def tied_names(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Each name whose tensor shares its storage with another (tied output embeddings such as
    ``lm_head`` or BERT's ``cls.predictions.decoder``, aliased biases), mapped to the first name
    of its group in ``state``'s order.

    Asking the model rather than listing known heads covers every architecture; safetensors
    refuses to write aliases, so writers keep one name per group and loaders accept any.
    """
    first: dict[tuple[int, tuple[int, ...]], str] = {}
    groups: dict[str, str] = {}
    for name, t in state.items():
        if t.numel() == 0 or t.device.type == "meta":
            continue  # empty and meta tensors may all report the same (null) pointer
        key = (t.data_ptr(), tuple(t.shape))
        if key in first:
            groups[name] = groups[first[key]] = first[key]
        else:
            first[key] = name
    return groups
