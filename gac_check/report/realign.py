"""The text summary of a realign: ranks changed, parameters kept, error moved, solver used."""
from __future__ import annotations

from gac_check.contract.rules import ERROR
from gac_check.ranks.factors import PROVENANCE, RealignReport
from gac_check.ranks.kept import DOWN, INPUT, NEAREST, REALIGNED, UP, Kept
from gac_check.ranks.knapsack import DENSE, RankPlan


def render_realign(report: RealignReport) -> str:
    """The text summary ``gac-check --realign`` prints."""
    p = report.plan
    old = report.old_ranks
    dense = sum(1 for m, r in p.ranks.items() if r == DENSE and old[m] != DENSE)
    changed = sum(1 for m, r in p.ranks.items() if r not in (old[m], DENSE))
    same = len(p.ranks) - dense - changed
    lines = [
        f"realigned {len(p.choices)} low-rank matrices to multiples of {report.align} "
        f"-> {report.out}",
        f"  ranks: {changed} changed to another aligned rank, {same} unchanged, {dense} "
        "now stored as dense matrices (the knapsack's best use of the budget for them)",
        f"  parameters in low-rank matrices: {report.old_params:,} -> {p.total_params:,} "
        f"(budget {p.budget:,})",
        f"  {report.error_name}: {report.old_error:.6g} -> "
        f"{p.objective:.6g}" + (f" ({p.objective / report.old_error:.3f}x)"
                                if report.old_error else ""),
        _solver_line(p),
    ]
    errors = sum(f.severity == ERROR for f in report.remaining)
    if report.kept is not None:
        lines.append(_kept_line(report.kept))
        if report.kept.output is not None:
            lines.append(_output_line(report.kept))
        if report.kept.model is not None:
            lines.append(_model_line(report.kept))
    lines += _matrix_lines(report)
    lines += [f"  note: {n}" for n in report.notes]
    lines.append(f"  re-check of {report.out.name}: {len(report.remaining)} sites still "
                 f"misaligned ({errors} errors, {len(report.remaining) - errors} warnings); "
                 f"provenance in {report.out.name}/{PROVENANCE}")
    return "\n".join(lines)


def _kept_line(kept: Kept) -> str:
    """What the plan keeps of the energy against rounding each rank by hand, on one line."""
    totals = kept.totals()

    def share(choice: str) -> str:
        t = totals[choice]
        fits = "within" if t["params"] <= kept.budget else "over"
        return f"{t['kept'] / t['energy']:.2%} ({fits} the budget)" if t["energy"] else "-"

    return (f"  energy kept: input {share(INPUT)}, realigned {share(REALIGNED)}; each rank "
            f"rounded down {share(DOWN)}, to the nearest {share(NEAREST)}, up {share(UP)}")


def _output_line(kept: Kept) -> str:
    """Each choice's mean relative output error over the matrices, and on what inputs."""
    assert kept.output is not None
    mean = kept.output.means((INPUT, REALIGNED, DOWN, NEAREST, UP))
    return (f"  output error (mean over matrices of ||X(W - W_r)||/||XW||): input "
            f"{mean[INPUT]:.4f}, realigned {mean[REALIGNED]:.4f}; each rank rounded down "
            f"{mean[DOWN]:.4f}, to the nearest {mean[NEAREST]:.4f}, up {mean[UP]:.4f}; "
            f"X: {kept.output.inputs}")


def _model_line(kept: Kept) -> str:
    """The whole model's last hidden state per choice against dense, on one line."""
    mo = kept.model
    assert mo is not None

    def fig(c: str) -> str:
        return f"{mo.cosine[c]:.4f} ({mo.relative[c]:.4f})"

    return (f"  model output (last hidden state against dense on {mo.lines} calibration lines, "
            f"{mo.tokens} tokens; mean cosine (relative error)): input {fig(INPUT)}, realigned "
            f"{fig(REALIGNED)}; each rank rounded down {fig(DOWN)}, to the nearest "
            f"{fig(NEAREST)}, up {fig(UP)}")


def _matrix_lines(report: RealignReport) -> list[str]:
    """Each matrix whose rank moved: before, after and why (an unchanged one has no story)."""
    moved = [m for m in report.matrices() if m["before"] != m["after"]]
    return [f"  {m['module']}: rank {m['before']} -> {m['after']} ({m['why']})" for m in moved]


def _solver_line(p: RankPlan) -> str:
    """Proved optimal, or (past the solver's work limit) how far from optimal it can be; or,
    where a rounding measured better was written in the knapsack's place, that."""
    if p.method.startswith("round "):
        return (f"  solver: {p.method} written (measured better than the knapsack's plan, "
                "which was solved)")
    if p.optimal:
        return "  solver: exact knapsack (proved optimal)"
    if p.gap is None:
        return "  solver: heuristic"
    return (f"  solver: knapsack, work limit reached: at most {p.gap:.6g} "
            f"({p.relative_gap:.3%}) above the optimum (certified gap)")
