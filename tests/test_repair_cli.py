"""``gac-check MODEL --repair OUT`` end to end, through real runs of the CLI (helpers.gac)."""
from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

from gac_check.models.compress import compress_dir
from gac_check.testing.strategies import TinyModel
from tests import helpers
from tests.helpers import tree_digest

#: head_dim 16, hidden 64, vocab 64: only the compressor's ranks and the intermediate (37)
#: are misaligned, so a repaired model re-checks with no errors.
TINY = TinyModel("llama", dict(vocab_size=64, hidden_size=64, intermediate_size=37,
                               num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=32,
                               tie_word_embeddings=False))


#: the CLI, with the time a repair (writing a whole model) may take
gac_check = partial(helpers.gac, timeout=300)


@pytest.fixture(scope="module")
def compressed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    TINY.build(seed=0).save_pretrained(root / "dense")
    compress_dir(root / "dense", root / "asvd", 0.7)
    return root / "asvd"


def test_repair_writes_a_model_that_rechecks_clean(compressed, tmp_path):
    before = tree_digest(compressed)
    out = tmp_path / "fixed"
    run = gac_check(compressed, "--repair", out, "--gpu", "gpu", "--dtype", "float16")
    assert run.returncode == 0, run.stderr
    assert "padded" in run.stdout and "refused" not in run.stdout
    assert tree_digest(compressed) == before
    again = gac_check(out, "--gpu", "gpu", "--dtype", "float16")
    assert again.returncode == 0, again.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["intermediate_size"] == 40
    assert all(r % 8 == 0 for r in config["truncation_ranks"].values())


def test_optimal_strategy_and_json_output(compressed, tmp_path):
    out = tmp_path / "fixed"
    run = gac_check(compressed, "--repair", out, "--strategy", "optimal", "--gpu", "gpu",
                    "--dtype", "float16", "--format", "json", "--fail-on", "warning")
    assert run.returncode == 1, run.stderr  # head_dim 16 is off FlashAttention's buckets
    doc = json.loads(run.stdout)
    assert doc["strategy"] == "optimal"
    assert {r["name"].split(":")[1] for r in doc["remaining"]} == {"head_dim"}
    assert {r["name"].split(":")[1] for r in doc["refused"]} == {"head_dim"}
    assert all(r["to"] % 16 == 0 for r in doc["repaired"])
    assert 0 < doc["repair_overhead_fraction"] < 1


def test_existing_out_is_refused_unless_forced(compressed, tmp_path):
    out = tmp_path / "fixed"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    run = gac_check(compressed, "--repair", out, "--gpu", "gpu")
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "already exists" in run.stderr and (out / "keep.txt").read_text() == "mine"
    forced = gac_check(compressed, "--repair", out, "--gpu", "gpu", "--force")
    assert forced.returncode in (0, 1), forced.stderr
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()


@pytest.mark.parametrize("case", ["missing", "corrupt", "inside", "strategy"])
def test_bad_input_is_one_line_exit_2_and_leaves_no_out(case, compressed, tmp_path):
    src, out, extra = compressed, tmp_path / "fixed", []
    if case == "missing":
        src = tmp_path / "nope"
    elif case == "corrupt":
        src = tmp_path / "corrupt"
        src.mkdir()
        (src / "config.json").write_text("{}")
        (src / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    elif case == "inside":
        out = compressed / "fixed"
    else:
        extra = ["--strategy", "fastest"]
    run = gac_check(src, "--repair", out, "--gpu", "gpu", *extra)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def test_pickled_input_stays_a_pickle_and_says_so(tmp_path):
    """A pickled state dict comes out as the same file, padded; never as another container."""
    model = TINY.build(seed=1)
    src = tmp_path / "pickled"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**model.config.to_dict(),
                                                 "architectures": ["LlamaForCausalLM"]}))
    torch.save(model.state_dict(), src / "pytorch_model.bin")
    run = gac_check(src, "--repair", tmp_path / "fixed", "--gpu", "gpu", "--dtype", "float16")
    assert run.returncode == 0, run.stderr
    assert "rewritten in its own layout" in run.stdout
    assert sorted(p.name for p in (tmp_path / "fixed").iterdir()) == [
        "config.json", "gac-repair.json", "pytorch_model.bin"]
    state = torch.load(tmp_path / "fixed" / "pytorch_model.bin", weights_only=True)
    assert state["model.layers.0.mlp.up_proj.weight"].shape == (40, 64)
    assert list(state) == list(model.state_dict())


def test_safetensors_repair_imports_no_array_library(tmp_path):
    """Under a loaded runner a repair's wall time follows its CPU, and imports are most of the
    CPU beside the copy (benchmarks/RESULTS.md, issue 42): a safetensors repair without
    --target writes byte ranges and needs neither torch nor numpy (the knapsack's)."""
    TINY.build(seed=0).save_pretrained(tmp_path / "dense")
    probe = ("import runpy, sys; sys.argv = ['gac-check', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('gac_check.cli', run_name='__main__')\n"
             "except SystemExit as exc:\n    print('exit', exc.code, file=sys.stderr)\n"
             "print(sorted(m for m in ('torch', 'numpy', 'transformers', 'safetensors')"
             " if m in sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "dense"), "--repair",
                           str(tmp_path / "fixed"), "--gpu", "gpu"],
                          capture_output=True, text=True, timeout=120)
    assert proc.stderr.strip().splitlines()[-2:] == ["exit 0", "[]"], proc.stderr
    assert (tmp_path / "fixed" / "model.safetensors").is_file()
