"""Usage errors and ``--help`` never import torch or transformers (issue 41): a typo is
refused in a fraction of a second, not after the seconds of CPU importing torch costs on a
busy runner. A fact about imports, not a timing; the CPU time is in
benchmarks/bench_usage_errors.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gac_check.models.compress import compress_dir
from tests.helpers import tiny_llama

#: Runs ``main(argv)`` and prints its exit code and which heavy modules it imported.
PROBE = """
import json, sys
from gac_check.cli.main import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
heavy = [m for m in ("torch", "transformers") if m in sys.modules]
print(json.dumps({"rc": rc, "heavy": heavy}), file=sys.stderr)
"""


def probe(*argv: object, cwd=None) -> tuple[dict, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "GAC_DEBUG"}
    done = subprocess.run([sys.executable, "-c", PROBE, *map(str, argv)], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)
    lines = done.stderr.splitlines()
    return json.loads(lines[-1]), lines[:-1]


@pytest.fixture(scope="module")
def asvd(tmp_path_factory):
    """A real low-rank checkpoint (the reference compressor's layout), which --realign takes."""
    root = tmp_path_factory.mktemp("usage")
    tiny_llama(1).save_pretrained(root / "dense")
    compress_dir(root / "dense", root / "asvd", 0.7)
    return root


@pytest.mark.parametrize("argv", [["--help"], ["report", "--help"], ["baseline", "--help"],
                                  ["compress", "--help"], ["demo", "--help"],
                                  ["evidence", "--help"], ["init", "--help"]],
                         ids=" ".join)
def test_help_imports_no_torch(argv):
    result, _ = probe(*argv)
    assert result == {"rc": 0, "heavy": []}


USAGE_ERRORS = {
    "budget above 1": (["asvd", "--realign", "out", "--budget", "2"], "--budget 2"),
    "budget not a number": (["asvd", "--realign", "out", "--budget", "x"], "--budget"),
    "calib without base": (["asvd", "--realign", "out", "--calib", "c.txt"], "needs --base"),
    "repair and realign": (["asvd", "--repair", "a", "--realign", "b"], "choose one"),
    "base without realign": (["asvd", "--base", "dense"], "only used with --realign"),
    "unknown dtype": (["asvd", "--dtype", "float17"], "--dtype"),
    "unknown gpu": (["asvd", "--gpu", "b300x"], "b300x"),
    "unknown target": (["asvd", "--target", "vllm,tp=x"], "tp"),
    "missing model": (["nothing-here"], "does not exist"),
    "init unknown engine": (["init", "--gpu", "h100", "--target", "vlm"], "'vlm'"),
}


@pytest.mark.parametrize("case", USAGE_ERRORS)
def test_usage_error_is_one_line_before_torch(asvd, case):
    argv, said = USAGE_ERRORS[case]
    result, err = probe(*argv, cwd=asvd)
    assert result == {"rc": 2, "heavy": []}, (result, err)
    assert len(err) == 1 and said in err[0], err
    assert not (asvd / "out").exists()
