"""--realign --base on SVD-LLM's and PaLU's saves: the dense original measures each choice's
relative output error ||W - W_r|| / ||W|| (X = I) per SVD-LLM pair and per PaLU head group,
and never chooses (the ranks are those of a run without it). Every figure is recomputed here
from first principles (the dense weights; the factors as written, read with the compressors'
own loaders, or SVD-LLM's own factorisation at the rounded rank) and read back from the JSON,
the summary line and the HTML report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests import compressors as C
from tests import helpers
from tests.test_realign_output_error import OutputPanel
from tests.test_realign_palu import groups
from tests.test_realign_svdllm import factors

GPU = ("--gpu", "gpu", "--dtype", "float16")
CHOICES = ("input", "realigned", "round down", "round up")


@pytest.fixture(scope="module")
def scaling() -> dict[int, torch.Tensor]:
    return C.whitening([helpers.LLAMA["hidden_size"], helpers.LLAMA["intermediate_size"]])


@pytest.fixture(scope="module")
def svdllm(tmp_path_factory, scaling) -> tuple[C.Built, Path]:
    root = tmp_path_factory.mktemp("svdllm-base")
    C.tiny_llama(6).save_pretrained(root / "dense")
    return C.build_svdllm(root / "model", 0.6, scaling=scaling), root / "dense"


@pytest.fixture(scope="module")
def palu(tmp_path_factory, scaling) -> tuple[C.Built, Path]:
    root = tmp_path_factory.mktemp("palu-base")
    C.tiny_llama(8).save_pretrained(root / "dense")
    return C.build_palu(root / "model", (19, 10), scaling=scaling), root / "dense"


def relative(w: torch.Tensor, approx: torch.Tensor) -> float:
    return float(torch.linalg.norm(w - approx) / torch.linalg.norm(w))


def measured(built: C.Built, dense: Path, out: Path) -> tuple[dict, str, OutputPanel]:
    """The run's quality document (OUT's record, which --format json must repeat), its summary
    line and the report's output-error panel."""
    run = helpers.gac(built.path, "--realign", out, "--base", dense, *GPU,
                      "--report", out.parent / "r.html")
    assert run.returncode == 0, run.stderr
    quality = json.loads((out / "gac-realign.json").read_text())["quality"]
    doc = helpers.realign_json(built.path, out.parent / "again", "--base", dense, *GPU)
    assert doc["quality"] == quality
    panel = OutputPanel()
    panel.feed((out.parent / "r.html").read_text())
    [line] = [ln for ln in run.stdout.splitlines() if "output error (mean" in ln]
    return quality, line, panel


def read_back(quality: dict, line: str, panel: OutputPanel,
              ours: dict[str, dict[str, float]]) -> None:
    """Every figure as recomputed (``ours``: matrix -> choice -> error) in the JSON, the
    report's marks and means, and the summary's means."""
    assert "X = I" in quality["output"]["inputs"] and "X = I" in line
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
    quality, line, panel = measured(built, dense_dir, tmp_path / "out")
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
    read_back(quality, line, panel, ours)


def test_palu_output_error_against_the_dense_base(palu, tmp_path):
    built, dense_dir = palu
    quality, line, panel = measured(built, dense_dir, tmp_path / "out")
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
    read_back(quality, line, panel, ours)


@pytest.mark.parametrize("layout", ["svdllm", "palu"])
def test_the_base_measures_and_never_chooses(layout, request, tmp_path):
    built, dense_dir = request.getfixturevalue(layout)
    without = helpers.realign_json(built.path, tmp_path / "a", *GPU)
    run = helpers.gac(built.path, "--realign", tmp_path / "b", "--base", dense_dir, *GPU)
    assert run.returncode == 0, run.stderr
    with_base = json.loads((tmp_path / "b" / "gac-realign.json").read_text())
    assert helpers.plan_ranks(with_base) == helpers.plan_ranks(without)
    assert "output" not in without["quality"]
    assert "used to measure only" in run.stdout
    assert "still selected from" in run.stdout


@pytest.mark.parametrize("layout, dense", [
    ("svdllm", dict(intermediate_size=160)),  # the MLP pairs make 176 columns/rows
    ("palu", dict(num_key_value_heads=2)),  # the groups' rows add up to 64, the base has 32
])
def test_a_base_of_another_shape_is_refused(layout, dense, request, tmp_path):
    built, _ = request.getfixturevalue(layout)
    C.tiny_llama(0, **dense).save_pretrained(tmp_path / "other")
    run = helpers.gac(built.path, "--realign", tmp_path / "out", "--base", tmp_path / "other",
                      *GPU)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "not the same model" in run.stderr
    assert not (tmp_path / "out").exists()
