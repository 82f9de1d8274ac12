"""The report of a model a target does not load at all (vLLM and a low-rank checkpoint's factor
pairs): the verdict leads with that and with what would serve it, said once; the sites are
drawn by their own rules, so an aligned width is never red; and every command the page shows
names the model as the working directory does, never by the machine's absolute path."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.helpers import gac, tiny_llama
from tests.test_report_verdict import Page

REMEDY = "merge each pair into a dense weight"


@pytest.fixture(scope="module")
def lowrank(tmp_path_factory) -> Path:
    """ASVD-style factor pairs of a tiny Llama whose widths (960, 320, 64, 512) are aligned."""
    root = tmp_path_factory.mktemp("deployment")
    tiny_llama(0, hidden_size=320, intermediate_size=960, vocab_size=512,
               num_attention_heads=5).save_pretrained(root / "dense")
    made = gac("compress", root / "dense", root / "lowrank", "--ratio", "0.8")
    assert made.returncode == 0, made.stderr
    return root / "lowrank"


@pytest.fixture(scope="module")
def refused_page(lowrank, tmp_path_factory) -> tuple[str, Page]:
    out = tmp_path_factory.mktemp("page") / "lowrank.html"
    run = gac(lowrank, "--gpu", "h100", "--dtype", "float16", "--target", "vllm",
              "--fail-on", "never", "--report", out)
    assert run.returncode == 0, run.stderr
    text = out.read_text(encoding="utf-8")
    return text, Page(text)


def test_the_verdict_leads_with_the_target_that_does_not_load_and_what_would_serve_it(
        refused_page):
    _, page = refused_page
    [line] = page.texts("li", "target-verdict")
    assert line.startswith("vllm: DOES NOT LOAD the model: ") and REMEDY in line
    [sites] = page.texts("div", "check-summary")
    assert sites.startswith("sites: 0 of 22 misaligned by their own rules"), sites
    assert "repair adds" not in sites  # nothing to pad: no figure that reads as a cost


def test_a_reason_every_site_shares_is_said_once(refused_page):
    text, page = refused_page
    shown = " ".join(page.texts("body"))
    assert shown.count(REMEDY) == 1, shown.count(REMEDY)
    assert "no exact zero-padding" not in shown
    assert text.count(REMEDY) == 1  # nor in a hover text or attribute
    sites = [r for r in page.texts("tr") if ":rank" in r or ":intermediate" in r]
    assert sites == []  # no site row: in the targets table or the findings, each said it


def test_an_aligned_site_is_drawn_aligned(refused_page):
    _, page = refused_page
    cells = [(classes, text) for tag, classes, text in page.elements
             if tag == "g" and "cell" in classes]
    assert len(cells) == 22
    assert all("aligned" in classes for classes, _ in cells), [
        "".join(t) for c, t in cells if "aligned" not in c]


def test_the_gate_it_failed_is_the_verdict_it_shows(lowrank, tmp_path):
    """--fail-on refused exits 1 on the refused target; the page must not say PASS."""
    out = tmp_path / "gate.html"
    run = gac(lowrank, "--gpu", "h100", "--dtype", "float16", "--target", "vllm",
              "--fail-on", "refused", "--report", out)
    assert run.returncode == 1, run.stderr
    page = Page(out.read_text(encoding="utf-8"))
    assert page.texts("span", "verdict") == ["FAIL"]
    assert "lowrank: vllm does not load the model" in page.texts("ul", "reasons")[0]


def test_the_fix_command_names_the_model_as_the_working_directory_does(tmp_path):
    """Given by its absolute path from the directory it lies in, the report's command names
    it relatively, runs there as printed, and a merge elsewhere shows the same."""
    work = tmp_path / "repo"
    model = work / "models" / "pruned"
    tiny_llama(0, intermediate_size=170, vocab_size=128,
               num_key_value_heads=2).save_pretrained(model)
    out = work / "reports" / "check.html"
    run = gac(model.resolve(), "--gpu", "h100", "--dtype", "float16", "--target",
              "vllm,tp=2,quant=awq", "--fail-on", "never", "--report", out.resolve(), cwd=work)
    assert run.returncode == 0, run.stderr
    [command] = Page(out.read_text(encoding="utf-8")).texts("pre", "fixcmd")
    words = shlex.split(command)
    assert words[1] == "models/pruned", words
    assert str(tmp_path) not in command
    assert json.loads(out.with_suffix(".json").read_text())["checks"][0]["model_path"] == \
        "models/pruned"
    fixed = gac(*words[1:], "--report", "reports/fixed.html", cwd=work)  # as printed
    assert fixed.returncode in (0, 1), fixed.stderr
    page = Page((work / "reports" / "fixed.html").read_text(encoding="utf-8"))
    assert " ".join(page.texts("h3")).count("repair of models/pruned → pruned-repaired") == 1
    assert str(tmp_path) not in " ".join(page.texts("body"))
    merged = tmp_path / "elsewhere" / "team.html"
    merged.parent.mkdir()
    run = gac("report", "merge", out.with_suffix(".json"), "-o", merged, cwd=merged.parent)
    assert run.returncode == 0, run.stderr
    [command] = Page(merged.read_text(encoding="utf-8")).texts("pre", "fixcmd")
    assert shlex.split(command)[1] == "models/pruned"


def test_with_a_target_that_does_not_load_the_sites_read_as_the_hardware_judges_them(
        lowrank, tmp_path):
    """Ranks 123 and 184 (ratio 0.77) are misaligned on the H100 itself: the page with
    ``--target vllm`` counts them as the check without a target does, and offers a repair
    command that runs (``--repair --target vllm`` would be refused: vLLM loads no such model)."""
    model = tmp_path / "lowrank-077"
    made = gac("compress", lowrank.parent / "dense", model, "--ratio", "0.77")
    assert made.returncode == 0, made.stderr
    plain = json.loads(gac(model, "--gpu", "h100", "--dtype", "float16",
                           "--format", "json").stdout)["summary"]
    out = tmp_path / "mixed.html"
    run = gac(model, "--gpu", "h100", "--dtype", "float16", "--target", "vllm",
              "--fail-on", "never", "--report", out)
    assert run.returncode == 0, run.stderr
    page = Page(out.read_text(encoding="utf-8"))
    [sites] = page.texts("div", "check-summary")
    assert sites.startswith(f"sites: {plain['misaligned']} of 22 misaligned"), sites
    assert f"{plain['errors']} error(s), {plain['warnings']} warning(s)" in \
        page.texts("ul", "reasons")[0]
    cells = [c for tag, c, _ in page.elements if tag == "g" and "cell" in c]
    assert [sum(state in c for c in cells) for state in ("error", "warning")] == \
        [plain["errors"], plain["warnings"]]
    [command] = page.texts("pre", "fixcmd")
    words = shlex.split(command)
    assert "--target" not in words
    fixed = gac(*words[1:], "--format", "json", cwd=tmp_path)
    assert fixed.returncode in (0, 1) and fixed.stderr == "", fixed.stderr


@pytest.mark.parametrize(("path", "cwd", "expected"), [
    ("/ci/work/repo/models/m", "/ci/work/repo", "models/m"),
    ("/ci/work/repo", "/ci/work/repo", "."),
    ("/elsewhere/m", "/ci/work/repo", "/elsewhere/m"),  # not under it: as the user gave it
    ("/ci/work/repository/m", "/ci/work/repo", "/ci/work/repository/m"),  # a prefix, not a dir
    ("models/m", "/ci/work/repo", "models/m"),
    ("hf://org/name@0123abcd", "/ci/work/repo", "hf://org/name@0123abcd")])
def test_a_path_is_shown_relative_to_the_working_directory_only_under_it(path, cwd, expected):
    from gac_check.report.paths import shown

    assert shown(path, cwd) == expected


# ------------------------------------------------------------------- the text, as the page
def _verdict(stdout: str) -> list[str]:
    """The text's closing verdict block, each line without its indent."""
    lines = stdout.splitlines()
    return [line.strip() for line in lines[lines.index("verdict:") + 1:]]


def _rows(stdout: str) -> list[str]:
    """The text's findings table rows (site names end in :rank, :intermediate, ...)."""
    return [line for line in stdout.splitlines() if line.startswith("  model.")
            or line.startswith(("  hidden ", "  vocab "))]


def test_the_text_verdict_is_the_page_verdict(lowrank, tmp_path):
    """The text leads its verdict with the model-level outcome and the one action that would
    serve it, says the reason once, draws no aligned site as misaligned, and reads as the
    HTML written by the same run does (both from report/deployment.py)."""
    out = tmp_path / "lowrank.html"
    run = gac(lowrank, "--gpu", "h100", "--dtype", "float16", "--target", "vllm",
              "--fail-on", "never", "--report", out)
    assert run.returncode == 0, run.stderr
    page = Page(out.read_text(encoding="utf-8"))
    verdict = _verdict(run.stdout)
    assert verdict == page.texts("li", "target-verdict") + page.texts("div", "check-summary")
    assert verdict[0].startswith("vllm: DOES NOT LOAD the model: ") and REMEDY in verdict[0]
    assert verdict[1] == "sites: 0 of 22 misaligned by their own rules (the hardware's)"
    assert run.stdout.count(REMEDY) == 1 and "no exact zero-padding" not in run.stdout
    assert _rows(run.stdout) == [] and "misaligned (22 errors" not in run.stdout
    assert "target:vllm" not in run.stdout  # the verdict says it, not a rule per row


def test_the_text_draws_each_site_as_the_check_without_the_target(lowrank, tmp_path):
    """At ratio 0.77 the ranks 123 and 184 are misaligned on the H100 itself: with ``--target
    vllm`` the table holds exactly the rows the check without a target prints, and the count
    is the same; two targets refused for one reason are one verdict line."""
    model = tmp_path / "lowrank-077"
    made = gac("compress", lowrank.parent / "dense", model, "--ratio", "0.77")
    assert made.returncode == 0, made.stderr
    plain = gac(model, "--gpu", "h100", "--dtype", "float16")
    both = gac(model, "--gpu", "h100", "--dtype", "float16", "--target", "vllm",
               "--target", "vllm,tp=2")
    assert plain.returncode == both.returncode == 1, both.stderr
    assert _rows(both.stdout) == _rows(plain.stdout) != []
    count = plain.stdout.splitlines()[-1].split(" sites misaligned")[0]  # "14 of 22"
    [served, sites] = _verdict(both.stdout)
    assert served.startswith("vllm and vllm,tp=2: DOES NOT LOAD the model: ")
    assert sites.startswith(f"sites: {count} misaligned by their own rules (the hardware's); "
                            "zero-padding repair adds "), sites
    assert both.stdout.count(REMEDY) == 1


def test_the_apis_summary_line_counts_what_the_cli_verdict_counts(lowrank, tmp_path):
    """``summary().line`` counts the sites misaligned by their own rules, as the CLI's verdict
    does: at ratio 0.8 every width is aligned, so with vLLM (which does not load factor pairs)
    the line says 0 misaligned, not the 22 the target refuses; at ratio 0.77 it says the
    count the check without the target says."""
    import gac_check

    aligned = gac_check.check(lowrank, gpu="h100", dtype="float16", target="vllm")
    assert aligned.summary().line == "0 of 22 sites misaligned by their own rules " \
                                     "(0 errors, 0 warnings)"
    assert aligned.summary().errors == 22  # the exit code's count: vLLM refuses each site
    model = tmp_path / "lowrank-077"
    made = gac("compress", lowrank.parent / "dense", model, "--ratio", "0.77")
    assert made.returncode == 0, made.stderr
    plain = gac_check.check(model, gpu="h100", dtype="float16").summary().line
    served = gac_check.check(model, gpu="h100", dtype="float16", target="vllm").summary()
    count = plain.split(" sites misaligned")[0]
    assert served.line.startswith(f"{count} sites misaligned by their own rules ("), \
        served.line
    assert plain.split(" (")[1] == served.line.split(" (")[1]  # errors and warnings, and cost
