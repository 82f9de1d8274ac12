"""``gac-check MODEL --target SPEC``: verdicts per site and target from the command line, on
checkpoints of realistic widths (sparse files: a check reads headers only, so Llama-70B widths
cost nothing), with the JSON keys, text columns, HTML matrix and JUnit cases the issue fixes,
the exit codes a gate reads, and one-line refusals of bad targets."""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import helpers
from tests.target_models import sparse_llama

#: Llama-3-70B's widths, two layers of them.
L70 = dict(hidden=8192, intermediate=28672, heads=64, kv_heads=8, head_dim=128, vocab=128256)


def run_json(*args: object) -> tuple[int, dict]:
    proc = helpers.gac(*args, "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def verdicts(doc: dict, role: str) -> list[dict]:
    return [v for s in doc["sites"] if s["role"] == role for v in s["targets"]]


@pytest.fixture(scope="module")
def llama70(tmp_path_factory) -> Path:
    return sparse_llama(tmp_path_factory.mktemp("m") / "llama70", **L70)


@pytest.fixture(scope="module")
def pruned(tmp_path_factory) -> Path:
    """70B widths with the MLP pruned to 27000 (fine unsharded, not at tp=8 with AWQ)."""
    return sparse_llama(tmp_path_factory.mktemp("m") / "pruned", **{**L70, "intermediate": 27000})


def test_stock_70b_is_fast_everywhere_and_exits_0(llama70):
    code, doc = run_json(llama70, "--gpu", "h100", "--target", "vllm,tp=8,quant=awq",
                         "--target", "vllm,tp=4,quant=gptq", "--target", "vllm,quant=fp8")
    assert code == 0
    counts = {spec: {k: v[k] for k in ("verdict", "fast", "fallback", "refused")}
              for spec, v in doc["summary"]["targets"].items()}
    assert counts == {
        spec: {"verdict": "fast", "fast": len(doc["sites"]), "fallback": 0, "refused": 0}
        for spec in ("vllm,tp=8,quant=awq", "vllm,tp=4,quant=gptq", "vllm,quant=fp8")}
    for v in doc["summary"]["targets"].values():  # it loads, and says what is not modelled
        assert v["load"]["loads"] is True and v["load"]["why"] is None
        assert any("not modelled" in note for note in v["not_modelled"])
    for site in doc["sites"]:
        assert [v["target"] for v in site["targets"]] == ["vllm,tp=8,quant=awq",
                                                          "vllm,tp=4,quant=gptq",
                                                          "vllm,quant=fp8"]
        for v in site["targets"]:
            assert set(v) >= {"target", "verdict", "kernel", "fix_to", "source"}
            assert v["fix_to"] == site["value"]
    mlp = verdicts(doc, "intermediate")
    # AWQ on sm90 runs Machete from v0.24.0 (AutoAWQMarlinLinearMethod -> choose_mp_linear_kernel)
    assert [v["kernel"] for v in mlp[:3]] == ["machete", "machete", "cutlass_scaled_mm"]


def test_pruned_width_fails_at_tp8_awq_and_the_json_says_what_fixes_it(pruned):
    code, doc = run_json(pruned, "--gpu", "h100", "--target", "vllm,tp=8,quant=awq",
                         "--target", "vllm,tp=1,quant=awq")
    assert code == 1  # refused is an error-level finding under --fail-on error (default)
    at8, at1 = verdicts(doc, "intermediate")[:2]
    assert at8["verdict"] == "refused" and at8["kernel"] is None
    assert at8["fix_to"] == 27648  # 27648 / 8 = 3456 = 27 x 128
    assert at8["source"]["repo"] == "vllm-project/vllm" and at8["source"]["ref"]
    assert at1["verdict"] == "refused"  # 27000 % 128 = 120: a group straddles the width
    assert doc["summary"]["targets"]["vllm,tp=8,quant=awq"]["verdict"] == "refused"
    assert at1["fix_to"] == 27008  # 211 x 128
    site = next(s for s in doc["sites"] if s["role"] == "intermediate")
    assert site["severity"] == "error" and "target:vllm,tp=8,quant=awq" in site["rules"]
    assert site["repair_to"] == 27648


def test_json_says_what_each_target_resolved_to_and_which_pack(llama70):
    """Issue 28 item 6: per target the resolved release, tp, quant, group and the pack's hash;
    per site every projection's rule, kernel and shard width, and each rule's caveat."""
    import hashlib

    from gac_check.targets.packs import packs
    _, doc = run_json(llama70, "--gpu", "h100", "--target", "vllm,tp=8,quant=awq",
                      "--target", "sglang@v0.4.6.post5,tp=2")
    vllm = doc["summary"]["targets"]["vllm,tp=8,quant=awq"]
    assert {k: vllm[k] for k in ("engine", "version", "tp", "quant", "group", "kv")} == {
        "engine": "vllm", "version": "v0.33.0", "tp": 8, "quant": "awq", "group": 128,
        "kv": "auto"}
    pack_file = Path(packs()["vllm"].sha256 and __import__("gac_check").__file__).parent
    raw = (pack_file / "targets" / "packs" / "vllm.json").read_bytes()
    assert vllm["pack"] == {"file": "vllm.json", "newest": "v0.33.0",
                            "sha256": hashlib.sha256(raw).hexdigest()}
    assert doc["summary"]["targets"]["sglang@v0.4.6.post5,tp=2"]["version"] == "v0.4.6.post5"
    mlp = next(s for s in doc["sites"] if s["role"] == "intermediate")["targets"][0]
    by_use = {u["use"]: u for u in mlp["uses"]}
    assert by_use["gate_up_proj"]["shard_out"] == 2 * 28672 // 8  # fused, per rank
    assert by_use["down_proj"]["shard_in"] == 28672 // 8
    assert by_use["down_proj"]["kernel"] == "machete" and by_use["down_proj"]["rule"]
    assert mlp["uncertain"] == [] and all("uncertain" in u for u in mlp["uses"])


def test_json_carries_a_rules_uncertain_flag(tmp_path):
    """A GPTQ group straddling the shard at vLLM v0.30.0: Machete takes it, the scales'
    misalignment is read, not run, and the verdict says so (v0.33.0's loader was read, and
    refuses it: tests/test_targets_rules.py)."""
    model = sparse_llama(tmp_path / "m", **{**L70, "intermediate": 11008, "hidden": 4096,
                                             "heads": 32, "vocab": 32000})
    _, doc = run_json(model, "--gpu", "h100", "--target", "vllm@v0.30.0,tp=4,quant=gptq")
    mlp = next(s for s in doc["sites"] if s["role"] == "intermediate")["targets"][0]
    assert mlp["verdict"] == "fallback" and mlp["kernel"] == "machete"
    assert mlp["uncertain"] and "not run" in mlp["uncertain"][0]
    down = next(u for u in mlp["uses"] if u["use"] == "down_proj")
    assert down["uncertain"] and down["shard_in"] == 2752


@pytest.mark.parametrize("target, fail_on, code", [
    ("vllm,quant=fp8", "refused", 0),  # 27000 % 16: CUTLASS pads (fallback), nothing refused
    ("vllm,quant=fp8", "fallback", 1),
    ("vllm,tp=8,quant=awq", "refused", 1),
    ("vllm,tp=8,quant=awq", "fallback", 1),
    ("vllm", "refused", 0),  # the GPU contract's findings do not gate under refused/fallback
    ("vllm", "fallback", 0),
    ("vllm", "warning", 1),  # ... which they do under warning (27000: gemm-optimal-32B)
])
def test_fail_on_refused_and_fallback_gate_on_the_targets_alone(pruned, target, fail_on, code):
    proc = helpers.gac(pruned, "--gpu", "h100", "--target", target, "--fail-on", fail_on)
    assert proc.returncode == code, proc.stdout[-2000:]


def test_fail_on_never_reports_without_gating(pruned):
    proc = helpers.gac(pruned, "--gpu", "h100", "--target", "vllm,tp=8,quant=awq",
                       "--fail-on", "never")
    assert proc.returncode == 0


def test_text_table_has_a_column_per_target(pruned):
    proc = helpers.gac(pruned, "--gpu", "h100", "--target", "vllm,tp=8,quant=awq",
                       "--target", "vllm,quant=fp8")
    assert proc.returncode == 1, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.strip().startswith("site"))
    assert "vllm,tp=8,quant=awq" in header and "vllm,quant=fp8" in header
    row = next(line for line in proc.stdout.splitlines() if ":intermediate" in line)
    # 27000 % 16 = 8: CUTLASS pads K and N to 16 (a fallback that pads, named as one)
    assert "refused" in row and "fallback cutlass_scaled_mm (pads K, N to 16)" in row
    assert "27648" in row
    assert "vllm,tp=8,quant=awq          refused" in proc.stdout  # the model-level line


def test_heads_that_do_not_divide_say_which_tp_loads(tmp_path):
    """vllm#16021: Phi-4's 40 heads and 10 KV heads at tp=4."""
    model = sparse_llama(tmp_path / "phi4", hidden=5120, intermediate=17920, heads=40,
                         kv_heads=10, head_dim=128, vocab=100352)
    code, doc = run_json(model, "--gpu", "h100", "--target", "vllm,tp=4")
    heads = verdicts(doc, "heads")[0]
    assert code == 1 and heads["verdict"] == "refused" and heads["fix_to"] is None
    assert "loads at tp=1/2" in heads["cannot_pad"]
    site = next(s for s in doc["sites"] if s["role"] == "heads")
    assert "vllm,tp=4: no padding helps; it loads at tp=1/2" in site["refusal"]


def test_per_layer_pruned_model_is_refused_with_what_would_help(tmp_path):
    model = sparse_llama(tmp_path / "per-layer", hidden=4096, intermediate=[11008, 9472],
                         heads=32, kv_heads=8, vocab=32000)
    code, doc = run_json(model, "--gpu", "h100", "--target", "vllm")
    assert code == 1
    for v in verdicts(doc, "intermediate"):
        assert v["verdict"] == "refused" and v["fix_to"] is None
        assert "re-run the compressor" in v["cannot_pad"]


def test_head_dim_fallback_names_the_backend_and_why_padding_cannot(tmp_path):
    model = sparse_llama(tmp_path / "hd107", hidden=3424, intermediate=9216, heads=32,
                         kv_heads=8, head_dim=107, vocab=32000)
    code, doc = run_json(model, "--gpu", "h100", "--target", "vllm")
    v = verdicts(doc, "head_dim")[0]
    assert code == 1 and (v["verdict"], v["kernel"], v["fix_to"]) == ("fallback", "TRITON_ATTN",
                                                                       None)
    assert "head_dim % 8" in v["why"] and "RoPE" in v["cannot_pad"]


def test_junit_has_a_case_per_site_and_target_and_html_a_matrix(pruned, tmp_path):
    junit, report = tmp_path / "j.xml", tmp_path / "r.html"
    proc = helpers.gac(pruned, "--gpu", "h100", "--target", "vllm,tp=8,quant=awq",
                       "--target", "vllm,tp=2", "--junit", junit, "--report", report)
    assert proc.returncode == 1, proc.stderr
    root = ET.parse(junit).getroot()
    cases = [c for c in root.iter("testcase") if c.get("classname", "").endswith(".target")]
    doc = json.loads(report.with_suffix(".json").read_text())["checks"][0]
    assert len(cases) == 2 * len(doc["sites"])
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert "model.layers.0.mlp:intermediate on vllm,tp=8,quant=awq" in failed
    assert "model.layers.0.mlp:intermediate on vllm,tp=2" not in failed
    html = report.read_text()
    assert 'id="targets"' in html and html.count('class="verdict-refused"') >= 1
    assert "<th>vllm,tp=8,quant=awq<br>" in html


def test_without_targets_sites_carry_an_empty_list(llama70):
    code, doc = run_json(llama70, "--gpu", "h100")
    assert code == 0 and doc["summary"]["targets"] == {}
    assert all(s["targets"] == [] for s in doc["sites"])


def test_zoo_carries_targets_for_every_model(llama70, pruned):
    proc = helpers.gac(llama70, pruned, "--gpu", "h100", "--target", "vllm,tp=8,quant=awq",
                       "--format", "json")
    assert proc.returncode == 1, proc.stderr
    run = json.loads(proc.stdout)
    got = [c["summary"]["targets"]["vllm,tp=8,quant=awq"]["verdict"] for c in run["checks"]]
    assert got == ["fast", "refused"]


@pytest.mark.parametrize("spec, says", [
    ("sglang-nope", "unknown engine"), ("vllm@v9.9", "known: v0.6.3.post1"),
    ("vllm,tp=zero", "positive integer"), ("vllm,quant=awq8", "known: none, awq"),
    ("vllm,pp=2", "unknown option"),
])
def test_bad_target_is_one_line_and_exit_2(llama70, spec, says):
    proc = helpers.gac(llama70, "--target", spec)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr


def test_help_describes_target():
    proc = helpers.gac("--help")
    assert "--target SPEC" in proc.stdout and "vllm,tp=4,quant=awq" in proc.stdout


def test_hub_model_gets_target_verdicts(llama70, tmp_path):
    from tests.hub_server import HubServer
    from tests.test_remote_check import PROXY_VARS

    with HubServer({"org/l70": {"main": llama70}}) as hub:
        unset = {k: None for k in os.environ if k.startswith("HF_") or k in PROXY_VARS}
        proc = helpers.gac("hf://org/l70", "--gpu", "h100", "--target", "vllm,tp=3",
                           "--format", "json", env={**unset, "HF_ENDPOINT": hub.endpoint,
                                                    "HF_HOME": str(tmp_path / "hf"),
                                                    "NO_PROXY": "*"})
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["targets"]["vllm,tp=3"]["verdict"] == "refused"  # 64 heads % 3


def test_vllm_and_llamacpp_side_by_side(pruned):
    """The README's example: one vLLM and one llama.cpp target; 27000 = 105.5 x 256 and
    27000 % 32 = 24, so llama.cpp's Q4_K_M stores ffn_down in F16."""
    code, doc = run_json(pruned, "--gpu", "h100", "--target", "vllm,tp=4,quant=awq",
                         "--target", "llama.cpp,quant=Q4_K_M")
    assert code == 1
    vllm, llama = verdicts(doc, "intermediate")[:2]
    assert vllm["verdict"] == "refused" and vllm["fix_to"] == 27136  # 6784 = 53 x 128
    assert llama["verdict"] == "fallback" and llama["kernel"].startswith("F16 (for Q")
    assert llama["fix_to"] == 27136  # 106 x 256
    assert llama["source"]["repo"] == "ggml-org/llama.cpp"
    site = next(s for s in doc["sites"] if s["role"] == "intermediate")
    assert site["repair_to"] == 27136  # fast on both


def test_llamacpp_quant_names_are_checked(pruned):
    proc = helpers.gac(pruned, "--target", "llama.cpp,quant=Q4_K_X")
    assert proc.returncode == 2 and "Q4_K_M" in proc.stderr


def test_llamacpp_mix_differs_by_layer(tmp_path):
    """Q4_K_M asks Q6_K for ffn_down in llama.cpp's "more bits" layers only (of 8: 0, 3, 6,
    7), so the same width gets a different verdict per layer."""
    model = sparse_llama(tmp_path / "m", hidden=4096, intermediate=10944, heads=32,
                         kv_heads=8, layers=8, vocab=32000)
    code, doc = run_json(model, "--target", "llama.cpp,quant=Q4_K_M")
    kernels = [v["kernel"] for v in verdicts(doc, "intermediate")]
    assert code == 1
    assert kernels == ["Q8_0 (for Q6_K)", "Q5_0 (for Q4_K)", "Q5_0 (for Q4_K)",
                       "Q8_0 (for Q6_K)", "Q5_0 (for Q4_K)", "Q5_0 (for Q4_K)",
                       "Q8_0 (for Q6_K)", "Q8_0 (for Q6_K)"]
