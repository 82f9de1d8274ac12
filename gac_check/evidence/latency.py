"""Stage c: end-to-end latency of a Llama-3-8B-shaped model in its compressed, repaired and
realigned forms, and the paper's two claims checked against it, whatever they show.

The forms, each a real checkpoint directory made by gac-check's own commands:

* ``dense``: random weights at the real widths, saved with ``save_pretrained``;
* ``lowrank``: the reference compressor (``gac-check compress``'s ``compress_state``, ASVD's
  rank formula) at a 15% parameter cut, its SVDs on the device;
* ``lowrank-realign``: ``gac-check --realign`` of it (aligned ranks under the same budget,
  from its own factors: no ``--base``, whose float64 SVDs of the dense weights on the CPU
  would take the stage's budget);
* ``lowrank-repair``: ``gac-check --repair`` of it (exact zero padding);
* ``pruned``: the dense model with its MLP pruned to a narrower width (LLM-Pruner-style
  channel pruning), and ``pruned-repair``.

Each form is loaded with the loader the property suites prove equivalent
(:func:`gac_check.models.loaders.load_model`), moved to the device in the run's dtype and timed
interleaved with the others: prefill of a batch of tokens, and one decode step against a KV
cache, CUDA events on a GPU (:mod:`gac_check.bench.timing`). Forms are prepared while the
stage's time lasts, keeping a fifth of it for the timing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from gac_check.bench import timing, workloads
from gac_check.errors import BadInput
from gac_check.evidence.budget import StageClock
from gac_check.evidence.sizes import Sizes

#: Forms in the order they are prepared: the claims' forms first.
FORMS = ("dense", "lowrank", "lowrank-realign", "lowrank-repair", "pruned", "pruned-repair")
TIMING_SHARE = 0.2
CONFIG = {"cuda": timing.TimingConfig(samples=10, trials=3, warmup_s=0.2),
          "cpu": timing.TimingConfig(samples=3, trials=2, warmup_s=0.0, min_warmup_calls=1)}
#: "runs no faster": a speedup below this is none (5%: above the timing's noise on a GPU)
NO_FASTER = 1.05
#: the paper's figure for what realigned ranks recover
PAPER_RECOVERY = 1.5


@dataclass
class Form:
    name: str
    path: Path
    prepare_s: float
    params: int = 0  # decoder-layer parameters (embeddings and head are the same in all)
    dims: dict = field(default_factory=dict)  # the ranks / widths that define the form
    timings: dict = field(default_factory=dict)


def run(sizes: Sizes, layers: int, kind: str, profile: str, work: Path, clock: StageClock,
        log) -> dict:
    """Prepare and time the forms; ``work`` holds their checkpoints (kept for stage e)."""
    prepare_until = clock.deadline - TIMING_SHARE * clock.budget_s
    forms: dict[str, Form] = {}
    models: dict[str, object] = {}
    refused: dict[str, str] = {}
    for name in FORMS:
        if time.monotonic() > prepare_until:
            clock.stopped = True
            print(f"latency: {name}: stopped at budget (not prepared)", file=log, flush=True)
            continue
        started = time.monotonic()
        try:
            path = _MAKERS[name](sizes, layers, kind, profile, work)
        except (BadInput, KeyError) as exc:  # a refused fix, or a form whose source is missing
            refused[name] = str(exc)
            print(f"latency: {name}: not made: {exc}", file=log, flush=True)
            continue
        forms[name] = Form(name, path, 0.0)
        models[name] = _load(forms[name], sizes, kind)  # loading is preparing: timing is short
        forms[name].prepare_s = round(time.monotonic() - started, 1)
        print(f"latency: {name} prepared in {forms[name].prepare_s} s", file=log, flush=True)
    _STATE.clear()
    _time_forms(forms, models, sizes, kind, clock, log)
    return {"layers": layers, "dtype": sizes.dtype, "prefill": list(sizes.prefill),
            "decode": list(sizes.decode), "vocab": sizes.vocab,
            "forms": {n: {"prepare_s": f.prepare_s, "layer_params": f.params, "dims": f.dims,
                          **f.timings} for n, f in forms.items()},
            "not_made": refused, "claims": claims(forms)}


# --------------------------------------------------------------------------- the forms
_STATE: dict[str, object] = {}  # the dense model between its makers (one stage, one run)


def _config(sizes: Sizes, layers: int, inter: int):
    config = workloads.llama_config(sizes.hidden, sizes.heads, sizes.kv_heads, sizes.head_dim,
                                    inter, layers, sizes.vocab)
    config.dtype = sizes.dtype
    return config


def _dense(sizes: Sizes, layers: int, kind: str, profile: str, work: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(workloads.SEED)
    with torch.device(kind):
        model = AutoModelForCausalLM.from_config(_config(sizes, layers, sizes.inter))
    model = model.to(workloads.torch_dtype(sizes.dtype)).eval()
    model.config.dtype = sizes.dtype
    path = work / "dense"
    model.save_pretrained(path, safe_serialization=True)
    _STATE["dense"] = model
    return path


def _lowrank(sizes: Sizes, layers: int, kind: str, profile: str, work: Path) -> Path:
    from gac_check.models.compress import compress_state, save_low_rank

    model = _STATE["dense"]
    state, ranks = compress_state(model, sizes.ratio)
    state = {k: v.to("cpu") for k, v in state.items()}
    path = work / "lowrank"
    save_low_rank(model, state, ranks, work / "dense", path)
    return path


def _realign(sizes: Sizes, layers: int, kind: str, profile: str, work: Path) -> Path:
    from gac_check.api.flows import realign

    realign(work / "lowrank", work / "lowrank-realign", gpu=profile, progress=False)
    return work / "lowrank-realign"


def _repair(src: str):
    def make(sizes: Sizes, layers: int, kind: str, profile: str, work: Path) -> Path:
        from gac_check.api.flows import repair

        repair(work / src, work / f"{src}-repair", gpu=profile, progress=False)
        return work / f"{src}-repair"

    return make


def _pruned(sizes: Sizes, layers: int, kind: str, profile: str, work: Path) -> Path:
    from gac_check.models.loaders import prune_intermediate

    model = _STATE.pop("dense")
    prune_intermediate(model, dict.fromkeys(range(layers), sizes.pruned_inter))
    model.config.intermediate_size = sizes.pruned_inter  # the config says what was pruned
    path = work / "pruned"
    model.save_pretrained(path, safe_serialization=True)
    return path


_MAKERS = {"dense": _dense, "lowrank": _lowrank, "lowrank-realign": _realign,
           "lowrank-repair": _repair("lowrank"), "pruned": _pruned,
           "pruned-repair": _repair("pruned")}


# ------------------------------------------------------------------------------- timing
def _load(form: Form, sizes: Sizes, kind: str):
    """The form as the property suites run it, on the device in the run's dtype."""
    from gac_check.models.loaders import load_model

    model = load_model(form.path).to(kind, workloads.torch_dtype(sizes.dtype)).eval()
    form.params = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)
    form.dims = _dims(model)
    return model


def _time_forms(forms: dict[str, Form], models: dict, sizes: Sizes, kind: str,
                clock: StageClock, log) -> None:
    """Every form's prefill, then every form's decode, interleaved trial by trial."""
    import torch

    for phase, (b, s) in (("prefill", sizes.prefill), ("decode", sizes.decode)):
        if clock.expired():
            print(f"latency: {phase}: stopped at budget (not timed)", file=log, flush=True)
            continue
        try:
            with torch.inference_mode():
                calls = {n: workloads.forward_call(m, b, s, phase).fn
                         for n, m in models.items()}
            times = timing.measure_interleaved(calls, kind, CONFIG[kind])
        except RuntimeError as exc:  # a kernel the device refused: the other phase may run
            for form in forms.values():
                form.timings[phase] = {"error": str(exc)[:300]}
            print(f"latency: {phase}: {exc}", file=log, flush=True)
            continue
        tokens = b * s if phase == "prefill" else b
        for name, t in times.items():
            forms[name].timings[phase] = {"median_s": t.median, "iqr_s": t.iqr,
                                          "tokens_per_s": tokens / t.median,
                                          "samples": len(t.samples)}
            print(f"latency: {name} {phase}: {t.median * 1e3:.3f} ms "
                  f"({tokens / t.median:,.0f} tokens/s)", file=log, flush=True)


def _dims(model) -> dict:
    """The first layer's ranks and MLP width: what makes each form itself."""
    layer = model.model.layers[0]
    out = {f"{n}.rank": int(m.rank) for n, m in layer.named_modules()
           if isinstance(getattr(m, "rank", None), int)}
    gate = layer.mlp.gate_proj
    out["mlp.width"] = int(gate.out_features)
    return out


# ------------------------------------------------------------------------------- claims
def _speedup(forms: dict[str, Form], base: str, other: str, phase: str) -> float | None:
    try:
        return forms[base].timings[phase]["median_s"] / forms[other].timings[phase]["median_s"]
    except KeyError:
        return None


def claims(forms: dict[str, Form]) -> list[dict]:
    """The paper's claims, each with the measured figure and whether it held here."""
    out = []
    for phase in ("prefill", "decode"):
        for smaller in ("lowrank", "pruned"):
            x = _speedup(forms, "dense", smaller, phase)
            cut = (1 - forms[smaller].params / forms["dense"].params
                   if x is not None and forms["dense"].params else None)
            out.append({"claim": f"a ~15%-smaller model ({smaller}) runs no faster than dense",
                        "phase": phase, "speedup": x, "layer_params_cut": cut,
                        "held": None if x is None else x < NO_FASTER})
        x = _speedup(forms, "lowrank", "lowrank-realign", phase)
        out.append({"claim": f"realigned ranks recover up to {PAPER_RECOVERY}x over the "
                    "compressed model", "phase": phase, "speedup": x,
                    "held": None if x is None else x >= NO_FASTER,
                    "paper": PAPER_RECOVERY})
        x = _speedup(forms, "lowrank", "lowrank-repair", phase)
        out.append({"claim": "zero-padded (repaired) ranks are no slower than the compressed "
                    "model", "phase": phase, "speedup": x,
                    "held": None if x is None else x >= 1 / NO_FASTER})
    return out
