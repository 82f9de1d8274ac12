"""``--realign`` for SVD-LLM: re-truncate its factors in the whitened basis they were built in.

SVD-LLM (AIoT-MLSys-Lab/SVD-LLM, SVDLLM.py ``whitening``) factorises ``W S`` (``S`` the Cholesky
factor of the calibration activations' Gram matrix): ``U, Sigma, V^T = svd(W S)``, then
``svd_u = U_r sqrt(Sigma_r)`` and ``svd_v = sqrt(Sigma_r) V_r^T S^{-1}``. The columns of
``svd_u`` are orthogonal with squared norms ``sigma_i``, in descending order, so the first
``r'`` columns of ``svd_u`` and rows of ``svd_v`` are exactly SVD-LLM's own rank-``r'`` result,
and ``sigma_i = ||svd_u[:, i]||^2`` is each component's whitened singular value: the factors
alone say what every lower rank costs on the calibration data (``sum`` of the discarded
``sigma_i^2``, SVD-LLM's truncation loss), without ``S`` or the dense weights. A rank can go
down exactly, or up to the alignment by zero padding; never dense (the pickled module stays
SVD-LLM's u/v pair). A dense ``--base`` (and ``--calib``) only measures each choice
(:mod:`gac_check.ranks.measured`): it never chooses. The pickle is
rewritten in place, never unpickled (:mod:`gac_check.checkpoint.torchzip_write`), as
``--repair`` does.

Factors updated after truncation (SVDLLM.py's ``whitening_then_update``/``update_only``) are
no longer orthogonal, so their column norms are not singular values: refused.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.outdir import atomic_output_dir, copy_side_files, weight_file_names
from gac_check.checkpoint.tensors import tensor
from gac_check.checkpoint.torchzip_write import IntEdit, plan_rewrite, write_archive
from gac_check.contract.rules import Finding
from gac_check.errors import BadInput
from gac_check.formats.svdllm import U_SUFFIX, V_SUFFIX
from gac_check.ranks.candidates import RankMenu
from gac_check.ranks.factors import PROVENANCE, RealignReport, keep_best, select_ranks
from gac_check.ranks.knapsack import DENSE
from gac_check.ranks.measured import Truncated, measure, site_weights

#: The families whose realigned SVD-LLM output tests load with SVD-LLM's own call.
FAMILIES = frozenset({"llama"})
#: Largest |cos| between two columns of svd_u still read as orthogonal, per factor precision:
#: rounding to 16 bits leaves under 1e-3 (bfloat16, measured on the test models); an update
#: after truncation leaves far more.
COHERENCE = {torch.float32: 1e-3, torch.float64: 1e-6}
COHERENCE_16BIT = 1e-2


@dataclass
class Factors:
    """One SVD-LLM pair, ``u`` [out, r] and ``v`` [r, in], by name (the tensors are read again
    when written, so only one is in memory at a time), and each component's whitened value."""

    module: str
    u_name: str
    v_name: str
    rank: int
    sigma: torch.Tensor  # whitened singular values, descending
    order: torch.Tensor  # the components in that order (the stored order when it descends)

    def truncated(self, ckpt: Checkpoint, name: str, rank: int) -> torch.Tensor:
        """``u`` or ``v`` at ``rank``: the largest components, zero-padded past the stored rank."""
        keep = self.order[:rank]
        if name == self.u_name:
            u = tensor(ckpt, name)
            out = u.new_zeros(u.shape[0], rank)
            out[:, :keep.numel()] = u[:, keep]
            return out
        v = tensor(ckpt, name)
        out = v.new_zeros(rank, v.shape[1])
        out[:keep.numel()] = v[keep]
        return out


def factor_menus(menus: list[RankMenu]) -> list[RankMenu]:
    """The menus without the dense option, which SVD-LLM's pickled u/v modules cannot hold."""
    out = []
    for menu in menus:
        ranks = tuple(r for r in menu.candidates if r != DENSE)
        if not ranks:
            raise BadInput(f"{menu.module}: no rank {menu.targets or 'aligned'} fits within its "
                           f"factors (rank {menu.rank}), and SVD-LLM's u/v modules cannot hold a "
                           "dense matrix: nothing to re-select; run --repair OUT instead")
        out.append(dataclasses.replace(menu, candidates=ranks))
    return out


def require_rewritable(ckpt: Checkpoint, family: str | None, base: Path | None,
                       calib: Path | None) -> None:
    """Refuse, from the headers, what this rewrite cannot honour: a family no test loads with
    SVD-LLM's code, and ``--calib`` without ``--base`` (both only measure the choices:
    SVD-LLM's calibration is already in its factors)."""
    if family not in FAMILIES:
        raise BadInput(f"is an svd-llm checkpoint of the {family or 'unknown'} family; "
                       "--realign writes svd-llm checkpoints only of families whose output is "
                       f"tested in SVD-LLM's own loader ({', '.join(sorted(FAMILIES))})",
                       ckpt.path)
    if ckpt.container != "torch-zip" or len(ckpt.files) != 1:
        raise BadInput("--realign rewrites SVD-LLM's own save, one torch pickle "
                       "(torch.save({'model', 'tokenizer'})); this svd-llm checkpoint is "
                       f"{len(ckpt.files)} {ckpt.container} file(s): run --repair OUT instead",
                       ckpt.path)
    if calib is not None and not calib.is_file():
        raise BadInput("--calib: no such file", calib)
    if calib is not None and base is None:
        raise BadInput("--calib needs --base: an svd-llm model is re-selected from its own "
                       "whitened factors (SVD-LLM's calibration is already in them); --base "
                       "and --calib only measure each choice against the dense model",
                       ckpt.path)


def read_factors(ckpt: Checkpoint, menu: RankMenu) -> Factors:
    """A pair and its whitened values; refuses factors whose u columns are not orthogonal."""
    stem = menu.module.removesuffix("_proj")
    u_name, v_name = stem + U_SUFFIX, stem + V_SUFFIX
    u = tensor(ckpt, u_name)
    components = stored_components(u)
    if isinstance(components, float):
        raise BadInput(f"{u_name}: its columns are not orthogonal (|cos| up to "
                       f"{components:.3g}), so they are not SVD-LLM's whitened singular vectors "
                       "(factors updated after truncation, as SVDLLM.py's update steps do): "
                       "--realign cannot re-truncate them exactly; run --repair OUT instead",
                       ckpt.path)
    sigma, order = components
    return Factors(menu.module, u_name, v_name, u.shape[1], sigma, order)


def stored_components(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | float:
    """The components of a left factor stored as ``U_r sqrt(Sigma_r)`` (SVD-LLM's ``svd_u``,
    PaLU's ``U_g``): each column's value ``sigma_i = ||u[:, i]||^2`` in descending order, and
    the columns in that order; or, where the columns are not orthogonal (within what the
    factor's precision leaves, :data:`COHERENCE`), the largest ``|cos|`` between two of them:
    their norms are then not singular values, and a prefix is no truncation."""
    cols = u.double()
    gram = cols.T @ cols
    sigma = gram.diagonal().clone()
    norms = sigma.sqrt().clamp_min(torch.finfo(torch.float64).tiny)
    cos = (gram / norms[:, None] / norms[None, :]).fill_diagonal_(0).abs()
    worst = float(cos.max()) if cos.numel() else 0.0
    if worst > COHERENCE.get(u.dtype, COHERENCE_16BIT):
        return worst
    order = torch.argsort(sigma, descending=True, stable=True)
    return sigma[order], order


def realign_svdllm(ckpt: Checkpoint, menus: list[RankMenu], out: Path, align: int,
                   budget: str = "same", force: bool = False,
                   recheck: Callable[[Path], list[Finding]] | None = None,
                   base_dir: Path | None = None, calib: Path | None = None,
                   progress: bool = True) -> RealignReport:
    """Maximise the whitened energy kept (minimise SVD-LLM's own truncation loss) under the
    budget, over aligned ranks within each pair's factors, and write OUT in SVD-LLM's layout;
    with ``base_dir`` (the dense original) each choice's output error is measured against it
    (on ``calib``'s inputs, and the whole model's, where given); with ``calib`` too, each
    site's energy is weighted by its share of the output error (:mod:`gac_check.ranks.shares`)."""
    pairs = [read_factors(ckpt, menu) for menu in menus]
    spectra = [p.sigma for p in pairs]
    weights = None  # with --calib, each site weighted by its share of the output error
    if base_dir is not None and calib is not None:
        weights = site_weights(_sites(ckpt, pairs), menus, spectra, base_dir, calib, progress)
    report = select_ranks(menus, spectra, out, align, budget, weights=weights,
                          allow_dense=False,
                          error_name="whitened error (SVD-LLM's truncation loss, sum of "
                                     "discarded sigma^2)")
    report.notes.append("svd-llm: ranks re-truncated in the whitened basis SVD-LLM built them "
                        "in (each component's value is ||svd_u[:, i]||^2); the error shown is "
                        "SVD-LLM's truncation loss (discarded sigma^2) relative to the input")
    if base_dir is not None and report.kept is not None:
        report.kept = measure(report.kept, _sites(ckpt, pairs), base_dir, calib, progress)
        report.notes.append(f"--base {base_dir}{' --calib ' + str(calib) if calib else ''}: "
                            + ("used to measure and to weight each pair's whitened energy by "
                               "its share of the model's output error" if calib else
                               "used to measure only (each choice's output error against the "
                               "dense weights)")
                            + "; the ranks are still selected from SVD-LLM's own whitened "
                            "factors")
    _write(ckpt, pairs, keep_best(report, menus), force, recheck)
    return report


def _sites(ckpt: Checkpoint, pairs: list[Factors]) -> list[Truncated]:
    """Each pair as the base measures it: SVD-LLM names it ``<stem>_u_proj``/``<stem>_v_proj``
    after the dense ``<stem>_proj`` it replaced, whose ``.weight`` the base must hold."""
    return [Truncated(p.module, p.module, 0, tensor(ckpt, p.u_name), tensor(ckpt, p.v_name),
                      p.order) for p in pairs]


def _write(ckpt: Checkpoint, pairs: list[Factors], report: RealignReport, force: bool,
           recheck: Callable[[Path], list[Finding]] | None) -> None:
    """Every file of the pickle under its own name, the moved pairs' tensors and the
    ``in_features``/``out_features`` that record their rank replaced; then the re-check and
    the provenance record, all before OUT appears."""
    ranks = report.plan.ranks
    moved = [p for p in pairs if ranks[p.module] != p.rank]
    owner: dict[str, tuple[Factors, int]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    edits = []
    for p in moved:
        rank = int(ranks[p.module])
        owner[p.u_name] = owner[p.v_name] = (p, rank)
        shapes[p.u_name] = (ckpt.tensors[p.u_name].shape[0], rank)
        shapes[p.v_name] = (rank, ckpt.tensors[p.v_name].shape[1])
        edits += [IntEdit(p.u_name.removesuffix(".weight"), ("in_features",), p.rank, rank),
                  IntEdit(p.v_name.removesuffix(".weight"), ("out_features",), p.rank, rank)]
    archives = plan_rewrite(ckpt, shapes, edits)

    def data(name: str) -> memoryview:
        pair, rank = owner[name]
        flat = pair.truncated(ckpt, name, rank).contiguous().reshape(-1).view(torch.uint8)
        return memoryview(flat.numpy())

    with atomic_output_dir(report.out, force) as tmp:
        for rw in archives:
            write_archive(rw, tmp / rw.src.name, data)
        copy_side_files(ckpt.path, tmp, skip=weight_file_names(ckpt.path) | {PROVENANCE})
        applied = sum(len(rw.applied) for rw in archives)
        report.notes.append(f"the torch pickle was rewritten in its own layout (same files, "
                            f"same objects, never unpickled): {len(shapes)} factor tensors "
                            f"rewritten, {applied} pickled in_features/out_features updated")
        if recheck is not None:
            report.remaining = recheck(tmp)
        (tmp / PROVENANCE).write_text(json.dumps(
            {"source": str(ckpt.path), **report.to_json()}, indent=2) + "\n")
