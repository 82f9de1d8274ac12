"""Repair of sharded checkpoints, sites composing on one axis in any order, and what padding
costs, pinned on public behaviour: the files ``gac_check.repair``/``apply`` write (read back with
safetensors and loaded by transformers) and the numbers the check and repair report.

* The shard index of a repaired checkpoint: ``metadata.total_size`` is the padded size, every
  ``weight_map`` entry names a file that exists and holds that tensor; pickled shards become
  safetensors shards of the same stem and the index follows them.
* Several sites on one tensor axis compose into the same tensor whatever order they come in,
  for both writers (byte pieces for safetensors, in-memory padding for torch zip input).
* The padding a check quotes for a per-head site (head_dim: one block per head, GQA's k/v with
  fewer) is what a model built with the padded head_dim really holds more, and a repair
  report's padding is the parameter difference of what it wrote.

Each test was run against a mutant of the repair code and went red (benchmarks/hand_mutants.py,
group "repair").
"""
from __future__ import annotations

import json
import math
import random
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from gac_check.analysis import check
from gac_check.api import repair
from gac_check.checkpoint.index import open_checkpoint
from gac_check.contract.select import for_hardware
from gac_check.padding.plan import plan
from gac_check.padding.write import apply
from gac_check.sites import AxisKind, DimSite, Role, TensorAxis
from gac_check.testing.strategies import TinyModel
from tests import helpers

#: intermediate 37 is the only misaligned site under the float32 GPU contract (multiples of 4);
#: head_dim 16, hidden 64 and vocab 64 are aligned, so a repair pads gate/up rows and down
#: columns only and the repaired model must compute exactly what the input did.
TINY = TinyModel("llama", dict(vocab_size=64, hidden_size=64, intermediate_size=37,
                               num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=32,
                               tie_word_embeddings=False))
TOKENS = torch.tensor([[1, 5, 9, 2, 33, 60, 7]])


#: the CLI, with the time a repair (writing a whole model) may take
gac_check = partial(helpers.gac, timeout=300)


def write_pickled_shards(model: torch.nn.Module, out: Path, shards: int = 3) -> None:
    """The layout transformers < 4.35 wrote by default: pytorch_model-0000i-of-0000n.bin
    shards (torch.save of a state-dict slice each) and pytorch_model.bin.index.json."""
    out.mkdir()
    model.config.to_json_file(out / "config.json")
    state = model.state_dict()
    names = list(state)
    weight_map, total = {}, 0
    for i in range(shards):
        part = {n: state[n].contiguous() for n in names[i::shards]}
        fname = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save(part, out / fname)
        weight_map.update(dict.fromkeys(part, fname))
        total += sum(t.numel() * t.element_size() for t in part.values())
    (out / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))


def shard_contents(out: Path) -> dict[str, dict[str, tuple[int, ...]]]:
    """Every safetensors file in ``out``: tensor name -> shape, from the files themselves."""
    found = {}
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            found[f.name] = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}  # noqa: SIM118
    return found


def data_bytes(out: Path) -> int:
    return sum(t.numel() * t.element_size() for f in out.glob("*.safetensors")
               for t in load_file(f).values())


def params(out: Path) -> int:
    return sum(t.numel() for f in out.glob("*.safetensors") for t in load_file(f).values())


def assert_index_matches_files(out: Path) -> dict:
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = shard_contents(out)
    assert set(index["weight_map"].values()) == set(files)
    for name, fname in index["weight_map"].items():
        assert name in files[fname], (name, fname)
    assert sorted(index["weight_map"]) == sorted(n for f in files.values() for n in f)
    assert index["metadata"]["total_size"] == data_bytes(out)
    return index


def same_logits(src_model: torch.nn.Module, out: Path) -> None:
    fixed = AutoModelForCausalLM.from_pretrained(out).eval()
    assert fixed.config.intermediate_size == 40
    with torch.no_grad():
        torch.testing.assert_close(fixed(TOKENS).logits, src_model(TOKENS).logits,
                                   rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ shard index
def test_sharded_safetensors_repair_rewrites_total_size_and_keeps_shard_names(tmp_path):
    model = TINY.build(seed=0)
    model.save_pretrained(tmp_path / "src", max_shard_size="40KB")
    src_index = json.loads((tmp_path / "src" / "model.safetensors.index.json").read_text())
    assert len(set(src_index["weight_map"].values())) > 2
    report = repair(tmp_path / "src", tmp_path / "out", "gpu", dtype="float32").report
    index = assert_index_matches_files(tmp_path / "out")
    assert index["weight_map"] == src_index["weight_map"]
    assert index["metadata"]["total_size"] > src_index["metadata"]["total_size"]
    assert report.plan.padding_params == params(tmp_path / "out") - sum(
        p.numel() for p in model.state_dict().values())
    same_logits(model, tmp_path / "out")


def test_sharded_pickled_checkpoint_stays_sharded_pickles(tmp_path):
    """pytorch_model-0000i-of-00003.bin shards come out under their own names, each padded in
    place; the index keeps its map and gets the new total_size; transformers loads OUT."""
    model = TINY.build(seed=1)
    write_pickled_shards(model, tmp_path / "src")
    run = gac_check(tmp_path / "src", "--repair", tmp_path / "out", "--gpu", "gpu",
                    "--dtype", "float32", "--format", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    out = tmp_path / "out"
    assert not list(out.glob("*.safetensors"))
    shards = {p.name: torch.load(p, weights_only=True) for p in out.glob("*.bin")}
    assert sorted(shards) == [f"pytorch_model-{i:05d}-of-00003.bin" for i in (1, 2, 3)]
    index = json.loads((out / "pytorch_model.bin.index.json").read_text())
    src_index = json.loads((tmp_path / "src" / "pytorch_model.bin.index.json").read_text())
    assert index["weight_map"] == src_index["weight_map"]
    assert all(name in shards[f] for name, f in index["weight_map"].items())
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for s in shards.values() for t in s.values())
    assert set(doc["files"]) <= {p.name for p in out.iterdir()}
    assert any("rewritten in its own layout" in n for n in doc["notes"])
    assert doc["padding_params"] == sum(t.numel() for s in shards.values() for t in
                                        s.values()) - sum(
        p.numel() for p in model.state_dict().values())
    same_logits(model, out)


# --------------------------------------------------------------- several sites, any order
RANKS = [5, 7, 3, 8, 1]  # PaLU-like group latents stacked on one VT axis (8 needs nothing)


def vt_checkpoint(tmp_path: Path, container: str) -> tuple[Path, list[DimSite], dict]:
    """A VT whose rows hold one latent per group, and each group's U reading them."""
    torch.manual_seed(0)
    tensors = {"VT": torch.randn(sum(RANKS), 10) + 3}
    sites, start = [], 0
    for g, r in enumerate(RANKS):
        # 64 rows: the padded factors still cost less than the dense 64 x 10 (never dearer)
        tensors[f"U{g}"] = torch.randn(64, r) + 3  # + 3: no entry is zero, so a stray zero shows
        sites.append(DimSite(f"g{g}", Role.KV_LATENT, r,
                             [TensorAxis("VT", 0, AxisKind.PRODUCER, start=start),
                              TensorAxis(f"U{g}", 1, AxisKind.CONSUMER)]))
        start += r
    src = tmp_path / f"src-{container}"
    src.mkdir()
    (src / "config.json").write_text("{}")
    if container == "safetensors":
        save_file(tensors, src / "model.safetensors")
    else:
        torch.save(tensors, src / "pytorch_model.bin")
    return src, sites, tensors


def expected_vt(vt: torch.Tensor) -> torch.Tensor:
    """Each group's rows followed by zeros up to the next multiple of 8."""
    parts, start = [], 0
    for r in RANKS:
        target = -(-r // 8) * 8
        parts += [vt[start:start + r], torch.zeros(target - r, vt.shape[1])]
        start += r
    return torch.cat(parts)


@pytest.mark.parametrize("container", ["safetensors", "torch-zip"])
def test_sites_on_one_axis_compose_in_any_order(tmp_path, container):
    src, sites, tensors = vt_checkpoint(tmp_path, container)
    ckpt = open_checkpoint(src)
    contract = for_hardware("gpu", "float16")
    orders = [sites, sites[::-1], *(random.Random(seed).sample(sites, len(sites))
                                    for seed in range(3))]
    for i, order in enumerate(orders):
        repair = plan(order, contract, "minimal", shapes=ckpt.shapes)
        assert sorted(r.site.name for r in repair.repairs) == ["g0", "g1", "g2", "g4"]
        out = tmp_path / f"out{i}"
        apply(repair, ckpt, out)
        got = (load_file(out / "model.safetensors") if container == "safetensors"
               else torch.load(out / "pytorch_model.bin", weights_only=True))
        assert torch.equal(got["VT"], expected_vt(tensors["VT"])), [s.name for s in order]
        for g, r in enumerate(RANKS):
            u = got[f"U{g}"]
            assert u.shape == (64, -(-r // 8) * 8)
            assert torch.equal(u[:, :r], tensors[f"U{g}"]) and not u[:, r:].any()


# ------------------------------------------------------------------ what padding costs
def head_dim_model(head_dim: int):
    return TinyModel("llama", dict(vocab_size=64, hidden_size=64, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=head_dim,
                                   max_position_embeddings=32)).build(seed=0)


def test_padding_quoted_for_a_per_head_site_is_what_the_padded_model_holds(tmp_path):
    """head_dim 12 in fp16 must become 16: 4 query heads, 2 key/value heads and 4 heads of
    o_proj's columns each grow by 4; the check quotes exactly the difference between the two
    stock models' parameter counts, per layer."""
    head_dim_model(12).save_pretrained(tmp_path / "m")
    run = gac_check(tmp_path / "m", "--gpu", "gpu", "--dtype", "float16", "--format", "json")
    doc = json.loads(run.stdout)
    heads = [s for s in doc["sites"] if s["role"] == "head_dim"]
    assert len(heads) == 2 and all(s["repair_to"] == 16 for s in heads)
    grown = (sum(p.numel() for p in head_dim_model(16).parameters())
             - sum(p.numel() for p in head_dim_model(12).parameters()))
    assert [s["padding_params"] for s in heads] == [grown // 2] * 2
    assert grown // 2 == 4 * 64 * (4 + 2 + 2 + 4)


def test_check_quotes_the_padding_the_repair_writes(tmp_path):
    model = TINY.build(seed=2)
    model.save_pretrained(tmp_path / "m")
    result = check(tmp_path / "m", "gpu", "float32")
    quoted = sum(result.padding_params(f) for f in result.findings)
    report = repair(tmp_path / "m", tmp_path / "out", "gpu", dtype="float32").report
    before = sum(math.prod(s) for s in result.checkpoint.shapes.values())
    written = params(tmp_path / "out") - before
    assert quoted == report.plan.padding_params == written > 0
    assert report.plan.overhead_fraction == pytest.approx(written / result.checkpoint.params)
