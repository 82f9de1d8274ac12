"""--realign on layouts it cannot rewrite (PaLU, pruned models): one line, exit 2,
nothing written, and the command it names instead works on the same input."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests import compressors as C
from tests import helpers

BUILDERS = {"palu": C.build_palu,
            "llm-pruner": lambda p: C.build_llm_pruner(p, gqa=False)}


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_realign_refusal_names_what_to_run_instead(tmp_path: Path, fmt: str) -> None:
    built = BUILDERS[fmt](tmp_path / "model")
    before = helpers.tree_digest(built.path)
    out = tmp_path / "out"
    run = helpers.gac(built.path, "--realign", out, "--gpu", "gpu", "--dtype", "float16")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert f"is in {fmt} format" in run.stderr and "run --repair OUT" in run.stderr
    if fmt != "llm-pruner":
        assert "multiple" in run.stderr and "of 8" in run.stderr
    assert not out.exists() and helpers.tree_digest(built.path) == before
    instead = helpers.gac(built.path, "--repair", out, "--gpu", "gpu", "--dtype", "float16",
                          timeout=300)
    assert instead.returncode == 0, instead.stderr
    C.assert_loads_same(built, out)
