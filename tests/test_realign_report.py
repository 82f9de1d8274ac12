"""A --realign run's HTML report charts what the re-selected ranks keep against rounding each
rank down or up, per matrix and in all, with the numbers recomputed here from first
principles (the dense weights' SVD, the compressed factors as written), read back from the
HTML as a browser would get them."""
from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gac_check.models.compress import compress_dir, layer_linears
from tests.helpers import gac, tiny_llama

ALIGN = 8  # the a100 contract's rank rule for float16
GPU = ("--gpu", "a100", "--dtype", "float16")


@pytest.fixture(scope="module")
def realigned(tmp_path_factory):
    """A dense tiny Llama, its reference-compressed copy (ranks 14, 22, 32) with its factors
    perturbed (as ASVD's activation scaling makes them: not a truncated SVD of the dense
    weights, so the input keeps less than its ranks' truncation would), the realign's report
    and run document."""
    root = tmp_path_factory.mktemp("realign-report")
    dense = tiny_llama(1, num_key_value_heads=2)
    dense.save_pretrained(root / "dense")
    ranks = compress_dir(root / "dense", root / "compressed", 0.7)
    weights = root / "compressed" / "model.safetensors"
    state = load_file(str(weights))
    gen = torch.Generator().manual_seed(0)
    for name in [k for k in state if k.endswith(".ALinear.weight")]:
        state[name] = state[name] + 0.02 * torch.randn(state[name].shape, generator=gen)
    save_file(state, str(weights), metadata={"format": "pt"})
    run = gac(root / "compressed", "--realign", root / "out", "--base", root / "dense", *GPU,
              "--report", root / "rep" / "realign.html")
    assert run.returncode == 0, run.stderr
    (root / "summary.txt").write_text(run.stdout)
    return dense, ranks, root


class Chart(HTMLParser):
    """The quality section as a reader gets it: each row's marks and rank text, the totals."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, dict[str, float]] = {}
        self.rank_text: dict[str, str] = {}
        self.totals: dict[str, list[str]] = {}
        self._row: str | None = None
        self._total: str | None = None
        self._in_ranks = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "g" and a.get("class") == "kept-row":
            self._row = a["data-module"]
            self.marks[self._row] = {}
        elif tag == "circle" and self._row is not None:
            self.marks[self._row][a["data-choice"]] = float(a["data-fraction"])
        elif tag == "text" and a.get("class") == "ranks":
            self._in_ranks = True
        elif tag == "tr" and "data-choice" in a:
            self._total = a["data-choice"]
            self.totals[self._total] = []
        elif tag == "td" and self._total is not None and "data-fraction" in a:
            self.totals[self._total].append(a["data-fraction"])

    def handle_endtag(self, tag):
        if tag == "g":
            self._row = None
        elif tag == "text":
            self._in_ranks = False
        elif tag == "tr":
            self._total = None

    def handle_data(self, data):
        if self._in_ranks and self._row is not None:
            self.rank_text[self._row] = data
        elif self._total is not None and data.strip():
            self.totals[self._total].append(data.strip())


def read_chart(html: Path) -> Chart:
    chart = Chart()
    chart.feed(html.read_text())
    return chart


def menu(m: int, n: int) -> list[int]:
    """The aligned ranks whose factors are smaller than the dense matrix."""
    return list(range(ALIGN, min(m, n, (m * n - 1) // (m + n)) + 1, ALIGN))


def expected(dense, ranks: dict[str, int], root: Path) -> dict[str, dict]:
    """Per matrix, from first principles: each choice's rank, parameters and kept fraction."""
    factors = load_file(str(root / "compressed" / "model.safetensors"))
    record = json.loads((root / "out" / "gac-realign.json").read_text())
    plan = {k["module"]: k["ranks"]["realigned"] for k in record["quality"]["matrices"]}
    written = {c["name"]: c["rank"] for c in record["plan"]["choices"]}
    out = {}
    for name, lin in layer_linears(dense).items():
        w = lin.weight.detach().double()
        m, n = w.shape
        s2 = torch.linalg.svdvals(w) ** 2
        energy = float(s2.sum())
        r = ranks[name]
        a = factors[f"{name}.ALinear.weight"].double()
        b = factors[f"{name}.BLinear.weight"].double()
        cands = menu(m, n)
        choice = {"input": r, "realigned": plan[name],
                  "round down": max([c for c in cands if c <= r], default=cands[0]),
                  "round up": min([c for c in cands if c >= r], default="dense")}
        out[name] = {"ranks": choice, "w": w, "s2": s2, "energy": energy, "a": a, "b": b}
    nearest = nearest_within({n: (o["w"].shape, o["ranks"]) for n, o in out.items()})
    for name, o in out.items():
        choice, (m, n), s2, energy = o["ranks"], o["w"].shape, o["s2"], o["energy"]
        choice["round nearest"] = nearest[name]
        w, a, b = o["w"], o["a"], o["b"]
        fractions = {c: 1.0 if k == "dense" else float(s2[:k].sum()) / energy
                     for c, k in choice.items()}
        fractions["input"] = 1 - float(((w - a @ b) ** 2).sum()) / energy
        out[name] = {"ranks": choice, "fraction": fractions, "energy": energy,
                     "params": {c: m * n if k == "dense" else k * (m + n)
                                for c, k in choice.items()}}
    # what was written is one of the plans compared (the best measured of them)
    assert any(written == {n: o["ranks"][c] for n, o in out.items()}
               for c in ("realigned", "round nearest", "round down"))
    return out


def nearest_within(rows: dict[str, tuple]) -> dict[str, object]:
    """Each rank rounded to the nearer aligned rank in parameters; where that spends more than
    the input's own budget, the matrices farthest above their own rank go back down first."""
    def params(shape, k):
        return shape[0] * shape[1] if k == "dense" else k * (shape[0] + shape[1])

    out = {n: r["round down"] for n, (_, r) in rows.items()}
    budget = sum(params(shape, r["input"]) for shape, r in rows.values())
    spent = sum(params(shape, out[n]) for n, (shape, _) in rows.items())
    ups = sorted((params(shape, r["round up"]) - params(shape, r["input"]), n)
                 for n, (shape, r) in rows.items()
                 if params(shape, r["round up"]) - params(shape, r["input"])
                 < params(shape, r["input"]) - params(shape, r["round down"]))
    for _dist, n in ups:
        shape, r = rows[n]
        extra = params(shape, r["round up"]) - params(shape, out[n])
        if spent + extra <= budget:
            out[n], spent = r["round up"], spent + extra
    return out


def test_the_chart_draws_each_matrix_and_choice_with_the_right_numbers(realigned):
    dense, ranks, root = realigned
    chart = read_chart(root / "rep" / "realign.html")
    want = expected(dense, ranks, root)
    assert set(chart.marks) == set(want)
    moved = 0
    for name, w in want.items():
        assert chart.marks[name] == pytest.approx(w["fraction"], abs=2e-6), name
        assert chart.rank_text[name] == f"{w['ranks']['input']} → {w['ranks']['realigned']}"
        moved += w["ranks"]["realigned"] != w["ranks"]["input"]
    assert moved  # the test model's ranks are misaligned: the chart has something to show


def test_the_totals_weigh_each_matrix_by_its_energy_and_judge_the_budget(realigned):
    dense, ranks, root = realigned
    chart = read_chart(root / "rep" / "realign.html")
    want = expected(dense, ranks, root)
    energy = sum(w["energy"] for w in want.values())
    budget = sum(w["params"]["input"] for w in want.values())
    assert list(chart.totals) == ["input", "realigned", "round down", "round nearest",
                                  "round up"]
    for choice, cells in chart.totals.items():
        _label, params, within, fraction, shown = cells
        kept = sum(w["fraction"][choice] * w["energy"] for w in want.values()) / energy
        total = sum(w["params"][choice] for w in want.values())
        assert float(fraction) == pytest.approx(kept, abs=2e-6), choice
        assert shown == f"{kept * 100:.2f}%"
        assert params == f"{total:,}"
        assert within == ("yes" if total <= budget else "no"), choice
    # the knapsack keeps more than rounding down within the same budget, on these weights
    assert float(chart.totals["realigned"][3]) > float(chart.totals["round down"][3])
    assert chart.totals["round up"][2] == "no"  # rounding up does not fit the budget here
    # the text summary says the same, on one line
    share = {c: f"{float(cells[3]):.2%} ({'within' if cells[2] == 'yes' else 'over'} the "
                "budget)" for c, cells in chart.totals.items()}
    assert (f"  energy kept: input {share['input']}, realigned {share['realigned']}; each rank "
            f"rounded down {share['round down']}, to the nearest {share['round nearest']}, "
            f"up {share['round up']}\n"
            in (root / "summary.txt").read_text())


def test_a_merged_run_with_a_broken_quality_record_is_refused(realigned, tmp_path):
    _, _, root = realigned
    doc = json.loads((root / "rep" / "realign.json").read_text())
    doc["fix"]["quality"]["matrices"][0]["kept"]["realigned"] = "all of it"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    proc = gac("report", "merge", bad, "-o", tmp_path / "out.html")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "fix.quality.matrices[0].kept.realigned" in proc.stderr
    assert not (tmp_path / "out.html").exists()


def test_a_merged_realign_run_draws_its_chart_again(realigned, tmp_path):
    _, _, root = realigned
    out = tmp_path / "merged.html"
    proc = gac("report", "merge", root / "rep" / "realign.json", "-o", out)
    assert proc.returncode == 0, proc.stderr
    again, first = read_chart(out), read_chart(root / "rep" / "realign.html")
    assert again.marks == first.marks and again.totals == first.totals


def test_a_palu_realign_charts_each_group_in_its_whitened_basis(tmp_path):
    """Without --base the energy is the factors' own: the input keeps all of it, and each
    group's rounding keeps its leading whitened components (||U_g[:, i]||^2, squared)."""
    from tests import compressors as C
    from tests import helpers

    built = C.build_palu(tmp_path / "palu", (19, 10),
                         scaling=C.whitening([helpers.LLAMA["hidden_size"]]))
    run = gac(built.path, "--realign", tmp_path / "out", "--gpu", "gpu", "--dtype", "float16",
              "--report", tmp_path / "rep" / "palu.html")
    assert run.returncode == 0, run.stderr
    chart = read_chart(tmp_path / "rep" / "palu.html")
    state = load_file(str(built.path / "model.safetensors"))
    plan = {c["name"]: c["rank"] for c in
            json.loads((tmp_path / "out" / "gac-realign.json").read_text())["plan"]["choices"]}
    assert set(chart.marks) == set(plan) and len(plan) == 8  # 2 layers x k, v x 2 groups
    rows = {}
    for name in chart.marks:
        module, _, g = name.rpartition(":group")
        u, vt = state[f"{module}.U.{g}.weight"], state[f"{module}.VT.weight"]
        rank = u.shape[1]
        rows[name] = ((u.shape[0], vt.shape[1]),
                      {"input": rank, "round down": rank // ALIGN * ALIGN,
                       "round up": -(-rank // ALIGN) * ALIGN})
    nearest = nearest_within(rows)
    for name, marks in chart.marks.items():
        module, _, g = name.rpartition(":group")
        u = state[f"{module}.U.{g}.weight"].double()
        energy = u.square().sum(0).sort(descending=True).values.square()
        rank = u.shape[1]
        down, up = rank // ALIGN * ALIGN, -(-rank // ALIGN) * ALIGN
        near = nearest[name]
        want = {"input": 1.0, "round up": 1.0,
                "round down": float(energy[:down].sum() / energy.sum()),
                "round nearest": float(energy[:near].sum() / energy.sum()),
                "realigned": float(energy[:plan[name]].sum() / energy.sum())}
        assert marks == pytest.approx(want, abs=2e-6), name
        assert chart.rank_text[name] == f"{rank} → {plan[name]}"
        assert up > rank > down


@pytest.mark.parametrize("low", [0.5, 0.99, 0.9999])
def test_axis_ticks_stay_apart_however_close_the_fractions_are(low):
    """Without --base every choice keeps 99.9-100% of the factors' own energy: the axis must
    still label its ticks differently, from the lowest fraction to 100%."""
    from gac_check.report.kept_charts import kept_chart

    choices = ["input", "realigned", "round down", "round up"]
    kept = dict(zip(choices, (1.0, (1 + low) / 2, low, 1.0), strict=True))
    quality = {"objective": "x", "budget": 10, "choices": choices, "totals": {},
               "matrices": [{"module": "m", "m": 4, "n": 4, "energy": 1.0,
                             "ranks": dict.fromkeys(choices, 8), "kept": kept,
                             "params": dict.fromkeys(choices, 8)}]}
    chart = kept_chart(quality)
    labels = [label for _, label in chart.x_ticks]
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    assert labels[-1].startswith("100")
    xs = {m.choice: m.x for m in chart.rows[0].marks}
    left, _, right, _ = chart.plot
    assert left <= xs["round down"] < xs["realigned"] < xs["input"] == right
