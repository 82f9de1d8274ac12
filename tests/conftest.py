"""Fixtures tests/ shares; the plain builders they are made of are in tests/helpers.py.

(The repository's conftest.py, one level up, loads the plugin and the hypothesis profile.)
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import SEED_LLAMA, put_back_libraries, save_layouts, tiny_llama


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny Llama of :data:`tests.helpers.SEED_LLAMA` (seed 0) saved three ways by
    :func:`tests.helpers.save_layouts`: ``single`` (one model.safetensors), ``sharded``
    (150 KB safetensors shards and their index) and ``torch`` (config.json and a torch.save
    zip of the state dict). The hostile corpus and the fuzzers start from these files.

    Shared by the whole session (each xdist worker builds its own): read them, never write
    them; copy one (``shutil.copytree``) to edit it.
    """
    return save_layouts(tiny_llama(**SEED_LLAMA), tmp_path_factory.mktemp("tiny"))


#: The test file whose skip must never pass unnoticed: without llama-cpp-python, no llama.cpp
#: verdict is checked against llama.cpp's own quantizer.
ORACLE = "tests/test_targets_llamacpp_oracle.py"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say once, loudly, at the end of the run, that the llama.cpp oracle was skipped."""
    for report in terminalreporter.stats.get("skipped", []):
        if report.nodeid.split("::")[0] != ORACLE:
            continue
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        terminalreporter.write_sep("!", "llama.cpp oracle SKIPPED", red=True, bold=True)
        terminalreporter.write_line(
            f"{ORACLE}: {reason.removeprefix('Skipped: ')}: no llama.cpp verdict was checked "
            "against llama.cpp's own quantizer (make llamacpp-wheel builds the wheel once)",
            red=True, bold=True)
        return


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test's fixtures are torn down (pytester's restores its snapshot of
    ``sys.modules`` there), put back the libraries an in-process pytester run imported: see
    :class:`tests.helpers._ModuleKeeper`."""
    result = yield
    put_back_libraries()
    return result
