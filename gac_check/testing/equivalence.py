"""Equivalence checks for zero-padding repair: build a real model, repair it, compare outputs.

Each ``check_*`` function builds something real (stock transformers modules with random
weights), writes it as a checkpoint of one compressor's layout, repairs it with
:func:`gac_check.repair` (or pads module weights with the same
:mod:`gac_check.padding.plan` edits), loads the result back and compares outputs against the
unrepaired model, returning the measured (max abs, relative) error. suites/ runs them under
hypothesis; tests/ runs them against deliberately broken repairs ("mutants") to show they go
red; benchmarks/repair_errors.py records their errors.

What "equivalent" means (docs/design.md, "Exactness"): within the dtype's tolerance below. A
padded GEMM may sum in another order, so bit-exactness is not claimed.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gac_check.api import check, repair
from gac_check.contract.select import for_hardware
from gac_check.errors import BadInput
from gac_check.models.compress import compress_dir
from gac_check.models.loaders import load_model, palu_state, prune_intermediate, svdllm_state
from gac_check.models.lowrank import factorize
from gac_check.padding import plan as planner
from gac_check.padding import write as writer
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis
from gac_check.testing.strategies import TinyModel

#: Max error relative to the reference output's largest magnitude.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
#: Contract the repairs target: fp16 on the generic GPU profile (multiples of 8, optimal 16).
PROFILE, DTYPE = "gpu", "float16"
SENTENCES = ["The cat sits on the mat.", "Zero padding keeps a model's outputs unchanged.",
             "GPU kernels prefer dimensions that are multiples of eight.",
             "A sentence embedding should not move when only shapes change."]


# ---------------------------------------------------------------------------- comparisons
def errors(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max abs error / max |ref|): the two figures every assertion states."""
    diff = (ref.float() - got.float()).abs().max().item()
    return diff, diff / max(ref.float().abs().max().item(), 1e-30)


def assert_equivalent(ref: torch.Tensor, got: torch.Tensor, what: str,
                      dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    assert ref.shape == got.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    abs_err, rel_err = errors(ref, got)
    tol = TOLERANCE[dtype]
    assert rel_err <= tol, (f"{what} ({dtype}): max abs error {abs_err:.3g}, max relative error "
                            f"{rel_err:.3g} > tolerance {tol:g}")
    return abs_err, rel_err


def run(model: nn.Module, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits of a causal LM, last hidden states of an encoder."""
    model = model.to(dtype)
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def inputs(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 11), generator=torch.Generator().manual_seed(seed))


def save_model(model: nn.Module, path: Path, shard_bytes: int | None = None) -> Path:
    """``save_pretrained`` for real; with ``shard_bytes``, sharded with an index."""
    kw = {"max_shard_size": shard_bytes} if shard_bytes else {}
    model.save_pretrained(path, **kw)
    return path


def write_layout(model: nn.Module, state: dict[str, torch.Tensor], path: Path,
                 extra_config: dict | None = None, pickle: bool = False) -> Path:
    """A checkpoint directory of a non-HF layout: config.json + safetensors (or a torch zip)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    config = {**model.config.to_dict(), "architectures": [type(model).__name__],
              **(extra_config or {})}
    (path / "config.json").write_text(json.dumps(config))
    if pickle:
        torch.save(state, path / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    return path


def repaired(src: Path, out: Path, strategy: str, targets: Sequence[str] = (),
             gpu: str = PROFILE, dtype: str | None = DTYPE) -> writer.RepairReport | None:
    """Repair to ``gpu``'s contract for ``dtype`` and assert what every repair must: input
    untouched, repaired sites clean (on the deployment ``targets`` too, when given). None where
    a target would still refuse OUT (a layout no engine loads, heads or a vocabulary TP does
    not divide): then the repair must have been refused before writing anything."""
    before = {p.name: p.stat().st_mtime_ns for p in src.iterdir()}
    try:
        report = repair(src, out, gpu, strategy, dtype, target=targets).report
    except BadInput as exc:
        if not targets or "would still refuse OUT" not in str(exc):
            raise
        assert not out.exists(), "a repair that a target refuses wrote OUT"
        assert {p.name: p.stat().st_mtime_ns for p in src.iterdir()} == before, "input modified"
        return None
    assert {p.name: p.stat().st_mtime_ns for p in src.iterdir()} == before, "input modified"
    still = {f.site.name for f in check(out, gpu, dtype, targets).findings
             if f.severity in planner.STRATEGIES[strategy]}
    fixed = {r.site.name for r in report.plan.repairs}
    assert not fixed & still, f"repaired sites still misaligned: {sorted(fixed & still)[:3]}"
    return report


# ------------------------------------------------------------------ checkpoint-level checks
@dataclass(frozen=True)
class CheckpointEquivalence:
    """What :func:`check_checkpoint` proved: how many sites the repair padded, and the
    largest output errors of OUT against the checkpoint as it was."""

    repairs: int
    abs_err: float
    rel_err: float


def check_checkpoint(src: Path, out: Path, gpu: str, dtype: str | None,
                     strategy: str = "minimal") -> CheckpointEquivalence:
    """A team's own checkpoint, any layout :func:`load_model` runs: repair it to ``gpu``'s
    contract for ``dtype`` into ``out``, run both on the same tokens in float32 (the
    strictest tolerance: padding is exact or it is not, whatever dtype serves it) and compare
    logits (hidden states of an encoder). A checkpoint that is not a model is BadInput."""
    report = repaired(src, out, strategy, gpu=gpu, dtype=dtype)
    if not report.plan.repairs:
        return CheckpointEquivalence(0, 0.0, 0.0)
    ref_model = load_model(src)
    ids = inputs(ref_model.config.vocab_size)
    ref = run(ref_model, ids)
    got = run(load_model(out), ids)
    abs_err, rel_err = assert_equivalent(
        ref, got, f"{src} repaired for {gpu} {dtype or 'its own dtype'} "
        f"({len(report.plan.repairs)} sites padded)")
    return CheckpointEquivalence(len(report.plan.repairs), abs_err, rel_err)


def check_asvd(tiny: TinyModel, ratio: float, strategy: str, tmp: Path,
               targets: Sequence[str] = ()) -> tuple[float, float]:
    """Reference-compress (irregular ranks), repair (to what is fast on ``targets`` too),
    load both, compare logits/hidden states."""
    model = tiny.build(seed=1)
    dense = save_model(model, tmp / "dense")
    compress_dir(dense, tmp / "asvd", ratio)
    report = repaired(tmp / "asvd", tmp / "fixed", strategy, targets)
    if report is None:  # no engine loads ASVD's layout: refused, nothing to compare
        return 0.0, 0.0
    ids = inputs(tiny.kwargs["vocab_size"])
    ref = run(load_model(tmp / "asvd"), ids)
    got = run(load_model(tmp / "fixed"), ids)
    ranks = json.loads((tmp / "fixed" / "config.json").read_text())["truncation_ranks"]
    padded = [r for r in report.plan.repairs if r.site.role is Role.RANK]
    assert all(ranks[r.site.module] == r.target for r in padded), "truncation_ranks not updated"
    return assert_equivalent(ref, got, f"{tiny.family} ASVD ratio {ratio} {strategy}")


def check_pruned(tiny: TinyModel, strategy: str, tmp: Path,
                 shard_bytes: int | None = 4096, targets: Sequence[str] = ()
                 ) -> tuple[float, float]:
    """A stock model whose config records a pruned intermediate size (e.g. 37), saved sharded;
    repaired shards keep their names and the index its map; loaded with from_pretrained.
    With ``targets`` the repair pads to what is fast on those deployments too."""
    from transformers import AutoModel, AutoModelForCausalLM

    model = tiny.build(seed=2)
    src = save_model(model, tmp / "pruned", shard_bytes)
    if repaired(src, tmp / "fixed", strategy, targets) is None:
        return 0.0, 0.0  # a target refuses this model whatever the padding: nothing written
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert sorted(p.name for p in (tmp / "fixed").glob("*.safetensors")) == shards
    auto = AutoModel if tiny.family == "bert" else AutoModelForCausalLM
    fixed = auto.from_pretrained(tmp / "fixed")
    inter = fixed.config.intermediate_size
    assert inter % 8 == 0 and inter >= tiny.kwargs["intermediate_size"]
    ids = inputs(tiny.kwargs["vocab_size"])
    return assert_equivalent(run(model, ids), run(fixed, ids),
                             f"{tiny.family} intermediate {tiny.kwargs['intermediate_size']} "
                             f"-> {inter}")


def check_palu(tiny: TinyModel, group_size: int, ranks: list[list[int]],
               tmp: Path) -> tuple[float, float]:
    """PaLU layout (VT + U.{g} per head group): several group sites share VT's row axis."""
    model = tiny.build(seed=3)
    groups = tiny.kwargs["num_key_value_heads"] // group_size
    layers = tiny.kwargs["num_hidden_layers"]
    per_module = {}
    for i in range(layers):
        for j, proj in enumerate(("k_proj", "v_proj")):
            rs = ranks[(2 * i + j) % len(ranks)]
            per_module[f"model.layers.{i}.self_attn.{proj}"] = [rs[g % len(rs)]
                                                                 for g in range(groups)]
    state = palu_state(model, group_size, per_module)
    src = write_layout(model, state, tmp / "palu", {"head_wise_ranks": per_module})
    # minimal: at group size 1 a tiny model's optimal latent (16) would cost more than the
    # dense 16 x 64 group, which the repair refuses (never dearer than dense)
    report = repaired(src, tmp / "fixed", "minimal")
    assert report is not None
    assert any(r.site.role is Role.KV_LATENT for r in report.plan.repairs) or all(
        "more than the dense matrix" in r.reason for r in report.plan.refused
        if r.site.role is Role.KV_LATENT), "no group latent padded, and not for its cost"
    ids = inputs(tiny.kwargs["vocab_size"])
    return assert_equivalent(run(load_model(src), ids), run(load_model(tmp / "fixed"), ids),
                             f"PaLU group ranks {per_module}")


def check_svdllm(tiny: TinyModel, rank: int, tmp: Path, pickle: bool) -> tuple[float, float]:
    """SVD-LLM layout (X_u_proj / X_v_proj), as safetensors or as a pickled state dict (which
    the repair rewrites in place: the same file name, still a torch pickle)."""
    model = tiny.build(seed=4)
    names = [n for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and ".layers." in n and n.endswith("_proj")]
    state = svdllm_state(model, {n: rank for n in names})
    src = write_layout(model, state, tmp / "svdllm", pickle=pickle)
    report = repaired(src, tmp / "fixed", "minimal")
    assert report.container_out == ("torch-zip" if pickle else "safetensors")
    assert sorted(p.name for p in (tmp / "fixed").glob("*.*") if p.suffix != ".json") == [
        "pytorch_model.bin" if pickle else "model.safetensors"]
    ids = inputs(tiny.kwargs["vocab_size"])
    return assert_equivalent(run(load_model(src), ids), run(load_model(tmp / "fixed"), ids),
                             f"SVD-LLM rank {rank} ({'pickle' if pickle else 'safetensors'})")


def check_llm_pruner(tiny: TinyModel, sizes: dict[int, int], tmp: Path) -> tuple[float, float]:
    """A whole pickled model with per-layer pruned MLPs and a dense config, as LLM-Pruner
    writes; the repair reads it without unpickling and writes safetensors."""
    model = prune_intermediate(tiny.build(seed=5), sizes)
    src = tmp / "pruner"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(
        {**model.config.to_dict(), "architectures": [type(model).__name__]}))
    torch.save({"model": model}, src / "pytorch_model.bin")
    repaired(src, tmp / "fixed", "minimal")
    ids = inputs(tiny.kwargs["vocab_size"])
    return assert_equivalent(run(model, ids), run(load_model(tmp / "fixed"), ids),
                             f"LLM-Pruner intermediates {sizes}")


# ----------------------------------------------------------------------- module-level checks
def pad_weights(sites: list[DimSite], state: dict[str, torch.Tensor],
                strategy: str = "minimal") -> dict[str, torch.Tensor]:
    """Pad a module's weights with the repair's own plan and edits (no checkpoint needed)."""
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    p = planner.plan(sites, for_hardware(PROFILE, DTYPE), strategy, shapes=shapes)
    assert not p.refused, [r.reason for r in p.refused]
    return {k: p.edits[k].apply(v) if k in p.edits else v for k, v in state.items()}


def check_lowrank_pair(shape, seed: int = 0) -> tuple[float, float]:
    """y = A(B x): rank padded with zero rows of B and zero columns of A."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape.out_features, shape.in_features, generator=gen)
    f = factorize(w, shape.rank)
    state = {"B": f.B, "A": f.A, "bias": torch.randn(shape.out_features, generator=gen)}
    site = DimSite("pair:rank", Role.RANK, shape.rank,
                   [TensorAxis("B", 0, AxisKind.PRODUCER), TensorAxis("A", 1, AxisKind.CONSUMER)])
    new = pad_weights([site], state)
    x = torch.randn(5, shape.in_features, generator=gen)

    def forward(s):
        return F.linear(F.linear(x, s["B"]), s["A"], s["bias"])

    return assert_equivalent(forward(state), forward(new), f"low-rank pair {shape}")


def check_llama_mlp(hidden: int, inter: int, seed: int = 0) -> tuple[float, float]:
    """A stock LlamaMLP: zero rows in gate/up, zero columns in down (SiLU(0) * 0 = 0)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(seed)
    mlp = LlamaMLP(LlamaConfig(hidden_size=hidden, intermediate_size=inter,
                                num_attention_heads=1)).eval()
    state = {k: v.detach() for k, v in mlp.state_dict().items()}
    site = DimSite("mlp:intermediate", Role.INTERMEDIATE, inter, [
        TensorAxis("gate_proj.weight", 0, AxisKind.PRODUCER),
        TensorAxis("up_proj.weight", 0, AxisKind.PRODUCER),
        TensorAxis("down_proj.weight", 1, AxisKind.CONSUMER)])
    new = pad_weights([site], state)
    padded = LlamaMLP(LlamaConfig(hidden_size=hidden, num_attention_heads=1,
                                  intermediate_size=new["up_proj.weight"].shape[0])).eval()
    padded.load_state_dict(new)
    x = torch.randn(3, 7, hidden)
    with torch.no_grad():
        return assert_equivalent(mlp(x), padded(x), f"LlamaMLP intermediate {inter}")


def attention_state(heads: int, head_dim: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden, inner = 24, heads * head_dim
    return {"q.weight": torch.randn(inner, hidden, generator=gen) / hidden ** 0.5,
            "q.bias": torch.randn(inner, generator=gen),
            "k.weight": torch.randn(inner, hidden, generator=gen) / hidden ** 0.5,
            "k.bias": torch.randn(inner, generator=gen),
            "v.weight": torch.randn(inner, hidden, generator=gen),
            "v.bias": torch.randn(inner, generator=gen),
            "o.weight": torch.randn(hidden, inner, generator=gen)}


def head_dim_site(heads: int, head_dim: int) -> DimSite:
    """head_dim of a RoPE-free attention, with the q rows (and bias) named for compensation."""
    def axis(t: str, ax: int, kind: AxisKind) -> TensorAxis:
        return TensorAxis(t, ax, kind, blocks=heads, stride=head_dim)

    axes = [axis(f"{p}.{w}", 1 if p == "o" else 0,
                 AxisKind.CONSUMER if p == "o" else AxisKind.BIAS if w == "bias"
                 else AxisKind.PRODUCER)
            for p in "qkvo" for w in ("weight", "bias") if not (p == "o" and w == "bias")]
    return DimSite("attn:head_dim", Role.HEAD_DIM, head_dim, axes,
                   attrs={"softmax_scale_rows": ("q.weight", "q.bias")})


def sdpa_attention(s: dict[str, torch.Tensor], x: torch.Tensor, heads: int,
                   scale: float | None = None) -> torch.Tensor:
    """Multi-head attention through F.scaled_dot_product_attention (default scale
    1/sqrt(head_dim of the tensors given), or ``scale``)."""
    b, n, _ = x.shape

    def split(t):
        return t.view(b, n, heads, -1).transpose(1, 2)

    q, k, v = (split(F.linear(x, s[f"{p}.weight"], s[f"{p}.bias"])) for p in "qkv")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return F.linear(out.transpose(1, 2).reshape(b, n, -1), s["o.weight"])


def check_head_dim_compensated(heads: int, head_dim: int, seed: int = 0) -> tuple[float, float]:
    """Padded q/k/v head_dim under SDPA's default scale: exact only because the repair scales
    the real q rows by sqrt(d_new / d)."""
    state = attention_state(heads, head_dim, seed)
    new = pad_weights([head_dim_site(heads, head_dim)], state)
    x = torch.randn(2, 9, 24, generator=torch.Generator().manual_seed(seed + 7))
    return assert_equivalent(sdpa_attention(state, x, heads), sdpa_attention(new, x, heads),
                             f"SDPA head_dim {head_dim} compensated")


def check_head_dim_explicit_scale(heads: int, head_dim: int,
                                  seed: int = 0) -> tuple[float, float]:
    """With an explicit scale 1/sqrt(d) carried by the caller, zero padding alone is exact."""
    state = attention_state(heads, head_dim, seed)
    site = head_dim_site(heads, head_dim)
    site.attrs["softmax_scale_rows"] = ()
    new = pad_weights([site], state)
    x = torch.randn(2, 9, 24, generator=torch.Generator().manual_seed(seed + 7))
    scale = 1 / math.sqrt(head_dim)
    return assert_equivalent(sdpa_attention(state, x, heads, scale),
                             sdpa_attention(new, x, heads, scale),
                             f"SDPA head_dim {head_dim} with explicit scale")




def mean_pooled(model: nn.Module, batch) -> torch.Tensor:
    """sentence-transformers' pooling for this model: mean over real tokens, L2-normalised."""
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
