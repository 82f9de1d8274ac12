"""torch zip checkpoints are indexed without unpickling: every file here is written by real
torch.save, and every name, shape, dtype, offset and stride is compared with the real tensors.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from gac_check.checkpoint.index import open_checkpoint
from gac_check.checkpoint.pickled import naming, torchzip
from gac_check.checkpoint.pickled.torchzip import read_tensor, read_torch_zip
from gac_check.errors import BadInput, UnsafeCheckpoint
from tests import helpers

#: on tests.helpers.LLAMA (2 layers, 4 heads): head_dim 8, 2 key/value heads
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_key_value_heads=2)


def tiny_llama(**overrides: object) -> LlamaForCausalLM:
    return helpers.tiny_llama(**{**TINY, **overrides})


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, so equality is bit equality for every dtype (float8 included)."""
    fresh = torch.empty(t.shape, dtype=t.dtype).copy_(t)  # row-major strides, even for size 1
    return fresh.reshape(-1).view(torch.uint8)


def assert_matches(index: dict, tensors: dict[str, torch.Tensor], data: bool = True) -> None:
    """Every name in order, and each shape, dtype, offset, stride (and data) as torch has it."""
    assert list(index) == list(tensors)
    for name, t in tensors.items():
        info = index[name]
        assert info.shape == tuple(t.shape), name
        assert info.dtype == str(t.dtype).removeprefix("torch."), name
        assert info.storage_offset == t.storage_offset(), name
        assert info.stride == t.stride(), name
        if data:
            got = read_tensor(info)
            assert got.dtype == t.dtype and got.shape == t.shape, name
            assert torch.equal(bits(got), bits(t.detach())), name


def save(obj: object, path: Path, **kwargs: object) -> Path:
    torch.save(obj, path, **kwargs)
    return path


def rewrite_zip(src: Path, dst: Path, replace: dict[str, bytes | None]) -> Path:
    """Copy an archive, dropping (None) or replacing members, the way a bad copy would."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = replace.get(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
    return dst


def member(path: Path, suffix: str) -> str:
    with zipfile.ZipFile(path) as zf:
        return next(n for n in zf.namelist() if n.endswith(suffix))


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama(tie_word_embeddings=True)


# ----------------------------------------------------------------------------- what can be read

def test_state_dict(model: LlamaForCausalLM, tmp_path: Path) -> None:
    sd = model.state_dict()
    assert_matches(read_torch_zip(save(sd, tmp_path / "pytorch_model.bin")), sd)


def test_state_dict_protocol_4(model: LlamaForCausalLM, tmp_path: Path) -> None:
    """Protocol 4 spells globals with STACK_GLOBAL and memoizes with MEMOIZE."""
    sd = model.state_dict()
    assert_matches(read_torch_zip(save(sd, tmp_path / "m.pt", pickle_protocol=4)), sd)


def test_whole_model_names_are_state_dict_names(model: LlamaForCausalLM, tmp_path: Path) -> None:
    """LLM-Pruner's torch.save(model): names come from the module tree, non-persistent
    buffers (rotary inv_freq) are left out, tied weights appear under both names."""
    index = read_torch_zip(save(model, tmp_path / "pytorch_model.bin"))
    sd = model.state_dict()
    assert_matches(index, sd)
    assert not any("inv_freq" in n for n in index)
    assert index["lm_head.weight"].storage == index["model.embed_tokens.weight"].storage


def test_model_and_tokenizer_wrapper(model: LlamaForCausalLM, tmp_path: Path) -> None:
    """SVD-LLM's torch.save({'model': model, 'tokenizer': tokenizer}) with a real fast
    tokenizer (its Rust state pickles as protocol-2 bytes through _codecs.encode)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    rust = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="[UNK]")
    path = save({"model": model, "tokenizer": tokenizer}, tmp_path / "svd.pt")
    assert_matches(read_torch_zip(path), model.state_dict())


def test_pruned_whole_model(tmp_path: Path) -> None:
    """Per-layer pruned shapes while the config stays dense, saved whole in bfloat16."""
    m = tiny_llama()
    layer0, layer1 = m.model.layers
    layer0.mlp.gate_proj = torch.nn.Linear(32, 40, bias=False)
    layer0.mlp.up_proj = torch.nn.Linear(32, 40, bias=False)
    layer0.mlp.down_proj = torch.nn.Linear(40, 32, bias=False)
    layer1.self_attn.q_proj = torch.nn.Linear(32, 24, bias=False)
    layer1.self_attn.o_proj = torch.nn.Linear(24, 32, bias=False)
    m = m.to(torch.bfloat16)
    index = read_torch_zip(save(m, tmp_path / "pytorch_model.bin"))
    assert_matches(index, m.state_dict())
    assert index["model.layers.0.mlp.down_proj.weight"].shape == (32, 40)
    assert index["model.layers.1.self_attn.q_proj.weight"].dtype == "bfloat16"


def test_views_shared_storage_and_dtypes(tmp_path: Path) -> None:
    """Views keep their storage's member, offset and stride; float8/uint16 go through
    _rebuild_tensor_v3 with an UntypedStorage whose size is in bytes."""
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    tensors = {
        "base": base, "row": base[2], "cols": base[:, 3:6], "t": base.t(),
        "step": base[1::2, ::3], "half": torch.randn(3, 5).half(),
        "bf16": torch.randn(4, 2).bfloat16(), "long": torch.arange(7),
        "mask": torch.tensor([True, False, True]), "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4), "fp8": torch.randn(4, 4).to(torch.float8_e4m3fn),
        "u16": torch.arange(10).to(torch.uint16)[2:],
    }
    index = read_torch_zip(save(tensors, tmp_path / "views.pt"))
    assert_matches(index, tensors)
    assert {index[n].storage for n in ("base", "row", "cols", "t", "step")} == {
        index["base"].storage}
    assert index["fp8"].dtype == "float8_e4m3fn"
    assert index["u16"].storage_offset == 2


def apply_view(view: torch.Tensor, op: str, a: int, b: int) -> torch.Tensor:
    if view.dim() == 0:
        return view
    d = a % view.dim()
    size = view.shape[d]
    if op == "narrow" and size > 0:
        start = a % size
        return view.narrow(d, start, max(1, size - start - b + 1))
    if op == "step":
        index = [slice(None)] * view.dim()
        index[d] = slice(a % 2, None, b)
        return view[tuple(index)]
    if op == "select" and size > 0:
        return view.select(d, a % size)
    if op == "t" and view.dim() >= 2:
        return view.transpose(0, view.dim() - 1)
    return view


@given(
    dims=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    ops=st.lists(st.tuples(st.sampled_from(["narrow", "step", "select", "t"]),
                           st.integers(0, 4), st.integers(1, 3)), max_size=4),
)
def test_any_view_reads_back_bit_equal(dims: list[int], ops: list[tuple[str, int, int]]) -> None:
    """Random narrowing/stepping/selecting/transposing of a saved base tensor."""
    base = torch.randn(*dims)
    view = base
    for op, a, b in ops:
        view = apply_view(view, op, a, b)
    with tempfile.TemporaryDirectory() as tmp:
        tensors = {"base": base, "view": view}
        assert_matches(read_torch_zip(save(tensors, Path(tmp) / "v.pt")), tensors)


@pytest.mark.parametrize("wrap", [
    lambda sd: {"model": sd},
    lambda sd: {"state_dict": sd, "epoch": 3},
    lambda sd: {"checkpoint": sd, "step": 10},
    lambda sd: {"model": sd, "optimizer": {"state": {0: {"exp_avg": torch.zeros(2)}}}},
])
def test_wrapped_state_dict_gives_inner_names(model: LlamaForCausalLM, tmp_path: Path,
                                              wrap: object) -> None:
    sd = model.state_dict()
    assert_matches(read_torch_zip(save(wrap(sd), tmp_path / "w.pt")), sd, data=False)


def test_nested_dicts_get_dotted_names(tmp_path: Path) -> None:
    """SliceGPT-style extra tensors and genuinely nested dicts keep their full paths."""
    enc, dec, q = torch.randn(2, 3), torch.randn(3, 2), torch.eye(4)
    obj = {"encoder": {"w": enc}, "decoder": {"layers": [dec]},
           "model.layers.0.attn_shortcut_Q": q}
    index = read_torch_zip(save(obj, tmp_path / "n.pt"))
    assert_matches(index, {"encoder.w": enc, "decoder.layers.0": dec,
                           "model.layers.0.attn_shortcut_Q": q})
    single = read_torch_zip(save({"layer": {"weight": enc}}, tmp_path / "s.pt"))
    assert list(single) == ["layer.weight"]


def test_open_checkpoint_on_a_pytorch_model_bin_dir(model: LlamaForCausalLM,
                                                    tmp_path: Path) -> None:
    model.config.to_json_file(tmp_path / "config.json")
    save(model, tmp_path / "pytorch_model.bin")
    ckpt = open_checkpoint(tmp_path)
    assert ckpt.container == "torch-zip"
    assert ckpt.config["hidden_size"] == 32
    assert ckpt.shapes == {n: tuple(t.shape) for n, t in model.state_dict().items()}


# ----------------------------------------------------------------------------- what is refused

class RunsShell:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple:
        return (os.system, (f"echo pwned > {self.target}",))


class CallsEval:
    def __reduce__(self) -> tuple:
        return (eval, ("1+1",))


def one_line(exc: pytest.ExceptionInfo, path: Path, *words: str) -> None:
    text = str(exc.value)
    assert "\n" not in text and text.startswith(str(path)), text
    for w in words:
        assert w in text, text


@pytest.mark.parametrize("protocol", [2, 4])
def test_os_system_is_refused_and_never_runs(tmp_path: Path, protocol: int) -> None:
    target = tmp_path / "pwned"
    path = save({"w": torch.ones(2), "x": RunsShell(target)}, tmp_path / "pytorch_model.bin",
                pickle_protocol=protocol)
    with pytest.raises(UnsafeCheckpoint) as exc:
        read_torch_zip(path)
    one_line(exc, path, "os.system", "would run code")
    assert not target.exists()


def test_the_os_system_payload_is_live(tmp_path: Path) -> None:
    """The refused file really would run its payload when loaded, so the test above is real."""
    target = tmp_path / "pwned"
    path = save({"x": RunsShell(target)}, tmp_path / "evil.pt")
    code = f"import torch; torch.load({str(path)!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    assert target.read_text().strip() == "pwned"


def test_eval_is_refused(tmp_path: Path) -> None:
    path = save({"w": torch.ones(2), "x": CallsEval()}, tmp_path / "m.pt")
    with pytest.raises(UnsafeCheckpoint) as exc:
        read_torch_zip(path)
    one_line(exc, path, "builtins.eval")


@pytest.mark.parametrize(("gadget", "named"), [
    # getattr(object, '__subclasses__')(): the classic first step to any callable
    (b"\x80\x02cbuiltins\ngetattr\ncbuiltins\nobject\nX\x0e\x00\x00\x00__subclasses__"
     b"\x86R)R.", "builtins.getattr"),
    # Popen.__new__ + BUILD: object construction of a class that must never be built
    (b"\x80\x02csubprocess\nPopen\n)\x81}b.", "subprocess.Popen"),
    # protocol 0 INST calls the class: posix.system('true')
    (b"(S'true'\niposix\nsystem\n.", "os.system"),
    # __builtin__ is Python 2's name; fix_imports maps it to builtins
    (b"\x80\x02c__builtin__\nexec\nX\x04\x00\x00\x00passq\x00\x85R.", "builtins.exec"),
])
def test_hand_written_gadgets_are_refused(tmp_path: Path, gadget: bytes, named: str) -> None:
    src = save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    path = rewrite_zip(src, tmp_path / "bad.pt", {member(src, "data.pkl"): gadget})
    with pytest.raises(UnsafeCheckpoint) as exc:
        read_torch_zip(path)
    one_line(exc, path, named)


def test_legacy_non_zip_save(model: LlamaForCausalLM, tmp_path: Path) -> None:
    path = save(model.state_dict(), tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "legacy")


def test_truncated_zip(model: LlamaForCausalLM, tmp_path: Path) -> None:
    path = save(model.state_dict(), tmp_path / "pytorch_model.bin")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "truncated")


def test_missing_storage_record(model: LlamaForCausalLM, tmp_path: Path) -> None:
    src = save(model.state_dict(), tmp_path / "src.bin")
    path = rewrite_zip(src, tmp_path / "pytorch_model.bin", {member(src, "data/3"): None})
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "data/3", "missing")


def test_storage_record_too_small(model: LlamaForCausalLM, tmp_path: Path) -> None:
    src = save(model.state_dict(), tmp_path / "src.bin")
    name = member(src, "data/0")
    with zipfile.ZipFile(src) as zf:
        short = zf.read(name)[:-4]
    path = rewrite_zip(src, tmp_path / "pytorch_model.bin", {name: short})
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "truncated", "data/0")


def test_zip_without_data_pkl(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/notes.txt", "hello")
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "without data.pkl")


def test_not_a_zip(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_text(json.dumps({"not": "a checkpoint"}))
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "not a torch.save zip")


def test_no_tensors(tmp_path: Path) -> None:
    path = save({"epoch": 3, "names": ["a", "b"]}, tmp_path / "m.pt")
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "no tensors")


def test_exponential_sharing_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[[l, l], [l, l]] sixty levels deep is a tiny pickle naming 2**60 paths. (The budget is
    lowered only to keep the test fast; the default refuses the same file in ~5 s.)"""
    monkeypatch.setattr(naming, "MAX_VISITS", 20_000)
    node: list = [torch.ones(1)]
    for _ in range(60):
        node = [node, node]
    path = save(node, tmp_path / "laughs.pt")
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "more than")


def test_deep_nesting_does_not_recurse(tmp_path: Path) -> None:
    """100k nested lists (EMPTY_LIST x N, APPEND x N-1): refused, not a RecursionError."""
    src = save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    n = 100_000
    deep = b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."
    path = rewrite_zip(src, tmp_path / "deep.pt", {member(src, "data.pkl"): deep})
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "deeper than")


def test_pickle_size_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save({"w": torch.ones(2)}, tmp_path / "m.pt")
    monkeypatch.setattr(torchzip, "MAX_PICKLE_BYTES", 16)
    with pytest.raises(BadInput) as exc:
        read_torch_zip(path)
    one_line(exc, path, "too large")


# --- two tensors, one dotted name (issue 42) -----------------------------------------------------

@pytest.mark.parametrize("layout", ["dict", "module"])
def test_two_tensors_with_one_dotted_name_are_refused(tmp_path: Path, layout: str) -> None:
    """``{"a.b": x, "a": {"b": y}}``, as real torch.save writes it, flattens to two tensors
    named ``a.b``: one would silently win, so the file is refused naming it (a module whose
    attribute dict holds the same clash likewise); distinct names read both."""
    x, y = torch.zeros(2, 3), torch.ones(4)
    if layout == "dict":
        clash, fine = {"a.b": x, "a": {"b": y}}, {"a.c": x, "a": {"b": y}}
    else:
        clash = {"layer.weight": x, "layer": torch.nn.Linear(3, 2, bias=False)}
        fine = {"other.weight": x, "layer": torch.nn.Linear(3, 2, bias=False)}
    torch.save(fine, tmp_path / "fine.bin")
    assert len(read_torch_zip(tmp_path / "fine.bin")) == 2
    torch.save(clash, tmp_path / "clash.bin")
    name = "a.b" if layout == "dict" else "layer.weight"
    with pytest.raises(BadInput, match=f"two tensors are both named '{name}'"):
        read_torch_zip(tmp_path / "clash.bin")
