"""What a gate reads from the Python API without re-deriving it: names taken as users write
them (and refused when unknown), a namespace of what docs/api.md documents, and a
``CheckResult`` that carries the CLI's verdict, summary line and folded rows."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import gac_check
from gac_check.errors import BadInput
from tests import helpers

FAIL_ON = ("error", "warning", "never")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """4 layers whose MLP width 170 breaks a GPU's rule in each, and a vocab of 100."""
    path = tmp_path_factory.mktemp("api-gate") / "m"
    helpers.tiny_llama(0, intermediate_size=170, num_hidden_layers=4, vocab_size=100,
                       num_key_value_heads=2).save_pretrained(path)
    return path


@pytest.mark.parametrize(("gpu", "dtype", "profile", "canonical"), [
    ("H100", "fp16", "h100", "float16"),
    (" a100 ", "BF16", "a100", "bfloat16"),
    ("h200", torch.float32, "h200", "float32"),
    ("Gpu", "half", "gpu", "float16"),
])
def test_names_are_taken_as_users_write_them_and_come_back_canonical(model, gpu, dtype,
                                                                     profile, canonical):
    result = gac_check.check(model, gpu=gpu, dtype=dtype)
    assert (result.contract.profile, result.contract.dtype) == (profile, canonical)
    assert result.dtype_choice.dtype == canonical
    same = gac_check.check(model, gpu=profile, dtype=canonical)
    assert result.findings == same.findings


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"gpu": "x100"}, "unknown hardware profile 'x100'"),
    ({"gpu": "h100", "dtype": "fp99"}, "unknown dtype 'fp99'"),
    ({"gpu": "h100", "dtype": "float8_e5m2"}, "unknown dtype 'float8_e5m2'"),
])
def test_unknown_names_are_bad_input_before_any_work(model, tmp_path, kwargs, says):
    for call in (lambda: gac_check.check(model, **kwargs),
                 lambda: gac_check.repair(model, tmp_path / "out", **kwargs)):
        with pytest.raises(BadInput, match=says):
            call()
        assert not (tmp_path / "out").exists()


def test_the_namespace_holds_what_the_docs_document():
    code = ("import gac_check; names = [n for n in vars(gac_check) if not n.startswith('_')]; "
            "print(sorted(names)); print(dir(gac_check))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()
    assert out == ["[]", str(sorted(gac_check.__all__))]
    for name in ("Any", "TYPE_CHECKING", "annotations"):
        assert not hasattr(gac_check, name), name


@pytest.mark.parametrize("fail_on", FAIL_ON)
def test_the_verdict_is_the_clis_exit_code_at_each_fail_on(model, fail_on):
    result = gac_check.check(model, gpu="h100", dtype="float16")
    cli = helpers.gac(model, "--gpu", "h100", "--dtype", "float16", "--fail-on", fail_on)
    assert cli.returncode in (0, 1), cli.stderr
    assert result.verdict(fail_on) == ("fail" if cli.returncode else "pass")
    summary = result.summary(fail_on)
    assert summary.verdict == result.verdict(fail_on)
    assert summary.passed is (cli.returncode == 0)
    assert summary.line in cli.stdout


def test_a_warning_fails_only_a_gate_at_warning(tmp_path):
    """Widths a GPU takes, only not at the optimal multiple: warnings alone."""
    helpers.tiny_llama(0, intermediate_size=168, num_key_value_heads=2,
                       vocab_size=128).save_pretrained(tmp_path)
    result = gac_check.check(tmp_path, gpu="h100", dtype="float16")
    summary = result.summary()
    assert summary.errors == 0 and summary.warnings > 0, summary
    assert [result.verdict(f) for f in FAIL_ON] == ["pass", "fail", "pass"]
    with pytest.raises(ValueError, match="fail_on must be one of"):
        result.verdict("errors")


def test_the_summary_counts_what_the_json_counts(model):
    from gac_check.report.json_report import to_json

    result = gac_check.check(model, gpu="h100", dtype="float16", target="vllm,tp=2")
    summary, doc = result.summary(), to_json(result)["summary"]
    assert (summary.sites, summary.misaligned, summary.errors, summary.warnings) == (
        doc["sites"], doc["misaligned"], doc["errors"], doc["warnings"])
    assert summary.errors > 0 and summary.verdict == "fail"
    assert summary.repair_overhead_fraction == doc["repair_overhead_fraction"]
    assert summary.targets == {spec: t["verdict"] for spec, t in doc["targets"].items()}
    assert list(summary.targets) == ["vllm,tp=2"]
    assert summary.refused == len(result.refusals)


def test_groups_fold_the_findings_as_the_cli_table_does(model):
    result = gac_check.check(model, gpu="h100", dtype="float16")
    groups = result.groups
    assert sum(len(g.findings) for g in groups) == len(result.findings) > len(groups)
    mlp = next(g for g in groups if g.pattern == "model.layers.*.mlp:intermediate")
    assert sorted(mlp.layers) == [0, 1, 2, 3] and {f.site.value for f in mlp.findings} == {170}
    assert mlp.pad == sum(result.padding_params(f) for f in mlp.findings)
    table = helpers.gac(model, "--gpu", "h100", "--dtype", "float16").stdout
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  ---")) + 1
    rows = lines[start:lines.index("", start)]
    assert len(rows) == len(groups)
    assert any("model.layers.*.mlp:intermediate" in r and " 0-3 " in r for r in rows)
