"""SliceGPT (microsoft/TransformerCompression): a rotated, sliced residual stream per layer.

SliceGPT fuses every norm's weight into the linears after it, replaces the norms with a
weightless RMSN, rotates the residual stream by PCA and deletes its trailing directions. The
stream then has a different width between each pair of blocks: the embedding output, each
layer's attention output and each layer's MLP output. ``attn_shortcut_Q`` [attn_in, attn_out]
and ``mlp_shortcut_Q`` [mlp_in, mlp_out] carry the residual from one width to the next. The
state dict is ``torch.save(model.state_dict())``; the widths are recorded in a JSON sidecar
(``embedding_dimensions``, ``attention_{input,output}_dimensions``,
``mlp_{input,output}_dimensions``, ``head_dimension`` = the LM head's input width).

Each stream segment is one HIDDEN site. Zero padding one is exact in SliceGPT's own modules:
RMSN divides sum(x^2) by the dense ``hidden_size`` it was built with (not by the sliced width)
and has no weight, so zero features change no statistic; the producer's zero rows and the
shortcut Q's zero columns keep the padded features zero, and the consumers' zero columns ignore
them. If a norm weight over the stream is present (the norms were not fused) that no longer
holds, and the site says so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gac_check.checkpoint.index import Checkpoint
from gac_check.errors import BadInput
from gac_check.formats.architectures import (
    HIDDEN_INEXACT,
    Family,
    embeddings,
    family_sites,
    find_family,
    unknown_architecture,
)
from gac_check.formats.base import Format
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis

SHORTCUT = re.compile(r"^(.*?)\.(\d+)\.(attn|mlp)_shortcut_Q$")
SLICING_KEYS = ("attention_input_dimensions", "attention_output_dimensions",
                "mlp_input_dimensions", "mlp_output_dimensions")
#: The families microsoft/TransformerCompression ships adapters for (src/slicegpt/adapters/:
#: llama_adapter, opt_adapter, phi2_adapter, phi3_adapter).
SLICEGPT_FAMILIES = ("llama", "opt", "phi", "phi3")
EXACT_BECAUSE = ("SliceGPT's RMSN is weightless and divides by the dense hidden_size, so zero "
                 "residual features change nothing")


@dataclass
class _Stream:
    """One residual-stream segment: who writes it, who reads it, what the sidecar says."""

    name: str
    layer: int | None
    axes: list[TensorAxis] = field(default_factory=list)
    declared: list[tuple[str, str, int]] = field(default_factory=list)  # (key, index, value)


class SliceGPT(Format):
    name = "slicegpt"
    description = "SliceGPT sliced residual stream (shortcut_Q rotations + slicing config)"

    def matches(self, ckpt: Checkpoint) -> bool:
        return (any(SHORTCUT.match(n) for n in ckpt.tensors)
                or _slicing_config(ckpt) is not None)

    def sites(self, ckpt: Checkpoint) -> list[DimSite]:
        found = find_family(ckpt)
        if not found:
            why = unknown_architecture(ckpt) or "no transformer layers gac-check recognises"
            raise BadInput(f"is a SliceGPT checkpoint of {why}; refusing rather than "
                           "guessing which tensors carry the sliced stream", ckpt.path)
        if found[0].name not in SLICEGPT_FAMILIES:
            raise BadInput(f"is a SliceGPT checkpoint of the {found[0].name} family, which "
                           "SliceGPT has no adapter for (it ships "
                           f"{', '.join(SLICEGPT_FAMILIES)})", ckpt.path)
        fam, prefix, layers = found
        shared = family_sites(ckpt, fam, prefix, layers, lambda m: self.linear(ckpt, m))
        streams = self._stream_sites(ckpt, fam, prefix, layers)
        if streams and not _head_dim_known(shared):
            streams[0].notes.append("no head_dim in config.json (SliceGPT saves none): "
                                    "attention sites were not checked")
        return streams + [s for s in shared if s.role is not Role.HIDDEN]

    def _stream_sites(self, ckpt: Checkpoint, fam: Family, prefix: str,
                      layers: list[int]) -> list[DimSite]:
        sidecar = _slicing_config(ckpt)
        name, conf = sidecar if sidecar else ("", {})
        streams = _streams(ckpt, fam, prefix, layers, conf)
        return [s for s in (_site(ckpt, st, name) for st in streams) if s]


def _slicing_config(ckpt: Checkpoint) -> tuple[str, dict] | None:
    for name, data in ckpt.sidecars.items():
        if all(k in data for k in SLICING_KEYS):
            return name, data
    return None


def _declared(conf: dict, key: str, index: int) -> tuple[str, str, int] | None:
    table = conf.get(key)
    if isinstance(table, dict):
        value = table.get(str(index), table.get(index))  # type: ignore[call-overload]
        if isinstance(value, int):
            return key, str(index), value
    return None


def _streams(ckpt: Checkpoint, fam: Family, prefix: str, layers: list[int],
             conf: dict) -> list[_Stream]:
    """The residual-stream segments, each with every tensor axis SliceGPT slices to its width
    (its adapters' attention/MLP inputs and outputs, embeddings, shortcut Qs and head).

    Sequential blocks have three widths per layer boundary (attention input, attention output,
    MLP output); parallel blocks (Phi-2) read one normed input into attention and MLP and add
    both outputs into one stream, so they have no attention-output segment and no
    ``mlp_shortcut_Q``.
    """
    shapes = ckpt.shapes
    _require_modules(ckpt, fam, prefix, layers)

    def w(module: str, axis: int, kind: AxisKind) -> list[TensorAxis]:
        name = f"{module}.weight"
        out = [TensorAxis(name, axis, kind)]
        if kind is AxisKind.PRODUCER and f"{module}.bias" in shapes:
            out.append(TensorAxis(f"{module}.bias", 0, AxisKind.BIAS))
        return out

    def q(layer: int, which: str, axis: int, kind: AxisKind) -> list[TensorAxis]:
        return [TensorAxis(f"{prefix}.{layer}.{which}_shortcut_Q", axis, kind)]

    def norm(module: str) -> list[TensorAxis]:
        """A norm weight over the stream; SliceGPT fuses them away, so normally none."""
        name = f"{module}.weight"
        return [TensorAxis(name, 0, AxisKind.NORM)] if len(shapes.get(name, ())) == 1 else []

    def cols(layer: int, modules: tuple[str, ...]) -> list[TensorAxis]:
        return [a for m in modules for a in w(f"{prefix}.{layer}.{m}", 1, AxisKind.CONSUMER)]

    def readers(layer: int) -> list[TensorAxis]:
        """What reads a layer's input: the attention inputs (and, in parallel blocks, the MLP
        inputs), the attention shortcut's rows and a first norm if one was left."""
        read = fam.attention_inputs + (fam.mlp_inputs if fam.parallel else ())
        return (cols(layer, read) + q(layer, "attn", 0, AxisKind.CONSUMER)
                + norm(f"{prefix}.{layer}.{fam.norms[0]}"))

    first = _Stream("hidden:embedding", None)
    for k, table in enumerate(embeddings(ckpt, fam)):
        first.axes.append(TensorAxis(table, 1, AxisKind.CONSUMER))
        first.declared += [d for d in (_declared(conf, "embedding_dimensions", k),) if d]
    first.axes += readers(layers[0])
    first.declared += [d for d in (_declared(conf, "attention_input_dimensions", layers[0]),)
                       if d]
    streams = [first]
    for pos, i in enumerate(layers):
        base = f"{prefix}.{i}"
        mlp = _Stream(f"{base}:hidden_mlp_out", i)
        mlp.axes = w(f"{base}.{fam.down}", 0, AxisKind.PRODUCER)
        if fam.parallel:
            mlp.axes += (w(f"{base}.{fam.o}", 0, AxisKind.PRODUCER)
                         + q(i, "attn", 1, AxisKind.PRODUCER))
        else:
            attn = _Stream(f"{base}:hidden_attn_out", i)
            attn.axes = (w(f"{base}.{fam.o}", 0, AxisKind.PRODUCER)
                         + q(i, "attn", 1, AxisKind.PRODUCER) + q(i, "mlp", 0, AxisKind.CONSUMER)
                         + cols(i, fam.mlp_inputs) + norm(f"{base}.{fam.norms[1]}"))
            attn.declared = [d for d in (_declared(conf, "attention_output_dimensions", i),
                                         _declared(conf, "mlp_input_dimensions", i)) if d]
            streams.append(attn)
            mlp.axes += q(i, "mlp", 1, AxisKind.PRODUCER)
        mlp.declared = [d for d in (_declared(conf, "mlp_output_dimensions", i),) if d]
        if pos + 1 < len(layers):
            mlp.axes += readers(layers[pos + 1])
            nxt = _declared(conf, "attention_input_dimensions", layers[pos + 1])
            mlp.declared += [nxt] if nxt else []
        else:
            final_norm = f"{prefix.rsplit('.', 1)[0]}.{fam.final_norm}"
            mlp.axes += w("lm_head", 1, AxisKind.CONSUMER) + norm(final_norm)
            head = conf.get("head_dimension")
            mlp.declared += [("head_dimension", "", head)] if isinstance(head, int) else []
        streams.append(mlp)
    return streams


def _require_modules(ckpt: Checkpoint, fam: Family, prefix: str, layers: list[int]) -> None:
    """Every tensor SliceGPT's adapter for ``fam`` slices must be there, in every layer: a
    missing one means the checkpoint is not what this adapter describes (refused, not
    skipped, so a repair can never pad some of a stream and not the rest)."""
    shapes = ckpt.shapes
    wanted = [f"{prefix}.{i}.{m}.weight" for i in layers for m in fam.required()]
    wanted += [f"{prefix}.{i}.{which}_shortcut_Q" for i in layers
               for which in (("attn",) if fam.parallel else ("attn", "mlp"))]
    wanted += ["lm_head.weight"]
    missing = [n for n in wanted if len(shapes.get(n, ())) != 2]
    if fam.parallel:
        missing += [n for n in shapes if n.endswith("mlp_shortcut_Q")][:1]
    if missing:
        raise BadInput(f"is a SliceGPT checkpoint of the {fam.name} family without "
                       f"{missing[0]} (or with it where {fam.name} has none), which SliceGPT's "
                       f"{fam.name} adapter writes; refusing rather than guessing its layout",
                       ckpt.path)


def _site(ckpt: Checkpoint, st: _Stream, sidecar: str) -> DimSite | None:
    """The stream's site: its width is the first producer's (or reader's) width."""
    shapes = ckpt.shapes
    weights = [a for a in st.axes if a.kind not in (AxisKind.BIAS, AxisKind.NORM)]
    if not weights:
        return None
    value = shapes[weights[0].tensor][weights[0].axis]
    norms = [a for a in st.axes if a.kind is AxisKind.NORM]
    site = DimSite(st.name, Role.HIDDEN, value, list(st.axes), layer=st.layer,
                   module=st.name.split(":")[0],
                   inexact=HIDDEN_INEXACT + " (the norm weights were not fused)" if norms
                   else None,
                   attrs={"sidecar": sidecar,
                          "sidecar_fields": [[k, i] for k, i, _ in st.declared]}
                   | ({} if norms else {"exact_because": EXACT_BECAUSE}))
    for a in weights[1:]:
        width = shapes[a.tensor][a.axis]
        if width != value:
            site.notes.append(f"{a.tensor} axis {a.axis} is {width} wide, {weights[0].tensor} "
                              f"makes {value}")
    for key, index, declared in st.declared:
        if declared != value:
            where = f"{key}[{index}]" if index else key
            site.notes.append(f"{sidecar or 'slicing config'} says {where}={declared}, tensors "
                              f"have {value}")
    return site


def _head_dim_known(shared: list[DimSite]) -> bool:
    return any(s.role is Role.HEAD_DIM for s in shared)
