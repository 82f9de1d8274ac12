"""Long steps show progress to a person at a terminal, and nothing in a pipe or with JSON."""
from __future__ import annotations

from pathlib import Path

from gac_check.models.compress import compress_dir
from tests.helpers import gac, gac_on_terminal, tiny_llama


def compressed_llama(root: Path) -> Path:
    tiny_llama(vocab_size=64, hidden_size=48, intermediate_size=100, num_hidden_layers=1,
               max_position_embeddings=32).save_pretrained(root / "dense")
    compress_dir(root / "dense", root / "c", 0.7)
    return root / "c"


def stderr_of(args: list[str], tty: bool) -> str:
    """What reaches stderr on a terminal (as a person sees it) or on a pipe."""
    return gac_on_terminal(*args)[1] if tty else gac(*args, timeout=300).stderr


def test_realign_progress_on_a_terminal_only(tmp_path):
    model = compressed_llama(tmp_path)
    realign = [str(model), "--gpu", "a100", "--dtype", "float16", "--fail-on", "never",
               "--base", str(tmp_path / "dense"), "--realign"]
    assert "factorizing" in stderr_of([*realign, str(tmp_path / "o1")], tty=True)
    assert "factorizing" not in stderr_of([*realign, str(tmp_path / "o2")], tty=False)
    json_run = stderr_of([*realign, str(tmp_path / "o3"), "--format", "json"], tty=True)
    assert "factorizing" not in json_run
