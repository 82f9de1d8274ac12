"""Accounting: every tensor of a checkpoint is read, or the check refuses to judge it.

A gate is only worth what it refuses. The sites a format describes cover the tensors it
understands; a tensor no site names was not looked at, and "0 of N sites misaligned" over a
model whose experts, or whose every packed linear, went unread is a green light on nothing.
So after a format has built its sites, each tensor is put in exactly one class:

- ``in_sites``: some site's axes name it (:attr:`DimSite.axes`): its widths were judged;
- ``auxiliary``: the reader of the checkpoint's layout recorded it in
  :attr:`Checkpoint.auxiliary` (a quantized layout's scales, zero points, group indices);
- ``no_dimension``: of a kind listed once in :data:`NO_DIMENSION` (rotary frequencies, index
  buffers, BERT's lookup tables and its hidden-by-hidden heads),
  each with why it carries no width a check must judge on its own. Norm vectors and biases
  are not among them: the sites name those of the linears and the residual stream they
  belong to, and one no site names is as unread as a weight;
- unknown: anything else, of any rank or dtype. One unknown tensor is a refusal (BadInput,
  exit 2) naming the first and the count; there is no "weight-like" test that an unknown
  tensor could slip past, because when in doubt the check refuses.

This is the one place that knows which tensors a check read: the check, its JSON and report
(:class:`Accounting`'s counts) and ``--repair`` (which re-checks, so never writes a model it
did not read) all go through :func:`account`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import NotRead
from gac_check.formats.architectures import find_family
from gac_check.sites import DimSite, Role, natural_key

#: The classes a tensor can be accounted in, in the order they are tried.
CLASSES = ("in_sites", "auxiliary", "no_dimension")


@dataclass(frozen=True)
class _Context:
    """What a kind's test may look at besides the tensor: the tensors the sites read and
    every shape (is a tied decoder's table among them), the hidden width the check judged
    and the family (BERT's own tensors are BERT's only)."""

    read: frozenset[str]
    shapes: Mapping[str, tuple[int, ...]]
    hidden: int | None
    family: str | None
    fixed: frozenset[str] = frozenset()
    ssm: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Kind:
    """A kind of tensor that carries no dimension a check must judge on its own."""

    name: str
    why: str
    test: Callable[[str, TensorInfo, _Context], bool]


_INDEX_BUFFERS = ("position_ids", "token_type_ids")
_INTEGER = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
#: BERT's lookup tables: indexed by position or segment, never multiplied.
_BERT_TABLES = ("embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight")
#: BERT's hidden x hidden heads outside the encoder layers (the pooler, the masked-LM transform).
_BERT_HEADS = ("pooler.dense", "cls.predictions.transform.dense")


def _is_rotary(name: str, t: TensorInfo, _: _Context) -> bool:
    return name.rsplit(".", 1)[-1] == "inv_freq" and len(t.shape) == 1


def _is_index_buffer(name: str, t: TensorInfo, _: _Context) -> bool:
    return name.rsplit(".", 1)[-1] in _INDEX_BUFFERS and t.dtype in _INTEGER


def _is_bert_table(name: str, t: TensorInfo, ctx: _Context) -> bool:
    return (ctx.family == "bert" and name.endswith(_BERT_TABLES) and len(t.shape) == 2
            and t.shape[1] == ctx.hidden)


def _is_bert_head(name: str, t: TensorInfo, ctx: _Context) -> bool:
    if ctx.family != "bert":
        return False
    weight = name.endswith(tuple(f"{h}.weight" for h in _BERT_HEADS))
    bias = name.endswith(tuple(f"{h}.bias" for h in _BERT_HEADS))
    return ((weight and t.shape == (ctx.hidden, ctx.hidden))
            or (bias and t.shape == (ctx.hidden,)))


def _is_fixed(name: str, t: TensorInfo, ctx: _Context) -> bool:
    return name in ctx.fixed


def _is_ssm(name: str, t: TensorInfo, ctx: _Context) -> bool:
    return name in ctx.ssm


#: Every kind of tensor accounted as carrying no dimension of its own, with why. Nothing else is.
NO_DIMENSION: tuple[Kind, ...] = (
    Kind("rotary", "rotary frequencies (a 1-D inv_freq buffer): head_dim / 2 numbers derived "
         "from head_dim, which the attention sites judge", _is_rotary),
    Kind("index buffer", "an integer buffer of positions or token types (position_ids, "
         "token_type_ids): indices, not weights", _is_index_buffer),
    Kind("lookup table", "BERT's position and token-type embeddings (width = hidden): rows "
         "are gathered by index, never multiplied; their width is the hidden site's",
         _is_bert_table),
    Kind("hidden head", "BERT's pooler and masked-LM transform, hidden x hidden: their only "
         "width is the hidden site's, judged there", _is_bert_head),
    Kind("fixed by the class", "a tensor whose every axis transformers' class builds at a "
         "size no config width moves (a scalar gate, kernel taps): the class table "
         "(formats/derived.py) names it, and it has no width to judge", _is_fixed),
    Kind("SSM parameter", "an SSM mixer's own tensor that is not a linear (conv taps, A_log, "
         "D, dt_bias, its gated norm): no GEMM reads it; the mixer's linears are the sites "
         "(docs/formats.md \"Hybrid and SSM models\")", _is_ssm),
)


@dataclass(frozen=True)
class Tally:
    """Tensors and parameters per class (``read`` = all of them)."""

    read: int = 0
    in_sites: int = 0
    auxiliary: int = 0
    no_dimension: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"read": self.read, "in_sites": self.in_sites, "auxiliary": self.auxiliary,
                "no_dimension": self.no_dimension}


@dataclass(frozen=True)
class Accounting:
    """Where every tensor of a checkpoint went: per class, and the unknown ones by name."""

    classes: Mapping[str, str]  # tensor -> "in_sites" | "auxiliary" | "no_dimension" | "unknown"
    kinds: Mapping[str, str] = field(default_factory=dict)  # no_dimension tensor -> kind name
    tensors: Tally = Tally()
    params: Tally = Tally()

    @property
    def unknown(self) -> list[str]:
        return sorted((n for n, c in self.classes.items() if c == "unknown"), key=natural_key)


def site_axes(sites: Iterable[DimSite]) -> frozenset[tuple[str, int]]:
    """Every (tensor, axis) a site says carries its dimension: what a check reads, and what
    ``--repair``'s completeness guard knows not to suspect."""
    return frozenset((ax.tensor, ax.axis) for s in sites for ax in s.axes)


def account(ckpt: Checkpoint, sites: list[DimSite], fixed: frozenset[str] = frozenset(),
            ssm: frozenset[str] = frozenset()) -> Accounting:
    """Put every tensor of ``ckpt`` in its class, given the sites its format built
    (``fixed``: tensors the class table says carry no config width; ``ssm``: an SSM mixer's
    tensors that are not linears)."""
    found = find_family(ckpt, strict=False)
    family = found[0].name if found else None
    on_axes = frozenset(t for t, _ in site_axes(sites)) & ckpt.tensors.keys()
    hidden = next((s.value for s in sites if s.role is Role.HIDDEN and s.name == "hidden"), None)
    ctx = _Context(on_axes, ckpt.shapes, hidden, family, fixed, ssm)
    classes: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for name, info in ckpt.tensors.items():
        if name in on_axes:
            classes[name] = "in_sites"
        elif name in ckpt.auxiliary:
            classes[name] = "auxiliary"
        elif kind := next((k for k in NO_DIMENSION if k.test(name, info, ctx)), None):
            classes[name] = "no_dimension"
            kinds[name] = kind.name
        else:
            classes[name] = "unknown"
    return Accounting(classes, kinds, _tally(ckpt, classes, lambda _: 1),
                      _tally(ckpt, classes, lambda n: ckpt.tensors[n].numel))


def _tally(ckpt: Checkpoint, classes: Mapping[str, str], weigh: Callable[[str], int]) -> Tally:
    sums = dict.fromkeys(CLASSES, 0)
    for name, c in classes.items():
        if c in sums:
            sums[c] += weigh(name)
    return Tally(sum(weigh(n) for n in ckpt.tensors), **sums)


def require_accounted(accounting: Accounting, ckpt: Checkpoint) -> None:
    """Refuse (BadInput, exit 2) a check that would judge a model with tensors it did not read."""
    unknown = accounting.unknown
    if not unknown:
        return
    first = ckpt.tensors[unknown[0]]
    shape = "x".join(map(str, first.shape)) or "scalar"
    count = f"{len(unknown)} tensor{'s' if len(unknown) > 1 else ''}"
    raise NotRead(f"{count} gac-check did not read, first {unknown[0]} ({first.dtype} "
                   f"[{shape}]): refusing to judge a model it did not read (docs/formats.md, "
                   "\"Accounting: every tensor read\")", ckpt.path)
