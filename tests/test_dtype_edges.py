"""The dtype a check uses when config.json and the weights disagree, tie in width, or when the
weights' tensor counts and element counts point different ways (issue 22, "tests that bite").

Every case is a real safetensors file with a real config.json, opened as a check opens it.
Each test fails on one of the "dtype" mutants in benchmarks/hand_mutants.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from gac_check.checkpoint.index import open_checkpoint
from gac_check.contract.dtype_choice import choose_dtype, mixed_weights, weights_dtype

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def model(root: Path, tensors: dict[str, tuple[tuple[int, ...], torch.dtype]],
          config: dict | None = None):
    root.mkdir(parents=True, exist_ok=True)
    save_file({n: torch.zeros(shape, dtype=dt) for n, (shape, dt) in tensors.items()},
              str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "llama", **(config or {})}))
    return open_checkpoint(root)


#: (config.json's dtype fields, the weights' dtype) -> (chosen, source)
DISAGREE = [
    ({"torch_dtype": "float32"}, F16, "float16", "stricter of the config and weights"),
    ({"torch_dtype": "float16"}, F32, "float16", "stricter of the config and weights"),
    # equal widths: the weights' dtype is what runs, whichever the config names
    ({"torch_dtype": "bfloat16"}, F16, "float16", "stricter of the config and weights"),
    ({"torch_dtype": "float16"}, BF16, "bfloat16", "stricter of the config and weights"),
    ({"dtype": "torch.bfloat16"}, F16, "float16", "stricter of the config and weights"),
    # agreement, with and without the torch. prefix
    ({"torch_dtype": "torch.float32"}, F32, "float32", "the config"),
    ({"torch_dtype": "bfloat16"}, BF16, "bfloat16", "the config"),
    # transformers 5 writes "dtype"; it wins over a stale torch_dtype beside it
    ({"dtype": "bfloat16", "torch_dtype": "float32"}, BF16, "bfloat16", "the config"),
    ({"dtype": "float32", "torch_dtype": "bfloat16"}, BF16, "bfloat16",
     "stricter of the config and weights"),
    # "auto" and "" say nothing: the weights decide
    ({"torch_dtype": "auto"}, F16, "float16", "weights"),
    ({"torch_dtype": ""}, BF16, "bfloat16", "weights"),
    ({}, F32, "float32", "weights"),
]


@pytest.mark.parametrize(("config", "stored", "dtype", "source"), DISAGREE)
def test_config_against_weights(tmp_path, config, stored, dtype, source):
    ckpt = model(tmp_path / "m", {"w": ((8, 8), stored)}, config)
    choice = choose_dtype(ckpt)
    assert (choice.dtype, choice.source) == (dtype, source)
    if source.startswith("stricter"):
        assert f"checked against {dtype}, the stricter of the two" in choice.note
        assert f"({2 if dtype != 'float32' else 4} bytes per element" in choice.note
    else:
        assert choice.note is None


def test_a_tie_in_width_is_said_with_both_names(tmp_path):
    ckpt = model(tmp_path / "m", {"w": ((8, 8), F16)}, {"torch_dtype": "bfloat16"})
    assert choose_dtype(ckpt).note.startswith(
        "the config says bfloat16, the weights are float16: checked against float16")


#: tensors -> the weights' dtype: elements decide, not how many tensors there are
COUNTS = [
    # three small fp32 norms beside one large fp16 matrix: fp16 holds most elements
    ({"a.norm": ((4,), F32), "b.norm": ((4,), F32), "c.norm": ((4,), F32),
      "w": ((16, 16), F16)}, "float16"),
    # and the other way round
    ({"a": ((2,), F16), "b": ((2,), F16), "c": ((2,), F16), "w": ((8, 8), F32)}, "float32"),
    # a dtype's elements are summed over its tensors: three fp32 vectors of 10 outweigh one
    # fp16 vector of 16, though each is smaller
    ({"a": ((10,), F32), "b": ((10,), F32), "c": ((10,), F32), "w": ((16,), F16)}, "float32"),
    # one element more decides
    ({"a": ((33,), BF16), "b": ((32,), F16)}, "bfloat16"),
    ({"a": ((32,), BF16), "b": ((33,), F16)}, "float16"),
    # integer and bool tensors are not weights, however large (position ids, masks)
    ({"ids": ((4096,), torch.int64), "mask": ((4096,), torch.bool), "w": ((2, 2), F16)},
     "float16"),
]


@pytest.mark.parametrize(("tensors", "dtype"), COUNTS)
def test_elements_decide_the_weights_dtype(tmp_path, tensors, dtype):
    ckpt = model(tmp_path / "m", tensors)
    assert weights_dtype(ckpt) == dtype
    assert choose_dtype(ckpt).dtype == dtype


def test_no_float_tensors_and_no_config_dtype_is_float32_by_default(tmp_path):
    ckpt = model(tmp_path / "m", {"ids": ((8,), torch.int32)})
    assert weights_dtype(ckpt) is None
    choice = choose_dtype(ckpt)
    assert (choice.dtype, choice.source, choice.note) == ("float32", "default", None)


def test_counts_and_elements_disagreeing_against_the_config(tmp_path):
    """Most tensors are fp32 (the config's dtype), most elements fp16: the weights are fp16,
    the stricter of the two, and the mixed note names the fp32 minority by tensor."""
    ckpt = model(tmp_path / "m", {"a.norm": ((4,), F32), "b.norm": ((4,), F32),
                                  "c.norm": ((4,), F32), "w": ((16, 16), F16)},
                 {"torch_dtype": "float32"})
    choice = choose_dtype(ckpt)
    assert (choice.dtype, choice.source) == ("float16", "stricter of the config and weights")
    assert mixed_weights(ckpt) == (
        "the weights mix dtypes: float16 in 1 tensors (most elements), float32 in 3 "
        "(a.norm, b.norm, ...); every site is judged in one dtype")


def test_requested_dtype_wins_and_says_what_it_overrode(tmp_path):
    ckpt = model(tmp_path / "m", {"w": ((8, 8), F16)}, {"torch_dtype": "float32"})
    choice = choose_dtype(ckpt, "float32")
    assert (choice.dtype, choice.source) == ("float32", "--dtype")
    assert choice.note == ("the config says float32, the weights are float16; checked "
                           "against --dtype float32")
    agreeing = model(tmp_path / "n", {"w": ((8, 8), F16)}, {"torch_dtype": "float16"})
    assert choose_dtype(agreeing, "float32").note is None


def test_the_mixed_note_lists_two_minority_tensors_without_an_ellipsis(tmp_path):
    ckpt = model(tmp_path / "m", {"a": ((2,), F32), "b": ((2,), F32), "w": ((8, 8), F16)})
    assert mixed_weights(ckpt) == (
        "the weights mix dtypes: float16 in 1 tensors (most elements), float32 in 2 (a, b); "
        "every site is judged in one dtype")


def test_mixed_weights_are_noted_whichever_source_decides(tmp_path):
    """config.json agreeing with the majority, or no config dtype at all: the mix is still
    said, with the dtype used and why."""
    tensors = {"a": ((2,), F32), "w": ((8, 8), F16)}
    mix = "the weights mix dtypes: float16 in 1 tensors (most elements), float32 in 1 (a)"
    agreed = choose_dtype(model(tmp_path / "m", tensors, {"torch_dtype": "float16"}))
    assert (agreed.dtype, agreed.source) == ("float16", "the config")
    assert agreed.note.startswith(mix) and agreed.note.endswith(": float16, the config's")
    weights = choose_dtype(model(tmp_path / "n", tensors))
    assert (weights.dtype, weights.source) == ("float16", "weights")
    assert weights.note.startswith(mix) and weights.note.endswith(
        ": float16, the dtype of most weight elements (pass --dtype to judge in the dtype it "
        "is served in)")
    requested = choose_dtype(model(tmp_path / "o", tensors), "bfloat16")
    assert requested.note.startswith(mix) and requested.note.endswith(
        "; checked against --dtype bfloat16")


def test_a_config_dtype_gac_check_does_not_know_counts_as_four_bytes(tmp_path):
    """An unknown name ("half", "fp8") is taken as 4 bytes wide: the 2-byte weights are
    stricter and win."""
    choice = choose_dtype(model(tmp_path / "m", {"w": ((8, 8), F16)}, {"torch_dtype": "half"}))
    assert (choice.dtype, choice.source) == ("float16", "stricter of the config and weights")
    assert "the config says half, the weights are float16" in choice.note
    wide = choose_dtype(model(tmp_path / "n", {"w": ((8, 8), torch.float64)},
                              {"torch_dtype": "half"}))
    assert wide.dtype == "half"  # 4 bytes, narrower than float64's 8
    assert "checked against half, the stricter of the two (4 bytes per element" in wide.note
