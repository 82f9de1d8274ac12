"""``--realign``'s engine: re-select aligned ranks under the compressor's own budget (GAC).

Zero padding costs memory; re-selection keeps the memory and moves the approximation error to
where it costs least. With ``--base DENSE_DIR`` the candidates are truncated SVDs of the dense
weights (any aligned rank up to the useful maximum, or keeping the matrix dense). Without it
only the existing factors are available, so a matrix can only go *down* to an aligned rank
within its current one; we do that and say so.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gac_check.checkpoint.index import Checkpoint, open_checkpoint
from gac_check.checkpoint.outdir import (
    atomic_output_dir,
    copy_side_files,
    weight_file_names,
)
from gac_check.checkpoint.tensors import read_state, tensor
from gac_check.contract.rules import ERROR, WARNING, Contract, Finding
from gac_check.errors import BadInput
from gac_check.progress import steps
from gac_check.ranks.calibration import Activations, activations
from gac_check.ranks.candidates import RankMenu
from gac_check.ranks.guarantee import Verdict, bounded, choose, lowest, plan_of
from gac_check.ranks.kept import CHOICES, INPUT, REALIGNED, Kept, kept
from gac_check.ranks.knapsack import DENSE, Matrix, RankPlan, budget_from_spec, realign_plan
from gac_check.ranks.model_output import Operator, model_output
from gac_check.ranks.output_error import (
    IDENTITY,
    Spectrum,
    calibration_inputs,
    output_error,
    spectrum,
)
from gac_check.ranks.shares import WEIGHTED, Probe, output_weights
from gac_check.sites import Role

#: the provenance record written into OUT, as a repair writes gac-repair.json
PROVENANCE = "gac-realign.json"

B_SUFFIX, A_SUFFIX = ".BLinear.weight", ".ALinear.weight"


@dataclass
class Source:
    """One low-rank matrix: its shape, SVD (of the dense weight or of the current product)."""

    module: str
    m: int
    n: int
    rank: int
    U: torch.Tensor
    S: torch.Tensor
    Vh: torch.Tensor
    bias: torch.Tensor | None
    current_error: float  # ||W - A B||_F^2 against the reference weight
    dtype: torch.dtype  # the factors' dtype, which the rewritten ones keep
    #: the output energy per singular direction on the sampled inputs (with --base only)
    output: Spectrum | None = None


@dataclass
class RealignReport:
    """What changed: the plan, the budget it kept, and what went in and came out."""

    out: Path
    plan: RankPlan
    align: int
    old_ranks: dict[str, int]
    old_params: int
    old_error: float
    with_base: bool
    notes: list[str] = field(default_factory=list)
    #: what the re-check of OUT still finds (run before OUT appears, as a repair's is)
    remaining: list[Finding] = field(default_factory=list)
    #: per matrix, why it ended at its rank (what its old rank broke, what it was offered)
    why: dict[str, str] = field(default_factory=dict)
    #: what the error measures (SVD-LLM's is its whitened truncation loss)
    error_name: str = "weight-space error (sum of discarded s^2)"
    #: what the plan and rounding each rank down/up keep, per matrix (the report's chart)
    kept: Kept | None = None
    #: which plan was written and how it measured against the others (:func:`keep_best`)
    verdict: Verdict | None = None
    #: which menus the knapsack chose from (bounded near the input's ranks, or all)
    menus_note: str = ""
    #: the knapsack's instance, so a rounding can be written in its plan's place
    instance: list[Matrix] = field(default_factory=list, repr=False)
    #: each matrix's weight on its energy (its measured share of the output error, --calib)
    weights: dict[str, float] | None = None

    def matrices(self) -> list[dict]:
        """Each matrix's rank before and after, and why: the report's per-matrix table."""
        return [{"module": c.name, "before": self.old_ranks[c.name], "after": c.rank,
                 "why": self.why.get(c.name, "")} for c in self.plan.choices]

    def to_json(self) -> dict:
        counts = {sev: sum(f.severity == sev for f in self.remaining)
                  for sev in ("error", "warning")}
        return {"out": str(self.out), "align": self.align, "with_base": self.with_base,
                "old_ranks": self.old_ranks, "old_params": self.old_params,
                "old_error": self.old_error, "plan": self.plan.as_dict(), "notes": self.notes,
                "matrices": self.matrices(), "remaining": counts,
                "quality": self.kept.to_json() if self.kept else None,
                "written": self.verdict.to_json() if self.verdict else None,
                "weights": self.weights}


def rank_alignment(contract: Contract, strategy: str = "minimal") -> int:
    """The multiple every rank must be: the lcm of the contract's rank rules' moduli."""
    severities = (ERROR,) if strategy == "minimal" else (ERROR, WARNING)
    align = 1
    for rule in contract.rules:
        if Role.RANK in rule.roles and rule.severity in severities and not rule.allowed:
            align = math.lcm(align, rule.modulus)
    return align


def sources(state: dict[str, torch.Tensor], modules: list[str], base: Checkpoint | None,
            acts: Activations | None = None, progress: bool = True) -> list[Source]:
    scales = acts.scales if acts else {}
    samples = acts.samples if acts else {}
    return [_source(state, base, module, scales.get(module), samples.get(module))
            for module in steps(modules, "factorizing", enabled=progress)]


def _source(state: dict[str, torch.Tensor], base: Checkpoint | None, module: str,
            scale: torch.Tensor | None = None, sample: torch.Tensor | None = None) -> Source:
    """SVD of the reference weight; with ``scale`` (activation-aware) of ``W diag(scale)``,
    unscaled again in Vh so the factors still multiply to an approximation of W. With a base,
    also each singular direction's output energy on ``sample`` (None: X = I)."""
    a = state[module + A_SUFFIX].double()
    b = state[module + B_SUFFIX].double()
    bias = state.get(f"{module}.ALinear.bias")
    m, n = a.shape[0], b.shape[1]
    if base is not None:
        w = base_weight(base, module, (m, n)).double()
        s = torch.ones(n, dtype=torch.float64) if scale is None else scale
        U, S, Vh = torch.linalg.svd(w * s, full_matrices=False)
        Vh = Vh / s
        err = float((((w - a @ b) * s) ** 2).sum())
        output = spectrum(w, a, b, S, Vh, sample)
    else:
        U, S, Vh = svd_of_product(a, b)
        err = 0.0
        output = None
    return Source(module, m, n, a.shape[1], U, S, Vh, bias, err,
                  state[module + A_SUFFIX].dtype, output)


def base_weight(base: Checkpoint, module: str, shape: tuple[int, int]) -> torch.Tensor:
    """``module``'s dense weight in ``base``, by the module's own name, refused (one line)
    where it is missing or its shape is not what the compressed factors make."""
    name = f"{module}.weight"
    if name not in base.tensors:
        raise BadInput(f"has no {name!r}: it is not the dense original of the compressed "
                       "model", base.path)
    if base.tensors[name].shape != shape:
        raise BadInput(f"{name} is {list(base.tensors[name].shape)}, the compressed model's "
                       f"factors make {list(shape)}: not the same model", base.path)
    return tensor(base, name)


def svd_of_product(a: torch.Tensor, b: torch.Tensor):
    """SVD of A @ B through two thin QRs: O((m + n) r^2), never the m x n product."""
    qa, ra = torch.linalg.qr(a)
    qb, rb = torch.linalg.qr(b.T)
    u, s, vh = torch.linalg.svd(ra @ rb.T)
    return qa @ u, s, vh @ qb.T


def realign(ckpt: Checkpoint, menus: list[RankMenu], out: Path, align: int,
            base_dir: Path | None = None, budget: str = "same", force: bool = False,
            calib: Path | None = None, progress: bool = True,
            recheck: Callable[[Path], list[Finding]] | None = None) -> RealignReport:
    """Solve the knapsack over each matrix's menu (:mod:`gac_check.ranks.candidates`) for an
    ASVD-layout checkpoint and write the re-selected model.

    ``recheck`` checks the finished output before it appears, so its ``gac-realign.json``
    records what remains, like a repair's ``gac-repair.json``.
    """
    if calib is not None:  # refused before any work: the SVDs take minutes on a real model
        if base_dir is None:
            raise BadInput("--calib needs --base: activations come from the dense model")
        if not Path(calib).is_file():
            raise BadInput("--calib: no such file", calib)
    if not menus:
        raise BadInput("has no low-rank sites: nothing to realign (it is not a low-rank "
                       "compressed model in a format gac-check can rewrite)", ckpt.path)
    base = open_checkpoint(base_dir) if base_dir else None
    modules = [menu.module for menu in menus]
    acts = None
    if calib is not None:
        acts = activations(Path(base_dir), modules, Path(calib))
    state = read_state(ckpt)
    srcs = sources(state, modules, base, acts, progress)
    weights = (output_weights(Path(base_dir), Path(calib), _probes(srcs, menus),
                              progress) if calib is not None else None)
    report = select_ranks(menus, [src.S for src in srcs], out, align, budget,
                          old_errors={s.module: s.current_error for s in srcs} if base else None,
                          with_base=base is not None, weights=weights)
    if base is not None and report.kept is not None:
        report.kept = _with_output(report.kept, srcs, acts, calib)
        if calib is not None:
            report.kept = dataclasses.replace(report.kept, model=model_output(
                Path(base_dir), Path(calib), _operators(report.kept, srcs, state),
                {s.module: s.bias for s in srcs}, progress))
    if acts is not None:
        report.notes.append(f"activation-aware objective from {calib}: errors are "
                            "activation-weighted (ASVD scaling, alpha 0.5)")
    if base is None:
        report.notes.append("no --base given: only the existing factors were available (ranks "
                            "go down within them, up only to the alignment by zero padding); "
                            "the error shown is relative to the compressed model")
    _write(ckpt, state, srcs, keep_best(report, menus), force, recheck)
    return report


def _with_output(k: Kept, srcs: list[Source], acts: Activations | None,
                 calib: Path | None) -> Kept:
    """``k`` with every matrix's output error under each choice, on the calibration sample
    (or X = I without one)."""
    rows = min((len(x) for x in acts.samples.values()), default=0) if acts else 0
    inputs = (calibration_inputs(str(calib), rows, acts.lines, acts.tokens)
              if acts else IDENTITY)
    measured = output_error({s.module: s.output for s in srcs if s.output is not None},
                            {row.module: row.ranks for row in k.matrices}, inputs, rows, INPUT)
    return dataclasses.replace(k, output=measured)


def _probes(srcs: list[Source], menus: list[RankMenu]) -> list[Probe]:
    """Each matrix as :mod:`gac_check.ranks.shares` perturbs it: the SVD the knapsack values
    (activation-scaled with --calib) truncated at the input's rank and at its menu's lowest
    rank, and the energy between them. Both from that SVD, not the input's own factors (an
    ASVD model's were built on other calibration text: their error is not this basis')."""
    probes = []
    for s, menu in zip(srcs, menus, strict=True):
        low, top = lowest(menu), min(menu.rank, s.S.numel())
        if low is None or low >= top:
            continue
        probes.append(Probe(s.module, (s.module,), _truncation(s, top), _truncation(s, low),
                            float((s.S[low:top] ** 2).sum()), s.bias))
    return probes


def _truncation(s: Source, rank: int) -> Operator:
    """``x`` through ``s``'s reference SVD kept to its first ``rank`` components."""
    return lambda x, u=s.U[:, :rank], sv=s.S[:rank], vh=s.Vh[:rank]: ((x @ vh.T) * sv) @ u.T


def _operators(k: Kept, srcs: list[Source], state: dict[str, torch.Tensor]
               ) -> dict[str, dict[str, Operator]]:
    """Per choice, what each matrix computes: the input's factors as they are, a truncation
    of the reference SVD at the choice's rank, or (dense) the weight itself."""
    by_module = {s.module: s for s in srcs}
    out: dict[str, dict[str, Operator]] = {c: {} for c in CHOICES}
    for row in k.matrices:
        s = by_module[row.module]
        for c in CHOICES:
            if c == INPUT:
                a = state[s.module + A_SUFFIX].double()
                b = state[s.module + B_SUFFIX].double()
                out[c][s.module] = lambda x, a=a, b=b: (x @ b.T) @ a.T
            elif row.ranks[c] == DENSE:
                out[c][s.module] = None
            else:
                out[c][s.module] = _truncation(s, min(int(row.ranks[c]), s.S.numel()))
    return out


def select_ranks(menus: list[RankMenu], spectra: list[torch.Tensor], out: Path, align: int,
                 budget: str, *, allow_dense: bool = True,
                 old_errors: dict[str, float] | None = None, with_base: bool = False,
                 error_name: str | None = None,
                 weights: Mapping[str, float] | None = None) -> RealignReport:
    """The knapsack over every matrix's menu, each valued by its singular values
    (``spectra``, in the menus' order), as every layout's --realign chooses: the plan and the
    report of what changed, with what rounding each rank would have kept instead
    (``allow_dense``: whether a matrix may be kept dense; ``old_errors``: the input's own error
    per matrix, where its factors are not a truncation of ``spectra``; ``weights``: each
    matrix's worth on the output per unit of its energy, :mod:`gac_check.ranks.shares`, which
    the knapsack minimises the weighted sum of; the report's figures stay unweighted)."""
    matrices = [Matrix(menu.module, menu.m, menu.n, sv=sv.numpy())
                for menu, sv in zip(menus, spectra, strict=True)]
    old = {menu.module: menu.rank for menu in menus}
    limit = budget_from_spec(budget, matrices, old)
    near = {m.module: bounded(m) for m in menus}
    wide = limit < sum(min(m.params(r) for r in near[m.module]) for m in menus)
    solved = [dataclasses.replace(m, sv=m.sv * math.sqrt((weights or {}).get(m.name, 1.0)))
              for m in matrices]
    plan = realign_plan(solved, limit, align,
                        {m.module: m.candidates if wide else near[m.module] for m in menus},
                        allow_dense=allow_dense)
    if weights:
        plan = dataclasses.replace(plan_of(matrices, plan.ranks, limit, plan.method),
                                   optimal=plan.optimal)
    report = RealignReport(Path(out), plan, align, old,
                           sum(old[m.name] * (m.m + m.n) for m in matrices),
                           math.fsum((old_errors or {}).values()), with_base,
                           why={m.module: m.why(plan.ranks[m.module]) for m in menus},
                           instance=matrices)
    report.menus_note = (
        "the budget is below what ranks near the input's can meet: every aligned rank was "
        "offered" if wide else "each rank was offered from one menu step below its own "
        "rounded down to its own rounded up (the input's allocation is the starting point: a "
        "larger move is not offered)")
    if error_name:
        report.error_name = error_name
    if weights:
        report.menus_note += ("; " + WEIGHTED)
        report.weights = dict(weights)
    report.kept = kept(menus, matrices, plan, report.error_name, old_errors)
    return report


def keep_best(report: RealignReport, menus: list[RankMenu]) -> RealignReport:
    """Write the best measured of the knapsack's plan, each rank rounded to the nearest within
    the budget and each rounded down (:mod:`gac_check.ranks.guarantee`): on the whole model's
    output with ``--calib``, else each matrix's mean output error with ``--base``; unmeasured,
    the knapsack's plan (over bounded menus) stays."""
    k = report.kept
    if k is None:
        return report
    totals = k.totals()
    within = {c: t["params"] <= k.budget for c, t in totals.items()}
    if k.model is not None:
        verdict = choose(k.model.cosine, within, "the whole model's mean cosine to dense on "
                         + k.model.inputs, True)
    elif k.output is not None:
        verdict = choose(k.output.means(CHOICES), within, "the matrices' mean relative error "
                         "against the dense weights (X: " + k.output.inputs + ")", False)
    else:
        verdict = choose({REALIGNED: 0.0}, {REALIGNED: True}, "", True)
    report.verdict = verdict
    report.kept = dataclasses.replace(k, written=verdict.to_json())
    if verdict.written != REALIGNED:
        ranks = {row.module: row.ranks[verdict.written] for row in k.matrices}
        report.plan = plan_of(report.instance, ranks, report.plan.budget, verdict.written)
        report.why = {m.module: f"{m.problem + '; ' if m.problem else ''}each rank "
                      f"{verdict.written.removeprefix('round ')}: measured better than the "
                      "knapsack's plan" for m in menus}
    report.notes += [n for n in (report.menus_note, verdict.sentence()) if n]
    return report


def _write(ckpt: Checkpoint, state: dict[str, torch.Tensor], srcs: list[Source],
           report: RealignReport, force: bool,
           recheck: Callable[[Path], list[Finding]] | None) -> None:
    """The input's tensors with every factor pair replaced (``state`` is consumed), the
    re-check of the result and the provenance record, all before OUT appears."""
    from safetensors.torch import save_file

    ranks = report.plan.ranks
    for s in srcs:
        for suffix in (A_SUFFIX, B_SUFFIX, ".ALinear.bias"):
            state.pop(s.module + suffix, None)
        state.update(_factors(s, ranks[s.module], s.dtype))
    config = dict(ckpt.config)
    config["truncation_ranks"] = {m: int(r) for m, r in ranks.items() if r != DENSE}
    with atomic_output_dir(report.out, force) as tmp:
        copy_side_files(ckpt.path, tmp, skip=weight_file_names(ckpt.path)
                        | {"config.json", PROVENANCE})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        if recheck is not None:
            report.remaining = recheck(tmp)
        (tmp / PROVENANCE).write_text(json.dumps(
            {"source": str(ckpt.path), **report.to_json()}, indent=2) + "\n")


def _factors(s: Source, rank, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    if rank == DENSE:
        weight = (s.U * s.S) @ s.Vh
        out = {f"{s.module}.weight": weight.to(dtype)}
        if s.bias is not None:
            out[f"{s.module}.bias"] = s.bias
        return out
    # Without --base a rank below the alignment can only go up to it by zero padding: the
    # product has fewer singular values than the rank, and the rest of the factors are zeros.
    k = min(rank, s.S.numel())
    root = s.S[:k].sqrt()
    a = s.U.new_zeros(s.m, rank)
    b = s.Vh.new_zeros(rank, s.n)
    a[:, :k] = s.U[:, :k] * root
    b[:k] = root[:, None] * s.Vh[:k]
    out = {f"{s.module}{A_SUFFIX}": a.to(dtype), f"{s.module}{B_SUFFIX}": b.to(dtype)}
    if s.bias is not None:
        out[f"{s.module}.ALinear.bias"] = s.bias
    return out

