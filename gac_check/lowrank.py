"""Build a working transformers model from an ASVD-layout checkpoint (ours or ASVD's).

ASVD ships its own modeling files behind ``auto_map``, which would need trust_remote_code; we
never set that. Instead we build the stock architecture from config.json, swap each module
named in ``truncation_ranks`` for a :class:`LowRankLinear` whose parameter names match the
checkpoint (``X.BLinear.weight``, ``X.ALinear.weight``), and load the tensors strictly.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from gac_check.checkpoint import open_checkpoint
from gac_check.errors import BadInput


class LowRankLinear(nn.Module):
    """``y = A(B(x))``: B maps in -> r, A maps r -> out (and carries the bias)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.BLinear = nn.Linear(in_features, rank, bias=False)
        self.ALinear = nn.Linear(rank, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ALinear(self.BLinear(x))


def model_class(config):
    """The stock transformers class named by config.architectures, else AutoModel's choice."""
    import transformers

    for arch in config.architectures or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def build_skeleton(model_dir: Path):
    """The stock model for config.json with random weights (no hub, no remote code)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    return model_class(config)._from_config(config)


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


def load_model(model_dir: Path | str) -> nn.Module:
    """A ready-to-run model (eval mode, fp32) from a dense or ASVD-layout directory."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    ckpt = open_checkpoint(model_dir)
    if ckpt.container != "safetensors":
        raise BadInput("only safetensors checkpoints can be loaded as models", model_dir)
    model = build_skeleton(model_dir)
    swap_low_rank(model, ckpt.config.get("truncation_ranks") or {})
    state: dict[str, torch.Tensor] = {}
    for f in ckpt.files:
        state.update(load_file(str(f)))
    state = _match_prefix(model, state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not _is_derived(model, m)]
    unexpected = [u for u in unexpected if not _is_derived(model, u)]
    if missing or unexpected:
        raise BadInput(f"tensors do not match the architecture (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})", model_dir)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval()


def _match_prefix(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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


def _is_derived(model: nn.Module, name: str) -> bool:
    """Buffers rebuilt at init (rotary inv_freq, position_ids) and tied heads need no tensor."""
    tied = name.startswith("lm_head.") and getattr(model.config, "tie_word_embeddings", False)
    return tied or name.endswith(("position_ids", "inv_freq"))
