"""The equivalence suite shipped for a team's own checkpoint
(``pytest --pyargs gac_check.testing.model_suite --gac-model DIR``), run the way pytest
plugins are tested: pytest in this process, in a directory that is not this repository."""
from __future__ import annotations

import pytest

from gac_check.padding import write as writer
from gac_check.testing.equivalence import check_checkpoint
from gac_check.testing.models import tiny_llama
from tests.helpers import pytest_here

SUITE = ("--pyargs", "gac_check.testing.model_suite", "--gpu", "h100", "--gac-dtype",
         "float16", "-rs")


@pytest.fixture(scope="module", autouse=True)
def _imported(tmp_path_factory) -> None:
    """Run the suite's work once out here: an in-process pytest run drops the modules first
    imported inside it, and torch cannot import some of them twice in one process."""
    tmp = tmp_path_factory.mktemp("warm")
    tiny_llama(intermediate_size=172).save_pretrained(tmp / "model")
    check_checkpoint(tmp / "model", tmp / "out", "h100", "float16")


@pytest.fixture
def misaligned(pytester: pytest.Pytester):
    """A Llama whose MLP width 172 an H100 runs on a slow path in float16."""
    tiny_llama(intermediate_size=172).save_pretrained(pytester.path / "model")
    return pytester.path / "model"


def test_the_repair_of_the_teams_model_is_proven_exact(pytester, misaligned):
    result = pytest_here(pytester, *SUITE, "--gac-model", misaligned, "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*model: 2 sites padded for h100 float16; max abs logit error*"])
    assert sorted(p.name for p in misaligned.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors"]  # the input untouched


def test_a_repair_that_is_not_exact_fails_the_suite(pytester, misaligned, monkeypatch):
    monkeypatch.setattr(writer, "_zeros", lambda n: b"\x3c" * n)  # fp16 1.0, not zero
    result = pytest_here(pytester, *SUITE, "--gac-model", misaligned)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*max relative error * > tolerance 1e-05*"])


def test_an_aligned_model_is_skipped_with_the_reason(pytester):
    tiny_llama(intermediate_size=176).save_pretrained(pytester.path / "model")
    result = pytest_here(pytester, *SUITE, "--gac-model", pytester.path / "model")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*nothing to repair for h100 float16:*already aligned*"])


def test_a_directory_that_is_no_model_fails_in_one_line(pytester):
    (pytester.path / "notes").mkdir()
    (pytester.path / "notes" / "README.txt").write_text("not a checkpoint")
    result = pytest_here(pytester, *SUITE, "--gac-model", pytester.path / "notes")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*notes: holds no checkpoint*"])
    result.stdout.no_fnmatch_line("*BadInput*")  # its message, not its traceback


def test_no_model_given_fails(pytester):
    result = pytest_here(pytester, *SUITE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no --gac-model given*"])


def test_an_unknown_dtype_is_a_usage_error(pytester, misaligned):
    result = pytest_here(pytester, "--pyargs", "gac_check.testing.model_suite",
                         "--gac-dtype", "float17", "--gac-model", misaligned)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown dtype 'float17'*"])
