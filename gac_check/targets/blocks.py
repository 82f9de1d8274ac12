"""Per-layer block layouts (DeciLM / Nemotron-NAS ``block_configs``): what an engine's model
class builds for each layer, and whether the tensors agree with it.

A Nemotron-NAS checkpoint (NVIDIA's Puzzle / ModelOpt Puzzletron) describes every layer in
config.json: its attention is full (with ``num_attention_heads // n_heads_in_group`` KV
heads), skipped (``no_op``) or one hidden x hidden linear (``replace_with_linear``), and so is
its FFN (width from ``ffn_mult``). The engines that have a class for it build each layer from
that entry, not from one global width, so a per-layer width is no blocker there; what is, is a
block their class does not build (a linear replacement) and a config the tensors contradict
(the class is built from the config, the weights then do not fit).

This module holds the data the format (:mod:`gac_check.formats.decilm`) hands the targets, the
rounding the engines apply to ``ffn_mult``, and which engines were read to have such a class.
"""
from __future__ import annotations

from dataclasses import dataclass

from gac_check.sites import DimSite
from gac_check.targets.source import Source

FULL, NO_OP, LINEAR = "full", "no_op", "linear"
#: The engines build each FFN's width as ``int(2 * ffn_mult * hidden / 3)`` rounded up to
#: this multiple (vLLM v0.33.0 vllm/model_executor/models/nemotron_nas.py,
#: ``_ffn_mult_to_intermediate_size`` and ``_find_multiple``; SGLang v0.5.23 and llama.cpp's
#: converter (conversion/deci.py, ``DeciModel._ffn_mult_to_intermediate_size``) alike).
FFN_ROUNDING = 256
#: Decimals of ``ffn_mult`` the engines see: the config class that ships with the Nemotron-NAS
#: hub repositories (block_config.py, ``FFNConfig.__post_init__``) keeps
#: ``round(ffn_mult, 6)``, and vLLM and SGLang build their classes from that config
#: (trust_remote_code); mlx-lm's mlx_lm/models/nemotron-nas.py (``FFNConfig.__post_init__``)
#: rounds alike.
FFN_MULT_DECIMALS = 6
#: The key of a DeciLM MLP site's attrs that says where its width is recorded: {"block_config":
#: layer, "ffn_mult": declared value or None, "intermediate_size": declared value or None,
#: "hidden_size": the config's}. ModelOpt's Puzzletron writes ``intermediate_size`` (the width
#: itself) instead of or beside ``ffn_mult``; vLLM v0.33.0 (nemotron_nas.py,
#: ``DeciLMDecoderLayer.__init__``) builds ffn_mult's rounded width where the block config has
#: an ffn_mult, else ``intermediate_size`` as given, never rounded.
FFN_MULT = "ffn_mult"


def ffn_width(ffn_mult: float, hidden: int) -> int:
    """The MLP width an engine builds from ``ffn_mult`` at ``hidden`` (see FFN_ROUNDING)."""
    width = int(2 * round(ffn_mult, FFN_MULT_DECIMALS) * hidden / 3)
    return buildable(width)


def buildable(width: int) -> int:
    """The smallest MLP width at or above ``width`` that some ``ffn_mult`` builds."""
    return -(-width // FFN_ROUNDING) * FFN_ROUNDING


def recordable(site: DimSite, size: int) -> int:
    """The smallest size at or above ``size`` that the site's config can record: a DeciLM
    MLP's width recorded by an ``ffn_mult`` (FFN_MULT attrs) loads only at a width some
    ffn_mult builds; one recorded by ``intermediate_size`` alone, and any other site's, at any
    size."""
    rec = site.attrs.get(FFN_MULT)
    return buildable(size) if isinstance(rec, dict) and rec.get("ffn_mult") is not None else size


def ffn_mult_for(width: int, hidden: int, current: float | None = None) -> float | None:
    """An ``ffn_mult`` that builds exactly ``width`` at ``hidden``: ``current`` where it
    already does, else the shortest decimal (at most FFN_MULT_DECIMALS places, so the config
    class's rounding leaves it as written) that does; None where no value does (``width`` is
    no multiple of FFN_ROUNDING).

    Any value whose ``int(2 * m * hidden / 3)`` falls in (width - 256, width] builds
    ``width``; one whose formula gives ``width`` itself, before any rounding up, is preferred
    (an engine rounding to a finer multiple would build the same). The formula is evaluated on
    every candidate, never assumed."""
    if current is not None and ffn_width(current, hidden) == width:
        return current
    if width <= 0 or width % FFN_ROUNDING:
        return None
    exact = 3 * width / (2 * hidden)
    candidates = [m for m in (round(exact, p) for p in range(FFN_MULT_DECIMALS + 1)) if m > 0]
    unrounded = [m for m in candidates if int(2 * m * hidden / 3) == width]
    return next((m for m in unrounded + candidates if ffn_width(m, hidden) == width), None)


@dataclass(frozen=True)
class LayerBlocks:
    """One layer as config.json's ``block_configs`` builds it, and what its tensors say.

    ``attention`` and ``ffn`` are FULL, NO_OP or LINEAR as the config says; ``conflicts``
    are the config values the tensors contradict (both values), each of which stops a class
    built from the config from loading the weights."""

    layer: int
    attention: str
    ffn: str
    #: what a full attention declares: num_attention_heads // n_heads_in_group, else
    #: num_key_value_heads (ModelOpt Puzzletron's AttentionConfig, which has no group)
    kv_heads: int | None = None
    n_heads_in_group: int | None = None
    kv_declared: int | None = None  # num_key_value_heads as the entry writes it
    ffn_mult: float | None = None
    width: int | None = None  # the ffn entry's intermediate_size, where it writes one
    intermediate: int | None = None  # what the engines build: from ffn_mult, else width
    conflicts: tuple[str, ...] = ()
    #: the one of ``conflicts`` that says the MLP's width is not what ffn_mult builds (the
    #: only one ``--repair`` resolves: it pads the width and rewrites ffn_mult)
    mlp_conflict: str | None = None

    @property
    def repairable(self) -> bool:
        """Whether an engine's class would build this layer once ``--repair`` has padded its
        MLP and rewritten its ffn_mult: every block full or no-op, and no conflict but the
        MLP width's."""
        return (LINEAR not in (self.attention, self.ffn)
                and set(self.conflicts) <= {self.mlp_conflict})

    def built(self) -> str:
        """What the engine builds for this layer (without the layer's index)."""
        heads = f"{self.kv_heads} KV head{'s' if self.kv_heads != 1 else ''}"
        attn = (f"attention with {heads}" if self.attention == FULL
                else {NO_OP: "no attention", LINEAR: "attention replaced by a linear"}[
                    self.attention])
        said = (f"ffn_mult {self.ffn_mult:g}" if self.ffn_mult is not None
                else "intermediate_size")
        ffn = (f"MLP {self.intermediate} ({said})" if self.ffn == FULL
               else {NO_OP: "no MLP", LINEAR: "MLP replaced by a linear"}[self.ffn])
        return f"{attn}, {ffn}"


def describe(blocks: tuple[LayerBlocks, ...]) -> str:
    """Each distinct layer build once, with the layers that have it (``layers 0-2, 5``)."""
    groups: dict[str, list[int]] = {}
    for b in blocks:
        groups.setdefault(b.built(), []).append(b.layer)
    return "; ".join(f"{_ranges(layers)}: {built}" for built, layers in groups.items())


def _ranges(layers: list[int]) -> str:
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"layer{'s' if len(layers) > 1 else ''} {text}"


@dataclass(frozen=True)
class BlockClass:
    """An engine's model class for ``block_configs`` checkpoints, as read at one release."""

    name: str
    source: Source
    since: str  # the oldest release read to have it (an older one has no such class)
    #: what an older release has under that architecture name, where it has something
    before: Source | None = None
    #: the release read to build a full FFN from its ``intermediate_size`` where the entry has
    #: no ``ffn_mult`` (ModelOpt Puzzletron's entries); None: the class reads ffn_mult alone,
    #: so such a layer fails building (no such attribute under ModelOpt's config class)
    explicit_width: str | None = None


_VLLM = Source("vllm-project/vllm", "vllm/model_executor/models/nemotron_nas.py",
               "DeciLMDecoderLayer.__init__ (DeciLMForCausalLM.load_weights)", "v0.33.0")
#: Engines whose release was read to build each layer from its own block config: full or
#: no-op attention (KV heads from n_heads_in_group) and full or no-op FFN (width from
#: ffn_mult). Neither builds a linear replacement: its weight names no parameter of the class.
BLOCK_CLASSES: dict[str, BlockClass] = {
    # v0.6.3.post1's DeciLMForCausalLM (models/decilm.py) is DeciLM-7B's: a Llama that
    # reads num_key_value_heads_per_layer, no block_configs; nemotron_nas.py from v0.8.5
    # v0.33.0's DeciLMDecoderLayer: ``if hasattr(block_config.ffn, "ffn_mult")`` the rounded
    # width, else ``block_config.ffn.intermediate_size`` as given (older releases not read)
    "vllm": BlockClass("DeciLMForCausalLM", _VLLM, "v0.8.5", Source(
        "vllm-project/vllm", "vllm/model_executor/models/decilm.py",
        "DeciLMForCausalLM.__init__ (num_key_value_heads_per_layer)", "v0.6.3.post1"),
        explicit_width="v0.33.0"),
    # v0.4.6.post5 has no nemotron_nas.py; v0.5.23's DeciLMDecoderLayer reads
    # block_config.ffn.ffn_mult for every full FFN, never intermediate_size
    "sglang": BlockClass("DeciLMForCausalLM", Source(
        "sgl-project/sglang", "python/sglang/srt/models/nemotron_nas.py",
        "DeciLMDecoderLayer.__init__ (DeciLMForCausalLM.load_weights)", "v0.5.23"), "v0.5.23"),
}
#: Engines that were not read for block_configs checkpoints: judging them would be a guess.
NOT_READ: dict[str, str] = {
    "tensorrt-llm": "TensorRT-LLM has its own Nemotron-NAS model class, which gac-check has "
                    "not read",
    "llama.cpp": "llama.cpp converts DeciLM with per-layer head counts and FFN widths "
                 "(conversion/deci.py), which gac-check's llama.cpp rules do not model",
}
