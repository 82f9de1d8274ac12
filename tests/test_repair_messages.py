"""What --repair and --realign say about models they cannot fully fix: mixed weight dtypes,
aligned PaLU ranks kept by --realign, a channel-pruned hidden size, and progress that stays
off JSON runs."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from gac_check.cli.main import main
from gac_check.padding import write
from tests import compressors as C
from tests import helpers


def test_mixed_weight_dtypes_are_named(tmp_path: Path) -> None:
    """SVD-LLM's fp32 factors beside fp16 embeddings: the check says the weights mix dtypes,
    which one every site was judged in and why."""
    built = C.build_svdllm(tmp_path / "svd")
    pt = next(built.path.iterdir())
    entry = torch.load(pt, weights_only=False)
    entry["model"].model.embed_tokens.half()
    entry["model"].lm_head.half()
    torch.save(entry, pt)
    doc = json.loads(helpers.gac(built.path, "--gpu", "gpu", "--format", "json").stdout)
    note = doc["hardware"]["dtype_note"]
    assert doc["hardware"]["dtype"] == "float32"
    assert "mix" in note and "float16 in 2 (lm_head.weight, model.embed_tokens.weight)" in note
    assert "most weight elements" in note


def test_palu_realign_with_aligned_ranks_keeps_them(tmp_path: Path) -> None:
    """Every r_g already a multiple of 8: no group can go up past its own rank without another
    going below the alignment, so --realign keeps them all and OUT computes what the input
    does (PaLU's loader, logits equal)."""
    built = C.build_palu(tmp_path / "palu", ranks=(16, 8))
    run = helpers.gac(built.path, "--realign", tmp_path / "out", "--gpu", "gpu",
                      "--dtype", "float16")
    assert run.returncode == 0, run.stderr
    assert "ranks: 0 changed to another aligned rank, 8 unchanged" in run.stdout
    C.assert_loads_same(built, tmp_path / "out")


def test_channel_pruned_hidden_refusal_says_what_to_do(tmp_path: Path) -> None:
    """LLM-Pruner --channel_wise narrows the hidden size everywhere; padding it is not exact,
    and the refusal names the pruning runs that would fix it."""
    model = helpers.tiny_llama(2)
    state = {}
    for name, t in model.state_dict().items():
        keep = [slice(0, 60) if n == 64 else slice(None) for n in t.shape]
        state[name] = t[tuple(keep)].contiguous()
    root = tmp_path / "pruned"
    root.mkdir()
    save_file(state, root / "model.safetensors")
    model.config.save_pretrained(root)
    run = helpers.gac(root, "--repair", tmp_path / "out", "--gpu", "gpu", "--format", "json",
                      "--dtype", "float16")
    doc = json.loads(run.stdout)
    hidden = next(r for r in doc["refused"] if r["role"] == "hidden")
    assert "--channel_wise" in hidden["reason"] and "--block_wise" in hidden["reason"]


def test_repair_progress_is_for_terminals_not_json(tmp_path: Path, monkeypatch, capsys) -> None:
    """Progress lines (here from the first byte) go to stderr for a person, never beside
    --format json."""
    built = C.build_asvd(tmp_path / "asvd")
    monkeypatch.setattr(write, "PROGRESS_AFTER", 0.0)
    main([str(built.path), "--repair", str(tmp_path / "text"), "--gpu", "gpu"])
    assert "gac-check repair:" in capsys.readouterr().err
    main([str(built.path), "--repair", str(tmp_path / "json"), "--gpu", "gpu",
          "--format", "json"])
    captured = capsys.readouterr()
    assert "gac-check repair:" not in captured.err
    json.loads(captured.out)
