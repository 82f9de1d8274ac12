"""The in-process CLI runner (:func:`tests.helpers.in_process`) most CLI tests go through: it
must answer as a fresh ``python -m`` process would, and leave nothing behind for the next test.
"""
from __future__ import annotations

import os
import subprocess
import threading
import warnings
from pathlib import Path

import pytest

from tests import helpers


def test_a_check_answers_the_same_in_process_and_as_a_subprocess(tiny_checkpoints, tmp_path):
    for args in ((tiny_checkpoints["single"], "--gpu", "a100"),
                 (tiny_checkpoints["sharded"], "--gpu", "h100", "--format", "json"),
                 (tmp_path / "absent", "--gpu", "a100"),  # bad input: one line, exit 2
                 ("--gpu", "no-such-gpu", tiny_checkpoints["single"])):  # a usage error
        here, there = helpers.gac(*args), helpers.gac(*args, process=True)
        assert (here.returncode, here.stdout, here.stderr) == \
            (there.returncode, there.stdout, there.stderr), args


def test_environment_and_directory_are_restored_and_gac_debug_is_unset(tmp_path, monkeypatch):
    monkeypatch.setenv("GAC_DEBUG", "1")
    monkeypatch.setenv("KEPT", "before")
    before = Path.cwd()

    def main(argv: list[str]) -> int:
        print(os.environ.get("GAC_DEBUG"), os.environ.get("KEPT"), os.environ.get("ADDED"),
              Path.cwd() == tmp_path)
        os.environ["LEFT_BEHIND"] = "1"
        os.chdir("/")
        return 0

    run = helpers.in_process(main, cwd=tmp_path, env={"KEPT": None, "ADDED": "x"})
    assert run.stdout == "None None x True\n"
    assert "LEFT_BEHIND" not in os.environ and os.environ["GAC_DEBUG"] == "1"
    assert os.environ["KEPT"] == "before" and "ADDED" not in os.environ
    assert Path.cwd() == before


@pytest.mark.parametrize(("exit_with", "code", "stderr"), [
    (None, 0, ""), (3, 3, ""), ("a message", 1, "a message\n")])
def test_system_exit_is_the_exit_code(exit_with, code, stderr):
    def main(argv: list[str]) -> int:
        raise SystemExit(exit_with)

    run = helpers.in_process(main)
    assert (run.returncode, run.stderr) == (code, stderr)


def test_an_escaping_exception_is_a_traceback_and_exit_1():
    def main(argv: list[str]) -> int:
        raise ValueError(f"boom {argv}")

    run = helpers.in_process(main, "x", 2)
    assert run.returncode == 1
    assert run.stderr.startswith("Traceback") and "ValueError: boom ['x', '2']" in run.stderr


def test_warnings_and_library_log_lines_reach_its_stderr():
    """As in a fresh process: a UserWarning each run (not once per session, not recorded by
    pytest), deprecations hidden, transformers' and huggingface_hub's log lines on stderr."""
    import logging

    from transformers.utils import logging as hf_logging

    def main(argv: list[str]) -> int:
        warnings.warn("a user warning", stacklevel=1)
        warnings.warn("a deprecation", DeprecationWarning, stacklevel=1)
        hf_logging.get_logger("transformers.test").warning("a transformers line")
        logging.getLogger("huggingface_hub").warning("a hub line")
        return 0

    for _ in range(2):
        err = helpers.in_process(main).stderr
        assert "a user warning" in err and "a deprecation" not in err
        assert "a transformers line" in err and "a hub line" in err


def test_a_hung_run_fails_after_its_timeout():
    release = threading.Event()

    def main(argv: list[str]) -> int:
        release.wait(60)
        return 0

    try:
        with pytest.raises(subprocess.TimeoutExpired):
            helpers.in_process(main, timeout=0.2)
    finally:
        release.set()
