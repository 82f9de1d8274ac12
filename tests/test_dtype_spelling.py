"""One spelling of dtypes across the front ends (issue 41): the CLI's ``--dtype``, the plugin's
``--gac-dtype`` and the Python API take the same names and aliases, and judge by the same
canonical dtype; an unknown one is refused by each."""
from __future__ import annotations

import json

import pytest

import gac_check
from gac_check.errors import BadInput
from gac_check.testing.models import tiny_llama
from tests.helpers import gac


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("dtype") / "model"
    tiny_llama(intermediate_size=172).save_pretrained(root)
    return root


@pytest.mark.parametrize("alias,name", [("fp16", "float16"), ("bf16", "bfloat16"),
                                        ("Float32", "float32")])
def test_the_cli_and_the_api_take_the_same_aliases(model, alias, name):
    done = gac(model, "--gpu", "h100", "--dtype", alias, "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stdout)["hardware"]["dtype"] == name
    assert gac_check.check(model, gpu="h100", dtype=alias).contract.dtype == name


def test_an_unknown_dtype_is_refused_by_both(model):
    done = gac(model, "--dtype", "float17")
    assert done.returncode == 2 and "unknown dtype 'float17'" in done.stderr
    with pytest.raises(BadInput, match="unknown dtype 'float17'"):
        gac_check.check(model, gpu="h100", dtype="float17")
