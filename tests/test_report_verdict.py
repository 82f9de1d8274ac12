"""The HTML report's verdict box tells a reviewer what is wrong and what to run; a merged team
report draws each model once, offers no padding that pads nothing, and says SKIPPED where
nothing was measured. Read from the rendered page with an HTML parser, as a browser would."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gac_check.report.html import render_html, run_verdict
from gac_check.report.run import new_run
from tests.helpers import gac, tiny_llama

TARGET = "vllm,tp=2,quant=awq"


class Page(HTMLParser):
    """Each element's tag, classes and text (its own and its children's)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, set[str], list[str]]] = []
        self.open: list[int] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs) -> None:
        if tag in ("meta", "br", "rect", "line", "circle", "polygon", "polyline", "link"):
            return
        self.elements.append((tag, set((dict(attrs).get("class") or "").split()), []))
        self.open.append(len(self.elements) - 1)

    def handle_endtag(self, tag) -> None:
        while self.open:
            if self.elements[self.open.pop()][0] == tag:
                break

    def handle_data(self, data) -> None:
        for i in self.open:
            self.elements[i][2].append(data)

    def texts(self, tag: str, cls: str | None = None) -> list[str]:
        return [" ".join("".join(parts).split()) for t, classes, parts in self.elements
                if t == tag and (cls is None or cls in classes)]


@pytest.fixture(scope="module")
def pruned(tmp_path_factory) -> Path:
    """An MLP pruned to 170 in both layers: 176 on an H100, 256 for AWQ at tp=2."""
    path = tmp_path_factory.mktemp("verdict") / "pruned-llama"
    tiny_llama(0, intermediate_size=170, num_hidden_layers=2, vocab_size=128,
               num_key_value_heads=2).save_pretrained(path)
    return path


def report(model: Path, out: Path, *args: str) -> Page:
    run = gac(model, "--gpu", "h100", "--dtype", "float16", "--fail-on", "never",
              "--report", out, *args)
    assert run.returncode == 0, run.stderr
    return Page(out.read_text(encoding="utf-8"))


def test_the_verdict_box_names_each_target_the_fix_and_why_it_costs_what_it_does(
        pruned, tmp_path):
    page = report(pruned, tmp_path / "out.html", "--target", TARGET)
    [line] = page.texts("li", "target-verdict")
    assert line.startswith(f"{TARGET}: REFUSED: the engine refuses to load the model")
    # vLLM's own words: AWQ's group (128) must divide each rank's input, 170 / 2 = 85
    assert "ValueError" in line and "shard_in = 85" in line, line
    [why] = page.texts("div", "cost-reason")
    assert "mlp:intermediate 170 → 256" in why and f"{TARGET} forces it" in why
    [command] = page.texts("pre", "fixcmd")
    words = shlex.split(command)
    assert words[:2] == ["gac-check", str(pruned)] and words.count("--target") == 1
    assert words[words.index("--dtype") + 1] == "float16"
    fixed = gac(*words[1:], "--format", "json", cwd=tmp_path)  # the command, as printed
    assert fixed.returncode in (0, 1) and fixed.stderr == "", fixed.stderr
    out = tmp_path / words[words.index("--repair") + 1]
    recheck = gac(out, "--gpu", "h100", "--dtype", "float16", "--target", TARGET,
                  "--format", "json")
    mlp = [c["verdict"] for s in json.loads(recheck.stdout)["sites"] if "mlp" in s["name"]
           for c in s.get("targets") or []]
    assert mlp and "refused" not in mlp, mlp


def test_without_a_target_the_hardware_rule_sets_the_cost(pruned, tmp_path):
    page = report(pruned, tmp_path / "out.html")
    assert page.texts("li", "target-verdict") == []
    [why] = page.texts("div", "cost-reason")
    assert "170 → 176" in why and "h100's rules" in why and "forces" not in why


def test_the_title_is_the_models_name_not_the_files(pruned, tmp_path):
    page = report(pruned, tmp_path / "team-report.html")
    title = page.texts("title")[0]  # the page's; the SVGs carry their own
    assert "pruned-llama" in title and "team-report" not in title


def test_a_merge_draws_each_model_once(pruned, tmp_path):
    report(pruned, tmp_path / "check.html")
    for label in ("perf-a", "perf-b"):
        shutil.copy(tmp_path / "check.json", tmp_path / f"{label}.json")
    merged = tmp_path / "merged.html"
    run = gac("report", "merge", *(tmp_path / f"{n}.json" for n in ("check", "perf-a", "perf-b")),
              "-o", merged)
    assert run.returncode == 0, run.stderr
    page = Page(merged.read_text(encoding="utf-8"))
    single = Page((tmp_path / "check.html").read_text(encoding="utf-8"))
    assert len(page.texts("svg", "grid")) == len(single.texts("svg", "grid")) > 0
    repeats = page.texts("p", "repeat")
    assert len(repeats) == 2 and all("same checkpoint on the same contract as check" in r
                                     for r in repeats)
    assert len(page.texts("h3")) - len(single.texts("h3")) == 0  # no findings table twice


def test_no_row_offers_a_padding_that_pads_nothing(tmp_path):
    """168 meets the H100's 16-byte rule, not its 32-byte optimum: nothing to pad minimally."""
    model = tmp_path / "m168"
    tiny_llama(0, intermediate_size=168, num_key_value_heads=2,
               vocab_size=128).save_pretrained(model)
    page = report(model, tmp_path / "out.html")
    cells = " | ".join(page.texts("td"))
    assert "pad 168 → 168" not in cells and "--strategy optimal pads to 176" in cells
    assert page.texts("pre", "fixcmd") == []  # nothing a minimal repair would change


@pytest.mark.parametrize(("counts", "verdict"), [
    ({"skipped": 4}, "skipped"), ({"passed": 1, "skipped": 3}, "pass"),
    ({"failed": 1, "skipped": 3}, "fail"), ({}, "pass")])
def test_a_run_that_measured_nothing_is_skipped(counts, verdict):
    run = new_run([], label="perf-h100", fail_on="never",
                  tests={"counts": counts, "failures": []})
    assert run_verdict(run)[0] == verdict
    page = Page(render_html([run]))
    assert page.texts("span", "verdict") == [verdict.upper()]


#: An interpreter in which every dependency but jinja2 fails to import, as in the example
#: workflow's report job (``pip install --no-deps gac-check`` and jinja2: no torch).
NO_TORCH = """
import sys
BLOCKED = ("torch", "transformers", "safetensors", "numpy", "hypothesis", "pytest", "xdist",
           "tqdm", "huggingface_hub", "httpx2")
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed in this job")
sys.meta_path.insert(0, NoTorch())
from gac_check.cli.main import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_report_merge_runs_with_jinja2_alone(pruned, tmp_path):
    report(pruned, tmp_path / "check.html", "--target", TARGET)
    merged = tmp_path / "team.html"
    run = subprocess.run([sys.executable, "-c", NO_TORCH, "report", "merge",
                          tmp_path / "check.json", "-o", merged], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert Page(merged.read_text(encoding="utf-8")).texts("li", "target-verdict")
