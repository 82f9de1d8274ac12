"""transformers ``per_layer_config`` checkpoints (issue 30, items 1 and 4): each layer's sites
from its own tensors, its own entry as its declared value, the overrides validated, the
engines' global-config classes refused per layer, --repair exact per layer, and the in-memory
check equal to the on-disk one.

The checkpoints are tests/per_layer_models.py's: real safetensors written from real
``LlamaDecoderLayer`` modules, each built from transformers' own ``per_layer_config[i]``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.integrations.heterogeneity import AmbiguousGlobalPerLayerAttributeError
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import gac_check
from tests.helpers import gac, tree_digest
from tests.per_layer_models import (
    ARCHS,
    PRUNED,
    base_config,
    per_layer_forward,
    write_per_layer,
)
from tests.test_api_check import same_check


def _json(*args: object) -> dict:
    run = gac(*args, "--format", "json", "--fail-on", "never")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def _sites(result) -> dict[str, object]:
    return {s.name: s for s in result.sites}


@pytest.fixture(scope="module")
def pruned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_per_layer(tmp_path_factory.mktemp("pl") / "m")


def test_transformers_cannot_build_llama_from_it_but_builds_each_layer(pruned: Path) -> None:
    """What docs/formats.md says of transformers v5.24.0: the whole model fails on the global
    read of a per-layer attribute; per_layer_config[i] builds layer i."""
    cfg = LlamaConfig(**json.loads((pruned / "config.json").read_text()))
    with pytest.raises(AmbiguousGlobalPerLayerAttributeError):
        LlamaForCausalLM(cfg)
    assert LlamaDecoderLayer(cfg.per_layer_config[1], 1).mlp.up_proj.out_features == 107
    assert cfg.per_layer_config[2].skip == ["mlp"]


def test_each_layer_is_read_from_its_tensors_against_its_own_entry(pruned: Path) -> None:
    result = gac_check.check(pruned, gpu="h100")
    sites = _sites(result)
    assert result.format.name == "per-layer"
    assert result.accounting.unknown == []
    layer1 = sites["model.layers.1.mlp:intermediate"]
    assert layer1.value == 107
    assert layer1.config_field == ("per_layer_config", "1", "intermediate_size")
    assert layer1.notes == []  # its entry says 107: no "the config says 128"
    assert sites["model.layers.1.self_attn:heads"].attrs["kv_heads"] == 4
    assert sites["model.layers.1.self_attn:heads"].notes == []
    assert "model.layers.2.mlp:intermediate" not in sites  # skipped, as its entry says
    assert not any(n for s in result.sites for n in s.notes)
    assert [f.site.name for f in result.findings if f.severity == "error"] == [
        "model.layers.1.mlp:intermediate"]


def test_the_same_tensors_without_per_layer_config_are_a_config_that_lies(
        tmp_path: Path) -> None:
    """Without per_layer_config the global values are the only declaration: every layer
    that differs is a note against config.json (read as LLM-Pruner's layout)."""
    lying = write_per_layer(tmp_path / "m", tensors=lambda s: s,
                            config=lambda c: {k: v for k, v in c.items()
                                              if k != "per_layer_config"})
    state = write_per_layer(tmp_path / "ref")
    assert load_file(str(lying / "model.safetensors")).keys() == load_file(
        str(state / "model.safetensors")).keys()
    result = gac_check.check(lying, gpu="h100")
    assert result.format.name != "per-layer"
    notes = {n for s in result.sites for n in s.notes}
    assert "the config says intermediate_size=128, tensors have 107" in notes


def test_an_override_the_tensors_contradict_is_a_note_with_both_values(
        tmp_path: Path) -> None:
    root = write_per_layer(tmp_path / "m", config=lambda c: {
        **c, "per_layer_config": {"1": {"intermediate_size": 112, "num_key_value_heads": 2},
                                  "2": {"skip": ["mlp"]}}})
    result = gac_check.check(root, gpu="h100")
    sites = _sites(result)
    assert sites["model.layers.1.mlp:intermediate"].value == 107
    assert sites["model.layers.1.mlp:intermediate"].notes == [
        "per_layer_config['1'] says intermediate_size=112, tensors have 107"]
    assert sites["model.layers.1.self_attn:heads"].notes == [
        "per_layer_config['1'] says num_key_value_heads=2, tensors have 4"]


def test_a_block_dropped_without_per_layer_config_does_not_load(tmp_path: Path) -> None:
    """The skipped MLP with a config that does not say so: the class builds it and finds no
    weights (vLLM v0.33.0's loader refuses that; before, the target said it loads)."""
    root = write_per_layer(tmp_path / "m", {"2": {"skip": ["mlp"]}}, config=lambda c: {
        k: v for k, v in c.items() if k != "per_layer_config"})
    load = _json(root, "--gpu", "h100", "--target", "vllm")["summary"]["targets"]["vllm"]["load"]
    assert not load["loads"] and load["blocker"] == "layers"
    assert load["why"].startswith("layer 2 has no MLP tensors, where the class builds every")


def test_a_skip_the_tensors_contradict_is_a_note_either_way(tmp_path: Path) -> None:
    """A skipped block with tensors is read as the full block they are; a block with no
    tensors that no entry skips is noted too."""
    root = write_per_layer(tmp_path / "m", {"1": {"skip": ["mlp"]}}, config=lambda c: {
        **c, "per_layer_config": {"0": {"skip": ["mlp"]}}},
        tensors=lambda s: s)
    result = gac_check.check(root, gpu="h100")
    sites = _sites(result)
    assert "model.layers.0.mlp:intermediate" in sites  # the tensors win
    notes = sites["hidden"].notes
    assert any(n.startswith("per_layer_config['0'] skips layer 0's mlp, the tensors have it")
               for n in notes), notes
    assert "layer 1 has no mlp tensors, and per_layer_config does not skip it" in notes


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_per_layer(tmp_path_factory.mktemp("pl") / "wide")


@pytest.mark.parametrize("engine,file", [
    ("vllm", "vllm/model_executor/models/llama.py"),
    ("sglang", "python/sglang/srt/models/llama.py"),
    ("transformers", "src/transformers/integrations/heterogeneity/configuration_utils.py")])
def test_engines_refuse_it_per_layer_with_the_reason_and_the_citation(
        wide: Path, engine: str, file: str) -> None:
    load = _json(wide, "--gpu", "h100", "--target", engine)["summary"]["targets"][engine]["load"]
    assert not load["loads"] and load["blocker"] == "layers"
    assert "ignores per_layer_config and its skip" in load["why"]
    assert ("layer 1: MLP 107 (global intermediate_size 128), 4 KV heads (global "
            "num_key_value_heads 8); layer 2: no mlp (per_layer_config skips it)") in load["why"]
    assert load["source"]["file"] == file
    assert load["source"]["ref"] in ("v0.33.0", "v0.5.23", "v5.24.0")
    assert "head count" in load["remedy"]  # KV heads differ: padding cannot make them uniform


def test_a_skip_alone_does_not_load_where_the_class_builds_every_block(
        tmp_path: Path) -> None:
    """Uniform widths, one skipped MLP: the global-config class builds that MLP and finds
    no weights for it."""
    root = write_per_layer(tmp_path / "m", {"2": {"skip": ["mlp"]}})
    load = _json(root, "--gpu", "h100", "--target", "vllm")["summary"]["targets"]["vllm"]["load"]
    assert not load["loads"] and "layer 2: no mlp (per_layer_config skips it)" in load["why"]


def test_an_engine_not_read_for_per_layer_config_is_not_judged(wide: Path) -> None:
    run = gac(wide, "--gpu", "h100", "--target", "llama.cpp")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "has not read whether llama.cpp's class for LlamaForCausalLM reads" in run.stderr


def _plc(entries: object):
    return lambda c: {**c, "per_layer_config": entries}


BAD = {
    "not-an-object": (_plc([{"intermediate_size": 107}]), "per_layer_config is list, not an "
                      "object"),
    "index-not-a-number": (_plc({"one": {}}), "per_layer_config key 'one' is not a layer index"),
    "negative-index": (_plc({"-1": {}}), "key '-1' is not a layer index"),
    "index-out-of-range": (_plc({"3": {}}), "per_layer_config['3'] names layer 3, but "
                           "num_hidden_layers is 3"),
    "index-twice": (_plc({"1": {}, "01": {}}), "per_layer_config names layer 1 twice"),
    "entry-not-an-object": (_plc({"1": 107}), "per_layer_config['1'] is int, not an object"),
    "width-a-string": (_plc({"1": {"intermediate_size": "107"}}),
                       "per_layer_config['1'].intermediate_size is '107', not a positive"),
    "width-a-bool": (_plc({"1": {"num_key_value_heads": True}}), "is True, not a positive"),
    "width-zero": (_plc({"1": {"intermediate_size": 0}}), "is 0, not a positive integer"),
    "unknown-attribute": (_plc({"1": {"sliding_window": 64}}),
                          "per_layer_config['1'] has 'sliding_window', which gac-check does "
                          "not read"),
    "per-layer-hidden-size": (_plc({"1": {"hidden_size": 128}}),
                              "per_layer_config['1'].hidden_size is 128 (global 64): a "
                              "per-layer hidden_size is no layout"),
    "heads-split-nothing": (_plc({"1": {"head_dim": 24, "num_attention_heads": 5}}),
                            "layer 1's q/k widths 64/32 are whole heads of neither its "
                            "head_dim 24 nor 5 heads"),
    "skip-unknown-block": (_plc({"2": {"skip": ["attention"]}}),
                           "skip names 'attention'; a layer's blocks are 'self_attn' and 'mlp'"),
    "skip-a-string": (_plc({"2": {"skip": "mlp"}}), "skip is 'mlp', not a list of block names"),
    "no-layer-count": (lambda c: {**{k: v for k, v in c.items() if k != "num_hidden_layers"}},
                       "num_hidden_layers is None"),
    "with-block-configs": (lambda c: {**c, "block_configs": []},
                           "has both per_layer_config and block_configs"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_is_not_understood_is_refused(tmp_path: Path, case: str) -> None:
    edit, message = BAD[case]
    root = write_per_layer(tmp_path / "m", config=edit)
    before = tree_digest(root)
    run = gac(root, "--gpu", "h100")
    assert run.returncode == 2, run.stdout
    assert len(run.stderr.strip().splitlines()) == 1 and message in run.stderr, run.stderr
    assert tree_digest(root) == before


def test_a_refusal_is_one_line_from_the_real_cli_process(tmp_path: Path) -> None:
    root = write_per_layer(tmp_path / "m", config=_plc({"7": {"intermediate_size": 107}}))
    run = gac(root, "--gpu", "h100", "--target", "vllm", process=True)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"gac-check: {root / 'config.json'}: per_layer_config['7'] names layer 7, but "
        "num_hidden_layers is 3"]


def test_an_override_at_the_global_value_is_read_as_transformers_drops_it(
        tmp_path: Path) -> None:
    root = write_per_layer(tmp_path / "m", {**PRUNED, "0": {"head_dim": 8,
                                                            "intermediate_size": 128}})
    assert gac(root, "--gpu", "h100", "--fail-on", "never").returncode == 0


def test_tensors_of_a_layer_past_num_hidden_layers_are_refused(tmp_path: Path) -> None:
    root = write_per_layer(tmp_path / "m", config=lambda c: {**c, "num_hidden_layers": 2,
                                                            "per_layer_config": {"1": {}}})
    run = gac(root, "--gpu", "h100")
    assert run.returncode == 2 and "has tensors of layer 2, but num_hidden_layers is 2" in \
        run.stderr


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_repair_pads_each_layer_and_records_it_in_that_layers_entry(tmp_path: Path,
                                                                    arch: str) -> None:
    """Layer 1's MLP padded, its entry (zero-padded key kept) rewritten; every layer built
    from the output's own per_layer_config[i] as the architecture's decoder layer loads
    strictly, and the logits are those of the input."""
    root = write_per_layer(tmp_path / "m", {"01": PRUNED["1"], "2": PRUNED["2"]}, arch=arch)
    before = tree_digest(root)
    run = gac(root, "--gpu", "h100", "--repair", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    out = tmp_path / "out"
    entry = json.loads((out / "config.json").read_text())["per_layer_config"]
    width = load_file(str(out / "model.safetensors"))["model.layers.1.mlp.up_proj.weight"].shape[0]
    assert width > 107 and width % 4 == 0
    assert entry == {"01": {"intermediate_size": width, "num_key_value_heads": 4},
                     "2": {"skip": ["mlp"]}}
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(per_layer_forward(out, ids), per_layer_forward(root, ids),
                               rtol=0, atol=1e-12)
    assert tree_digest(root) == before
    assert all(f.severity != "error" for f in gac_check.check(out, gpu="h100").findings)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_the_per_layer_forward_is_transformers_own_on_a_uniform_model(tmp_path: Path,
                                                                      arch: str) -> None:
    """The proof's forward pass (each layer from its own config) against the whole stock
    model transformers builds, where one can be built: the same logits."""
    torch.manual_seed(4)
    model = AutoModelForCausalLM.from_config(
        ARCHS[arch].config(**base_config(arch=arch), attn_implementation="sdpa")).eval()
    model.save_pretrained(tmp_path / "m")
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(ids).logits.double()
    torch.testing.assert_close(per_layer_forward(tmp_path / "m", ids), logits, rtol=0,
                               atol=1e-5)


def _assembled(per_layer: dict) -> LlamaForCausalLM:
    """A model in memory as the classes that read per_layer_config build one: transformers'
    LlamaForCausalLM (global config) with each layer a LlamaDecoderLayer from its own
    per_layer_config[i], and that per_layer_config on its config."""
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(**base_config(), attn_implementation="sdpa")).eval()
    cfg = LlamaConfig(**base_config(), per_layer_config=per_layer, attn_implementation="sdpa")
    for i in range(cfg.num_hidden_layers):
        model.model.layers[i] = LlamaDecoderLayer(cfg.per_layer_config[i], i)
    model.config.per_layer_config = per_layer
    return model


def test_a_module_built_per_layer_checks_as_its_saved_directory(tmp_path: Path) -> None:
    model = _assembled({"1": PRUNED["1"]})
    model.save_pretrained(tmp_path / "saved")
    on_disk = gac_check.check(tmp_path / "saved", gpu="h100", target="vllm")
    assert on_disk.format.name == "per-layer" and on_disk.findings
    same_check(gac_check.check(model, gpu="h100", target="vllm"), on_disk)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits.double()
    torch.testing.assert_close(per_layer_forward(tmp_path / "saved", ids), logits,
                               rtol=0, atol=1e-5)


#: Layer 1 with heads of 16 (8 of them: q 128 wide), its MLP pruned to 107: transformers
#: v5.24.0 builds the layer from per_layer_config[1] (head_dim 16), as the per-layer forward does.
HEAD_DIM = {"1": {"head_dim": 16, "intermediate_size": 107}}


def test_a_per_layer_head_dim_is_read_from_the_layers_own_tensors(tmp_path: Path) -> None:
    root = write_per_layer(tmp_path / "m", HEAD_DIM)
    result = gac_check.check(root, gpu="h100")
    sites = _sites(result)
    assert sites["model.layers.1.self_attn:head_dim"].value == 16
    assert sites["model.layers.0.self_attn:head_dim"].value == 8
    assert sites["model.layers.1.self_attn:heads"].value == 8
    assert not any(n for s in result.sites for n in s.notes)
    load = _json(root, "--gpu", "h100", "--target", "vllm")["summary"]["targets"]["vllm"]["load"]
    assert not load["loads"] and ("layer 1: MLP 107 (global intermediate_size 128), head_dim "
                                  "16 (global head_dim 8)") in load["why"]
    # --repair pads the MLP only (a head_dim is never padded under RoPE) and the layers
    # built from OUT's own per_layer_config[i] compute the same
    run = gac(root, "--gpu", "h100", "--repair", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    entry = json.loads((tmp_path / "out" / "config.json").read_text())["per_layer_config"]["1"]
    assert entry["head_dim"] == 16 and entry["intermediate_size"] > 107
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(per_layer_forward(tmp_path / "out", ids),
                               per_layer_forward(root, ids), rtol=0, atol=1e-12)


def test_transformers_cannot_build_a_llama_config_with_per_layer_head_counts() -> None:
    """transformers v5.24.0's LlamaConfig validates hidden_size % num_attention_heads with a
    global read (configuration_llama.py, validate_architecture), which a per-layer
    num_attention_heads refuses: no Llama config, let alone model, has one."""
    with pytest.raises(AmbiguousGlobalPerLayerAttributeError):
        LlamaConfig(**base_config(), per_layer_config={"1": {"num_attention_heads": 4}})


def _fewer_heads(q_heads: int, kv_heads: int):
    """Layer 1's attention cut to its first ``q_heads`` query and ``kv_heads`` KV heads (of
    8), real weights sliced: rows of q/k/v, columns of o."""
    def edit(state: dict) -> dict:
        base = "model.layers.1.self_attn"
        return {**state, f"{base}.q_proj.weight": state[f"{base}.q_proj.weight"][:q_heads * 8],
                f"{base}.k_proj.weight": state[f"{base}.k_proj.weight"][:kv_heads * 8],
                f"{base}.v_proj.weight": state[f"{base}.v_proj.weight"][:kv_heads * 8],
                f"{base}.o_proj.weight": state[f"{base}.o_proj.weight"][:, :q_heads * 8]
                .contiguous()}
    return edit


def test_per_layer_head_counts_are_the_layers_own_and_tensors_win(tmp_path: Path) -> None:
    heads = {"1": {"num_attention_heads": 4, "num_key_value_heads": 2}}
    root = write_per_layer(tmp_path / "m", None, tensors=_fewer_heads(4, 2),
                           config=lambda c: {**c, "per_layer_config": heads})
    result = gac_check.check(root, gpu="h100", target=["vllm"])
    layer1 = _sites(result)["model.layers.1.self_attn:heads"]
    assert (layer1.value, layer1.attrs["kv_heads"]) == (4, 2)
    assert _sites(result)["model.layers.1.self_attn:head_dim"].value == 8
    assert not any(n for s in result.sites for n in s.notes)
    load = result.contract.targets.loads["vllm"]
    assert not load.loads and ("layer 1: 4 heads (global num_attention_heads 8), 2 KV heads "
                               "(global num_key_value_heads 8)") in load.why
    # the same entry over 6 query heads: the tensors win, the entry is a note with both values
    other = write_per_layer(tmp_path / "n", None, tensors=_fewer_heads(6, 2),
                            config=lambda c: {**c, "per_layer_config": heads})
    layer1 = _sites(gac_check.check(other, gpu="h100"))["model.layers.1.self_attn:heads"]
    assert layer1.value == 6 and layer1.notes == [
        "per_layer_config['1'] says num_attention_heads=4, tensors have 6"]
    run = gac(other, "--gpu", "h100", "--repair", tmp_path / "out", "--target", "vllm")
    assert run.returncode == 2 and not (tmp_path / "out").exists()  # head counts: no padding


def test_a_per_layer_config_in_text_config_is_refused_with_the_reason(tmp_path: Path) -> None:
    """transformers v5.24.0 reads it there (get_text_config() is the text config, with its
    per_layer_config), but gac-check reads no nested text config's widths."""
    nested = {"text_config": {**base_config(), "per_layer_config": PRUNED}}
    root = write_per_layer(tmp_path / "m", None, config=lambda c: {**c, **nested})
    run = gac(root, "--gpu", "h100")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "text_config.per_layer_config" in run.stderr and "does not read" in run.stderr


def test_a_module_with_a_per_layer_head_dim_checks_as_its_saved_directory(
        tmp_path: Path) -> None:
    """In memory the layer's own head_dim is its attention module's (tensors and attributes),
    the same as on disk."""
    model = _assembled(HEAD_DIM)
    assert model.model.layers[1].self_attn.head_dim == 16
    model.save_pretrained(tmp_path / "saved")
    on_disk = gac_check.check(tmp_path / "saved", gpu="h100", target="vllm")
    assert _sites(on_disk)["model.layers.1.self_attn:head_dim"].value == 16
    same_check(gac_check.check(model, gpu="h100", target="vllm"), on_disk)
