"""llama.cpp's own quantizer is the oracle for every llama.cpp verdict gac-check predicts.

For drawn widths (hidden, MLP, heads, head_dim, layers) and ftypes, build a tiny llama GGUF
with the ``gguf`` package, quantize it with llama.cpp's real ``llama_model_quantize`` (from
``llama-cpp-python``), read back the type of every tensor, and compare it, tensor by tensor,
with the type the shipped pack predicts (``gac_check.targets.gguf``); a refusal must be
predicted as one. Slow tier: llama-cpp-python builds llama.cpp from source (~7 minutes on
2 cores); CI builds the wheel once and caches it (``make llamacpp-wheel``). Skips, saying
why, where llama_cpp or gguf is not importable or is another version than the pack's newest.
"""
from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gac_check.targets import gguf as rules
from gac_check.targets.packs import packs

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed "
                                "(make llamacpp-wheel, then pip install .cache/wheels/llama_cpp*)")
gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.slow

PACK = packs()["llama.cpp"]
#: The llama.cpp commit llama-cpp-python 0.3.36 vendors: the pack's newest version.
VENDORED = {"0.3.36": "0c1e57098"}
#: llama_ftype ids (llama.h) of the ftypes the pack models.
FTYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
             "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
             "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ2_XXS": 19, "IQ2_XS": 20,
             "IQ3_XXS": 23, "IQ1_S": 24, "IQ4_NL": 25, "IQ2_S": 28, "IQ2_M": 29, "IQ4_XS": 30,
             "IQ1_M": 31, "BF16": 32}


def version() -> str:
    have = llama_cpp.__version__
    if have not in VENDORED or VENDORED[have] != PACK.versions[-1]:
        pytest.skip(f"llama-cpp-python {have} vendors another llama.cpp than the pack's "
                    f"newest ({PACK.versions[-1]}, in llama-cpp-python 0.3.36)")
    return VENDORED[have]


def tensors(m: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, ne) of a llama model; ne[0] is the row length (the input features)."""
    h, ff, hd = m["hidden"], m["ff"], m["head_dim"]
    q, kv = m["heads"] * hd, m["kv_heads"] * hd
    out = [("token_embd.weight", (h, m["vocab"]))]
    for i in range(m["layers"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (h, q)),
                (b + "attn_k.weight", (h, kv)), (b + "attn_v.weight", (h, kv)),
                (b + "attn_output.weight", (q, h)), (b + "ffn_norm.weight", (h,)),
                (b + "ffn_gate.weight", (h, ff)), (b + "ffn_up.weight", (h, ff)),
                (b + "ffn_down.weight", (ff, h))]
    return [*out, ("output_norm.weight", (h,)), ("output.weight", (h, m["vocab"]))]


def write_gguf(path: Path, m: dict) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(m["layers"])
    w.add_context_length(64)
    w.add_embedding_length(m["hidden"])
    w.add_feed_forward_length(m["ff"])
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_key_length(m["head_dim"])
    w.add_value_length(m["head_dim"])
    w.add_rope_dimension_count(m["head_dim"] - m["head_dim"] % 2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)
    w.add_vocab_size(m["vocab"])
    w.add_tokenizer_model("llama")
    toks = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    toks += [f"t{i}".encode() for i in range(len(toks), m["vocab"])]
    w.add_token_list(toks[: m["vocab"]])
    w.add_token_scores([0.0] * m["vocab"])
    w.add_token_types(([2, 3, 3] + [6] * 256 + [1] * m["vocab"])[: m["vocab"]])
    rng = np.random.default_rng(0)
    for name, ne in tensors(m):
        shape = tuple(reversed(ne))
        arr = (np.ones(shape, np.float32) if len(ne) == 1
               else (rng.standard_normal(shape) * 0.02).astype(np.float16))
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src: Path, dst: Path, ftype: str) -> int:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPE_IDS[ftype]
    params.nthread = 1
    return llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                          ctypes.byref(params))


def predicted(m: dict, ftype: str, ver: str) -> dict[str, str | None]:
    """The pack's type per quantized tensor (None: the quantizer refuses the file)."""
    out: dict[str, str | None] = {}
    gqa = m["heads"] // m["kv_heads"]
    refused = False
    for name, ne in tensors(m):
        if len(ne) != 2:
            continue
        parts = name.split(".")
        layer = int(parts[1]) if parts[0] == "blk" else 0
        kind = parts[-2]
        requested = rules.mix_type(PACK, ftype, kind, layer, m["layers"], gqa)
        out[name] = rules.stored_type(PACK, ver, ftype, kind, requested, ne[0]).type
        refused |= out[name] is None or bool(rules.imatrix_refusal(PACK, kind, out[name]))
    return {name: None for name in out} if refused else out


def _quiet_logs() -> None:
    cb = llama_cpp.llama_log_callback(lambda level, text, data: None)
    _quiet_logs.keep = cb  # type: ignore[attr-defined]
    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))


@st.composite
def models(draw) -> dict:
    heads = draw(st.sampled_from((2, 4)))
    return {"hidden": draw(st.sampled_from((64, 96, 179, 256, 288, 320, 512))),
            "ff": draw(st.sampled_from((128, 176, 700, 704, 768, 1843, 1856, 2048))),
            "heads": heads, "kv_heads": draw(st.sampled_from([k for k in (1, 2, 4)
                                                              if heads % k == 0])),
            "head_dim": draw(st.sampled_from((16, 24, 32, 48, 64))),
            "layers": draw(st.integers(1, 8)), "vocab": 300}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=models(), ftype=st.sampled_from(sorted(set(PACK.ftypes) & set(FTYPE_IDS))))
def test_llama_cpp_stores_every_tensor_as_the_pack_predicts(m, ftype):
    ver = version()
    _quiet_logs()
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.gguf", Path(tmp) / "out.gguf"
        write_gguf(src, m)
        rc = quantize(src, dst, ftype)
        want = predicted(m, ftype, ver)
        if any(t is None for t in want.values()):
            assert rc != 0, f"predicted a refusal, llama.cpp quantized {m} to {ftype}"
            return
        assert rc == 0, f"llama.cpp refused {m} as {ftype}; the pack predicted {want}"
        got = {t.name: gguf.GGMLQuantizationType(t.tensor_type).name
               for t in gguf.GGUFReader(str(dst)).tensors if len(t.shape) == 2}
        assert got == want, {k: (want.get(k), v) for k, v in got.items() if want.get(k) != v}
