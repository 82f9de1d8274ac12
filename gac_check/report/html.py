"""The alignment-regression report: one self-contained HTML file a reviewer opens in a browser.

Rendered with jinja2 from run documents (:mod:`gac_check.report.run`), so the same code draws
a single CLI check, a pytest session, or several machines' runs merged side by side. Inline CSS
and SVG only: the file works offline, attached to a CI run, with scripting disabled. Every name
in it comes from a checkpoint a stranger wrote, so autoescaping is on for the whole template.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from jinja2 import Environment, PackageLoader, StrictUndefined

from gac_check.contract.rules import TARGET_GATES
from gac_check.report import charts, deployment, kept_charts
from gac_check.report.paths import model_path, shown

SEVERITY_ORDER = {"error": 0, "warning": 1}


@dataclass
class FindingGroup:
    """Identical findings repeated across layers, read as one line (``layers 0–31``)."""

    kind: str
    value: int
    severity: str
    rules: list[str]
    repair_to: int | None
    optimal_to: int | None
    slowdown: dict | None  # the figure with its provenance (json_report's "slowdown")
    refusal: str | None
    layers: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    padding_params: int = 0


@dataclass
class MatrixRow:
    """A site (folded over layers) and its verdict on each --target: the site x target matrix."""

    kind: str
    value: int
    cells: list[dict]
    layers: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


@dataclass
class CheckView:
    label: str
    model: str
    check: dict
    grid: charts.Grid | None
    wide: charts.Grid | None
    groups: list[FindingGroup]
    counts: dict[str, int]
    targets: dict[str, dict] = field(default_factory=dict)  # summary.targets
    matrix: list[MatrixRow] = field(default_factory=list)
    #: the verdict box's lines: each target's worst verdict and why, the command that fixes
    #: what padding can fix, and which rule set the repair's cost
    target_lines: list[str] = field(default_factory=list)
    fix_command: str | None = None
    cost_reason: str | None = None
    #: the same model on the same contract already drawn for an earlier run of a merge
    repeat_of: str | None = None
    #: the targets that do not load the model at all (said once, in the verdict)
    blocked: dict[str, deployment.Outcome] = field(default_factory=dict)
    #: how many sites are misaligned by their own rules (not only because a target refuses
    #: the model) and what padding them costs
    sites_line: str = ""


@dataclass
class RunView:
    label: str
    colour: str
    run: dict
    verdict: str  # "pass" | "warn" | "fail" | "skipped"
    reasons: list[str]
    checks: list[CheckView]


def render_html(runs: list[dict], title: str | None = None) -> str:
    views = [_run_view(i, run) for i, run in enumerate(runs)]
    _mark_repeats(views)
    models = list(dict.fromkeys(c.model for v in views for c in v.checks))
    template = _environment().get_template("report.html.j2")
    perf_rows = [(v, rec) for v in views for rec in v.run["perf"]]
    return template.render(
        title=title or "gac-check alignment report: " + ", ".join(
            models or [v.label for v in views]),
        runs=views,
        overall=_overall(views),
        colours=charts.COLOURS,
        charts=charts.staircases([(v.label, v.run["perf"]) for v in views]),
        perf_rows=perf_rows,
        equivalence=[(v, rec) for v in views for rec in v.run["equivalence"]],
        failures=[(v, rec) for v in views for rec in v.run["tests"].get("failures", [])
                  if not rec.get("equivalence")],
        environment=_environment_rows(views),
        charts_layers=charts.layers_text,
        kept_chart=kept_charts.kept_chart,
        kept_totals=kept_charts.kept_totals,
        kept_label=kept_charts.kept_label,
        output_chart=kept_charts.output_chart,
        shown=shown,
    )


def _environment() -> Environment:
    return Environment(loader=PackageLoader("gac_check.report", "templates"), autoescape=True,
                       undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _run_view(index: int, run: dict) -> RunView:
    checks = [_check_view(run["label"], c) for c in run["checks"]]
    verdict, reasons = run_verdict(run)
    colour = charts.RUN_PALETTE[index % len(charts.RUN_PALETTE)]
    return RunView(run["label"], colour, run, verdict, reasons, checks)


def _check_view(label: str, check: dict) -> CheckView:
    """A check as the page draws it: sites by their own rules (a target that refuses the whole
    model is said once, not on every site), the site x target matrix without those targets."""
    sites = deployment.own_sites(check)
    blocked = deployment.blocked(check)
    grid, wide = charts.alignment_grids(sites)
    counts = {"aligned": 0, "warning": 0, "error": 0}
    for s in sites:
        counts[charts.site_state(s)] += 1
    model = model_name(check["model_dir"])
    groups = _groups(sites)
    targets = check["summary"].get("targets") or {}
    loading = [spec for spec in targets if spec not in blocked]
    return CheckView(label, model, check, grid, wide, groups, counts, targets,
                     _matrix(check["sites"], loading), deployment.verdict_lines(check, sites),
                     fix_command(check, sites), _cost_reason(check, groups), blocked=blocked,
                     sites_line=deployment.sites_line(check, counts["warning"] + counts["error"]))


def _mark_repeats(views: list[RunView]) -> None:
    """In a merge, a model checked on the same contract by several runs (one per GPU job, all
    of the same checkpoint) is drawn once; the later runs point to the first."""
    seen: dict[tuple, str] = {}
    for v in views:
        for c in v.checks:
            hw = c.check["hardware"]
            key = (c.check["model_dir"], hw.get("profile"), hw.get("dtype"),
                   tuple(c.targets), tuple((s["name"], s["value"]) for s in c.check["sites"]))
            if key in seen:
                c.repeat_of = seen[key]
            else:
                seen[key] = v.label


def fix_command(check: dict, sites: list[dict] | None = None) -> str | None:
    """The one command that fixes what zero padding can fix exactly, or None where nothing
    misaligned is exactly repairable. It names the model as the user did (relative to the
    working directory: never the absolute path of the machine that ran the check) and leaves
    out a target that does not load the model (``--repair --target`` refuses it)."""
    sites = check["sites"] if sites is None else sites
    fixable = [s for s in sites if not s.get("aligned") and not s.get("refusal")
               and s.get("repair_to") and s["repair_to"] > s["value"]]
    if not fixable:
        return None
    hw = check["hardware"]
    model = check["model_dir"]
    out = model_name(model).split("@")[0].rsplit("/", 1)[-1] + "-repaired"
    words = ["gac-check", model_path(check), "--repair", out, "--gpu", hw["profile"]]
    if hw.get("dtype"):
        words += ["--dtype", hw["dtype"]]
    blocked = deployment.blocked(check)
    for spec in check["summary"].get("targets") or {}:
        if spec not in blocked:
            words += ["--target", spec]
    return " ".join(shlex.quote(w) for w in words)


def _cost_reason(check: dict, groups: list[FindingGroup]) -> str | None:
    """Which rule set the repair's cost: the costliest padding and, where a target's kernel
    needs more than the hardware's rule, that target and what its engine needs."""
    costly = [g for g in groups if not g.refusal and g.repair_to and g.padding_params]
    if not costly:
        return None
    g = max(costly, key=lambda g: g.padding_params)
    params = check["summary"].get("params") or 0
    share = f" ({g.padding_params / params:.2%} of the model)" if params else ""
    cells = [c for s in check["sites"] if s["name"] in g.names for c in s.get("targets") or []
             if c.get("fix_to") == g.repair_to and c["verdict"] != "fast"]
    head = (f"the largest padding is {g.kind} {g.value} → {g.repair_to} in "
            f"{len(g.names)} site(s), +{g.padding_params:,} parameters{share}")
    if not cells:
        return f"{head}: {check['hardware']['profile']}'s rules ({', '.join(g.rules)})"
    cell = cells[0]
    return (f"{head}: {cell['target']} forces it ({cell['verdict']} below "
            f"{g.repair_to}: {cell.get('why') or cell.get('cannot_pad') or ''})")


def _matrix(sites: list[dict], specs: list[str]) -> list[MatrixRow]:
    """One row per site kind, value and verdicts (layers folded), one cell per target of
    ``specs`` (those that load the model: the others refuse every site for one reason, which
    the verdict says once)."""
    rows: dict[tuple, MatrixRow] = {}
    for s in sites:
        cells = [c for c in s.get("targets") or [] if c["target"] in specs]
        if not cells:
            continue
        kind = charts.site_kind(s)
        key = (kind, s["value"], tuple((c["verdict"], c.get("kernel"), c.get("fix_to"))
                                       for c in cells))
        row = rows.setdefault(key, MatrixRow(kind, s["value"], cells))
        if s.get("layer") is not None:
            row.layers.append(s["layer"])
        row.names.append(s["name"])
    order = {"refused": 0, "fallback": 1, "fast": 2}
    return sorted(rows.values(), key=lambda r: (min(order.get(c["verdict"], 3) for c in r.cells),
                                                r.kind))


def model_name(model_dir: str) -> str:
    """A directory's last part; a Hub model's ``org/name@commit`` with the commit cut to 12
    characters (the full ``hf://`` name stays in the page, as the cell's title)."""
    if model_dir.startswith("hf://"):
        name, _, commit = model_dir.removeprefix("hf://").partition("@")
        return f"{name}@{commit[:12]}" if commit else name
    return model_dir.rstrip("/").rsplit("/", 1)[-1] or model_dir


def _groups(sites: list[dict]) -> list[FindingGroup]:
    groups: dict[tuple, FindingGroup] = {}
    for s in sites:
        if s.get("aligned"):
            continue
        kind = charts.site_kind(s)
        key = (kind, s["value"], s.get("severity"), tuple(s.get("rules") or ()),
               s.get("repair_to"), s.get("refusal"))
        g = groups.get(key)
        if g is None:
            g = groups[key] = FindingGroup(kind, s["value"], s.get("severity") or "warning",
                                           list(s.get("rules") or []), s.get("repair_to"),
                                           s.get("optimal_to"), _figure(s),
                                           s.get("refusal"))
        if s.get("layer") is not None:
            g.layers.append(s["layer"])
        g.names.append(s["name"])
        g.padding_params += int(s.get("padding_params") or 0)
    return sorted(groups.values(), key=lambda g: (SEVERITY_ORDER.get(g.severity, 2),
                                                  -len(g.names), g.kind))


def _figure(site: dict) -> dict | None:
    """The site's slowdown with provenance; a document from before provenance gives its bare
    number, marked as of unknown origin rather than dressed up as a published figure."""
    if site.get("slowdown"):
        return site["slowdown"]
    if site.get("expected_slowdown"):
        return {"value": site["expected_slowdown"], "source": None, "hardware": None,
                "dtype": None, "shape": None, "coverage": None, "citation": None,
                "note": "provenance not recorded (a report from an older gac-check)"}
    return None


def run_verdict(run: dict) -> tuple[str, list[str]]:
    """pass / warn / fail and why: the first thing a reviewer reads."""
    fail_on = run.get("fail_on", "error")
    gate = {"error": ("error",), "warning": ("error", "warning"), "never": (),
            "refused": (), "fallback": ()}[fail_on]  # the last two gate on targets alone
    reasons, failing = [], False
    for check in run["checks"]:
        model = check["model_dir"].rstrip("/").rsplit("/", 1)[-1]
        reasons += [f"{model}: {spec} does not load the model"
                    for spec in deployment.blocked(check)]
        own = [s for s in deployment.own_sites(check) if not s.get("aligned")]
        errors = sum(s.get("severity") == "error" for s in own)
        if own:
            reasons.append(f"{model}: {errors} error(s), {len(own) - errors} warning(s) on the "
                           f"{check['hardware']['profile']} contract")
        failing |= any(not site["aligned"] and site.get("severity") in gate
                       for site in check["sites"])
        failing |= any(t.get("verdict") in TARGET_GATES.get(fail_on, ())
                       for t in (check["summary"].get("targets") or {}).values())
    failed = run["tests"].get("counts", {}).get("failed", 0)
    if failed:
        reasons.append(f"{failed} test(s) failed")
        failing = True
    regressions = sum(r.get("verdict") == "regressed" for r in run["perf"])
    if regressions:
        reasons.append(f"{regressions} performance regression(s) against the baseline")
        failing = True
    if failing:
        return "fail", reasons
    counts = run["tests"].get("counts", {})
    if counts and not run["perf"] and not any(n for k, n in counts.items() if k != "skipped"):
        return "skipped", [*reasons, f"all {counts.get('skipped', 0)} test(s) were skipped: "
                           "nothing was measured"]
    return ("warn" if reasons else "pass"), reasons


def _overall(views: list[RunView]) -> str:
    verdicts = {v.verdict for v in views}
    if verdicts == {"skipped"}:
        return "skipped"
    return next(x for x in ("fail", "warn", "pass") if x in verdicts or x == "pass")


def _environment_rows(views: list[RunView]) -> list[tuple[str, list[str]]]:
    keys: list[str] = []
    for v in views:
        keys += [k for k in v.run["environment"] if k not in keys]
    return [(k, [str(v.run["environment"].get(k, "")) for v in views]) for k in keys]
