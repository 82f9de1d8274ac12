"""Hybrid attention/SSM models and pure SSM models, read through their own classes.

Each model is built tiny by transformers' own class with random weights (every hybrid with
an attention layer beside its SSM layer, its MLP / expert widths 173), written with
``save_pretrained`` and checked from its headers as a user would: every tensor of the SSM
mixers accounted, their linears judged as the GEMMs they are, the attention and MLP/MoE
layers judged as in any other family. docs/formats.md "Hybrid and SSM models".
"""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import gac_check
from gac_check.formats.derive_table import derive
from gac_check.formats.derived import table
from gac_check.sites import Role

_ATTN = {"num_attention_heads": 4, "num_key_value_heads": 2}
#: model_type -> config of a tiny model with one SSM layer and (hybrids) one attention layer
CONFIGS: dict[str, dict] = {
    "mamba": {"hidden_size": 64, "intermediate_size": 173, "state_size": 16,
              "time_step_rank": 16},
    "mamba2": {"hidden_size": 64, "expand": 2, "num_heads": 8, "head_dim": 16, "n_groups": 1,
               "state_size": 16},
    "jamba": {**_ATTN, "hidden_size": 64, "intermediate_size": 173, "attn_layer_period": 2,
              "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
              "num_experts": 4, "mamba_d_state": 16, "mamba_dt_rank": 16},
    "bamba": {**_ATTN, "hidden_size": 64, "intermediate_size": 173, "attn_layer_indices": [1],
              "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
              "mamba_d_state": 16},
    "falcon_h1": {**_ATTN, "hidden_size": 64, "head_dim": 16, "intermediate_size": 173,
                  "mamba_d_ssm": None, "mamba_n_heads": 8, "mamba_d_head": 16,
                  "mamba_n_groups": 1, "mamba_d_state": 16},
    "qwen3_next": {**_ATTN, "hidden_size": 64, "head_dim": 16, "intermediate_size": 173,
                   "moe_intermediate_size": 173, "shared_expert_intermediate_size": 173,
                   "num_experts": 4, "layer_types": ["linear_attention", "full_attention"],
                   "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16},
    # one child (``mixer``) that is Mamba, attention or MLP by layer; saved as ``backbone.``
    "nemotron_h": {**_ATTN, "hidden_size": 64, "head_dim": 16, "intermediate_size": 173,
                   "layers_block_type": ["linear_attention", "full_attention", "mlp"],
                   "num_hidden_layers": 3, "mamba_num_heads": 8, "mamba_head_dim": 16,
                   "n_groups": 1, "ssm_state_size": 16, "expand": 2},
}
#: the SSM mixer's linears each family's class builds (``{i}``: the SSM layer)
SSM_LINEARS = {
    "mamba": ("backbone.layers.0.mixer", ("in_proj", "x_proj", "dt_proj", "out_proj")),
    "mamba2": ("backbone.layers.0.mixer", ("in_proj", "out_proj")),
    "jamba": ("model.layers.0.mamba", ("in_proj", "x_proj", "dt_proj", "out_proj")),
    "bamba": ("model.layers.0.mamba", ("in_proj", "out_proj")),
    "falcon_h1": ("model.layers.0.mamba", ("in_proj", "out_proj")),
    "qwen3_next": ("model.layers.0.linear_attn", ("in_proj_qkvz", "in_proj_ba", "out_proj")),
    "nemotron_h": ("backbone.layers.0.mixer", ("in_proj", "out_proj")),
}
HYBRIDS = ("jamba", "bamba", "falcon_h1", "qwen3_next", "nemotron_h")


def build(model_type: str, out: Path, **override) -> None:
    """The class's own tiny model, random weights, saved as a user's checkpoint would be."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {"num_hidden_layers": 2, "vocab_size": 512, "pad_token_id": 0, "bos_token_id": 0,
              "eos_token_id": 0, **CONFIGS[model_type], **override}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kwargs))
        model.save_pretrained(out)


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_ssm_layers_are_read_every_tensor_accounted(model_type: str, tmp_path: Path) -> None:
    build(model_type, tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    acc = result.accounting
    assert acc is not None and acc.unknown == []
    mixer, linears = SSM_LINEARS[model_type]
    ssm = [s for s in result.sites if s.role is Role.SSM]
    on_ssm = {(a.tensor, a.axis) for s in ssm for a in s.axes}
    hidden = {(a.tensor, a.axis) for s in result.sites if s.role is Role.HIDDEN
              for a in s.axes}
    for linear in linears:  # both widths of every SSM GEMM are sites: its own, or hidden
        w = f"{mixer}.{linear}.weight"
        assert {(w, 0), (w, 1)} <= on_ssm | hidden, sorted(on_ssm)
        assert (w, 0) in on_ssm or (w, 1) in on_ssm
    assert (f"{mixer}.out_proj.weight", 1) in on_ssm  # the mixer's inner width, as K
    conv = [s for s in result.sites if s.role is Role.SSM_CONV and s.layer == 0]
    assert [(a.tensor, a.axis) for s in conv for a in s.axes] == [(f"{mixer}.conv1d.weight", 2)]
    # A_log (Mamba-2 style: one per head), D, dt_bias, the conv's bias and channels, norms:
    # the mixer's own parameters, accounted
    params = [n for n, k in acc.kinds.items() if k == "SSM parameter"]
    assert params and any(n.startswith(mixer) for n in params)
    assert all(f".{mixer.rsplit('.', 1)[1]}." in n for n in params), params


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_hybrid_attention_and_mlp_are_judged_as_today(model_type: str, tmp_path: Path) -> None:
    build(model_type, tmp_path / "m")
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    heads = [s for s in result.sites if s.role is Role.HEAD_DIM]
    assert heads and all(".self_attn" in s.name or s.name.startswith("backbone.layers.1")
                         for s in heads), [s.name for s in heads]
    mlp = {s.value for s in result.sites
           if s.role in (Role.INTERMEDIATE, Role.EXPERT, Role.SHARED_EXPERT)}
    assert 173 in mlp
    assert result.verdict() == "fail"
    assert any(f.site.value == 173 for f in result.findings)


def test_an_ssm_gemm_width_is_judged_like_any_linear(tmp_path: Path) -> None:
    """Mamba's inner width is out_proj's K and dt_proj's N: 128 passes, 173 is an error."""
    build("mamba", tmp_path / "ok", intermediate_size=128)
    build("mamba", tmp_path / "bad")
    ok = gac_check.check(tmp_path / "ok", gpu="h100", dtype="bfloat16")
    assert ok.verdict() == "pass", [(f.site.name, f.site.value) for f in ok.findings]
    bad = gac_check.check(tmp_path / "bad", gpu="h100", dtype="bfloat16")
    flagged = {f.site.name: f.site.value for f in bad.findings if f.severity == "error"}
    assert flagged["backbone.layers.0.mixer.out_proj:ssm_in"] == 173
    assert flagged["backbone.layers.1.mixer.in_proj:ssm_out"] == 346


@pytest.mark.parametrize(("override", "rule", "site"), [
    ({"conv_kernel": 5}, "ssm-conv-width", "backbone.layers.0.mixer:ssm_conv"),
    ({"state_size": 272}, "ssm-state-max", "backbone.layers.0.mixer:ssm_state"),
])
def test_the_ssm_kernels_published_limits_are_judged(override: dict, rule: str, site: str,
                                                      tmp_path: Path) -> None:
    """causal-conv1d takes 2-4 conv taps, mamba_ssm's selective scan a state <= 256
    (gac_check/contract/rules.py ssm_rules cites both); the model is otherwise aligned."""
    build("mamba", tmp_path / "m", intermediate_size=128, **override)
    result = gac_check.check(tmp_path / "m", gpu="h100", dtype="bfloat16")
    broken = {(f.site.name, r.id) for f in result.findings for r in f.rules}
    assert (site, rule) in broken
    assert {r for _, r in broken} == {rule}, broken


def test_repair_of_an_ssm_width_is_refused_in_one_line(tmp_path: Path) -> None:
    build("mamba", tmp_path / "m")
    done = subprocess.run([sys.executable, "-m", "gac_check.cli.main", str(tmp_path / "m"),
                           "--gpu", "h100", "--repair", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "SSM" in lines[0] and "ssm_" in lines[0], done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type", ["mamba2", "jamba", "falcon_h1", "nemotron_h"])
def test_shipped_table_matches_the_ssm_classes(model_type: str) -> None:
    """Stale after a transformers upgrade: rerun python -m gac_check.formats.derive_table."""
    assert table()["types"][model_type] == derive(model_type)
