"""A GGUF file's stored tensor types against its ftype's nominal mix: which tensors llama.cpp
fell back on, why, and what that costs in bits per weight (llama.cpp issue 26616 asks for
exactly this: a Q4_K_M file at 6.18 bpw instead of 4.50).

The mix and the fallback are the pack's rules (:mod:`gac_check.targets.gguf`), the same that
predict a Hugging Face model's verdicts on ``--target llama.cpp,quant=...``; here they are
applied to the widths the file holds and compared, tensor by tensor, with the types it holds.
Bits per weight come from each ggml type's block (elements) and block size (bytes), the
``gguf`` package's ``GGML_QUANT_SIZES``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gac_check.checkpoint.gguf_header import GgufHeader, ggml_types
from gac_check.errors import BadInput
from gac_check.targets import gguf as rules
from gac_check.targets.packs import Pack, packs
from gac_check.targets.spec import Target, parse_target

ENGINE = "llama.cpp"
_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
#: The tensors the quantizer's mix speaks about (llama_tensor_get_type_impl); 1-D tensors
#: (norms) are never quantized (``ggml_n_dims(tensor) >= 2``) and stay as converted.
MIX_TENSORS = frozenset({"token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output",
                         "ffn_gate", "ffn_up", "ffn_down"})


@dataclass(frozen=True)
class TensorType:
    """One tensor: the type the mix asks for, the type llama.cpp's rules store it in at this
    row length (``expected``), the type the file holds, and why they differ."""

    name: str
    row: int
    numel: int
    requested: str
    expected: str | None
    stored: str
    why: str
    block: int = 1  # the requested type's block

    @property
    def fell_back(self) -> bool:
        """Stored in another type than the mix asks for because the row does not divide the
        requested type's block (an override at an aligned row is a disagreement, not this)."""
        return self.stored != self.requested and self.row % self.block != 0

    @property
    def agrees(self) -> bool:
        """The file holds what llama.cpp's rules (as the pack has them) store."""
        return self.expected == self.stored


@dataclass(frozen=True)
class GgufTypes:
    """Every tensor of a GGUF file against its ftype, with the sizes both ways."""

    ftype: str
    version: str
    default: str  # the ftype's nominal type (Q4_K for Q4_K_M)
    tensors: tuple[TensorType, ...]
    bits: dict[str, float]  # bits per weight of each ggml type

    def bytes_of(self, which: str) -> float:
        """The tensors' bytes at their ``stored`` or ``requested`` types."""
        return sum(t.numel * self.bits[getattr(t, which)] / 8 for t in self.tensors)

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def bpw(self) -> float:
        """Effective bits per weight: what the file holds, every tensor counted (as
        llama.cpp's loader prints it)."""
        return self.bytes_of("stored") * 8 / self.numel if self.numel else 0.0

    @property
    def mix_bpw(self) -> float:
        """Bits per weight had every tensor got the type its mix asks for."""
        return self.bytes_of("requested") * 8 / self.numel if self.numel else 0.0

    @property
    def fallbacks(self) -> list[TensorType]:
        return [t for t in self.tensors if t.fell_back]

    @property
    def disagreements(self) -> list[TensorType]:
        return [t for t in self.tensors if not t.agrees]

    def as_dict(self) -> dict:
        return {
            "ftype": self.ftype, "version": self.version, "nominal_type": self.default,
            "nominal_bpw": round(self.bits[self.default], 4),
            "mix_bpw": round(self.mix_bpw, 4), "bpw": round(self.bpw, 4),
            "bytes": round(self.bytes_of("stored")), "mix_bytes": round(self.bytes_of("requested")),
            "tensors": [{"name": t.name, "row": t.row, "requested": t.requested,
                         "expected": t.expected, "stored": t.stored, "why": t.why,
                         "padded_row": padded_row(t)} for t in self.tensors],
            "fallbacks": len(self.fallbacks), "disagreements": len(self.disagreements),
        }


def padded_row(t: TensorType) -> int | None:
    """The row length that would have kept the requested type: the next multiple of its block
    (None where the tensor did not fall back)."""
    if not t.fell_back:
        return None
    return -(-t.row // t.block) * t.block


def file_ftype(header: GgufHeader) -> str:
    """``general.file_type`` as the pack's quant name (``MOSTLY_Q4_K_M`` -> ``Q4_K_M``); the
    pack must model its mix."""
    from gguf.constants import LlamaFileType

    raw = header.get("general.file_type")
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise BadInput("has no general.file_type: which type mix it was quantized with "
                       "cannot be known", header.path)
    try:
        name = LlamaFileType(raw).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        raise BadInput(f"has general.file_type {raw}, which the gguf package does not know",
                       header.path) from None
    if name not in packs()[ENGINE].ftypes:
        known = ", ".join(packs()[ENGINE].ftypes)
        raise BadInput(f"is quantized as {name}, whose type mix gac-check does not model "
                       f"(it does: {known})", header.path)
    return name


def file_target(header: GgufHeader, targets: tuple[Target | str, ...]) -> tuple[Target, ...]:
    """The targets a GGUF file is judged on: llama.cpp at the file's own ftype, added when
    not given; another engine, or llama.cpp at another quant, contradicts the file."""
    ftype = file_ftype(header)
    parsed = [t if isinstance(t, Target) else parse_target(t) for t in targets]
    for t in parsed:
        if t.engine != ENGINE:
            raise BadInput(f"--target {t.spec}: a GGUF file runs on llama.cpp; check the "
                           "Hugging Face model for other engines", header.path)
        if t.quant != ftype:
            raise BadInput(f"--target {t.spec}: the file is quantized as {ftype}, not "
                           f"{t.quant}", header.path)
    return tuple(parsed) if parsed else (parse_target(f"{ENGINE},quant={ftype}"),)


def file_types(header: GgufHeader, target: Target) -> GgufTypes:
    """Every tensor's stored type against what ``target``'s rules ask for at its row length."""
    pack: Pack = target.pack
    ftype = target.quant
    n_layer = _int(header.arch_value("block_count")) or 1 + max(
        (int(m[1]) for n in header.tensors if (m := _LAYER.match(n))), default=0)
    heads = _int(header.arch_value("attention.head_count"))
    kv = _int(header.arch_value("attention.head_count_kv")) or heads
    gqa = heads // kv if heads and kv else 1
    tied = "output.weight" not in header.tensors
    out = []
    for name, t in header.tensors.items():
        m = _LAYER.match(name)
        short, layer = (m[2], int(m[1])) if m else (name.removesuffix(".weight"), 0)
        if len(t.ne) < 2 or short not in MIX_TENSORS:
            out.append(TensorType(name, t.ne[0], t.numel, t.type, t.type, t.type, ""))
            continue
        # without an output head, token_embd is quantized as the head (llama-quant.cpp:
        # ``name == output || (!qs.has_output && name == token_embd)``)
        as_tensor = "output" if short == "token_embd" and tied else short
        requested = rules.mix_type(pack, ftype, as_tensor, layer, n_layer, gqa)
        s = rules.stored_type(pack, target.version, ftype, as_tensor, requested, t.ne[0])
        why = s.why
        if s.type != t.type:
            why = (f"{why}; " if why else "") + (
                f"the file holds {t.type} where llama.cpp@{target.version} stores {s.type} "
                "(made with --pure, --tensor-type or another llama.cpp?)")
        out.append(TensorType(name, t.ne[0], t.numel, requested, s.type, t.type, why,
                              pack.gguf_types[requested].block))
    bits = {name: 8 * size / block for name, block, size in ggml_types().values()}
    default = pack.ftypes[ftype]["default"]
    return GgufTypes(ftype, target.version, default, tuple(out), bits)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
