"""Loadability first (issue 28 item 3, issue 33 item 5): a target refuses a model its engine
has no model class for, every site of it refused with why and what would make it servable;
``--repair`` refuses, before writing anything, what a target would still refuse, and
``--uniform`` pads a per-layer pruned model to one width that every engine loads, exactly.

The rules are tested at their boundaries on the pure function; the CLI on the compressors'
own checkpoints (tests/compressors.py) and on a real per-layer pruned Llama written with
safetensors, whose uniform repair loads into the stock transformers class and computes the
same logits.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import LlamaForCausalLM

from gac_check.targets.loadability import (
    ARCHITECTURE,
    CONTAINER,
    CUSTOM,
    LAYERS,
    ModelKind,
    judge_load,
    registry,
)
from gac_check.targets.packs import packs
from gac_check.targets.shards import LayerShape, ModelShape
from gac_check.targets.spec import parse_target
from tests import compressors as C
from tests import helpers
from tests.target_models import sparse_llama

ENGINES = ("vllm", "sglang", "tensorrt-llm", "llama.cpp", "transformers")
LLAMA = ModelKind("dense", ("LlamaForCausalLM",))


def shape(widths: list[int], heads: list[int] | None = None) -> ModelShape:
    heads = heads or [32] * len(widths)
    return ModelShape(4096, 32000, {i: LayerShape(h, 8, 128, w)
                                    for i, (w, h) in enumerate(zip(widths, heads, strict=True))})


# ------------------------------------------------------------------------------ the rules
@pytest.mark.parametrize("engine", ENGINES)
def test_one_width_loads_and_one_layer_off_by_one_is_refused(engine):
    target = parse_target(engine)
    assert judge_load(LLAMA, shape([11008] * 4), target).loads
    off = judge_load(LLAMA, shape([11008, 11008, 11007, 11008]), target)
    assert (off.loads, off.blocker) == (False, LAYERS)
    assert "[11008, 11008, 11007, 11008]" in off.why and "--uniform" in off.remedy
    assert off.source is not None and off.source.file


def test_per_layer_head_counts_are_refused_and_only_a_rerun_helps():
    load = judge_load(LLAMA, shape([11008] * 3, heads=[32, 32, 28]), parse_target("vllm"))
    assert (load.loads, load.blocker) == (False, LAYERS)
    assert "head count" in load.remedy and "--uniform" not in load.remedy


@pytest.mark.parametrize("fmt, says", [
    ("asvd", "B@A"), ("svd-llm", "u_proj @ v_proj"), ("palu", "palullama"),
    ("slicegpt", "load_sliced_model"),
])
@pytest.mark.parametrize("engine", ENGINES)
def test_compressors_custom_modules_load_nowhere(fmt, says, engine):
    load = judge_load(ModelKind(fmt, ("LlamaForCausalLM",)), shape([11008] * 2),
                      parse_target(engine))
    assert (load.loads, load.blocker) == (False, CUSTOM)
    assert says in load.remedy and load.source is not None


@pytest.mark.parametrize("fmt", ["dense", "llm-pruner"])
def test_stock_layouts_are_not_custom(fmt):
    assert judge_load(ModelKind(fmt, ("LlamaForCausalLM",)), shape([11008] * 2),
                      parse_target("vllm")).loads


def test_a_pickled_whole_model_is_refused_with_the_export_that_helps():
    load = judge_load(ModelKind("llm-pruner", ("LlamaForCausalLM",), pickled_model=True),
                      shape([11008] * 2), parse_target("sglang"))
    assert (load.loads, load.blocker) == (False, CONTAINER)
    assert "save_pretrained" in load.remedy and "weights_only" in load.why


def test_architecture_is_read_from_the_registry_of_the_version_asked():
    v033, v085 = (registry("vllm").architectures[v] for v in ("v0.33.0", "v0.8.5"))
    newer = sorted(v033 - v085)[0]  # registered by v0.33.0, not yet by v0.8.5
    kind = ModelKind("dense", (newer,))
    assert judge_load(kind, shape([11008] * 2), parse_target("vllm@v0.33.0")).loads
    old = judge_load(kind, shape([11008] * 2), parse_target("vllm@v0.8.5"))
    assert (old.loads, old.blocker) == (False, ARCHITECTURE) and "v0.8.5" in old.why
    # a release between two read ones takes the older read one; one before both, the oldest
    assert not judge_load(kind, shape([11008] * 2), parse_target("vllm@v0.20.0")).loads
    assert not judge_load(kind, shape([11008] * 2), parse_target("vllm@v0.6.3.post1")).loads
    unknown = judge_load(ModelKind("dense", ("PaluLlamaForCausalLM",)), shape([11008] * 2),
                         parse_target("vllm"))
    assert unknown.blocker == ARCHITECTURE


def test_every_engine_with_a_pack_has_a_registry_with_sources():
    for engine in packs():
        reg = registry(engine)
        assert reg is not None and reg.registry.ref in packs()[engine].versions
        for _message, source in reg.refusals.values():
            assert source.ref in packs()[engine].versions
        for version in reg.architectures:
            assert version in packs()[engine].versions


# ---------------------------------------------------------------------------- the check
@pytest.mark.parametrize("fmt, builder", [
    ("asvd", C.build_asvd), ("svd-llm", C.build_svdllm), ("palu", C.build_palu),
    ("slicegpt", lambda root: C.build_slicegpt(root, [44, 52, 36, 40])),
])
def test_compressor_checkpoints_are_refused_on_every_engine(tmp_path, fmt, builder):
    built = builder(tmp_path / fmt)
    specs = ("vllm", "sglang,tp=2", "tensorrt-llm", "llama.cpp,quant=Q4_K_M")
    args = [a for s in specs for a in ("--target", s)]
    proc = helpers.gac(built.path, "--gpu", "h100", *args, "--format", "json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["format"] == fmt
    for spec in specs:
        summary = doc["summary"]["targets"][spec]
        assert summary["verdict"] == "refused" and summary["fast"] == 0
        assert summary["load"]["blocker"] == CUSTOM and summary["load"]["remedy"]
    assert all(v["verdict"] == "refused" and v["kernel"] is None
               for s in doc["sites"] for v in s["targets"])
    text = helpers.gac(built.path, "--gpu", "h100", "--target", "vllm").stdout.splitlines()
    block = text[text.index("targets (the worst of the sites; fix: what --repair --target pads "
                            "to):"):]  # the targets block itself, not the rules' reasons
    assert block[2].startswith("    does not load the model, so it refuses every site")
    verdict = text[text.index("verdict:") + 1:]
    assert verdict[0].startswith("  vllm: DOES NOT LOAD the model: vllm has no model class for")
    assert ". To serve it: " in verdict[0]


def test_html_report_says_the_target_does_not_load(tmp_path):
    built = C.build_asvd(tmp_path / "asvd")
    report = tmp_path / "r.html"
    helpers.gac(built.path, "--gpu", "h100", "--target", "vllm", "--report", report)
    html = report.read_text()
    # said once, at the model's level: in the verdict and at the head of the targets table
    assert "vllm: DOES NOT LOAD the model" in html
    assert '<span class="sev error">vllm does not load the model</span>' in html
    assert "ALinear @ BLinear" in html
    assert "Not modelled by these verdicts" in html


def test_per_layer_widths_name_the_widths_not_a_kernel_on_every_layer(tmp_path):
    """Issue 33's LLM-Pruner-style model at tp=2 with AWQ: layer 2 (10923) used to be blamed
    on awq_marlin's shard_in % 64; the blocker is the differing widths."""
    model = sparse_llama(tmp_path / "pl", hidden=4096, intermediate=[14336, 11001, 10923, 14336],
                         heads=32, kv_heads=8, layers=4, vocab=128256)
    proc = helpers.gac(model, "--gpu", "h100", "--target", "vllm,tp=2,quant=awq",
                       "--format", "json")
    doc = json.loads(proc.stdout)
    mlp = [s for s in doc["sites"] if s["role"] == "intermediate"]
    assert [s["value"] for s in mlp] == [14336, 11001, 10923, 14336]
    for site in mlp:
        (v,) = site["targets"]
        assert v["verdict"] == "refused" and "different MLP widths" in v["why"]
        assert "shard_in" not in v["why"] and "--uniform" in v["cannot_pad"]
    assert not [v for s in doc["sites"] for v in s["targets"] if v["verdict"] == "fast"]


# --------------------------------------------------------------------------- the repair
def per_layer_llama(widths: list[int]) -> LlamaForCausalLM:
    """A 4-layer tiny Llama whose MLP channels were pruned per layer (LLM-Pruner block-wise):
    config.json keeps the dense width, each layer has its own."""
    torch.manual_seed(0)
    model = helpers.tiny_llama(num_hidden_layers=len(widths), intermediate_size=max(widths))
    for layer, width in zip(model.model.layers, widths, strict=True):
        keep = torch.randperm(max(widths))[:width].sort().values
        mlp = layer.mlp
        mlp.gate_proj = helpers.prune_linear(mlp.gate_proj, rows=keep)
        mlp.up_proj = helpers.prune_linear(mlp.up_proj, rows=keep)
        mlp.down_proj = helpers.prune_linear(mlp.down_proj, cols=keep)
    return model.eval()


def test_repair_of_per_layer_widths_is_refused_before_writing_and_offers_uniform(tmp_path):
    src = tmp_path / "src"
    per_layer_llama([256, 200, 171, 256]).save_pretrained(src)
    before = helpers.tree_digest(src)
    proc = helpers.gac(src, "--gpu", "h100", "--target", "vllm,tp=2", "--repair",
                       tmp_path / "out")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "vllm,tp=2 would still refuse OUT" in proc.stderr
    assert "[256, 200, 171, 256]" in proc.stderr and "re-run the compressor" in proc.stderr
    assert "add --uniform" in proc.stderr and "to 256: +27,072 parameters" in proc.stderr
    assert not (tmp_path / "out").exists() and helpers.tree_digest(src) == before
    assert len(list(tmp_path.iterdir())) == 1  # no temporary directory left either


def test_uniform_repair_loads_in_the_stock_class_with_the_same_logits(tmp_path):
    model = per_layer_llama([256, 200, 171, 256])
    src, out = tmp_path / "src", tmp_path / "out"
    model.save_pretrained(src)
    proc = helpers.gac(src, "--gpu", "h100", "--target", "vllm,tp=2",
                       "--target", "llama.cpp,quant=Q8_0", "--repair", out, "--uniform")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--uniform: every layer's MLP padded to 256" in proc.stdout
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_slice(f"model.layers.{i}.mlp.up_proj.weight").get_shape()[0]
                for i in range(4)} == {256}
    stock = LlamaForCausalLM.from_pretrained(out).eval()  # one width: the stock class loads it
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator()
                        .manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(stock(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    again = json.loads(helpers.gac(out, "--gpu", "h100", "--target", "vllm,tp=2",
                                   "--format", "json").stdout)
    assert again["summary"]["targets"]["vllm,tp=2"]["load"]["loads"] is True


def test_uniform_pads_past_the_widest_to_what_the_target_runs_fast(tmp_path):
    """The widest layer (170) is itself misaligned: every layer goes to the size the contract
    and the target both take (176), and config.json records it (it kept the dense 300)."""
    model = per_layer_llama([170, 150, 170, 120])
    model.config.intermediate_size = 300  # what LLM-Pruner leaves: the dense width
    src, out = tmp_path / "src", tmp_path / "out"
    model.save_pretrained(src)
    proc = helpers.gac(src, "--gpu", "h100", "--dtype", "float16", "--target", "vllm,tp=2",
                       "--repair", out, "--uniform", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == 176
    stock = LlamaForCausalLM.from_pretrained(out).eval()
    ids = torch.arange(10)[None]
    with torch.no_grad():
        torch.testing.assert_close(stock(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_uniform_without_a_target_still_pads_to_one_width(tmp_path):
    model = per_layer_llama([256, 200, 171, 256])
    src, out = tmp_path / "src", tmp_path / "out"
    model.save_pretrained(src)
    proc = helpers.gac(src, "--gpu", "h100", "--repair", out, "--uniform")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stock = LlamaForCausalLM.from_pretrained(out).eval()
    ids = torch.arange(12)[None]
    with torch.no_grad():
        torch.testing.assert_close(stock(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_uniform_is_only_for_repair(tmp_path):
    proc = helpers.gac(tmp_path, "--uniform")
    assert proc.returncode == 2 and "--uniform is only used with --repair" in proc.stderr


def test_repair_of_a_compressors_layout_for_an_engine_is_refused(tmp_path):
    built = C.build_asvd(tmp_path / "asvd")
    proc = helpers.gac(built.path, "--gpu", "h100", "--target", "vllm", "--repair",
                       tmp_path / "out")
    assert proc.returncode == 2
    assert "no padding changes that" in proc.stderr and "B@A" in proc.stderr
    assert not (tmp_path / "out").exists()


# ----------------------------------------------- head sizes are not MLP widths (issue 42)
def _head_dims(head_dims: list[int]) -> ModelShape:
    """Layers alike in all but head_dim: 32 heads, 8 KV heads, MLP 11008 each."""
    return ModelShape(4096, 32000, {i: LayerShape(32, 8, d, 11008)
                                    for i, d in enumerate(head_dims)})


@pytest.mark.parametrize("engine", ENGINES)
def test_per_layer_head_sizes_are_refused_and_padding_is_not_offered(engine):
    """Layers whose head_dim differs are refused like differing head counts: zero padding
    of a head changes its softmax scale (1/sqrt(head_dim)), so --uniform cannot be the
    remedy; one head_dim everywhere loads."""
    assert judge_load(LLAMA, _head_dims([128, 128]), parse_target(engine)).loads
    load = judge_load(LLAMA, _head_dims([128, 64, 128]), parse_target(engine))
    assert (load.loads, load.blocker) == (False, LAYERS)
    assert "head count" in load.remedy and "--uniform" not in load.remedy, load.remedy


def test_a_per_layer_config_of_head_sizes_is_not_offered_padding():
    """The same through transformers' per_layer_config (judge_per_layer): a layer of another
    head_dim gets the re-run remedy, a layer of another MLP width the --uniform one."""
    from gac_check.targets.per_layer import LayerDiff

    kind = ModelKind("dense", ("LlamaForCausalLM",), per_layer=(LayerDiff(1, "differs"),))
    heads = judge_load(kind, _head_dims([128, 64]), parse_target("vllm"))
    assert not heads.loads and "--uniform" not in heads.remedy, heads.remedy
    mlp = judge_load(kind, shape([11008, 8192]), parse_target("vllm"))
    assert not mlp.loads and "--uniform" in mlp.remedy, mlp.remedy
