"""Round trips through the five compressors' own layouts: build what the compressor saves,
``gac-check --repair OUT`` (a real CLI run), load OUT the way that compressor's users load it,
and compare logits with the model as the compressor left it.

The layouts and loading calls are in tests/compressors.py (reimplemented from the compressors'
repositories only as far as their save and load calls go). OUT must keep the input's own
files: a pickled whole model stays one pickle with its tokenizer, SliceGPT keeps its ``.pt``
and slicing config, ASVD and PaLU their safetensors, config and modeling files.
"""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from gac_check.errors import BadInput
from tests import compressors as C
from tests import helpers, slicegpt


def repair(src: Path, out: Path, *args: str) -> dict:
    run = helpers.gac(src, "--repair", out, "--gpu", "gpu", "--format", "json", *args,
                      timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def files(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


def linears_agree(model: nn.Module) -> None:
    """Every nn.Linear says the size its weight has (what code reading in_features sees)."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            assert (mod.out_features, mod.in_features) == tuple(mod.weight.shape), name


def padded(doc: dict, role: str) -> dict[str, tuple[int, int]]:
    return {r["name"]: (r["from"], r["to"]) for r in doc["repaired"] if r["role"] == role}


def test_svdllm_pickle_round_trip(tmp_path):
    """SVD-LLM: {'model', 'tokenizer'} pickled whole, no config.json; get_model_from_local."""
    built = C.build_svdllm(tmp_path / "svdllm")
    out = tmp_path / "out"
    doc = repair(built.path, out, "--dtype", "float16")
    ranks = padded(doc, "rank")
    assert set(ranks.values()) == {(19, 24), (28, 32)}
    assert files(out) == files(built.path) | {"gac-repair.json"}  # still no config.json
    fixed = C.assert_loads_same(built, out)
    linears_agree(fixed)
    attn = fixed.model.layers[0].self_attn
    assert type(attn) is C.SVDLlamaAttention and attn.q_u_proj.in_features == 24
    entry = torch.load(out / next(iter(files(built.path))), weights_only=False)
    assert set(entry) == {"model", "tokenizer"}
    assert entry["tokenizer"].get_vocab() == C.tokenizer().get_vocab()


@pytest.mark.parametrize("gqa", [False, True], ids=["hf_prune", "llama3"])
def test_llm_pruner_pickle_round_trip(tmp_path, gqa):
    """LLM-Pruner: pytorch_model.bin holding the pruned model and tokenizer; generate.py's
    torch.load(...)['model']. The MLP (141 wide) is padded; heads are left as pruned."""
    built = C.build_llm_pruner(tmp_path / "pruned", gqa=gqa)
    out = tmp_path / "out"
    doc = repair(built.path, out)
    assert set(padded(doc, "intermediate").values()) == {(141, 144)}
    assert files(out) == {"pytorch_model.bin", "config.json", "gac-repair.json"}
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (built.path / "config.json").read_text())  # the dense sizes it records stay
    fixed = C.assert_loads_same(built, out)
    linears_agree(fixed)
    for layer, before in zip(fixed.model.layers, built.model.model.layers, strict=True):
        assert layer.mlp.up_proj.out_features == 144
        assert (layer.self_attn.num_heads, layer.self_attn.num_key_value_heads) == (
            before.self_attn.num_heads, before.self_attn.num_key_value_heads)
    assert C.load_pickled(out / "pytorch_model.bin")[1].get_vocab() == C.tokenizer().get_vocab()


def test_slicegpt_round_trip(tmp_path):
    """SliceGPT: <name>_<s>.pt state dict and <name>_<s>.json; load_sliced_model."""
    built = C.build_slicegpt(tmp_path / "sliced", [179, 179, 179, 179], hidden=256)
    out = tmp_path / "out"
    repair(built.path, out)
    assert files(out) == files(built.path) | {"gac-repair.json"}
    conf = json.loads((out / "tiny-llama_0.3.json").read_text())
    assert conf["embedding_dimensions"] == {"0": 184}
    fixed = C.assert_loads_same(built, out)
    assert fixed.model.layers[0].attn_shortcut_Q.shape == (184, 184)
    pt = out / "tiny-llama_0.3.pt"  # records as torch writes them: stored, data 64-aligned
    assert data_offsets(pt) and all(off % 64 == 0 for off in data_offsets(pt).values())
    with zipfile.ZipFile(pt) as new, zipfile.ZipFile(built.path / pt.name) as old:
        assert new.namelist() == old.namelist()


def data_offsets(path: Path) -> dict[str, int]:
    """Where each record's data starts (after its local header and extra field)."""
    out = {}
    with path.open("rb") as fh, zipfile.ZipFile(fh) as zf:
        for info in zf.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            fh.seek(info.header_offset)
            header = fh.read(30)
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            out[info.filename] = info.header_offset + 30 + name_len + extra_len
    return out


def test_asvd_round_trip(tmp_path):
    """ASVD: save_pretrained + truncation_ranks + auto_map and its modeling files."""
    built = C.build_asvd(tmp_path / "asvd")
    out = tmp_path / "out"
    doc = repair(built.path, out, "--dtype", "float16")
    assert padded(doc, "rank")
    assert files(out) == files(built.path) | {"gac-repair.json"}
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == json.loads((built.path / "config.json").read_text())["auto_map"]
    assert all(r % 8 == 0 for r in config["truncation_ranks"].values())
    C.assert_loads_same(built, out)


def test_palu_round_trip(tmp_path):
    """PaLU: save_pretrained + head_wise_ranks, model_type palullama; from_pretrained."""
    built = C.build_palu(tmp_path / "palu", ranks=(13, 11))
    out = tmp_path / "out"
    doc = repair(built.path, out, "--dtype", "float16")  # PaLU serves in fp16
    assert set(padded(doc, "kv_latent").values()) == {(13, 16), (11, 16)}
    ranks = json.loads((out / "config.json").read_text())["head_wise_ranks"]
    assert set(map(tuple, ranks.values())) == {(16, 16)}
    fixed = C.assert_loads_same(built, out)
    assert fixed.model.layers[0].self_attn.k_proj.VT.out_features == 32


def rename_module(path: Path, old: bytes, new: bytes) -> None:
    """Rewrite the class module names in a torch zip's data.pkl (protocol 2 spells a global as
    text lines, so any length fits), keeping every other record."""
    with zipfile.ZipFile(path) as zf:
        records = [(i, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(path, "w") as zf:
        for info, data in records:
            if info.filename.endswith("/data.pkl"):
                assert old in data
                data = data.replace(old, new)
            zf.writestr(info, data)


def test_pickles_are_repaired_without_importing_their_classes(tmp_path):
    """The repair never unpickles: a pickle whose classes cannot even be imported is repaired
    all the same, and once its module names are restored it loads and computes as before."""
    built = C.build_svdllm(tmp_path / "svdllm")
    (pt,) = built.path.glob("*.pt")
    rename_module(pt, b"tests.compressors\n", b"no_such_module_anywhere\n")
    out = tmp_path / "out"
    repair(built.path, out, "--dtype", "float16")
    rename_module(out / pt.name, b"no_such_module_anywhere\n", b"tests.compressors\n")
    C.assert_loads_same(built, out)


def test_shared_storage_is_refused_before_anything_is_written(tmp_path):
    """A padded tensor whose storage another tensor shares cannot be rewritten in place."""
    built = C.build_llm_pruner(tmp_path / "pruned", gqa=False, config_json=False)
    model, tok = C.load_pickled(built.path / "pytorch_model.bin")  # our own fixture
    mlp = model.model.layers[0].mlp
    mlp.up_proj.weight = mlp.gate_proj.weight  # tied: one storage, two names
    torch.save({"model": model, "tokenizer": tok}, built.path / "pytorch_model.bin")
    out = tmp_path / "out"
    run = helpers.gac(built.path, "--repair", out, "--gpu", "gpu", timeout=300)
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "shares its storage" in run.stderr and "up_proj" in run.stderr
    assert not out.exists() and sorted(files(tmp_path)) == ["pruned"]


# ------------------------------------------------- SliceGPT on every family it has an adapter for
def shapes_of(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, read from the files (never unpickled), whatever the adapter says."""
    from gac_check.checkpoint.index import open_checkpoint

    return open_checkpoint(path).shapes


def assert_padded_everywhere(before: dict, after: dict, sizes: dict[int, int]) -> None:
    """The adapter-independent invariant: every tensor axis that held a padded size holds its
    new size, and no other axis changed (so no consumer of a padded stream was missed)."""
    assert before.keys() == after.keys()
    for name, shape in before.items():
        assert after[name] == tuple(sizes.get(n, n) for n in shape), name


@pytest.mark.parametrize("family", ["llama", "opt", "phi", "phi3"])
def test_slicegpt_family_round_trip(tmp_path, family):
    """SliceGPT's four adapters (Llama, OPT with its position table and lm_head bias, Phi-2's
    parallel blocks, Phi-3's fused qkv_proj and gate_up_proj): every stream padded, the
    sidecar rewritten, and load_sliced_model's strict load gives the same logits."""
    widths = [179, 179] if family == "phi" else [179, 179, 179, 179]
    root, stem, model = slicegpt.build(tmp_path / "sliced", family, widths)
    out = tmp_path / "out"
    doc = repair(root, out)
    assert set(padded(doc, "hidden").values()) == {(179, 184)}
    assert_padded_everywhere(shapes_of(root), shapes_of(out), {179: 184})
    conf = json.loads((out / f"{stem}.json").read_text())
    tables = [v for k, v in conf.items() if k.endswith("_dimensions")]
    assert 179 not in {d for t in tables for d in t.values()}
    assert 184 in {d for t in tables for d in t.values()}
    fixed = slicegpt.load(out, family, stem)
    err = C.max_relative_error(C.logits(model, 96), C.logits(fixed, 96))
    assert err <= C.tolerance(torch.float32), f"max relative logit error {err:.3g}"


def edited_slicegpt(tmp_path: Path, family: str, edit) -> Path:
    """A SliceGPT save of ``family`` whose state dict ``edit`` (state -> state) changed."""
    root, stem, _ = slicegpt.build(tmp_path / "sliced", family, [179, 179, 179, 179])
    pt = root / f"{stem}.pt"
    torch.save(edit(torch.load(pt)), pt)
    return root


def refused_repair(model: Path, tmp_path: Path, names: str) -> None:
    """``--repair`` exits 2 with one line naming ``names``, and writes nothing."""
    run = helpers.gac(model, "--repair", tmp_path / "out", "--gpu", "gpu")
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and names in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()


def test_slicegpt_unknown_architecture_is_refused(tmp_path):
    """Layers whose modules no family names (here Llama's o_proj renamed) are refused with one
    line and exit 2, never read as Llama; nothing is written."""
    root = edited_slicegpt(tmp_path, "llama", lambda state: {
        k.replace("self_attn.o_proj", "self_attn.wo"): v for k, v in state.items()})
    refused_repair(root, tmp_path, "does not know")


def test_slicegpt_missing_shortcut_is_refused(tmp_path):
    """A layer without the mlp_shortcut_Q SliceGPT's sequential adapters write is refused,
    naming it, rather than left out of the stream."""
    root = edited_slicegpt(tmp_path, "opt", lambda state: {
        k: v for k, v in state.items() if k != "model.decoder.layers.1.mlp_shortcut_Q"})
    refused_repair(root, tmp_path, "model.decoder.layers.1.mlp_shortcut_Q")


def test_repair_refuses_an_axis_no_site_pads(tmp_path):
    """The plan is checked against the tensors, not the adapter: a tensor the adapter does not
    know that carries a padded stream's width refuses the repair, naming the tensor. The check
    refuses it first (no site reads it: tests/test_accounting.py); planned past the check, the
    writer's completeness guard refuses it too, naming the axis."""
    from gac_check.checkpoint.index import open_checkpoint
    from gac_check.contract.select import assemble
    from gac_check.formats import detect
    from gac_check.padding.plan import plan
    from gac_check.padding.write import apply

    root = edited_slicegpt(tmp_path, "opt", lambda state: {
        **state, "model.decoder.layers.0.extra_scale": torch.ones(179, dtype=torch.float16)})
    refused_repair(root, tmp_path, "1 tensor gac-check did not read, first "
                   "model.decoder.layers.0.extra_scale (float16 [179])")
    ckpt = open_checkpoint(root)
    sites = detect(ckpt).sites(ckpt)
    repair_plan = plan(sites, assemble("gpu", "float16", (), sites), shapes=ckpt.shapes,
                       config=ckpt.config)
    with pytest.raises(BadInput, match=r"model\.decoder\.layers\.0\.extra_scale axis 0 also "
                       "holds its size 179"):
        apply(repair_plan, ckpt, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()


def test_repair_refuses_a_family_not_tested_with_its_loader(tmp_path):
    """SVD-LLM's OPT layout (fc1/fc2 as *_u_proj/*_v_proj pairs, pickled) is checked, but
    --repair refuses it: no test loads a repaired one with SVD-LLM's OPT code, so an exit 0
    could not be trusted."""
    import transformers

    dense = transformers.OPTForCausalLM(slicegpt.config_of("opt", 64))
    state = {k: v.detach() for k, v in dense.state_dict().items()}
    for i in range(dense.config.num_hidden_layers):
        for fc in ("fc1", "fc2"):
            w = state.pop(f"model.decoder.layers.{i}.{fc}.weight")
            state[f"model.decoder.layers.{i}.{fc}_u_proj.weight"] = w[:, :37].contiguous()
            state[f"model.decoder.layers.{i}.{fc}_v_proj.weight"] = torch.randn(37, w.shape[1])
            state[f"model.decoder.layers.{i}.{fc}_u_proj.bias"] = state.pop(
                f"model.decoder.layers.{i}.{fc}.bias")
    svd = tmp_path / "svd"
    svd.mkdir()
    torch.save(state, svd / "model.pt")
    dense.config.save_pretrained(svd)
    check = helpers.gac(svd, "--gpu", "gpu", "--format", "json")
    assert check.returncode == 1 and json.loads(check.stdout)["format"] == "svd-llm"
    run = helpers.gac(svd, "--repair", tmp_path / "out", "--gpu", "gpu")
    assert run.returncode == 2, run.stderr
    assert "svd-llm checkpoint of the opt family" in run.stderr
    assert not (tmp_path / "out").exists()
