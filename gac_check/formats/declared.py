"""config.json's attention sizes held to the tensors: the tensors win, a lie is a note.

A config.json is written by whoever published the model, and nothing forces it to describe
the tensors beside it. ``hidden_size`` 4096 over tensors 64 wide would make head_dim
4096 / heads = 1024 and every attention site wrong; ``num_attention_heads`` 7 over a width of
64 would make head_dim 9 and a --repair pad the wrong thing. So head_dim is taken from
config.json only where the tensors agree with it: an explicit ``head_dim`` must split every
layer's q and k widths into whole heads, and ``hidden_size / num_attention_heads`` uses the
tensors' width when the config's disagrees, or q's own width where hidden_size splits into no
whole heads (a channel-wise pruned residual stream). A head count that divides neither width
leaves head_dim unknowable: a refusal, for the check and for ``--repair`` alike.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.layout import Linear
from gac_check.sites import DimSite, Role


def _count(value: object) -> int | None:
    return value if type(value) is int and value > 0 else None


def config_head_dim(ckpt: Checkpoint,
                    attention: list[tuple[Linear | None, Linear | None, Linear | None]]
                    ) -> tuple[int | None, list[str]]:
    """head_dim as config.json gives it, where each layer's (q, k, v) agree (v may be None:
    a family without its own v); and notes for every config value the tensors contradict
    (both values shown). None: config.json does not say, or says something the tensors
    refute (then the caller infers head_dim as without one)."""
    cfg = ckpt.config
    widths = [(q.out_features, k.out_features, q.in_features) for q, k, _ in attention
              if q and k]
    values = [(q.out_features, k.out_features, v.out_features if v else k.out_features)
              for q, k, v in attention if q and k]
    notes: list[str] = []

    def whole(hd: int) -> bool:
        return all(q % hd == 0 and k % hd == 0 for q, k, _ in widths)

    declared = _count(cfg.get("head_dim"))
    if declared is not None:
        if all(w % declared == 0 for w3 in values for w in w3):
            return declared, notes
        q, k, v = next(w for w in values if any(x % declared for x in w))
        notes.append(f"the config says head_dim={declared}, tensors have q/k/v widths "
                     f"{q}/{k}/{v}, not whole heads of it: not used")
    heads = _count(cfg.get("num_attention_heads"))
    hidden = _count(cfg.get("hidden_size"))
    if heads is None or (hidden is None and not widths):
        return None, notes
    tensor_width = max((q for q, _, _ in widths), default=None)
    if widths and (hidden is None or hidden not in {i for _, _, i in widths}):
        if hidden is not None:
            notes.append(f"head_dim from the tensors' attention width {tensor_width} / "
                         f"num_attention_heads={heads}, not from the config's "
                         f"hidden_size={hidden} (the tensors have {widths[0][2]})")
        hidden = None  # the config's hidden_size is refuted (or absent): the tensors' width
    # The attention width is q's output, which a channel-wise pruner leaves dense while it
    # narrows hidden_size (LLM-Pruner --channel_wise: hidden 179, q_proj [256, 179]): where
    # hidden_size / heads does not split into whole heads, q's own width may.
    candidates = [w for w in dict.fromkeys((hidden, tensor_width)) if w is not None]
    splits = [w for w in candidates if w % heads == 0 and w // heads and whole(w // heads)]
    if splits:
        if splits[0] != candidates[0]:
            notes.append(_tensor_head_dim_note(candidates[0], heads, splits[0], widths))
        return splits[0] // heads, notes
    width = candidates[0]
    if width % heads:
        raise BadInput(f"says num_attention_heads={heads}, which does not divide the attention "
                       f"width {width} (head_dim would be {width / heads:.4g}): the head layout "
                       "cannot be known; correct config.json", ckpt.path / "config.json")
    if width // heads:  # a width of 0: nothing to split into heads
        notes.append(f"the config's hidden_size / num_attention_heads = {width // heads} does "
                     "not split the tensors' q/k widths into whole heads: not used")
    return None, notes


def _tensor_head_dim_note(hidden: int, heads: int, width: int,
                          widths: list[tuple[int, int, int]]) -> str:
    """Both values where q's width, not hidden_size, gives head_dim."""
    said = (f"hidden_size={hidden} / num_attention_heads={heads} = {hidden // heads}, which "
            f"does not split the tensors' q/k widths {widths[0][0]}/{widths[0][1]} into whole "
            "heads" if hidden % heads == 0 else
            f"hidden_size={hidden} does not split into num_attention_heads={heads} whole heads")
    return (f"the config's {said}; head_dim {width // heads} from q's width {width} / "
            f"num_attention_heads={heads}")


@dataclass(frozen=True)
class UnrecordedHeadDim:
    """config.json records no ``head_dim``, and what a model class derives from it instead
    (``hidden_size // num_attention_heads``) is not the tensors' head_dim. Torch-Pruning's
    LLM example writes such configs (VainF/Torch-Pruning#495): it prunes hidden_size and the
    head count by one ratio and updates both, but a Qwen2 config carries no head_dim, so
    Qwen2 built from it expects q_proj rows of the derived head size and the weights do not
    fit. Recording the tensors' head_dim is exact: no tensor changes."""

    hidden: int
    heads: int
    tensors: int

    @property
    def built(self) -> int:
        return self.hidden // self.heads

    def describe(self) -> str:
        return (f"the config has no head_dim, and hidden_size={self.hidden} / "
                f"num_attention_heads={self.heads} builds head_dim {self.built}; the tensors "
                f"have head_dim {self.tensors}")


def unrecorded_head_dim(config: Mapping, sites: Iterable[DimSite]) -> UnrecordedHeadDim | None:
    """The conflict above where there is one: every layer's q/k head (the family layouts'
    ``:head_dim`` sites; multi-head latent attention records its own sizes) has one size
    and config.json derives another."""
    hidden, heads = _count(config.get("hidden_size")), _count(config.get("num_attention_heads"))
    if "head_dim" in config or hidden is None or heads is None:
        return None
    dims = {s.value for s in sites if s.role is Role.HEAD_DIM and s.name.endswith(":head_dim")}
    if len(dims) != 1 or hidden // heads in dims:
        return None
    return UnrecordedHeadDim(hidden, heads, dims.pop())
