"""``gac-check init``: the CI workflow written into a team's repository with its GPU, dtype and
targets, as real runs of the CLI in fresh git repositories (tmp dirs): the docs' example is
exactly what it writes, the written deployment gate goes red on a width the team's engine
refuses, nothing is overwritten without --force, a missing value is asked for on a terminal
and is one line and exit 2 elsewhere."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import gac_on_terminal, gac_process, tiny_llama

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "alignment-gate.yml"
WORKFLOW = Path(".github") / "workflows" / "alignment-gate.yml"


def repository(root: Path) -> Path:
    repo = root / "team-repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    return repo


def init(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    """``gac-check init ARGS`` in a subprocess whose stdin is not a terminal."""
    return gac_process("init", *args, cwd=cwd, stdin=subprocess.DEVNULL)


def step(workflow: dict, job: str, name: str) -> dict:
    [found] = [s for s in workflow["jobs"][job]["steps"] if s.get("name", "").startswith(name)]
    return found


def test_the_docs_example_is_what_init_writes(tmp_path):
    """docs/examples/alignment-gate.yml names the command that writes it; run, it writes
    that file byte for byte (the one template; the slow fresh-repository test runs it)."""
    [command] = [line.removeprefix("#   gac-check init ").split()
                 for line in EXAMPLE.read_text().splitlines()[:8]
                 if line.startswith("#   gac-check init ")]
    repo = repository(tmp_path)
    run = init(*command, cwd=repo)
    assert run.returncode == 0, run.stderr
    assert (repo / WORKFLOW).read_text() == EXAMPLE.read_text()


def test_init_writes_the_targets_it_is_given_and_the_gate_goes_red_on_them(tmp_path):
    """``--target vllm --tp 2 --quant awq --gpu h100 --dtype fp16``, run from a subdirectory:
    the workflow lands at the repository's root and its deployment gate, run as written
    against a model whose MLP width 172 vLLM's AWQ kernels refuse at TP 2, exits 1."""
    repo = repository(tmp_path)
    (repo / "scripts").mkdir()
    run = init("--target", "vllm", "--tp", "2", "--quant", "awq", "--gpu", "H100", "--dtype",
               "fp16", cwd=repo / "scripts")
    assert run.returncode == 0, run.stderr
    assert str(repo / WORKFLOW) in run.stdout
    workflow = yaml.safe_load((repo / WORKFLOW).read_text())
    gate = step(workflow, "structure-and-equivalence", "Deployment gate")
    assert gate["if"] == "success() || failure()"
    words = shlex.split(gate["run"])
    assert words[:6] == ["gac-check", "build/model", "--gpu", "h100", "--dtype", "float16"]
    assert words[6:10] == ["--target", "vllm,tp=2,quant=awq", "--fail-on", "fallback"]
    structure = step(workflow, "structure-and-equivalence", "Structure gate")
    assert "--gpu h100 --dtype float16 --fail-on error" in structure["run"]
    assert workflow["jobs"]["performance"]["runs-on"][-1] == "h100"
    tiny_llama(0, intermediate_size=172, vocab_size=128).save_pretrained(repo / "build" / "model")
    red = gac_process(*words[1:], cwd=repo)
    assert red.returncode == 1, red.stdout + red.stderr
    assert "refused" in red.stdout


def test_an_existing_workflow_is_replaced_only_with_force(tmp_path):
    repo = repository(tmp_path)
    (repo / WORKFLOW).parent.mkdir(parents=True)
    (repo / WORKFLOW).write_text("ours\n")
    run = init("--gpu", "a100", "--target", "sglang", cwd=repo)
    assert run.returncode == 2 and run.stdout == "", run.stdout
    assert run.stderr.splitlines() == [f"gac-check: {repo / WORKFLOW}: exists; pass --force to "
                                       "replace it"]
    assert (repo / WORKFLOW).read_text() == "ours\n"
    run = init("--gpu", "a100", "--target", "sglang", "--force", cwd=repo)
    assert run.returncode == 0, run.stderr
    assert "--target sglang" in (repo / WORKFLOW).read_text()


@pytest.mark.parametrize(("args", "said"), [
    (["--gpu", "h100"], "name the engine you deploy on: --target"),
    (["--target", "vllm"], "name the GPU you serve on: --gpu"),
    (["--gpu", "cpu", "--target", "vllm"], "the workflow's GPU jobs need the GPU you serve on"),
    (["--gpu", "h101", "--target", "vllm"], "argument --gpu: invalid choice: 'h101'"),
    (["--gpu", "h100", "--target", "vlm"], "unknown engine 'vlm'"),
    (["--gpu", "h100", "--target", "llama.cpp", "--tp", "2"], "no tensor parallelism"),
    (["--gpu", "h100", "--target", "vllm,quant=awq", "--quant", "fp8", "--tp", "0"], "tp"),
    (["--gpu", "h100", "--target", "vllm", "--dtype", "fp12"], "fp12"),
    (["--gpu", "h100", "--target", "vllm;rm -rf /"], "only letters, digits"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, said):
    repo = repository(tmp_path)
    run = init(*args, cwd=repo)
    assert run.returncode == 2, (run.stdout, run.stderr)
    [line] = run.stderr.splitlines()
    assert line.startswith("gac-check: ") and said in line, line
    assert not (repo / ".github").exists()


def test_in_a_terminal_init_asks_for_what_the_options_leave_out(tmp_path):
    """GPU, dtype (Enter: float16), engine, TP size and quantization, answered at a terminal."""
    repo = repository(tmp_path)
    code, asked = gac_on_terminal("init", answers=b"h200\n\nvllm\n2\nfp8\n", cwd=repo,
                                  timeout=120)
    assert code == 0, asked
    for question in ("the GPU you serve on (", "the dtype you serve in (",
                     "the engine you deploy on (", "its tensor-parallel size (",
                     "its quantization ("):
        assert question in asked, asked
    assert "[float16]: " in asked, asked
    gate = step(yaml.safe_load((repo / WORKFLOW).read_text()), "structure-and-equivalence",
                "Deployment gate")
    assert "--gpu h200 --dtype float16 --target vllm,tp=2,quant=fp8 --fail-on fallback" in \
        " ".join(gate["run"].split())
    assert "wrote " in asked
