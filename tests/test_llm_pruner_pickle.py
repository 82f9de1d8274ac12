"""LLM-Pruner's real output read for what it is: a whole pickled model carries its head_dim
(its pickled config, which serves as config.json where none is beside it; else the attention
modules' attribute, the rotary buffer), so GQA pruning of every layer (192/96-wide
projections) is not mistaken for head_dim 96, and uniform pruning without config.json is
recognised as pruned, with its attention sites."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from gac_check.analysis import check
from gac_check.sites import Role
from tests.compressors import (
    build_llm_pruner,
    build_svdllm,
    load_pickled,
    prune_llama,
    tiny_llama,
)
from tests.helpers import gac


def sites_by_role(path: Path) -> tuple[str, dict[Role, list]]:
    result = check(path, "gpu")
    out: dict[Role, list] = {}
    for s in result.sites:
        out.setdefault(s.role, []).append(s)
    return result.format.name, out


def resave(path: Path, edit) -> None:
    """Re-pickle our own fixture after ``edit`` (trusted here: this test wrote it)."""
    model, tok = load_pickled(path / "pytorch_model.bin")
    edit(model)
    torch.save({"model": model, "tokenizer": tok}, path / "pytorch_model.bin")


def test_gqa_pruned_everywhere_keeps_head_dim_32(tmp_path):
    """llama3.py: 8 query / 4 key-value heads of 32, one kv group pruned in every layer:
    q is 192 wide, k/v 96. The GCD of the widths says 96; the pickle says 32, three times:
    first its config (the config, as config.json would be: recorded, nothing inferred), then,
    with the config's head sizes gone, the attention modules' attribute, then the rotary
    buffer."""
    built = build_llm_pruner(tmp_path / "gqa", gqa=True, config_json=False)
    result = check(built.path, "gpu")
    assert result.checkpoint.config_source == "the pickled config"
    fmt, by = sites_by_role(built.path)
    assert fmt == "llm-pruner"
    assert {s.value for s in by[Role.HEAD_DIM]} == {32}
    assert {(s.value, s.attrs["kv_heads"]) for s in by[Role.HEADS]} == {(6, 3)}
    assert all(s.notes == [] for s in by[Role.HEAD_DIM])
    q = next(a for a in by[Role.HEAD_DIM][0].axes if a.tensor.endswith("q_proj.weight"))
    assert (q.blocks, q.stride) == (6, 32)

    def drop_config_heads(model):
        for key in ("head_dim", "num_attention_heads"):  # past the config's validators
            vars(model.config).pop(key)

    resave(built.path, drop_config_heads)  # next: the attention modules' attribute
    fmt, by = sites_by_role(built.path)
    assert {s.value for s in by[Role.HEAD_DIM]} == {32}
    assert all("the pickled attention modules' head_dim attribute" in s.notes[0]
               for s in by[Role.HEAD_DIM])

    def drop_attribute(model):
        for layer in model.model.layers:
            del layer.self_attn.head_dim

    resave(built.path, drop_attribute)  # next: the non-persistent rotary buffer
    fmt, by = sites_by_role(built.path)
    assert {s.value for s in by[Role.HEAD_DIM]} == {32}
    assert "model.rotary_emb.inv_freq (16 rotary frequencies)" in by[Role.HEAD_DIM][0].notes[0]


def test_uniformly_pruned_pickle_is_llm_pruner_with_attention_sites(tmp_path):
    """hf_prune.py, every layer pruned alike (4 -> 3 heads, 176 -> 141), no config.json:
    only the pickled config's dense sizes show the pruning."""
    built = build_llm_pruner(tmp_path / "uniform", gqa=False, config_json=False)
    fmt, by = sites_by_role(built.path)
    assert fmt == "llm-pruner"
    assert {s.value for s in by[Role.INTERMEDIATE]} == {141}
    assert {s.value for s in by[Role.HEAD_DIM]} == {16}
    assert {s.value for s in by[Role.HEADS]} == {3}


def test_state_dict_with_rotary_buffer_gets_attention_sites(tmp_path):
    """The same pruning saved as a bare state dict: no config anywhere, but hf_prune's
    ``rotary_emb.inv_freq`` is in the state dict and gives head_dim."""
    model = prune_llama(tiny_llama(5, num_hidden_layers=2), [0, 1], 1, 141, legacy_rotary=True)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    fmt, by = sites_by_role(tmp_path)
    assert {s.value for s in by[Role.HEAD_DIM]} == {16}
    assert {s.value for s in by[Role.HEADS]} == {3}
    assert "rotary_emb.inv_freq (8 rotary frequencies)" in by[Role.HEAD_DIM][0].notes[0]
    assert fmt in ("dense", "llm-pruner")  # nothing records the dense sizes


def test_pickled_head_counts_that_disagree_are_noted(tmp_path):
    built = build_llm_pruner(tmp_path / "gqa", gqa=True, config_json=False)

    def stale(model):
        model.model.layers[1].self_attn.num_heads = 8  # as if never updated after pruning

    resave(built.path, stale)
    _, by = sites_by_role(built.path)
    heads = {s.layer: s for s in by[Role.HEADS]}
    dense = ["the config says num_attention_heads=8, tensors have 6",  # the pickled config's
             "the config says num_key_value_heads=4, tensors have 3"]
    assert heads[1].notes == [*dense, "the pickled module says num_heads=8, tensors have 6"]
    assert heads[0].notes == dense
    assert json.dumps(heads[0].attrs)  # plain data: reports can carry it


def test_the_cli_names_the_pickled_config_once_and_the_config_in_notes(tmp_path):
    """Without config.json the pickled config is the config: the text says where it was read
    (one ``config:`` line), the JSON in ``config_source``, and the notes and dtype source say
    "the config" as they do for a config.json, so a module and its save print alike."""
    built = build_llm_pruner(tmp_path / "gqa", gqa=True, config_json=False)
    text = gac(built.path, "--gpu", "h100")
    assert "\n  config: the pickled config\n" in text.stdout
    assert "the config says num_attention_heads=8, tensors have 6" in text.stdout
    doc = json.loads(gac(built.path, "--gpu", "h100", "--format", "json").stdout)
    assert doc["config_source"] == "the pickled config"
    svdllm = build_svdllm(tmp_path / "svdllm", config_dtype=torch.float16)
    hw = json.loads(gac(svdllm.path, "--gpu", "h100", "--format", "json").stdout)["hardware"]
    assert (hw["dtype"], hw["dtype_source"]) == ("float16", "stricter of the config and weights")
    assert hw["dtype_note"].startswith("the config says float16, the weights are float32")
    with_json = build_llm_pruner(tmp_path / "copied", gqa=True)
    assert "  config:" not in gac(with_json.path, "--gpu", "h100").stdout  # config.json: said
