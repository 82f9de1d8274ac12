"""Quantized safetensors checkpoints read at their logical widths, with their own scheme.

A quantized checkpoint stores each linear in a packed form whose shape is not the linear's:
llm-compressor's ``pack-quantized`` keeps ``X.weight_packed`` int32 [out, in/8]; GPTQ keeps
``X.qweight`` int32 [in/8, out]; bitsandbytes' NF4 keeps ``X.weight`` uint8 [in*out/2, 1]. Read
as dense, such a model shows only its embeddings, counts packed words as parameters and
passes (issue 27). Here each layout is recognised from ``config.json``'s
``quantization_config`` and its tensor names, every quantized linear becomes one logical
``X.weight`` :class:`TensorInfo` of shape [out, in] (so formats, sites and parameter counts
work unchanged), the physical tensors behind it are kept (:attr:`Quantization.backing`: never
to be written as if dense) and every auxiliary tensor (scales, zero points, group indices,
shapes, quantization states) goes to :attr:`Checkpoint.auxiliary`. A ``quantization_config``,
method, format or tensor this module does not understand is a refusal, never a dense read.

The layouts, as the libraries that write them define them:

- compressed-tensors (neuralmagic/compressed-tensors, written by vllm-project/llm-compressor),
  ``compressed_tensors/compressors/pack_quantized/base.py``,
  ``PackedQuantizationCompressor.compress`` (0.20.0): ``weight_packed`` int32
  [out, ceil(in * bits / 32)], ``weight_shape`` = ``torch.tensor(weight.shape)`` (the only exact
  record of ``in``: the packed width pins it to within 32/bits), ``weight_scale`` [out,
  ceil(in/group)] (group), [out, 1] (channel), ``weight_zero_point`` packed along dim 0 when
  asymmetric, ``weight_g_idx`` [in] with activation ordering. ``int-quantized`` /
  ``float-quantized`` / ``naive-quantized`` keep ``weight`` at [out, in] (int8 / float8_e4m3fn)
  beside ``weight_scale`` (and ``input_scale`` for static activations).
- GPTQ: AutoGPTQ ``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`` ``QuantLinear.__init__``
  and GPTQModel ``gptqmodel/nn_modules/qlinear/__init__.py`` ``PackableQuantLinear``:
  ``qweight`` int32 [in * bits / 32, out], ``qzeros`` int32 [ceil(in/group), out * bits / 32],
  ``scales`` [ceil(in/group), out], ``g_idx`` int32 [in] (GPTQModel writes ceil groups, so 688
  with group 128 has 6 group rows); ``desc_act`` in the config.
- AWQ: AutoAWQ ``awq/modules/linear/gemm.py`` ``WQLinear_GEMM.__init__``: ``qweight`` int32
  [in, out * bits / 32], ``qzeros`` [in/group, out * bits / 32], ``scales`` [in/group, out];
  ``awq/modules/linear/gemv.py`` ``WQLinear_GEMV``: ``qweight`` [out, in * bits / 32],
  ``scales`` and ``qzeros`` [out, ...] (their widths padded by ``calculate_zeros_width``).
- FP8 (transformers ``integrations/finegrained_fp8.py``, the DeepSeek-V3 / Qwen3 FP8
  releases): ``weight`` float8_e4m3fn [out, in] and ``weight_scale_inv`` float32
  [ceil(out/b0), ceil(in/b1)] for ``weight_block_size`` [b0, b1].
- bitsandbytes (bitsandbytes ``bitsandbytes/nn/modules.py`` ``Params4bit`` /
  ``Linear4bit._save_to_state_dict`` and ``bitsandbytes/functional.py``
  ``QuantState.as_dict(packed=True)``): 4-bit ``weight`` uint8 [ceil(out*in/2), 1] beside
  ``weight.absmax``, ``weight.quant_map``, ``weight.nested_absmax``,
  ``weight.nested_quant_map`` and ``weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``), a
  uint8 tensor holding the JSON of the state, whose ``shape`` is the logical [out, in];
  8-bit (``Linear8bitLt._save_to_state_dict``): ``weight`` int8 [out, in], ``SCB`` [out] and,
  in older releases, ``weight_format``.

Only two layouts keep a logical width in tensor data (compressed-tensors' ``weight_shape``,
bitsandbytes' quantization state): those few bytes are read through
:func:`gac_check.checkpoint.files.open_regular`, at most :data:`MAX_DATA_BYTES` each.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from gac_check.checkpoint.files import open_regular, parse_json
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput

#: The most bytes a data read of one tensor may take: ``weight_shape`` is 2 integers, a
#: bitsandbytes quantization state about 200 bytes of JSON.
MAX_DATA_BYTES = 1024
#: Small tensors this close together in one file are read as one range (on the Hub: one
#: request for a shard's every ``weight_shape``, which safetensors stores side by side), in
#: spans of at most MAX_SPAN bytes.
MAX_GAP = 4096
MAX_SPAN = 1024 * 1024
#: Reads a tensor's bytes (at most MAX_DATA_BYTES, checked before the call).
ByteReader = Callable[[TensorInfo], bytes]
METHODS = ("compressed-tensors", "gptq", "awq", "fp8", "bitsandbytes")
CT_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized")
STRATEGIES = ("group", "channel", "block", "tensor")
#: Tensor name endings that only a quantized checkpoint holds: without a
#: quantization_config, their presence is a refusal, not a dense read.
PACKED_SUFFIXES = (".weight_packed", ".qweight", ".qzeros", ".g_idx", ".weight_shape",
                   ".weight_scale_inv", ".SCB")
_BNB_STATE = re.compile(r"\.weight\.quant_state\.bitsandbytes__(\w+)$")
_INT_DTYPE = {4: "int4", 8: "int8", 2: "int2", 3: "int3"}


class Indexed(Protocol):
    """What this module needs of :class:`gac_check.checkpoint.index.Checkpoint` (which
    imports this module, so it is named here by its fields)."""

    path: Path
    config: dict
    tensors: dict[str, TensorInfo]
    container: str
    sidecars: dict[str, dict]
    auxiliary: dict[str, str]
    quantization: Quantization | None


Checkpoint = TypeVar("Checkpoint", bound=Indexed)


@dataclass
class Quantization:
    """A checkpoint's quantization scheme, as its own config and tensors say.

    ``method`` is the writer's ``quant_method``; ``format`` its storage layout
    (``pack-quantized``, ``gemm``, ``block-fp8``, ``nf4``...); ``strategy`` one of
    :data:`STRATEGIES` with ``group_size`` or ``block`` where it applies; ``activations`` the
    dtype activations are quantized to (W8A8) or None (weight-only: the kernel computes in the
    model's activation dtype). ``backing`` maps each logical ``X.weight`` to the physical
    tensors that hold it; ``notes`` are the packing's own constraints seen in this model.
    """

    method: str
    format: str
    bits: int
    weight_type: str  # "int" | "float" | "nf4" | "fp4"
    strategy: str
    group_size: int | None = None
    block: tuple[int, int] | None = None
    symmetric: bool | None = None
    act_order: bool = False
    activations: str | None = None
    quantized: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    backing: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def weight_only(self) -> bool:
        return self.activations is None

    @property
    def scheme(self) -> str:
        """``W4A16``, ``W8A8-FP8``...: the name llm-compressor and vLLM use for it."""
        a = "16" if self.weight_only else ("8-FP8" if "float8" in self.activations else "8")
        if self.weight_type == "float" and self.weight_only:
            return f"W{self.bits}A16-FP{self.bits}"
        return f"W{self.bits}A{a}"

    @property
    def granularity(self) -> str:
        if self.strategy == "group":
            return f"group {self.group_size}"
        if self.strategy == "block" and self.block:
            if self.block[0] == 1:
                return f"blocks of {self.block[1]}"
            return f"block {self.block[0]}x{self.block[1]}"
        return f"per {self.strategy}"

    def describe(self) -> str:
        """One phrase for the report: ``compressed-tensors pack-quantized W4A16, group 128``."""
        extra = [self.granularity]
        if self.symmetric is not None:
            extra.append("symmetric" if self.symmetric else "asymmetric")
        if self.act_order:
            extra.append("act-order")
        kind = self.weight_type if self.weight_type in ("nf4", "fp4") else f"{self.bits}-bit"
        fmt = "" if self.format == self.method else f" {self.format}"
        return (f"{self.method}{fmt} {self.scheme} ({kind} weights, "
                f"{', '.join(extra)}; {len(self.quantized)} linears quantized)")

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("backing")
        out["scheme"] = self.scheme
        out["block"] = list(self.block) if self.block else None
        out["quantized"] = len(self.quantized)
        out["ignored"] = list(self.ignored)
        return out

    def refuse_padding(self, flag: str) -> str:
        """Why ``--repair``/``--realign`` will not rewrite this checkpoint, and what to do."""
        return (f"is quantized ({self.method} {self.scheme}, {self.granularity}); {flag} does "
                "not rewrite packed weights (padding is not proven exact through this format's "
                "dequantization): repair the unquantized model, then quantize it again: "
                f"gac-check BASE_DIR --repair FIXED, then {self.requantize()}")

    def requantize(self) -> str:
        """What re-creates this quantization from a repaired unquantized model (FIXED)."""
        if self.method == "compressed-tensors":
            return ("llmcompressor.oneshot(model=FIXED, recipe=QuantizationModifier("
                    f"targets='Linear', scheme='{self.scheme}', ignore=['lm_head']), "
                    "output_dir=OUT)")
        if self.method == "gptq":
            return (f"GPTQModel.load(FIXED, QuantizeConfig(bits={self.bits}, group_size="
                    f"{self.group_size or -1}, desc_act={self.act_order})).quantize(calibration)"
                    "; model.save(OUT)")
        if self.method == "awq":
            return (f"AutoAWQForCausalLM.from_pretrained(FIXED).quantize(tokenizer, quant_config="
                    f"{{'w_bit': {self.bits}, 'q_group_size': {self.group_size}, 'version': "
                    f"'{self.format.upper()}'}}); model.save_quantized(OUT)")
        if self.method == "bitsandbytes":
            kind = (f"load_in_4bit=True, bnb_4bit_quant_type='{self.weight_type}'"
                    if self.bits == 4 else "load_in_8bit=True")
            return (f"AutoModelForCausalLM.from_pretrained(FIXED, quantization_config="
                    f"BitsAndBytesConfig({kind})).save_pretrained(OUT)")
        return ("quantize FIXED again with the tool that wrote this checkpoint "
                f"({self.method}, {self.scheme}, {self.granularity})")


def quantization_config(ckpt: Indexed) -> dict | None:
    """config.json's ``quantization_config`` (``compression_config`` in early llm-compressor
    releases), else AutoGPTQ's ``quantize_config.json`` / AutoAWQ's ``quant_config.json``."""
    for key in ("quantization_config", "compression_config"):
        if key in ckpt.config:
            value = ckpt.config[key]
            if not isinstance(value, dict):
                raise BadInput(f"config.json's {key} is not a JSON object", ckpt.path)
            return value
    for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        if name in ckpt.sidecars:
            return {"quant_method": method, **ckpt.sidecars[name]}
    return None


def read_quantization(ckpt: Checkpoint, read: ByteReader | None = None) -> Checkpoint:
    """``ckpt`` with its quantized linears at their logical widths, or unchanged when it is not
    quantized. ``read`` fetches a tensor's bytes (default: from its local file, bounded)."""
    qc = quantization_config(ckpt)
    if qc is None:
        stray = next((n for n in sorted(ckpt.tensors) if n.endswith(PACKED_SUFFIXES)
                      or _BNB_STATE.search(n)), None)
        if stray:
            raise BadInput(f"holds the quantized tensor {stray!r} but config.json has no "
                           "quantization_config saying how it is packed; gac-check reads "
                           f"{', '.join(METHODS)} checkpoints as they save themselves", ckpt.path)
        return ckpt
    if ckpt.container != "safetensors":
        raise BadInput(f"config.json says it is quantized, but its weights are a "
                       f"{ckpt.container} pickle; gac-check reads quantized checkpoints from "
                       "safetensors only", ckpt.path)
    method = qc.get("quant_method")
    reader = _READERS.get(method) if isinstance(method, str) else None
    if reader is None:
        raise BadInput(f"config.json's quantization_config has quant_method {method!r}, which "
                       f"gac-check does not read (it reads {', '.join(METHODS)}); refusing "
                       "rather than judging packed tensors as dense", ckpt.path)
    layout = _Layout(ckpt, qc, read or local_bytes)
    quant = reader(layout)
    return layout.result(quant)  # type: ignore[return-value]  # a replace() of ckpt


def local_bytes(info: TensorInfo) -> bytes:
    """A tensor's bytes from its safetensors file, through the one regular-file door."""
    n = info.end - info.begin
    with open_regular(info.file) as fh:
        fh.seek(info.begin)
        data = fh.read(n)
    if len(data) != n:
        raise BadInput(f"tensor {info.name!r} ends past the end of the file", info.file)
    return data


def hub_reader(ranged: Callable[[str, int, int], tuple[bytes, object]],
               snapshot: Path) -> ByteReader:
    """A Hub checkpoint's reader: the shard's copy when the Hub cache holds one, else one
    bounded range request (``ranged(name, start, length)``: the Hub reader's own, which
    counts the bytes and requests against the model's limits)."""
    def read(info: TensorInfo) -> bytes:
        if info.file.is_file():
            return local_bytes(info)
        name = info.file.relative_to(snapshot).as_posix()
        data = ranged(name, info.begin, info.end - info.begin)[0]
        if len(data) != info.end - info.begin:
            raise BadInput(f"{name}: the Hub served {len(data)} bytes of tensor {info.name!r} "
                           f"for {info.end - info.begin}")
        return data
    return read


# --- one checkpoint being read -------------------------------------------------------------

@dataclass
class _Layout:
    """The tensors of one checkpoint, regrouped per module as a quantized reader needs them."""

    ckpt: Indexed
    qc: dict
    read: ByteReader
    logical: dict[str, TensorInfo] = field(default_factory=dict)
    auxiliary: dict[str, str] = field(default_factory=dict)
    backing: dict[str, tuple[str, ...]] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    fetched: dict[str, bytes] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.ckpt.path

    def t(self, name: str) -> TensorInfo:
        return self.ckpt.tensors[name]

    def has(self, name: str) -> bool:
        return name in self.ckpt.tensors

    def modules(self, suffix: str) -> list[str]:
        """Every module holding a tensor named ``module + suffix``."""
        return sorted(n[: -len(suffix)] for n in self.ckpt.tensors if n.endswith(suffix))

    def refuse(self, message: str) -> BadInput:
        return BadInput(message, self.path)

    def aux(self, name: str, what: str) -> None:
        if self.has(name):
            self.auxiliary[name] = what

    def replace(self, module: str, shape: tuple[int, int], dtype: str,
                physical: tuple[str, ...]) -> None:
        """Record the logical ``module.weight`` [out, in] backed by ``physical`` tensors."""
        name = module + ".weight"
        first = self.t(physical[0])
        self.logical[name] = TensorInfo(name, shape, dtype, first.file, first.begin, first.end)
        self.backing[name] = physical
        self.removed.update(physical)

    def data(self, name: str) -> bytes:
        """The bytes of a small tensor (read with its neighbours by :meth:`prefetch`)."""
        if name not in self.fetched:
            self.prefetch([name])
        return self.fetched[name]

    def prefetch(self, names: list[str]) -> None:
        """Read small tensors, each bounded before it is asked for, neighbours in one range."""
        infos = sorted((self.t(n) for n in names), key=lambda t: (str(t.file), t.begin))
        spans: list[list[TensorInfo]] = []
        for info in infos:
            if info.end - info.begin > MAX_DATA_BYTES:
                raise self.refuse(f"tensor {info.name!r} holds {info.end - info.begin} bytes "
                                  f"where a quantization record of at most {MAX_DATA_BYTES} is "
                                  "expected")
            last = spans[-1] if spans else None
            if (last and last[0].file == info.file and info.begin - last[-1].end <= MAX_GAP
                    and info.end - last[0].begin <= MAX_SPAN):
                last.append(info)
            else:
                spans.append([info])
        for span in spans:
            start, end = span[0].begin, max(t.end for t in span)
            raw = self.read(TensorInfo(span[0].name, (end - start,), "uint8", span[0].file,
                                       start, end))
            for info in span:
                self.fetched[info.name] = raw[info.begin - start:info.end - start]

    def unknown_tensors(self, module: str, known: tuple[str, ...]) -> None:
        """Refuse a tensor of a quantized module that its layout does not name."""
        for name in self.ckpt.tensors:
            if name.startswith(module + ".") and "." not in name[len(module) + 1:]:
                rest = name[len(module) + 1:]
                if rest not in known and rest != "bias":
                    raise self.refuse(f"tensor {name!r} is not part of the "
                                      f"{self.qc.get('quant_method')} layout gac-check reads "
                                      f"(known beside it: {', '.join(known)}); refusing rather "
                                      "than guessing what it holds")

    def result(self, quant: Quantization) -> Indexed:
        if not quant.quantized:
            raise self.refuse(f"config.json says it is quantized ({quant.method}) but no tensor "
                              "is stored in that layout")
        quant.backing = self.backing
        tensors = {n: t for n, t in self.ckpt.tensors.items() if n not in self.removed}
        tensors.update(self.logical)
        auxiliary = {**self.ckpt.auxiliary, **self.auxiliary}
        out = dataclasses.replace(self.ckpt, tensors=tensors, auxiliary=auxiliary)
        out.quantization = quant
        return out


def _int(value: object, what: str, layout: _Layout, *, allow: tuple[int, ...] = ()) -> int:
    if type(value) is not int or (value < 1 and value not in allow):
        raise layout.refuse(f"config.json's quantization_config {what} is {value!r}, not a "
                            "positive integer")
    return value


def _bits(value: object, layout: _Layout, allowed: tuple[int, ...]) -> int:
    bits = _int(value, "bits", layout)
    if bits not in allowed:
        raise layout.refuse(f"config.json's quantization_config has {bits}-bit weights; "
                            f"gac-check reads {', '.join(map(str, allowed))}-bit "
                            f"{layout.qc.get('quant_method')} checkpoints")
    return bits


def _group_note(quant: Quantization, module: str, width: int, axis: str) -> None:
    g = quant.group_size
    if g and g > 0 and width % g:
        quant.notes.append(f"{module}: {axis} {width} is not a multiple of the group size {g} "
                           f"({math.ceil(width / g)} groups, the last one "
                           f"{width - (width // g) * g} wide); llm-compressor refuses such a "
                           "width, GPTQModel writes a partial last group")


# --- compressed-tensors --------------------------------------------------------------------

def _compressed_tensors(layout: _Layout) -> Quantization:
    qc = layout.qc
    fmt = qc.get("format")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise layout.refuse("config.json's compressed-tensors quantization_config has no "
                            "config_groups")
    schemes = [g for g in groups.values() if isinstance(g, dict)]
    if len(schemes) != len(groups):
        raise layout.refuse("config.json's compressed-tensors config_groups hold a group that "
                            "is not an object")
    weights = [s.get("weights") for s in schemes]
    if any(not isinstance(w, dict) for w in weights) or any(w != weights[0] for w in weights):
        raise layout.refuse("config.json's compressed-tensors config_groups quantize weights "
                            "in more than one way (or not at all); gac-check reads one weight "
                            "scheme per checkpoint")
    fmts = {s.get("format", fmt) for s in schemes}
    if len(fmts) != 1 or next(iter(fmts)) not in CT_FORMATS:
        raise layout.refuse(f"config.json's compressed-tensors format {sorted(map(str, fmts))} "
                            f"is not one gac-check reads ({', '.join(CT_FORMATS)})")
    fmt = next(iter(fmts))
    w = weights[0]
    strategy = w.get("strategy")
    if strategy not in STRATEGIES:
        raise layout.refuse(f"config.json's compressed-tensors weight strategy {strategy!r} is "
                            f"not one gac-check reads ({', '.join(STRATEGIES)})")
    wtype = w.get("type", "int")
    if wtype not in ("int", "float"):
        raise layout.refuse(f"config.json's compressed-tensors weight type {wtype!r} is not "
                            "int or float")
    bits = _bits(w.get("num_bits"), layout, (2, 3, 4, 8) if wtype == "int" else (8,))
    acts = [s.get("input_activations") for s in schemes]
    act = acts[0] if isinstance(acts[0], dict) else None
    activations = None
    if act is not None:
        activations = "float8_e4m3fn" if act.get("type") == "float" else "int8"
    block = w.get("block_structure")
    ignore = qc.get("ignore") or []
    quant = Quantization(
        "compressed-tensors", fmt, bits, wtype, strategy,
        group_size=_int(w.get("group_size"), "group_size", layout) if strategy == "group"
        else None,
        block=tuple(block) if strategy == "block" and isinstance(block, list) else None,
        symmetric=bool(w.get("symmetric", True)),
        act_order=w.get("actorder") not in (None, False),
        activations=activations,
        ignored=tuple(str(x) for x in ignore) if isinstance(ignore, list) else ())
    if fmt == "pack-quantized":
        _ct_packed(layout, quant)
    else:
        _ct_unpacked(layout, quant)
    return quant


CT_AUX = {"weight_scale": "quantization scale", "weight_zero_point": "quantization zero point",
          "weight_g_idx": "activation-order group index", "weight_shape": "logical weight shape",
          "input_scale": "activation scale", "input_zero_point": "activation zero point",
          "weight_global_scale": "global weight scale", "input_global_scale":
          "global activation scale", "output_scale": "output scale"}


def _ct_packed(layout: _Layout, quant: Quantization) -> None:
    modules = layout.modules(".weight_packed")
    layout.prefetch([m + ".weight_shape" for m in modules if layout.has(m + ".weight_shape")])
    for m in modules:
        packed = layout.t(m + ".weight_packed")
        if not layout.has(m + ".weight_shape"):
            raise layout.refuse(f"{m}.weight_packed has no {m}.weight_shape, the only record "
                                "of its logical width")
        out, width = _shape_of(layout, m + ".weight_shape")
        cols = math.ceil(width * quant.bits / 32)
        if packed.dtype != "int32" or packed.shape != (out, cols):
            raise layout.refuse(f"{m}.weight_packed is {packed.dtype} {list(packed.shape)}, but "
                                f"{m}.weight_shape [{out}, {width}] at {quant.bits} bits packs "
                                f"to int32 [{out}, {cols}]")
        _ct_scale(layout, quant, m, out, width)
        _group_note(quant, m, width, "input width")
        pack = 32 // quant.bits
        if width % pack:
            quant.notes.append(f"{m}: input width {width} is not a multiple of the pack factor "
                               f"{pack}: its last int32 word is partly padding")
        layout.unknown_tensors(m, ("weight_packed", *CT_AUX))
        for suffix, what in CT_AUX.items():
            layout.aux(f"{m}.{suffix}", what)
        dtype = _INT_DTYPE.get(quant.bits, f"int{quant.bits}")
        layout.replace(m, (out, width), dtype, (m + ".weight_packed",))
    quant.quantized = tuple(modules)


def _ct_unpacked(layout: _Layout, quant: Quantization) -> None:
    """int-/float-/naive-quantized: ``weight`` keeps its logical shape beside its scale."""
    modules = layout.modules(".weight_scale")
    for m in modules:
        if not layout.has(m + ".weight"):
            raise layout.refuse(f"{m}.weight_scale has no {m}.weight beside it")
        w = layout.t(m + ".weight")
        if len(w.shape) != 2:
            raise layout.refuse(f"{m}.weight is {list(w.shape)}, not a matrix")
        _ct_scale(layout, quant, m, *w.shape)
        _group_note(quant, m, w.shape[1], "input width")
        layout.unknown_tensors(m, ("weight", *CT_AUX))
        for suffix, what in CT_AUX.items():
            layout.aux(f"{m}.{suffix}", what)
        layout.backing[m + ".weight"] = (m + ".weight",)
    quant.quantized = tuple(modules)


def _ct_scale(layout: _Layout, quant: Quantization, m: str, out: int, width: int) -> None:
    """``weight_scale``'s shape against the strategy: a scale that contradicts it means the
    scheme is not the one the config says."""
    if not layout.has(m + ".weight_scale"):
        raise layout.refuse(f"{m} has no {m}.weight_scale")
    shape = layout.t(m + ".weight_scale").shape
    if quant.strategy == "group":
        want: tuple[tuple[int, ...], ...] = ((out, math.ceil(width / quant.group_size)),)
    elif quant.strategy == "channel":
        want = ((out, 1), (out,))
    elif quant.strategy == "tensor":
        want = ((1,), (), (1, 1))
    else:
        b = quant.block or (128, 128)
        want = ((math.ceil(out / b[0]), math.ceil(width / b[1])),)
    if shape not in want:
        raise layout.refuse(f"{m}.weight_scale is {list(shape)}; a {quant.granularity} scale "
                            f"of a [{out}, {width}] weight is {list(want[0])}")


def _shape_of(layout: _Layout, name: str) -> tuple[int, int]:
    """The two integers of a ``weight_shape`` tensor (int32 or int64, little-endian)."""
    info = layout.t(name)
    size = {"int64": 8, "int32": 4}.get(info.dtype)
    if size is None or info.shape != (2,):
        raise layout.refuse(f"{name} is {info.dtype} {list(info.shape)}, not the two integers "
                            "of a weight shape")
    raw = layout.data(name)
    if len(raw) != 2 * size:
        raise layout.refuse(f"{name} holds {len(raw)} bytes, not two {info.dtype} integers")
    out, width = (int.from_bytes(raw[i:i + size], "little", signed=True) for i in (0, size))
    if out < 1 or width < 1:
        raise layout.refuse(f"{name} says [{out}, {width}], not a weight shape")
    return out, width


# --- GPTQ and AWQ --------------------------------------------------------------------------

GPTQ_AUX = {"qzeros": "packed zero points", "scales": "group scales",
            "g_idx": "group index per input column"}


def _gptq(layout: _Layout) -> Quantization:
    qc = layout.qc
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise layout.refuse(f"config.json's GPTQ checkpoint_format {fmt!r} is not gptq or "
                            "gptq_v2 (Marlin- or BitBLAS-repacked weights are not read)")
    bits = _bits(qc.get("bits"), layout, (2, 4, 8))
    group = _int(qc.get("group_size", 128), "group_size", layout, allow=(-1,))
    quant = Quantization("gptq", fmt, bits, "int", "group" if group > 0 else "channel",
                         group_size=group if group > 0 else None,
                         symmetric=bool(qc.get("sym", True)),
                         act_order=bool(qc.get("desc_act", False)),
                         ignored=tuple(qc.get("modules_to_not_convert") or ()))
    pack = 32 // bits
    modules = layout.modules(".qweight")
    for m in modules:
        q = layout.t(m + ".qweight")
        if q.dtype != "int32" or len(q.shape) != 2:
            raise layout.refuse(f"{m}.qweight is {q.dtype} {list(q.shape)}, not GPTQ's int32 "
                                "[in * bits / 32, out]")
        rows, out = q.shape
        width = rows * pack
        if layout.has(m + ".g_idx"):
            g = layout.t(m + ".g_idx").shape
            if len(g) != 1 or g[0] != width:
                raise layout.refuse(f"{m}.g_idx is {list(g)}, but {m}.qweight [{rows}, {out}] "
                                    f"packs {width} input columns")
        groups = math.ceil(width / group) if group > 0 else 1
        for name, shape in ((m + ".scales", (groups, out)),
                            (m + ".qzeros", (groups, out // pack))):
            if not layout.has(name):
                raise layout.refuse(f"{m}.qweight has no {name}")
            if layout.t(name).shape != shape:
                raise layout.refuse(f"{name} is {list(layout.t(name).shape)}; GPTQ with group "
                                    f"{group} on [{out}, {width}] stores {list(shape)}")
        if out % pack:
            raise layout.refuse(f"{m}: GPTQ cannot pack {out} output columns into qzeros "
                                f"(not a multiple of {pack})")
        _group_note(quant, m, width, "input width")
        layout.unknown_tensors(m, ("qweight", *GPTQ_AUX))
        for suffix, what in GPTQ_AUX.items():
            layout.aux(f"{m}.{suffix}", what)
        layout.replace(m, (out, width), _INT_DTYPE[bits], (m + ".qweight",))
    quant.quantized = tuple(modules)
    return quant


def _awq(layout: _Layout) -> Quantization:
    qc = layout.qc
    version = str(qc.get("version", "gemm")).lower()
    if version not in ("gemm", "gemv"):
        raise layout.refuse(f"config.json's AWQ version {version!r} is not gemm or gemv "
                            "(gemv_fast, marlin and exllama repackings are not read)")
    bits = _bits(qc.get("bits", qc.get("w_bit")), layout, (4,))
    group = _int(qc.get("group_size", qc.get("q_group_size")), "group_size", layout)
    quant = Quantization("awq", version, bits, "int", "group", group_size=group,
                         symmetric=not bool(qc.get("zero_point", True)),
                         ignored=tuple(qc.get("modules_to_not_convert") or ()))
    pack = 32 // bits
    modules = layout.modules(".qweight")
    for m in modules:
        q = layout.t(m + ".qweight")
        if q.dtype != "int32" or len(q.shape) != 2:
            raise layout.refuse(f"{m}.qweight is {q.dtype} {list(q.shape)}, not AWQ's int32")
        if not layout.has(m + ".scales") or not layout.has(m + ".qzeros"):
            raise layout.refuse(f"{m}.qweight has no {m}.scales or {m}.qzeros beside it")
        scales = layout.t(m + ".scales").shape
        if version == "gemm":  # qweight [in, out/8], scales [in/group, out]
            width, out = q.shape[0], q.shape[1] * pack
            want = (width // group, out)
            if scales != want:
                raise layout.refuse(f"{m}.scales is {list(scales)}; AWQ GEMM with group {group} "
                                    f"on [{out}, {width}] stores {list(want)}")
        else:  # GEMV: qweight [out, in/8], scales [out, padded groups]
            out, width = q.shape[0], q.shape[1] * pack
            if len(scales) != 2 or scales[0] != out:
                raise layout.refuse(f"{m}.scales is {list(scales)}; AWQ GEMV stores one row of "
                                    f"scales per output ({out})")
        _group_note(quant, m, width, "input width")
        layout.unknown_tensors(m, ("qweight", "qzeros", "scales"))
        layout.aux(m + ".qzeros", "packed zero points")
        layout.aux(m + ".scales", "group scales")
        layout.replace(m, (out, width), _INT_DTYPE[bits], (m + ".qweight",))
    quant.quantized = tuple(modules)
    return quant


# --- FP8 (fine-grained, DeepSeek / Qwen releases) ------------------------------------------

def _fp8(layout: _Layout) -> Quantization:
    qc = layout.qc
    block = qc.get("weight_block_size")
    if block is not None and (not isinstance(block, list) or len(block) != 2
                              or not all(type(b) is int and b > 0 for b in block)):
        raise layout.refuse(f"config.json's weight_block_size {block!r} is not two positive "
                            "integers")
    act = qc.get("activation_scheme", "dynamic")
    quant = Quantization("fp8", "block-fp8" if block else "fp8", 8, "float",
                         "block" if block else "tensor", block=tuple(block) if block else None,
                         activations="float8_e4m3fn",
                         ignored=tuple(qc.get("modules_to_not_convert") or ()))
    suffix = ".weight_scale_inv" if block else ".weight_scale"
    modules = layout.modules(suffix)
    for m in modules:
        w = layout.t(m + ".weight") if layout.has(m + ".weight") else None
        if w is None or len(w.shape) != 2:
            raise layout.refuse(f"{m}{suffix} has no matrix {m}.weight beside it")
        out, width = w.shape
        scale = layout.t(m + suffix).shape
        if block:
            want = (math.ceil(out / block[0]), math.ceil(width / block[1]))
            if scale != want:
                raise layout.refuse(f"{m}{suffix} is {list(scale)}; block {block} on "
                                    f"[{out}, {width}] stores {list(want)}")
            for axis, n, b in (("output width", out, block[0]), ("input width", width, block[1])):
                if n % b:
                    quant.notes.append(f"{m}: {axis} {n} is not a multiple of the FP8 block "
                                       f"{b}: its last block is partial")
        elif scale == (out, 1) or scale == (out,):
            quant.strategy = "channel"
        layout.unknown_tensors(m, ("weight", suffix[1:], "input_scale", "activation_scale"))
        layout.aux(m + suffix, "FP8 weight scale")
        layout.aux(m + ".input_scale", "FP8 activation scale")
        layout.aux(m + ".activation_scale", "FP8 activation scale")
        layout.backing[m + ".weight"] = (m + ".weight",)
    if act == "static":
        quant.notes.append("activations are quantized with static scales (input_scale)")
    quant.quantized = tuple(modules)
    return quant


# --- bitsandbytes --------------------------------------------------------------------------

BNB4_AUX = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


def _bitsandbytes(layout: _Layout) -> Quantization:
    qc = layout.qc
    four, eight = bool(qc.get("load_in_4bit")), bool(qc.get("load_in_8bit"))
    if four == eight:
        raise layout.refuse("config.json's bitsandbytes quantization_config sets neither (or "
                            "both) of load_in_4bit and load_in_8bit")
    ignored = tuple(qc.get("llm_int8_skip_modules") or ())
    if eight:
        quant = Quantization("bitsandbytes", "int8", 8, "int", "channel", symmetric=True,
                             ignored=ignored)
        modules = layout.modules(".SCB")
        for m in modules:
            w = layout.t(m + ".weight") if layout.has(m + ".weight") else None
            if w is None or len(w.shape) != 2 or w.dtype != "int8" \
                    or layout.t(m + ".SCB").shape != (w.shape[0],):
                raise layout.refuse(f"{m}.SCB is not the [out] row scale of an int8 matrix "
                                    f"{m}.weight")
            layout.unknown_tensors(m, ("weight", "SCB", "weight_format"))
            layout.aux(m + ".SCB", "int8 row scale")
            layout.aux(m + ".weight_format", "int8 weight layout tag")
            layout.backing[m + ".weight"] = (m + ".weight",)
        quant.quantized = tuple(modules)
        return quant
    kind = str(qc.get("bnb_4bit_quant_type", "fp4"))
    quant = Quantization("bitsandbytes", kind, 4, kind, "block", ignored=ignored)
    states = sorted(n for n in layout.ckpt.tensors if _BNB_STATE.search(n))
    layout.prefetch(states)
    for state in states:
        m = state[: _BNB_STATE.search(state).start()]
        found = _BNB_STATE.search(state).group(1)
        if found not in ("nf4", "fp4"):
            raise layout.refuse(f"{state}: bitsandbytes 4-bit type {found!r} is not nf4 or fp4")
        doc = _bnb_state(layout, state)
        shape = doc.get("shape")
        if not (isinstance(shape, list) and len(shape) == 2
                and all(type(x) is int and x > 0 for x in shape)):
            raise layout.refuse(f"{state} holds shape {shape!r}, not a matrix's [out, in]")
        w = layout.t(m + ".weight") if layout.has(m + ".weight") else None
        stored = math.ceil(shape[0] * shape[1] / 2)
        if w is None or w.dtype != "uint8" or w.numel != stored:
            raise layout.refuse(f"{m}.weight is not the {stored} packed bytes of the "
                                f"{shape} 4-bit matrix {state} describes")
        if isinstance(doc.get("blocksize"), int):
            quant.block = (1, doc["blocksize"])
        quant.format = found
        quant.weight_type = found
        for aux in BNB4_AUX:
            layout.aux(f"{m}.weight.{aux}", f"bitsandbytes 4-bit {aux.replace('_', ' ')}")
        layout.aux(state, "bitsandbytes 4-bit quantization state (JSON)")
        for name in layout.ckpt.tensors:
            if name.startswith(m + ".weight.") and name not in layout.auxiliary:
                raise layout.refuse(f"tensor {name!r} is not part of the bitsandbytes 4-bit "
                                    "layout gac-check reads")
        layout.replace(m, (shape[0], shape[1]), found, (m + ".weight",))
    quant.quantized = tuple(n[: _BNB_STATE.search(n).start()] for n in states)
    return quant


def _bnb_state(layout: _Layout, name: str) -> dict:
    info = layout.t(name)
    if info.dtype != "uint8" or len(info.shape) != 1:
        raise layout.refuse(f"{name} is {info.dtype} {list(info.shape)}, not the uint8 bytes "
                            "of a JSON quantization state")
    raw = layout.data(name)
    try:
        doc = parse_json(raw.decode("utf-8"), info.file, what=f"{name} ")
    except UnicodeDecodeError:
        raise layout.refuse(f"{name} is not UTF-8 JSON") from None
    if not isinstance(doc, dict):
        raise layout.refuse(f"{name} does not hold a JSON object")
    return doc


_READERS: dict[str, Callable[[_Layout], Quantization]] = {
    "compressed-tensors": _compressed_tensors, "gptq": _gptq, "awq": _awq, "fp8": _fp8,
    "bitsandbytes": _bitsandbytes,
}

__all__ = ["MAX_DATA_BYTES", "METHODS", "Quantization", "hub_reader", "local_bytes",
           "quantization_config", "read_quantization"]
