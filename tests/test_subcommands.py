"""``gac-check baseline|compress|demo``: one command line, one error boundary.

Each command runs as a real ``gac-check`` subprocess where the exit code and the one-line
contract are the point; its old ``python -m`` spelling still works and now answers the same way.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from gac_check.cli import baseline, compress, demo
from gac_check.cli.main import COMMANDS, _Parser, build_parser, main
from tests.helpers import gac, tiny_llama

NO_GPU = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is present")


def one_line_exit_2(proc: subprocess.CompletedProcess, says: str) -> None:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("gac-check: ") and says in lines[0], lines


BAD_INPUT = {
    "baseline (no subcommand)": (["baseline"], "required: record|published|contract"),
    "baseline unknown": (["baseline", "sweep"], "invalid choice: 'sweep'"),
    "record unknown --gpu": (["baseline", "record", "--gpu", "tpu"], "invalid choice: 'tpu'"),
    "published unknown gpu": (["baseline", "published", "v100", "x.json"], "invalid choice"),
    "published missing tables": (["baseline", "published", "h100", "x.json", "--reference",
                                  "no-such-dir"], "cannot read"),
    "contract missing file": (["baseline", "contract", "no-such.json"], "no-such.json"),
    "compress missing model": (["compress", "no-such-model", "out"], "no-such-model"),
    "compress bad ratio": (["compress", "no-such-model", "out", "--ratio", "x"], "--ratio"),
    "demo extra argument": (["demo", "a", "b"], "unrecognized arguments: b"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_to_a_command_is_one_line_and_exit_2(case, tmp_path):
    args, says = BAD_INPUT[case]
    proc = gac(*args, cwd=tmp_path)
    one_line_exit_2(proc, says)
    assert not list(tmp_path.iterdir())  # nothing written


@NO_GPU
def test_recording_on_an_absent_gpu_is_one_line_and_exit_2(tmp_path):
    proc = gac("baseline", "record", "--gpu", "h100", cwd=tmp_path,
               env={"GAC_BASELINES_DIR": str(tmp_path)})
    one_line_exit_2(proc, "--gpu h100 asks for an H100; this machine has no CUDA device")
    assert proc.stdout == "" and not list(tmp_path.iterdir())  # refused before the plan


def test_contract_of_a_file_that_is_no_baseline_is_one_line(tmp_path):
    (tmp_path / "b.json").write_text('{"schema": "something else"}')
    one_line_exit_2(gac("baseline", "contract", tmp_path / "b.json"), "b.json")


#: For each command, a library function it calls, made to fail as a bug would.
INTERNAL = {
    "baseline record": (["baseline", "record", "--gpu", "cpu", "--dry-run"],
                        "gac_check.bench.sweep.record_plan"),
    "baseline published": (["baseline", "published", "h100", "OUT/h100.json"],
                           "gac_check.bench.published.published_baseline"),
    "baseline contract": (["baseline", "contract", "OUT/h100.json"],
                          "gac_check.contract.measured.derive_rules"),
    "compress": (["compress", "SRC", "OUT/c"], "gac_check.models.compress.compress_dir"),
    "demo": (["demo", "OUT/demo"], "gac_check.cli.demo.bundled_model"),
}


@pytest.mark.parametrize("case", INTERNAL)
def test_a_bug_inside_a_command_is_exit_3_not_a_traceback(case, tmp_path, monkeypatch,
                                                          capsys):
    from gac_check.bench.baselines import save
    from gac_check.bench.published import published_baseline

    args, target = INTERNAL[case]
    save(published_baseline("h100"), tmp_path / "h100.json")
    argv = [a.replace("OUT", str(tmp_path)).replace("SRC", str(tmp_path)) for a in args]
    monkeypatch.delenv("GAC_DEBUG", raising=False)

    def bug(*args, **kwargs):
        raise ZeroDivisionError("a planted bug")

    monkeypatch.setattr(target, bug)
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error (ZeroDivisionError: a planted bug)" in err


@pytest.mark.parametrize("module, args, says", [
    ("gac_check.bench.sweep", ["--profile", "cpu", "--dry-run"], "cases on cpu"),
    ("gac_check.bench.published", ["h100", "OUT/h100.json"], "published cases to"),
    ("gac_check.contract.measured", ["OUT/h100.json", "--dtype", "float16",
                                     "--include-published"], "rule published-sweep-"),
    ("gac_check.models.compress", ["--help"], "usage: gac-check compress"),
    ("gac_check.demo", ["--help"], "usage: gac-check demo"),
])
def test_the_python_m_spellings_still_work(module, args, says, tmp_path):
    from gac_check.bench.baselines import save
    from gac_check.bench.published import published_baseline

    save(published_baseline("h100"), tmp_path / "h100.json")
    argv = [a.replace("OUT", str(tmp_path)) for a in args]
    proc = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and says in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("module, args", [
    ("gac_check.bench.sweep", ["--profile", "tpu"]),
    ("gac_check.bench.published", ["h100"]),
    ("gac_check.contract.measured", ["no-such.json"]),
    ("gac_check.models.compress", ["no-such-model", "out"]),
    ("gac_check.demo", ["a", "b"]),
])
def test_the_python_m_spellings_answer_bad_input_like_the_cli(module, args, tmp_path):
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    one_line_exit_2(proc, "")


def test_compress_writes_a_model_through_the_cli(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "dense")
    proc = gac("compress", tmp_path / "dense", tmp_path / "c", "--ratio", "0.5")
    assert proc.returncode == 0 and "compressed 14 linears at ratio 0.5" in proc.stdout, (
        proc.stdout + proc.stderr)
    assert (tmp_path / "c" / "model.safetensors").exists()


def test_a_model_directory_named_like_a_command_is_checked_as_dot_slash_name(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "compress")
    proc = gac("./compress", "--gpu", "a100", "--format", "json", cwd=tmp_path)
    assert proc.returncode in (0, 1) and '"gac-check/1"' in proc.stdout, proc.stderr


def test_help_names_every_command():
    text = build_parser().format_help()
    for command in ("report merge", "baseline", "record", "published", "contract",
                    "compress", "demo", "evidence", "init"):
        assert command in text
    assert set(COMMANDS) == {"report", "baseline", "compress", "demo", "evidence", "init"}


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("module", [baseline, compress, demo])
def test_every_option_of_every_command_has_help(module):
    for parser in _parsers(module.build_parser(_Parser)):
        assert parser.description, parser.prog
        bare = [a.option_strings or [a.dest] for a in parser._actions
                if not a.help and not isinstance(a, argparse._SubParsersAction)]
        assert not bare, (parser.prog, bare)


def test_record_keeps_profile_as_a_hidden_spelling_of_gpu():
    p = baseline.build_parser(_Parser)
    assert p.parse_args(["record", "--profile", "H100"]).gpu == "h100"
    record_help = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    assert "--profile" not in record_help.choices["record"].format_help()
    assert "--gpu PROFILE" in record_help.choices["record"].format_help()


def test_the_demo_names_the_compress_command_as_a_user_types_it(tmp_path, capsys,
                                                                monkeypatch):
    """The demo echoes ``gac-check compress ...``, not the module path it used to run."""
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    demo.sh(sys.executable, "-m", "gac_check.cli", "compress", "SRC", "OUT")
    assert "$ gac-check compress SRC OUT" in capsys.readouterr().out
    assert calls == [[sys.executable, "-m", "gac_check.cli", "compress", "SRC", "OUT"]]

