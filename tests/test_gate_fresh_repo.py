"""A team adopts the gate: docs/examples/alignment-gate.yml run step by step, as GitHub Actions
runs it, in a fresh git repository that is not a Python project.

The repository holds what docs/plugin-and-ci.md ("Adopting the gate") says to add and nothing
else: the workflow (written there by ``gac-check init``), the ``.gitignore`` lines, and the
team's compressor (``compress.py``, which saves a tiny real Llama with a misaligned MLP
width). Each job checks out a fresh clone, gets a fresh virtualenv for ``setup-python``
(nothing of this checkout's environment), and runs the workflow's ``run:`` blocks verbatim
under ``bash -eo pipefail``, with GitHub's rules for ``if:``, ``needs`` and artifacts. Two
things stand in for the network: the repository variable ``GAC_CHECK`` is the wheel built from
this checkout (the release asset the docs name), and the CPU torch line installs the same torch
release from this machine's index.

The run is slow (a virtualenv with torch is about a minute): ``make test-slow`` and CI run it.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.helpers import gac_process
from tests.wheel import ROOT, TORCH_PIN, build_wheel, clean_env, fresh_venv, run

WORKFLOW = ROOT / "docs" / "examples" / "alignment-gate.yml"
ADOPTION = ROOT / "docs" / "plugin-and-ci.md"
#: The one install line that needs the network; the same torch release comes from this
#: machine's configured index instead.
TORCH_FROM_ITS_INDEX = "pip install {pin} --index-url https://download.pytorch.org/whl/cpu"
#: The torch the README and the Makefile pin, which the workflow must install too.
DOCUMENTED_PIN = re.search(r"^TORCH_PIN \?= (\S+)$", (ROOT / "Makefile").read_text(),
                           re.M).group(1)
#: The `if:` conditions the workflow may use, and whether each runs after a failed step.
RUNS_AFTER_FAILURE = {None: False, "success() || failure()": True, "always()": True}
#: The step keys this emulation honours; any other (``env``, ``shell``, ...) fails the test.
STEP_KEYS = {"name", "uses", "with", "run", "if"}
MISALIGNED_SITE = "model.layers.0.mlp:intermediate"

COMPRESS = '''"""Our compressor (here: a tiny Llama whose MLP was pruned to 172 channels)."""
import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=64)
LlamaForCausalLM(config).save_pretrained(parser.parse_args().out)
'''


@dataclass
class Step:
    """What one step did: ``rc`` None when it was skipped."""

    name: str
    rc: int | None
    output: str = ""


@dataclass
class Runner:
    """One job's machine: its Python (``setup-python``'s, or the self-hosted runner's) and
    the run's artifact store, shared by every job of the run."""

    python_bin: Path
    artifacts: Path
    variables: dict[str, str]
    steps: list[Step] = field(default_factory=list)


def gitignore_lines() -> str:
    """The ``.gitignore`` block of the adoption steps, as the docs show it."""
    block = re.search(r"^( *)```\n\1(# \.gitignore\n.*?)^\1```", ADOPTION.read_text(),
                      re.S | re.M)
    assert block, f"{ADOPTION.name} shows no .gitignore block"
    return textwrap.dedent(block.group(1) + block.group(2))


def fresh_repository(root: Path) -> Path:
    """The team's repository after following the docs: the workflow ``gac-check init`` writes
    for the values the example names (the example itself: tests/test_init.py), .gitignore,
    compress.py."""
    repo = root / "team-repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    [values] = [line.removeprefix("#   gac-check init ").split()
                for line in WORKFLOW.read_text().splitlines()[:8]
                if line.startswith("#   gac-check init ")]
    written = gac_process("init", *values, cwd=repo, stdin=subprocess.DEVNULL)
    assert written.returncode == 0, written.stderr
    assert (repo / ".github" / "workflows" / "alignment-gate.yml").read_text() == \
        WORKFLOW.read_text()
    (repo / ".gitignore").write_text(gitignore_lines())
    (repo / "compress.py").write_text(COMPRESS)
    for cmd in (["add", "-A"],
                ["-c", "user.name=team", "-c", "user.email=team@example.com", "commit", "-qm",
                 "alignment gate"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True, capture_output=True)
    assert not any((repo / f).exists() for f in ("pyproject.toml", "setup.py", "setup.cfg"))
    return repo


def expand(text: str, variables: dict[str, str]) -> str:
    """``${{ vars.NAME }}`` as Actions expands it; any other expression fails the test (the
    emulation would not know what it means)."""
    text = re.sub(r"\$\{\{\s*vars\.(\w+)\s*\}\}", lambda m: variables[m.group(1)], text)
    assert "${{" not in text, f"an expression this test does not evaluate: {text}"
    return text


def run_job(job: dict, workflow: dict, repo: Path, runner: Runner, workdir: Path) -> None:
    """The job's steps in order, with Actions' rules: a step without ``if:`` runs only while
    every earlier step passed; ``uses:`` steps do what the action does."""
    workspace = workdir / "workspace"
    env = clean_env(CI="true", GITHUB_ACTIONS="true",
                    PATH=f"{runner.python_bin}:{clean_env()['PATH']}",
                    **{k: expand(str(v), runner.variables)
                       for k, v in workflow.get("env", {}).items()})
    failed = False
    for i, spec in enumerate(job["steps"]):
        name = spec.get("name") or spec.get("uses") or f"step {i}"
        assert set(spec) <= STEP_KEYS, f"{name}: keys this test does not emulate: {set(spec)}"
        condition = spec.get("if")
        assert condition in RUNS_AFTER_FAILURE, f"{name}: unknown condition {condition!r}"
        if failed and not RUNS_AFTER_FAILURE[condition]:
            runner.steps.append(Step(name, None))
            continue
        if "uses" in spec:
            use(spec["uses"].split("@")[0], spec.get("with", {}), repo, workspace, runner)
            runner.steps.append(Step(name, 0))
            continue
        script = expand(spec["run"], runner.variables)
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                               script], cwd=workspace, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        runner.steps.append(Step(name, proc.returncode, proc.stdout + proc.stderr))
        failed = failed or proc.returncode != 0


def use(action: str, with_: dict, repo: Path, workspace: Path, runner: Runner) -> None:
    if action == "actions/checkout":  # what is committed, nothing else
        subprocess.run(["git", "clone", "-q", str(repo), str(workspace)], check=True)
    elif action == "actions/setup-python":
        version = subprocess.run([runner.python_bin / "python", "-c",
                                  "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        if version != str(with_["python-version"]):
            pytest.skip(f"the workflow asks for Python {with_['python-version']}; this "
                        f"machine's is {version}")
        workspace.mkdir(parents=True, exist_ok=True)  # a job without checkout has one too
    elif action == "actions/upload-artifact":  # a path without files warns, as Actions does
        src, dest = workspace / with_["path"], runner.artifacts / with_["name"]
        if src.is_dir():
            shutil.copytree(src, dest)
        elif src.is_file():
            dest.mkdir(parents=True)
            shutil.copy(src, dest)
    elif action == "actions/download-artifact":  # no name: every artifact, each in its folder
        names = [with_["name"]] if "name" in with_ else sorted(
            p.name for p in runner.artifacts.iterdir())
        for name in names:
            dest = workspace / with_["path"] / ("" if "name" in with_ else name)
            shutil.copytree(runner.artifacts / name, dest, dirs_exist_ok=True)
    else:
        raise AssertionError(f"an action this test does not emulate: {action}")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel") / "dist")


def substitute_torch(workflow: dict) -> None:
    """The CPU torch line, pinned and from this machine's index (no network here)."""
    install = workflow["jobs"]["structure-and-equivalence"]["steps"][2]
    line = TORCH_FROM_ITS_INDEX.format(pin=DOCUMENTED_PIN)
    assert line in install["run"], (install, "the workflow's torch is not the README's pin")
    assert f"pip install {DOCUMENTED_PIN}" in (ROOT / "README.md").read_text()
    install["run"] = install["run"].replace(line, f"pip install {TORCH_PIN}")


def test_an_unset_gac_check_stops_the_install_in_one_line(tmp_path):
    """Before the variable is set, the install says what to set (and installs nothing)."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (install,) = [s["run"] for s in workflow["jobs"]["report"]["steps"] if "GAC_CHECK" in
                  s.get("run", "")]
    env = clean_env(GAC_CHECK=expand(workflow["env"]["GAC_CHECK"], {"GAC_CHECK": ""}))
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", install],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().endswith("GAC_CHECK: set the repository variable GAC_CHECK")
    assert proc.stdout == ""


@pytest.mark.slow
def test_a_fresh_repository_runs_the_example_workflow(wheel, tmp_path):
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow["env"]["GAC_CHECK"] == "${{ vars.GAC_CHECK }}"
    substitute_torch(workflow)
    repo = fresh_repository(tmp_path)
    jobs = workflow["jobs"]
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    variables = {"GAC_CHECK": str(wheel)}

    cpu = Runner(fresh_venv(tmp_path / "cpu-python"), artifacts, variables)
    run_job(jobs["structure-and-equivalence"], workflow, repo, cpu, tmp_path / "cpu")
    shown = "\n".join(f"--- {s.name}: {s.rc}\n{s.output[-3000:]}" for s in cpu.steps)
    assert [s.rc for s in cpu.steps] == [0, 0, 0, 0, 1, 1, 0, 0, 0, None], shown
    # the gate fails on the misaligned width, naming it; the suite proves the repair exact
    junit = (tmp_path / "cpu" / "workspace" / "reports" / "structure.xml").read_text()
    assert MISALIGNED_SITE in junit and "<failure" in junit
    # the deployment gate is red on its own: vLLM's AWQ kernels refuse the MLP width 172
    deployment = cpu.steps[5]
    assert deployment.name.startswith("Deployment gate") and "refused" in deployment.output
    targets = (tmp_path / "cpu" / "workspace" / "reports" / "targets.xml").read_text()
    assert "<failure" in targets and "awq" in targets, targets[:2000]
    equivalence = cpu.steps[6].output
    assert "1 passed" in equivalence, shown
    assert sorted(p.name for p in (artifacts / "cpu-reports").iterdir()) == [
        "cpu.html", "cpu.json", "pytest-cpu.xml", "structure.html", "structure.json",
        "structure.xml", "targets.xml"]
    assert not (artifacts / "model").exists()  # a red gate uploads no model
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path / "cpu" / "workspace",
                            capture_output=True, text=True, check=True).stdout
    assert status == "", f"the docs' .gitignore lets the jobs' outputs show:\n{status}"

    # record-baseline runs only when started by hand; performance needs the red job: skipped
    assert jobs["record-baseline"]["if"] == "github.event_name == 'workflow_dispatch'"
    assert "structure-and-equivalence" in jobs["performance"]["needs"]

    assert jobs["report"]["if"] == "always()"
    merge = Runner(fresh_venv(tmp_path / "report-python"), artifacts, variables)
    run_job(jobs["report"], workflow, repo, merge, tmp_path / "report")
    shown = "\n".join(f"--- {s.name}: {s.rc}\n{s.output[-3000:]}" for s in merge.steps)
    assert [s.rc for s in merge.steps] == [0, 0, 0, 0, 0], shown
    no_torch = run(merge.python_bin / "python", "-c", "import torch", cwd=tmp_path)
    assert no_torch.returncode != 0, "the report job installed torch"
    html = (tmp_path / "report" / "workspace" / "reports" / "alignment.html").read_text()
    assert "<html" in html[:300] and MISALIGNED_SITE in html
