"""--realign on layouts it cannot rewrite (pruned models): one line, exit 2, nothing written,
and the command it names instead works on the same input. (PaLU, SVD-LLM and ASVD are
re-selected: tests/test_realign_palu.py, test_realign_svdllm.py, test_realign.py.)"""
from __future__ import annotations

from pathlib import Path

from tests import compressors as C
from tests import helpers


def test_realign_refusal_names_what_to_run_instead(tmp_path: Path) -> None:
    built = C.build_llm_pruner(tmp_path / "model", gqa=False)
    before = helpers.tree_digest(built.path)
    out = tmp_path / "out"
    run = helpers.gac(built.path, "--realign", out, "--gpu", "gpu", "--dtype", "float16")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "is in llm-pruner format" in run.stderr and "run --repair OUT" in run.stderr
    assert "PaLU's (per-group VT/U latents)" in run.stderr
    assert not out.exists() and helpers.tree_digest(built.path) == before
    instead = helpers.gac(built.path, "--repair", out, "--gpu", "gpu", "--dtype", "float16",
                          timeout=300)
    assert instead.returncode == 0, instead.stderr
    C.assert_loads_same(built, out)
