"""What gets timed: SDPA, GEMM in nn.Linear's layout, a low-rank pair, an MLP, a decoder layer,
and whole-model prefill/decode built from a transformers config.

A :class:`Workload` is a case key, its FLOP count, and ``prepare(device)`` which allocates
random inputs (fixed seed; never zeros, which some kernels and CPUs run faster) and returns the
zero-argument call to time. Keeping allocation out of the timed call is what lets one timing
loop serve every kind.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from gac_check.bench.cases import case_key
from gac_check.errors import Unsupported

SEED = 1234
SDPA_BACKENDS = ("default", "flash", "efficient", "cudnn", "math", "flash_attn")


@dataclass
class Prepared:
    fn: Callable[[], object]
    backend: str | None = None  # the kernel that actually runs (SDPA), from the dispatcher
    notes: list[str] = field(default_factory=list)


@dataclass
class Workload:
    kind: str
    params: dict[str, object]
    flops: float
    prepare: Callable[[str], Prepared]

    @property
    def key(self) -> str:
        return case_key(self.kind, self.params)


def torch_dtype(name: str):
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def randn(shape: tuple[int, ...], dtype: str, device: str, scale: float = 1.0):
    """Seeded normal values made on ``device`` itself: three SDPA inputs of the GPU sweep take
    ~0.8 s to make on a CPU (and a copy), which over a thousand cases would eat most of the
    recording command's ten minutes; values differ between devices, which timing never sees."""
    import torch

    gen = torch.Generator(device=device).manual_seed(SEED + sum(shape))
    x = torch.randn(shape, generator=gen, device=device)
    return (x * scale).to(torch_dtype(dtype))


# ---------------------------------------------------------------- GEMM family (nn.Linear layout)
def gemm(m: int, k: int, n: int, dtype: str) -> Workload:
    """y = x @ W.T with W [N, K]: K is in_features (the reduction), N out_features."""

    def prepare(device: str) -> Prepared:
        import torch.nn.functional as F

        x, w = randn((m, k), dtype, device), randn((n, k), dtype, device, k ** -0.5)
        return Prepared(lambda: F.linear(x, w))

    return Workload("gemm", {"M": m, "K": k, "N": n, "dtype": dtype}, 2.0 * m * n * k, prepare)


def lowrank(m: int, k: int, r: int, n: int, dtype: str) -> Workload:
    """W ~ B @ A as two linears: x @ A.T (A [r, K]) then @ B.T (B [N, r])."""

    def prepare(device: str) -> Prepared:
        import torch.nn.functional as F

        x = randn((m, k), dtype, device)
        a, b = randn((r, k), dtype, device, k ** -0.5), randn((n, r), dtype, device, r ** -0.5)
        return Prepared(lambda: F.linear(F.linear(x, a), b))

    return Workload("lowrank", {"M": m, "K": k, "R": r, "N": n, "dtype": dtype},
                    2.0 * m * r * (k + n), prepare)


def mlp(m: int, hidden: int, inter: int, dtype: str, gated: bool = True) -> Workload:
    """A transformer MLP: gated (SiLU, LLaMA) or plain (GELU, BERT)."""

    def prepare(device: str) -> Prepared:
        import torch.nn.functional as F

        x = randn((m, hidden), dtype, device)
        up = randn((inter, hidden), dtype, device, hidden ** -0.5)
        down = randn((hidden, inter), dtype, device, inter ** -0.5)
        if not gated:
            return Prepared(lambda: F.linear(F.gelu(F.linear(x, up)), down))
        gate = randn((inter, hidden), dtype, device, hidden ** -0.5)
        return Prepared(lambda: F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down))

    n_in = 2 if gated else 1
    return Workload("mlp", {"M": m, "H": hidden, "I": inter, "gated": int(gated),
                            "dtype": dtype}, 2.0 * m * hidden * inter * (n_in + 1), prepare)


# ------------------------------------------------------------------------------------ SDPA
def sdpa(b: int, s: int, h: int, d: int, dtype: str, backend: str = "default",
         causal: bool = False) -> Workload:
    """torch SDPA with a forced backend (or the dispatcher's own choice for ``default``)."""
    if backend not in SDPA_BACKENDS:
        raise ValueError(f"unknown SDPA backend {backend!r} (one of {', '.join(SDPA_BACKENDS)})")

    def prepare(device: str) -> Prepared:
        q, k, v = (randn((b, h, s, d), dtype, device) for _ in range(3))
        if backend == "flash_attn":
            return _flash_attn_package(q, k, v, causal)
        return _torch_sdpa(q, k, v, causal, backend)

    params: dict[str, object] = {"B": b, "S": s, "H": h, "D": d, "dtype": dtype,
                                 "backend": backend}
    if causal:
        params["causal"] = 1
    flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
    return Workload("sdpa", params, flops, prepare)


def _torch_sdpa(q, k, v, causal: bool, backend: str) -> Prepared:
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    ran, why = chosen_backend(q, k, v, causal)
    if backend == "default":
        return Prepared(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                        ran, why)
    ok, reasons = backend_accepts(q, k, v, causal, backend)
    if not ok:
        raise Unsupported(f"SDPA backend {backend} refuses D={q.shape[-1]} {q.dtype}: "
                          + ("; ".join(reasons) or "no reason given"))
    forced = _sdpa_enum(backend)

    def call():
        with sdpa_kernel(forced):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return Prepared(call, backend, reasons)


def _sdpa_enum(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]


def chosen_backend(q, k, v, causal: bool) -> tuple[str, list[str]]:
    """The backend the SDPA dispatcher picks for these inputs, asked from the dispatcher itself
    (``torch._fused_sdp_choice``, the function SDPA calls) rather than guessed from timings;
    with the refusal reasons of the fused backends on CUDA."""
    import torch
    from torch.nn.attention import SDPBackend

    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
    choice = SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, causal))
    reasons: list[str] = []
    if q.is_cuda:
        for name in ("flash", "efficient", "cudnn"):
            ok, why = backend_accepts(q, k, v, causal, name)
            reasons += [] if ok else [f"{name}: {w}" for w in why]
    return names.get(choice, str(choice)), reasons


def backend_accepts(q, k, v, causal: bool, backend: str) -> tuple[bool, list[str]]:
    """Would a fused backend take these inputs, and if not why (torch's own debug reasons)."""
    import torch

    if backend == "math":
        return True, []
    if not q.is_cuda:
        if backend == "flash":  # the CPU "flash" kernel; the dispatcher knows whether it fits
            ran, _ = chosen_backend(q, k, v, causal)
            return ran == "flash", [] if ran == "flash" else ["CPU dispatcher picks math"]
        return False, [f"{backend} attention is CUDA-only"]
    check = {"flash": torch.backends.cuda.can_use_flash_attention,
             "efficient": torch.backends.cuda.can_use_efficient_attention,
             "cudnn": getattr(torch.backends.cuda, "can_use_cudnn_attention", None)}[backend]
    if check is None:
        return False, [f"this torch has no can_use_{backend}_attention"]
    from gac_check.bench.torch_warnings import with_reasons

    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, False)
    ok, reasons = with_reasons(lambda: bool(check(params, True)))
    return ok, reasons


def _flash_attn_package(q, k, v, causal: bool) -> Prepared:
    try:
        from flash_attn import flash_attn_func
    except ImportError as exc:
        raise Unsupported("the flash-attn package is not installed "
                          "(pip install 'gac-check[flash]')") from exc
    if not q.is_cuda:
        raise Unsupported("flash-attn runs on CUDA only")
    # flash-attn takes [B, S, H, D]
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return Prepared(lambda: flash_attn_func(qt, kt, vt, causal=causal), "flash_attn")


# --------------------------------------------------------------------- layer and whole model
def llama_config(hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int,
                 layers: int = 1, vocab: int = 1024):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=hidden, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=head_dim,
                       intermediate_size=inter, num_hidden_layers=layers, vocab_size=vocab,
                       max_position_embeddings=4096, attn_implementation="sdpa")


def _config_params(config) -> dict[str, object]:
    return {"arch": config.model_type, "hidden": config.hidden_size,
            "heads": config.num_attention_heads,
            "kv_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
            "head_dim": getattr(config, "head_dim", None)
            or config.hidden_size // config.num_attention_heads,
            "inter": config.intermediate_size}


def decoder_layer(config, b: int, s: int, dtype: str) -> Workload:
    """One decoder layer of the config's architecture (real transformers module), prefill."""

    def prepare(device: str) -> Prepared:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config).to(device, torch_dtype(dtype)).eval()
        inner = model.model
        layer = inner.layers[0]
        x = randn((b, s, config.hidden_size), dtype, device)
        pos = torch.arange(s, device=device).unsqueeze(0).expand(b, s)
        emb = inner.rotary_emb(x, pos)
        return Prepared(lambda: layer(x, position_embeddings=emb, position_ids=pos))

    p = _config_params(config)
    flops = 2.0 * b * s * _layer_params(p) + 4.0 * b * p["heads"] * s * s * p["head_dim"]
    return Workload("layer", {**p, "B": b, "S": s, "dtype": dtype}, flops, prepare)


def _layer_params(p: dict) -> int:
    attn = p["hidden"] * p["head_dim"] * (2 * p["heads"] + 2 * p["kv_heads"])
    return attn + 3 * p["hidden"] * p["inter"]


def cache_keyword(model) -> str:
    """The name a causal LM's forward takes its KV cache by: ``cache`` since transformers 5
    renamed it (``past_key_values`` still works there, with a FutureWarning, until 5.40),
    ``past_key_values`` in the releases before (4.45, the declared minimum)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def kv_cache(output):
    """The KV cache a forward returned, under whichever name this transformers gives it
    (reading ``past_key_values`` where it is ``cache`` logs a deprecation)."""
    return output["cache"] if "cache" in output else output["past_key_values"]


def model_forward(config, b: int, s: int, dtype: str, phase: str = "prefill") -> Workload:
    """A whole causal LM from a config (random weights): ``prefill`` of S tokens, or ``decode``
    of one token against an S-token KV cache (the cache is cropped back after every call so
    every sample sees the same length)."""
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be prefill or decode, not {phase!r}")

    def prepare(device: str) -> Prepared:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config).to(device, torch_dtype(dtype)).eval()
        return forward_call(model, b, s, phase)

    p = _config_params(config)
    layers = config.num_hidden_layers
    tokens = b * (s if phase == "prefill" else 1)
    ctx = s
    flops = layers * (2.0 * tokens * _layer_params(p) + 4.0 * tokens * p["heads"] * ctx
                      * p["head_dim"]) + 2.0 * tokens * p["hidden"] * config.vocab_size
    return Workload("model", {**p, "layers": layers, "vocab": config.vocab_size,
                              "phase": phase, "B": b, "S": s, "dtype": dtype}, flops, prepare)


def forward_call(model, b: int, s: int, phase: str) -> Prepared:
    """The call to time on a loaded causal LM (already on its device, in its dtype): prefill
    of ``b`` x ``s`` random tokens, or one decode step of ``b`` tokens against an ``s``-token
    KV cache, cropped back after every call so every sample sees the same length."""
    import torch

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, model.config.vocab_size, (b, s), generator=gen).to(device)
    if phase == "prefill":
        return Prepared(lambda: model(input_ids=ids, use_cache=False))
    with torch.inference_mode():
        cache = kv_cache(model(input_ids=ids, use_cache=True))
    nxt = ids[:, -1:]
    cache_arg = {cache_keyword(model): cache}

    def step():
        out = model(input_ids=nxt, use_cache=True, **cache_arg)
        cache.crop(-1)  # drop the token just appended (transformers 5: negative = count)
        return out

    return Prepared(step)


def reference_workload(device: str) -> Workload:
    """The kernel the perf gate times every regression case against, trial by trial, and that a
    baseline recording measures: an aligned GEMM, cheap on a CPU."""
    if device == "cuda":
        return gemm(4096, 4096, 4096, "float16")
    return gemm(64, 768, 1024, "float32")


#: The aligned size a family's reference kernel takes in its swept dimension, and the one it
#: takes when the case itself has that size (a case is never its own reference).
FAMILY_REFERENCE = {"sdpa": ("D", 128, 96), "lowrank": ("R", 128, 96)}


def reference_for(work: Workload, device: str) -> Workload:
    """The kernel the perf gate times ``work`` against, trial by trial.

    The same kernel family at an aligned size, with every other parameter the case's own: SDPA
    at head_dim 128, a low-rank pair at rank 128. A busy CPU does not slow every kernel alike
    (cache contention hits the memory-bound ones, a lower all-core clock the compute-bound
    ones): against one GEMM for everything, the ratio of an SDPA or a low-rank case moved 6-10%
    with the machine's load, which a 10% gate cannot tell from a regression
    (benchmarks/RESULTS.md, perf gate). A sibling of the same kernel shares the case's mix of
    compute and memory, so the ratio holds; the price: a slowdown of the whole family (every
    SDPA 10% slower after an upgrade) leaves the ratio alone and is not caught. GEMMs and every
    other kind keep :func:`reference_workload`.
    """
    family = FAMILY_REFERENCE.get(work.kind)
    if family is None:
        return reference_workload(device)
    dim, size, other = family
    size = other if work.params.get(dim) == size else size
    p = work.params
    if work.kind == "sdpa":
        return sdpa(p["B"], p["S"], p["H"], size, p["dtype"], p.get("backend", "default"),
                    bool(p.get("causal", False)))
    return lowrank(p["M"], p["K"], size, p["N"], p["dtype"])

