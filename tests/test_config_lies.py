"""config.json that disagrees with the tensors: the tensors win, the lie is a note showing both
values, and a head count that does not divide the width is a refusal (check and --repair)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import gac, tiny_llama


@pytest.fixture(scope="module")
def lies(tmp_path_factory) -> dict[str, Path]:
    """One real Llama (hidden 64, 4 heads of 16, 2 KV heads), saved with config.json edited."""
    root = tmp_path_factory.mktemp("lies")
    model = tiny_llama(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, num_hidden_layers=2, vocab_size=128)
    out = {}
    for name, patch in {"honest": {}, "hidden4096": {"hidden_size": 4096},
                        "head_dim9": {"head_dim": 9}, "heads7": {"num_attention_heads": 7}}.items():
        path = root / name
        model.save_pretrained(path)
        cfg = json.loads((path / "config.json").read_text())
        if "head_dim" not in patch:
            cfg.pop("head_dim", None)  # derived from hidden_size / num_attention_heads
        cfg.update(patch)
        (path / "config.json").write_text(json.dumps(cfg))
        out[name] = path
    return out


def sites(path: Path) -> dict[str, dict]:
    proc = gac(path, "--gpu", "h100", "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    return {"format": doc["format"], **{s["name"]: s for s in doc["sites"]}}


@pytest.mark.parametrize(("name", "note"), [
    ("hidden4096", "not from the config's hidden_size=4096 (the tensors have 64)"),
    ("head_dim9", "the config says head_dim=9, tensors have q/k/v widths 64/32/32"),
])
def test_a_config_value_the_tensors_refute_is_a_note_never_a_site(lies, name, note) -> None:
    honest, lied = sites(lies["honest"]), sites(lies[name])
    head = "model.layers.0.self_attn:head_dim"
    assert honest[head]["value"] == lied[head]["value"] == 16  # not 1024, not 9
    assert {n: s["value"] for n, s in lied.items() if n != "format"} == \
        {n: s["value"] for n, s in honest.items() if n != "format"}
    if name == "head_dim9":  # a refuted head_dim does not make it a pruned model either
        assert lied["format"] == honest["format"]
    assert any(note in n for n in lied["hidden"]["notes"]), lied["hidden"]["notes"]


def test_heads_that_do_not_divide_the_width_are_refused_for_check_and_repair(lies,
                                                                            tmp_path) -> None:
    out = tmp_path / "out"
    for args in ((), ("--repair", out)):
        proc = gac(lies["heads7"], "--gpu", "h100", *args)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == [
            f"gac-check: {lies['heads7'].resolve()}/config.json: says num_attention_heads=7, "
            "which does not divide the attention width 64 (head_dim would be 9.143): the head "
            "layout cannot be known; correct config.json"]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _channel_pruned(keep: int = 59) -> tuple[dict, dict]:
    """LLM-Pruner --channel_wise as it leaves a Llama: the residual stream narrowed (hidden 64 ->
    ``keep``, an odd width no head count divides) while every head keeps its width, so q_proj
    is [64, keep]; config.json's hidden_size says ``keep``."""
    model = tiny_llama(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, num_hidden_layers=2, vocab_size=128)
    reads = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # hidden on their columns
    state = {}
    for name, t in model.state_dict().items():
        if name.endswith(tuple(f"{r}.weight" for r in reads)):
            t = t[:, :keep]
        elif name.endswith(("o_proj.weight", "down_proj.weight")) or "norm" in name:
            t = t[:keep]
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            t = t[:, :keep]
        state[name] = t.contiguous()
    cfg = model.config.to_dict()
    cfg.pop("head_dim", None)
    cfg["hidden_size"] = keep
    return state, cfg


def test_a_channel_pruned_hidden_size_does_not_hide_the_heads(tmp_path) -> None:
    """q's own width decides head_dim where hidden_size / heads is no whole head (issue 30): the
    check judges head_dim 16 and the hidden size 59, in memory and from the saved copy alike,
    with the disagreement as a note, never a refusal."""
    from safetensors.torch import save_file

    import gac_check

    state, cfg = _channel_pruned()
    root = tmp_path / "channel-pruned"
    root.mkdir()
    save_file(state, root / "model.safetensors")
    (root / "config.json").write_text(json.dumps(cfg))
    on_disk = sites(root)
    head = "model.layers.0.self_attn:head_dim"
    assert on_disk[head]["value"] == 16 and on_disk["hidden"]["value"] == 59
    assert any("q's width 64 / num_attention_heads=4" in n for n in on_disk["hidden"]["notes"])
    in_memory = gac_check.check(state, config=cfg, gpu="h100")
    assert {s.name: s.value for s in in_memory.sites} == \
        {n: s["value"] for n, s in on_disk.items() if n != "format"}


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict[str, Path]:
    """GQA whose attention is wider than the hidden size (Qwen3's and Gemma's shape): hidden
    64, 8 heads of 16 (q 128 wide), 2 KV heads (k 32 wide); honest (head_dim said) and with a
    lying hidden_size and no head_dim (the tensors' q width must be used, not their hidden)."""
    root = tmp_path_factory.mktemp("wide")
    model = tiny_llama(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                       intermediate_size=128, num_hidden_layers=2, vocab_size=128)
    out = {}
    for name, patch in {"honest": {}, "hidden4096": {"hidden_size": 4096}}.items():
        path = root / name
        model.save_pretrained(path)
        cfg = json.loads((path / "config.json").read_text())
        assert cfg["head_dim"] == 16
        if patch:
            cfg.pop("head_dim")
        cfg.update(patch)
        (path / "config.json").write_text(json.dumps(cfg))
        out[name] = path
    return out


def test_gqa_wider_than_hidden_takes_head_dim_from_the_q_width(wide) -> None:
    honest, lied = sites(wide["honest"]), sites(wide["hidden4096"])
    head = "model.layers.0.self_attn:head_dim"
    assert honest[head]["value"] == lied[head]["value"] == 16  # 128 / 8, not 64 / 8, not 512
    assert {n: s["value"] for n, s in lied.items() if n != "format"} == \
        {n: s["value"] for n, s in honest.items() if n != "format"}
    assert any("attention width 128 / num_attention_heads=8, not from the config's "
               "hidden_size=4096 (the tensors have 64)" in n for n in lied["hidden"]["notes"])
