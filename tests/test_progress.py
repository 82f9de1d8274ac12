"""Long steps show progress: a bar at a terminal, periodic plain lines in a CI log or pipe,
nothing beside --format json."""
from __future__ import annotations

import json
from pathlib import Path

from gac_check import progress
from gac_check.cli.main import main
from gac_check.models.compress import compress_dir
from tests.helpers import gac_on_terminal, tiny_llama


def compressed_llama(root: Path) -> Path:
    tiny_llama(vocab_size=64, hidden_size=48, intermediate_size=100, num_hidden_layers=1,
               max_position_embeddings=32).save_pretrained(root / "dense")
    compress_dir(root / "dense", root / "c", 0.7)
    return root / "c"


def test_realign_progress_in_terminals_logs_and_not_json(tmp_path, monkeypatch, capsys):
    model = compressed_llama(tmp_path)
    realign = [str(model), "--gpu", "a100", "--dtype", "float16", "--fail-on", "never",
               "--base", str(tmp_path / "dense"), "--realign"]
    assert "factorizing" in gac_on_terminal(*realign, str(tmp_path / "o1"))[1]
    capsys.readouterr()
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.0)  # a line after every step
    main([*realign, str(tmp_path / "o2")])
    log = capsys.readouterr().err.splitlines()
    assert "gac-check: factorizing 1/7 (14%)" in [line.rsplit(",", 1)[0] for line in log]
    assert "\r" not in "".join(log)
    main([*realign, str(tmp_path / "o3"), "--format", "json"])
    captured = capsys.readouterr()
    assert "factorizing" not in captured.err
    assert set(json.loads(captured.out)["remaining"]) == {"error", "warning"}
