"""The noun a quantized checkpoint's reader produces: its scheme, as its own config and tensors
say (:mod:`gac_check.checkpoint.quantized.reader` reads it), what reports print of it, and what
re-creates it after a repair of the unquantized model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

STRATEGIES = ("group", "channel", "block", "tensor")
#: llm-compressor's preset schemes, as compressed-tensors 0.20.0 defines them
#: (``compressed_tensors/quantization/quant_scheme.py``, ``PRESET_SCHEMES``): name -> (bits,
#: weight type, strategy, group size, symmetric, block, activations as (type, dynamic,
#: symmetric) or None). A hint names a preset only where it re-creates the checkpoint's
#: scheme exactly (tests/test_quantized_presets.py holds this table to the package's own).
PRESETS: dict[str, tuple] = {
    "W4A16": (4, "int", "group", 128, True, None, None),
    "W4A16_ASYM": (4, "int", "group", 128, False, None, None),
    "W8A16": (8, "int", "group", 128, True, None, None),
    "W8A8": (8, "int", "channel", None, True, None, ("int", True, True)),
    "FP8": (8, "float", "tensor", None, True, None, ("float", False, True)),
    "FP8_DYNAMIC": (8, "float", "channel", None, True, None, ("float", True, True)),
    "FP8_BLOCK": (8, "float", "block", None, True, (128, 128), ("float", True, True)),
}


@dataclass
class Quantization:
    """A checkpoint's quantization scheme, as its own config and tensors say.

    ``method`` is the writer's ``quant_method``; ``format`` its storage layout
    (``pack-quantized``, ``gemm``, ``block-fp8``, ``nf4``...); ``strategy`` one of
    :data:`STRATEGIES` with ``group_size`` or ``block`` where it applies; ``activations`` the
    dtype activations are quantized to (W8A8) or None (weight-only: the kernel computes in the
    model's activation dtype); ``activations_dynamic`` and ``activations_symmetric`` say how
    those activations are scaled where the config says it (None: weight-only): engines pick
    other kernels for static per-tensor scales and for asymmetric INT8 activations
    (docs/targets.md, "Scheme names"). ``backing`` maps each logical ``X.weight`` to the
    physical tensors that hold it; ``notes`` are the packing's own constraints seen in this
    model.
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
    #: activation ordering by groups (GPTQ ``desc_act`` with a group size, compressed-tensors
    #: ``actorder: group``/``dynamic``), which vLLM no longer loads; ``weight``/``static``
    #: ordering is not this
    group_act_order: bool = False
    activations: str | None = None
    activations_dynamic: bool | None = None
    activations_symmetric: bool | None = None
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

    def llm_compressor_scheme(self) -> str:
        """The QuantizationModifier arguments that re-create this scheme: llm-compressor's
        preset where one is exactly it (``scheme='FP8_DYNAMIC'``), else the one config group
        (``W8A8-FP8`` and the like are gac-check's names, which llm-compressor rejects)."""
        acts = None if self.activations is None else (
            "float" if "float8" in self.activations else "int", bool(self.activations_dynamic),
            self.activations_symmetric is not False)
        mine = (self.bits, self.weight_type, self.strategy, self.group_size,
                self.symmetric is not False, self.block, acts)
        preset = next((name for name, p in PRESETS.items() if p == mine), None)
        if preset:
            return f"targets='Linear', scheme='{preset}'"
        weights = {"num_bits": self.bits, "type": self.weight_type, "strategy": self.strategy,
                   "symmetric": self.symmetric is not False}
        if self.group_size:
            weights["group_size"] = self.group_size
        if self.block:
            weights["block_structure"] = list(self.block)
        group: dict = {"targets": ["Linear"], "weights": weights}
        if acts:
            group["input_activations"] = {"num_bits": 8, "type": acts[0], "dynamic": acts[1],
                                          "strategy": "token" if acts[1] else "tensor",
                                          "symmetric": acts[2]}
        return f"config_groups={{'group_0': {group!r}}}"

    def requantize(self) -> str:
        """What re-creates this quantization from a repaired unquantized model (FIXED)."""
        if self.method == "compressed-tensors":
            return ("llmcompressor.oneshot(model=FIXED, recipe=QuantizationModifier("
                    f"{self.llm_compressor_scheme()}, ignore=['lm_head']), output_dir=OUT)")
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
        if self.method == "mxfp4":  # transformers quantizes on load (a GPU) and saves blocks
            return ("GptOssForCausalLM.from_pretrained(FIXED, quantization_config=Mxfp4Config())"
                    ".save_pretrained(OUT) (transformers, on a GPU with its MXFP4 kernels)")
        return ("quantize FIXED again with the tool that wrote this checkpoint "
                f"({self.method}, {self.scheme}, {self.granularity})")


__all__ = ["STRATEGIES", "Quantization"]
