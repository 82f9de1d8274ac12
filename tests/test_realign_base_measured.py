"""--realign --base on SVD-LLM's and PaLU's saves: the dense original measures each choice's
relative output error ||X(W - W_r)|| / ||XW|| per SVD-LLM pair and per PaLU head group (X = I,
or the dense model's inputs on --calib's text), and with --calib the whole model's output, and
never chooses (the ranks are those of a run without it). Every figure is recomputed here from
first principles (the dense weights and the dense model run with its own hooks; the factors as
written, read with the compressors' own loaders, or SVD-LLM's own factorisation at the rounded
rank; the compressed and realigned models run in the compressors' own loaders) and read back
from the JSON, the summary line and the HTML report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests import compressors as C
from tests import helpers
from tests.test_realign_output_error import CALIB, OutputPanel, _inputs
from tests.test_realign_palu import groups
from tests.test_realign_svdllm import factors

GPU = ("--gpu", "gpu", "--dtype", "float16")
CHOICES = ("input", "realigned", "round down", "round up")


@pytest.fixture(scope="module")
def scaling() -> dict[int, torch.Tensor]:
    return C.whitening([helpers.LLAMA["hidden_size"], helpers.LLAMA["intermediate_size"]])


def dense_dir(root: Path, seed: int) -> Path:
    """The compressors' base model with the bundled MiniLM tokenizer (which --calib needs),
    its embeddings grown to that vocabulary: every projection as the compressor saw it."""
    tok = C.tokenizer()
    model = C.tiny_llama(seed)
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(root / "dense")
    tok.save_pretrained(root / "dense")
    (root / "calib.txt").write_text(CALIB)
    return root / "dense"


@pytest.fixture(scope="module")
def svdllm(tmp_path_factory, scaling) -> tuple[C.Built, Path]:
    root = tmp_path_factory.mktemp("svdllm-base")
    return C.build_svdllm(root / "model", 0.6, scaling=scaling), dense_dir(root, 6)


@pytest.fixture(scope="module")
def palu(tmp_path_factory, scaling) -> tuple[C.Built, Path]:
    root = tmp_path_factory.mktemp("palu-base")
    return C.build_palu(root / "model", (19, 10), scaling=scaling), dense_dir(root, 8)


def relative(w: torch.Tensor, approx: torch.Tensor) -> float:
    return float(torch.linalg.norm(w - approx) / torch.linalg.norm(w))


def measured(built: C.Built, dense: Path, out: Path, *args: object
             ) -> tuple[dict, str, OutputPanel]:
    """The run's quality document (OUT's record, which --format json must repeat), its
    summary and the report's output-error panel."""
    run = helpers.gac(built.path, "--realign", out, "--base", dense, *GPU, *args,
                      "--report", out.parent / "r.html")
    assert run.returncode == 0, run.stderr
    quality = json.loads((out / "gac-realign.json").read_text())["quality"]
    doc = helpers.realign_json(built.path, out.parent / "again", "--base", dense, *GPU, *args)
    assert doc["quality"] == quality
    panel = OutputPanel()
    panel.feed((out.parent / "r.html").read_text())
    return quality, run.stdout, panel


def read_back(quality: dict, summary: str, panel: OutputPanel,
              ours: dict[str, dict[str, float]], inputs: str = "X = I") -> None:
    """Every figure as recomputed (``ours``: matrix -> choice -> error) in the JSON, the
    report's marks and means, and the summary's means."""
    [line] = [ln for ln in summary.splitlines() if "output error (mean" in ln]
    assert inputs in quality["output"]["inputs"] and inputs in line
    assert {k["module"] for k in quality["matrices"]} == set(ours)
    for k in quality["matrices"]:
        for choice in CHOICES:
            want = ours[k["module"]][choice]
            # float32 factors (SVD-LLM's computation in fp32) bound the agreement
            assert k["output_error"][choice] == pytest.approx(want, abs=1e-5), \
                (k["module"], choice)
            assert panel.marks[k["module"]][choice] == pytest.approx(want, abs=1e-5)
    for choice in CHOICES:
        mean = sum(e[choice] for e in ours.values()) / len(ours)
        assert quality["output"]["mean"][choice] == pytest.approx(mean, abs=1e-5)
        assert panel.means[choice] == pytest.approx(mean, abs=1e-5)
    assert f"realigned {quality['output']['mean']['realigned']:.4f}" in line


def test_svdllm_output_error_against_the_dense_base(svdllm, scaling, tmp_path):
    built, dense_dir = svdllm
    quality, summary, panel = measured(built, dense_dir, tmp_path / "out")
    dense = C.tiny_llama(6).state_dict()
    before, after = factors(built.path), factors(tmp_path / "out")
    ours = {}
    for pair, (u, v) in before.items():
        module = pair + "_proj"
        w = dense[module + ".weight"].double()
        [row] = [k for k in quality["matrices"] if k["module"] == module]
        rounded = {c: C.whitened(w, min(int(row["ranks"][c]), u.shape[1]),
                                 scaling[w.shape[1]]) for c in ("round down", "round up")}
        ours[module] = {"input": relative(w, u @ v),
                        "realigned": relative(w, after[pair][0] @ after[pair][1]),
                        **{c: relative(w, (a @ b).double()) for c, (a, b) in rounded.items()}}
    read_back(quality, summary, panel, ours)


def test_palu_output_error_against_the_dense_base(palu, tmp_path):
    built, dense_dir = palu
    quality, summary, panel = measured(built, dense_dir, tmp_path / "out")
    dense = C.tiny_llama(8).state_dict()
    before, after = groups(built.path), groups(tmp_path / "out")
    ours = {}
    for site, (u, vt) in before.items():
        module, _, g = site.rpartition(":group")
        rows = u.shape[0]
        w = dense[module + ".weight"].double()[int(g) * rows:(int(g) + 1) * rows]
        [row] = [k for k in quality["matrices"] if k["module"] == site]
        # PaLU's own result at a lower rank: the group's leading columns of U_g by norm
        keep = {c: (u ** 2).sum(0).argsort(descending=True)[:int(row["ranks"][c])]
                for c in ("round down", "round up")}
        ours[site] = {"input": relative(w, u @ vt),
                      "realigned": relative(w, after[site][0] @ after[site][1]),
                      **{c: relative(w, u[:, k] @ vt[k]) for c, k in keep.items()}}
    read_back(quality, summary, panel, ours)


@pytest.mark.parametrize("layout", ["svdllm", "palu"])
def test_the_base_measures_and_never_chooses(layout, request, tmp_path):
    built, dense_dir = request.getfixturevalue(layout)
    without = helpers.realign_json(built.path, tmp_path / "a", *GPU)
    run = helpers.gac(built.path, "--realign", tmp_path / "b", "--base", dense_dir, *GPU)
    assert run.returncode == 0, run.stderr
    with_base = json.loads((tmp_path / "b" / "gac-realign.json").read_text())
    # the same menus, the same knapsack: the base measures it against the roundings (and
    # writes the best of them, issue 40), it never changes what the knapsack chose
    knapsack = {k["module"]: k["ranks"]["realigned"] for k in with_base["quality"]["matrices"]}
    assert knapsack == helpers.plan_ranks(without)
    assert with_base["written"]["measure"] and not without["written"]["measure"]
    assert "output" not in without["quality"]
    assert "used to measure only" in run.stdout
    assert "still selected from" in run.stdout


@pytest.mark.parametrize("layout, dense", [
    ("svdllm", dict(intermediate_size=160)),  # the MLP pairs make 176 columns/rows
    ("palu", dict(num_key_value_heads=2)),  # the groups' rows add up to 64, the base has 32
])
@pytest.mark.parametrize("with_calib", [False, True])  # --calib: before the weights' runs
def test_a_base_of_another_shape_is_refused(layout, dense, with_calib, request, tmp_path):
    built, _ = request.getfixturevalue(layout)
    C.tiny_llama(0, **dense).save_pretrained(tmp_path / "other")
    (tmp_path / "calib.txt").write_text(CALIB)
    calib = ("--calib", tmp_path / "calib.txt") if with_calib else ()
    run = helpers.gac(built.path, "--realign", tmp_path / "out", "--base", tmp_path / "other",
                      *calib, *GPU)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "not the same model" in run.stderr
    assert not (tmp_path / "out").exists()


def relative_on(x: torch.Tensor, w: torch.Tensor, approx: torch.Tensor) -> float:
    return float(torch.linalg.norm(x @ (w - approx).T) / torch.linalg.norm(x @ w.T))


def last_hidden(model: torch.nn.Module, dense: Path) -> torch.Tensor:
    """Every token's last hidden state on the calibration lines (all of them: three, under
    model_output.MODEL_LINES), as the dense model's tokenizer encodes them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dense)
    out = []
    with torch.no_grad():
        for line in CALIB.splitlines():
            ids = tok(line, return_tensors="pt")
            hidden = model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"],
                           output_hidden_states=True).hidden_states[-1]
            out.append(hidden.reshape(-1, hidden.shape[-1]).double())
    return torch.cat(out)


def as_served(built: C.Built, root: Path, dense: Path) -> torch.nn.Module:
    """A compressed model loaded with its compressor's own loader, its (uncompressed)
    embeddings those of the dense base, so both read the same tokens."""
    from gac_check.models.loaders import load_model

    model = built.load(root).float().eval()
    model.resize_token_embeddings(load_model(dense).get_input_embeddings().num_embeddings)
    model.get_input_embeddings().load_state_dict(
        load_model(dense).get_input_embeddings().state_dict())
    return model


@pytest.mark.parametrize("layout", ["svdllm", "palu"])
def test_calib_measures_on_the_texts_inputs_and_runs_the_whole_model(layout, request,
                                                                     tmp_path):
    """Per matrix on the dense model's own inputs to it; the whole model's input and realigned
    figures are the compressed model and OUT run in their compressor's own loader."""
    from gac_check.models.loaders import load_model

    built, dense_dir = request.getfixturevalue(layout)
    calib = dense_dir.parent / "calib.txt"
    quality, summary, panel = measured(built, dense_dir, tmp_path / "out", "--calib", calib)
    sites = [k["module"] for k in quality["matrices"]]
    modules = sorted({s.rpartition(":group")[0] or s for s in sites})
    xs = _inputs(dense_dir, modules)
    dense = load_model(dense_dir).state_dict()
    if layout == "svdllm":
        pairs = {s: (s, slice(None)) for s in sites}
        before = {p + "_proj": f for p, f in factors(built.path).items()}
        after = {p + "_proj": f for p, f in factors(tmp_path / "out").items()}
    else:
        before, after = groups(built.path), groups(tmp_path / "out")
        rows = {s: u.shape[0] for s, (u, _) in before.items()}
        pairs = {s: (s.rpartition(":group")[0],
                     slice(int(s.rpartition(":group")[2]) * rows[s],
                           (int(s.rpartition(":group")[2]) + 1) * rows[s])) for s in sites}
    ours = {}
    for k in quality["matrices"]:
        module, rows_of = pairs[k["module"]]
        w, x = dense[module + ".weight"].double()[rows_of], xs[module]
        (u, v), (u2, v2) = before[k["module"]], after[k["module"]]
        order = (u ** 2).sum(0).argsort(descending=True)  # the whitened values' order
        ours[k["module"]] = {"input": relative_on(x, w, u @ v),
                             "realigned": relative_on(x, w, u2 @ v2),
                             **{c: relative_on(x, w, u[:, order[:int(k["ranks"][c])]]
                                               @ v[order[:int(k["ranks"][c])]])
                                for c in ("round down", "round up")}}
    read_back(quality, summary, panel, ours, inputs="calib.txt")
    model = quality["model_output"]
    reference = last_hidden(load_model(dense_dir).eval(), dense_dir)
    html = (tmp_path / "r.html").read_text()
    for choice, root in (("input", built.path), ("realigned", tmp_path / "out")):
        hidden = last_hidden(as_served(built, root, dense_dir), dense_dir)
        want = float(torch.linalg.norm(hidden - reference) / torch.linalg.norm(reference))
        cosine = float(torch.nn.functional.cosine_similarity(hidden, reference, dim=-1).mean())
        # fp32 models against float64 hooks: their rounding is the slack
        assert model["relative"][choice] == pytest.approx(want, rel=1e-3, abs=1e-5), choice
        assert model["cosine"][choice] == pytest.approx(cosine, abs=1e-5), choice
    for choice in CHOICES:
        assert (f'data-model-choice="{choice}"' in html
                and f'data-relative="{model["relative"][choice]:.6f}"' in html)
    assert model["tokens"] == reference.shape[0]
    [line] = [ln for ln in summary.splitlines() if "model output" in ln]
    assert f"realigned {model['cosine']['realigned']:.4f}" in line
