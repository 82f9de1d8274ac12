"""``--realign`` for PaLU: re-select each head group's latent rank from the group's own factors.

PaLU (shadowpa0327/Palu, ``palu/model/modules/svd_linear.py``, ``HeadwiseLowRankModule``)
splits a K/V projection's output rows into head groups and stores, per group ``g``, a latent
``VT_g`` [r_g, in] (its row segment of ``X.VT.weight``, the segments concatenated in group
order) and ``U_g`` [group_out, r_g] (``X.U.{g}.weight``, with the bias if the linear had one);
config.json's ``head_wise_ranks[X]`` lists the r_g.

Both of PaLU's decompositions store ``U_g = U_r sqrt(Sigma_r)``: ``--decompose_method whiten``
(its default, ``_per_head_whiten_decomposition_from_weight``) of ``svd(W_g S)`` with ``S`` the
Cholesky factor of the calibration activations' Gram matrix, ``svd``
(``_per_head_decomposition_from_weight``) of ``svd(W_g)``. So ``U_g``'s columns are
orthogonal, with squared norms ``sigma_i`` (the whitened singular values, or the plain ones),
and its first ``r'`` columns with ``VT_g``'s first ``r'`` rows are exactly PaLU's own
rank-``r'`` result under either method:
the re-truncation needs no ``S`` (which PaLU does not save: it lives on the replaced
``nn.Linear`` as ``scaling_diag_matrix`` during compress.py, and in its cache file
``cache/whiten/..._scaling_matrices_fp16.pt`` only with ``--use_cache``). Each group's values
(:func:`gac_check.ranks.whitened.stored_components`) are what the knapsack weighs, as for
SVD-LLM.

Where some group's ``U_g`` columns are not orthogonal (factors changed after PaLU built them,
e.g. a Hadamard rotation fused into them as ``fused_hadamard_matrix`` does), no stored
component is a singular vector; every group is then re-truncated in weight space instead: the
SVD of its product ``U_g VT_g`` (two thin QRs of the factors:
:func:`gac_check.ranks.factors.svd_of_product`), the best approximation of it at every lower
rank (Eckart-Young), which is PaLU's own result only for an ``svd`` build. The output says
which.

A group can go down to an aligned rank within its own, or up to the next aligned rank by zero
padding (exactly the input's factors, paid for with what other groups freed); never dense
(PaLU's module has no dense form). The grouping is kept: a group's rows are never moved to
another. The dense weights (``--base``, with ``--calib``) only measure each choice (every
group's output error against its rows of the dense K/V projection,
:mod:`gac_check.ranks.measured`): ranks above the factors would need PaLU's group
SVD (and its whitening) re-run on them, which needs its calibration data, so they never choose.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.outdir import atomic_output_dir, copy_side_files, weight_file_names
from gac_check.checkpoint.tensors import read_state
from gac_check.contract.rules import Contract, Finding
from gac_check.errors import BadInput
from gac_check.formats.palu import FULL_WIDTH, VT
from gac_check.ranks.candidates import RankMenu
from gac_check.ranks.factors import (
    PROVENANCE,
    RealignReport,
    keep_best,
    select_ranks,
    svd_of_product,
)
from gac_check.ranks.measured import Truncated, measure, site_weights
from gac_check.ranks.whitened import stored_components
from gac_check.sites import DimSite, Role

#: The families whose realigned PaLU output tests load with PaLU's own from_pretrained.
FAMILIES = frozenset({"llama"})


@dataclass
class Group:
    """One head group: each component's value (descending: the knapsack's spectrum) and how a
    lower rank is cut, either a prefix of the stored components in that ``order`` (PaLU's
    basis) or the leading components of the product's SVD ``U``, ``Vh`` (float64)."""

    site: str  # "X:group{g}", the knapsack's and the report's name
    module: str
    index: int
    rank: int
    S: torch.Tensor
    order: torch.Tensor | None = None
    U: torch.Tensor | None = None
    Vh: torch.Tensor | None = None


#: What the knapsack minimises in each basis, as the report names it.
STORED_ERROR = ("PaLU's own truncation loss in the basis it built each group in (sum of "
                "discarded sigma^2, sigma_i = ||U_g[:, i]||^2: whitened for its default "
                "--decompose_method whiten)")
PRODUCT_ERROR = "weight-space error of the group products (sum of discarded s^2)"


def group_menus(sites: list[DimSite], shapes: dict[str, tuple[int, ...]], contract: Contract,
                align: int) -> list[RankMenu]:
    """Every group latent's menu: the aligned ranks within its own r_g (exact re-truncation)
    and the next aligned one above it (zero-padded), up to min(group_out, in); no dense."""
    menus = []
    for site in sites:
        if site.role is not Role.KV_LATENT:
            continue
        vt, u = (ax.tensor for ax in site.axes)
        m, n = shapes[u][0], shapes[vt][1]
        up = -(-site.value // align) * align
        ranks = [r for r in range(align, up + 1, align) if r <= min(m, n)]
        targets = ""
        if contract.targets is not None:
            ranks = contract.targets.fast_values(site, ranks)
            targets = ", ".join(t.spec for t in contract.targets.targets)
        if not ranks:
            raise BadInput(f"{site.name}: no rank {targets or 'aligned'} fits within its group "
                           f"(latent {site.value}, group {m} x {n}), and PaLU's module cannot "
                           "hold a dense matrix: nothing to re-select; run --repair OUT instead")
        problem = "; ".join(r.why for r in contract.violations(site))
        menus.append(RankMenu(site.name, m, n, site.value, tuple(ranks),
                              f"rank {site.value}: {problem}" if problem else "", targets, True))
    return menus


def require_rewritable(ckpt: Checkpoint, family: str | None, sites: list[DimSite],
                       base: Path | None, calib: Path | None) -> None:
    """Refuse, from the headers, what this rewrite cannot honour: ``--calib`` without
    ``--base`` (both only measure), a
    family no test loads with PaLU's code, and a config whose ``head_wise_ranks`` does not
    say what the tensors hold (OUT's would be wrong too)."""
    if calib is not None and not calib.is_file():
        raise BadInput("--calib: no such file", calib)
    if calib is not None and base is None:
        raise BadInput("--calib needs --base: a palu model is re-selected from its own group "
                       "factors (ranks above them would need PaLU's group SVD, and its "
                       "whitening, re-run on the dense weights); --base and --calib only "
                       "measure each choice against the dense model", ckpt.path)
    if family not in FAMILIES:
        raise BadInput(f"is a palu checkpoint of the {family or 'unknown'} family; --realign "
                       "writes palu checkpoints only of families whose output is tested in "
                       f"PaLU's own loader ({', '.join(sorted(FAMILIES))})", ckpt.path)
    declared = ckpt.config.get("head_wise_ranks")
    for site in sites:
        disagree = [n for n in site.notes if FULL_WIDTH not in n]
        if site.role is Role.KV_LATENT and disagree:
            raise BadInput(f"{site.module}: {disagree[0]}; --realign rewrites head_wise_ranks "
                           "from the tensors and will not guess which is right", ckpt.path)
    if not isinstance(declared, dict):
        raise BadInput("config.json has no head_wise_ranks: PaLU's loader could not build OUT",
                       ckpt.path)
    stray = sorted(n for n in ckpt.tensors if n.endswith(".VT.bias"))
    if stray:
        raise BadInput(f"{stray[0]}: PaLU's VT has no bias; not a layout --realign can "
                       "rewrite", ckpt.path)


def read_groups(state: dict[str, torch.Tensor], menus: list[RankMenu]
                ) -> tuple[list[Group], str | None]:
    """Each group's factors, sliced from VT by the running sum of the earlier r_g, in PaLU's
    stored basis; or, where a ``U_g``'s columns are not orthogonal, every group in weight space
    (one objective for all groups), with the first such group and its largest ``|cos|``."""
    slices = []
    starts: dict[str, int] = {}
    for menu in menus:
        module, _, tail = menu.module.rpartition(":group")
        g = int(tail)
        start = starts.get(module, 0)
        starts[module] = start + menu.rank
        slices.append((menu, module, g, state[f"{module}.U.{g}.weight"],
                       state[module + VT][start:start + menu.rank]))
    stored = []
    for menu, module, g, u, _ in slices:
        components = stored_components(u)
        if isinstance(components, float):
            return ([Group(menu.module, module, g, menu.rank, S, U=U, Vh=Vh)
                     for menu, module, g, u, vt in slices
                     for U, S, Vh in [svd_of_product(u.double(), vt.double())]],
                    f"{module}.U.{g}.weight: columns not orthogonal (|cos| up to "
                    f"{components:.3g})")
        sigma, order = components
        stored.append(Group(menu.module, module, g, menu.rank, sigma, order=order))
    return stored, None


def realign_palu(ckpt: Checkpoint, menus: list[RankMenu], out: Path, align: int,
                 budget: str = "same", force: bool = False,
                 recheck: Callable[[Path], list[Finding]] | None = None,
                 base_dir: Path | None = None, calib: Path | None = None,
                 progress: bool = True) -> RealignReport:
    """Keep the most of every group's product (least discarded ``s^2``) under the budget, over
    aligned ranks within (or just above) each group's, and write OUT in PaLU's layout; with
    ``base_dir`` (the dense original) each choice's output error is measured against it (on
    ``calib``'s inputs, and the whole model's, where given), the selection unchanged."""
    if not menus:
        raise BadInput("is in palu format but has no group latents (X.VT.weight with X.U.{g}): "
                       "nothing to realign", ckpt.path)
    state = read_state(ckpt)
    groups, unrotated = read_groups(state, menus)
    spectra = [g.S for g in groups]
    weights = None  # with --calib, each site weighted by its share of the output error
    if base_dir is not None and calib is not None:
        weights = site_weights(_sites(state, groups), menus, spectra, base_dir, calib, progress)
    report = select_ranks(menus, spectra, out, align, budget, weights=weights, allow_dense=False,
                          error_name=PRODUCT_ERROR if unrotated else STORED_ERROR)
    if unrotated is None:
        report.notes.append("palu: each head group's latent re-truncated in the basis PaLU built "
                            "it in (U_g's columns are U_r sqrt(Sigma_r), whitened for "
                            "--decompose_method whiten, its default): a lower rank keeps the "
                            "leading components, PaLU's own lower-rank result; the error shown "
                            "is relative to the input")
    else:
        report.notes.append(f"palu: {unrotated}, so the stored components are not PaLU's "
                            "singular vectors (factors changed after compress.py, e.g. a fused "
                            "Hadamard rotation): every group re-truncated in weight space "
                            "instead (the SVD of U_g VT_g), PaLU's own result only for "
                            "--decompose_method svd builds; grouping kept")
    if base_dir is not None and report.kept is not None:
        report.kept = measure(report.kept, _sites(state, groups), base_dir, calib, progress)
        report.notes.append(f"--base {base_dir}{' --calib ' + str(calib) if calib else ''}: "
                            + ("used to measure and to weight each group's energy by its K/V "
                               "projection's share of the model's output error" if calib else
                               "used to measure only (each group's output error against its "
                               "rows of the dense K/V projection)")
                            + "; the ranks are still selected from PaLU's own group factors")
    _write(ckpt, state, groups, keep_best(report, menus), force, recheck)
    return report


def _sites(state: dict[str, torch.Tensor], groups: list[Group]) -> list[Truncated]:
    """Each group as the base measures it: its rows (``U.{g}``'s height each, in group order)
    of the dense K/V projection ``<module>.weight`` that PaLU's ``VT``/``U.{g}`` replaced; in
    the weight-space basis, its product's leading components."""
    out = []
    start: dict[str, int] = {}
    top: dict[str, int] = {}
    for g in groups:
        u = state[f"{g.module}.U.{g.index}.weight"]
        lo = start.get(g.module, 0)
        row = top.get(g.module, 0)
        start[g.module], top[g.module] = lo + g.rank, row + u.shape[0]
        if g.order is not None:
            out.append(Truncated(g.site, g.module, row, u, state[g.module + VT][lo:lo + g.rank],
                                 g.order))
        else:
            assert g.U is not None and g.Vh is not None
            out.append(Truncated(g.site, g.module, row, g.U * g.S, g.Vh,
                                 torch.arange(g.S.numel())))
    return out


def _write(ckpt: Checkpoint, state: dict[str, torch.Tensor], groups: list[Group],
           report: RealignReport, force: bool,
           recheck: Callable[[Path], list[Finding]] | None) -> None:
    """The input's tensors with each module's VT and moved U.{g} replaced (``state`` is
    consumed), head_wise_ranks updated, then the re-check and the provenance record, all
    before OUT appears."""
    from safetensors.torch import save_file

    ranks = report.plan.ranks
    by_module: dict[str, list[Group]] = {}
    for g in groups:
        by_module.setdefault(g.module, []).append(g)
    declared = dict(ckpt.config["head_wise_ranks"])
    for module, members in by_module.items():
        vt = state[module + VT]
        start, parts = 0, []
        for g in members:
            rank = int(ranks[g.site])
            u_name = f"{module}.U.{g.index}.weight"
            u, seg = _refactored(g, rank, state[u_name], vt[start:start + g.rank])
            state[u_name] = u.contiguous()
            parts.append(seg)
            start += g.rank
        state[module + VT] = torch.cat(parts).contiguous()
        declared[module] = [int(ranks[g.site]) for g in members]
    config = dict(ckpt.config, head_wise_ranks=declared)
    with atomic_output_dir(report.out, force) as tmp:
        copy_side_files(ckpt.path, tmp, skip=weight_file_names(ckpt.path)
                        | {"config.json", PROVENANCE})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        moved = sum(ranks[g.site] != g.rank for g in groups)
        report.notes.append(f"written in PaLU's layout (VT and U.{{g}} per K/V module, "
                            f"head_wise_ranks updated): {moved} of {len(groups)} group "
                            "latents moved")
        if recheck is not None:
            report.remaining = recheck(tmp)
        (tmp / PROVENANCE).write_text(json.dumps(
            {"source": str(ckpt.path), **report.to_json()}, indent=2) + "\n")


def _refactored(g: Group, rank: int, u: torch.Tensor, vt: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``U_g`` and ``VT_g`` at ``rank``: unchanged at the input's rank, the input's own
    factors zero-padded above it (exact); below it, the leading stored components (PaLU's
    basis) or the product's leading components (weight space)."""
    if rank >= g.rank:
        pad_u = u.new_zeros(u.shape[0], rank)
        pad_u[:, :g.rank] = u
        pad_vt = vt.new_zeros(rank, vt.shape[1])
        pad_vt[:g.rank] = vt
        return pad_u, pad_vt
    if g.order is not None:
        keep = g.order[:rank]
        return u[:, keep], vt[keep]
    assert g.U is not None and g.Vh is not None
    root = g.S[:rank].sqrt()
    return ((g.U[:, :rank] * root).to(u.dtype), (root[:, None] * g.Vh[:rank]).to(vt.dtype))
