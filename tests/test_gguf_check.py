"""``gac-check FILE.gguf``: GGUF files written by the ``gguf`` package's own GGUFWriter, read
from their headers; their stored types against the ftype's mix, the fallbacks and the bits
per weight; hostile headers refused in one line; --repair refused with what to run instead."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gac_check
from gac_check.checkpoint import gguf_header
from gac_check.checkpoint.gguf_header import read_gguf_header
from gac_check.errors import BadInput
from gac_check.sites import Role
from tests.gguf_files import PRUNED, llama_tensors, q4_k_m_types, write_gguf
from tests.helpers import gac, tiny_llama, tree_digest


def _q4km(tmp_path: Path, ff=688, down="F16", down_more_bits="F16", name="m.gguf", **kw) -> Path:
    m = dict(PRUNED, ff=ff, **kw)
    return write_gguf(tmp_path / name, m, "Q4_K_M", q4_k_m_types(m, down, down_more_bits))


def _one_line_refusal(run, *words: str) -> None:
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    for w in words:
        assert w in lines[0], lines[0]


# ------------------------------------------------------------------ reading, against gguf-py
def test_the_header_reader_agrees_with_gguf_reader(tmp_path):
    """Every tensor's name, ne, type and data offset, and the metadata's scalars, as the gguf
    package's own reader reads the same file."""
    path = _q4km(tmp_path, ff=[688, 768], layers=2)
    ours = read_gguf_header(path)
    theirs = gguf.GGUFReader(path)
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.ne == tuple(int(d) for d in t.shape)
        assert mine.type == t.tensor_type.name
        assert (mine.begin, mine.end - mine.begin) == (t.data_offset, t.n_bytes)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF.") or field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        value = field.contents()
        assert ours.metadata[key] == (pytest.approx(value) if isinstance(value, float)
                                      else value), key
    ff = ours.metadata["llama.feed_forward_length"]
    assert ff.values == (688, 768) == tuple(theirs.fields["llama.feed_forward_length"].contents())
    tokens = ours.metadata["tokenizer.ggml.tokens"]
    assert tokens.length == len(theirs.fields["tokenizer.ggml.tokens"].data)


# ------------------------------------------------------------------ the report
def test_q4_k_m_of_a_pruned_llama_reports_ffn_down_fallen_back_to_f16(tmp_path):
    """688 divides neither 256 (Q4_K, Q6_K) nor 32 (Q5_0, Q8_0): llama.cpp stores ffn_down F16.
    The report names each fallback, why, the width that keeps the mix, and the bits."""
    path = _q4km(tmp_path)
    run = gac(path, "--gpu", "h100", "--format", "json")
    assert run.returncode == 1, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["format"], doc["container"]) == ("gguf", "gguf")
    g = doc["gguf"]
    assert (g["ftype"], g["nominal_type"], g["nominal_bpw"]) == ("Q4_K_M", "Q4_K", 4.5)
    fell = {t["name"]: t for t in g["tensors"] if t["padded_row"] is not None}
    assert set(fell) == {"blk.0.ffn_down.weight", "blk.1.ffn_down.weight"}
    assert {(t["requested"], t["stored"], t["padded_row"]) for t in fell.values()} == {
        ("Q4_K", "F16", 768), ("Q6_K", "F16", 768)}
    assert all("nor of" in t["why"] for t in fell.values())
    assert g["disagreements"] == 0 and g["fallbacks"] == 2
    assert g["bpw"] > g["mix_bpw"] > g["nominal_bpw"]
    assert g["bytes"] == Path(path).stat().st_size - _data_start(path)
    down = [s for s in doc["sites"] if s["role"] == "intermediate"]
    assert [(s["value"], s["targets"][0]["verdict"], s["targets"][0]["fix_to"]) for s in down] \
        == [(688, "fallback", 768)] * 2
    assert doc["summary"]["targets"]["llama.cpp,quant=Q4_K_M"]["verdict"] == "fallback"
    text = gac(path, "--gpu", "h100").stdout
    assert "2 of 21 tensors fell back from the mix" in text
    assert "blk.*.ffn_down.weight" in text and "padded to 768 it keeps Q4_K" in text


def _data_start(path: Path) -> int:
    return min(t.begin for t in read_gguf_header(path).tensors.values())


def test_640_falls_back_to_the_32_block_types(tmp_path):
    """640 divides 32 but not 256: Q4_K -> Q5_0 and Q6_K -> Q8_0, as llama.cpp stores them;
    the file agrees with the rules, and 768 keeps the mix."""
    path = _q4km(tmp_path, ff=640, down="Q5_0", down_more_bits="Q8_0")
    g = gac_check.check(path, gpu="h100").gguf
    assert g is not None and not g.disagreements
    assert {(t.requested, t.stored) for t in g.fallbacks} == {("Q4_K", "Q5_0"),
                                                              ("Q6_K", "Q8_0")}


def test_a_file_that_holds_other_types_than_the_rules_says_so(tmp_path):
    """Q8_0 where llama.cpp stores Q5_0 (an override, or another llama.cpp): each named."""
    path = _q4km(tmp_path, ff=640, down="Q8_0", down_more_bits="Q8_0")
    g = gac_check.check(path, gpu="h100").gguf
    assert [t.name for t in g.disagreements] == ["blk.0.ffn_down.weight"]
    assert "the file holds Q8_0 where llama.cpp@0c1e57098 stores Q5_0" in g.disagreements[0].why


def test_an_aligned_model_keeps_its_mix(tmp_path):
    path = _q4km(tmp_path, ff=768, down="Q4_K", down_more_bits="Q6_K")
    result = gac_check.check(path, gpu="h100")
    assert result.gguf is not None and not result.gguf.fallbacks
    assert not result.gguf.disagreements
    assert result.gguf.bpw == pytest.approx(result.gguf.mix_bpw)


def test_an_override_at_an_aligned_width_is_no_fallback(tmp_path):
    """Q8_0 at a row of 768 is not llama.cpp falling back (768 divides 256): it is a
    disagreement with the mix (``--tensor-type``), not a fallback, and no padding helps."""
    g = gac_check.check(_q4km(tmp_path, ff=768, down="Q8_0", down_more_bits="Q8_0"),
                        gpu="h100").gguf
    assert g is not None and not g.fallbacks
    assert [t.name for t in g.disagreements] == ["blk.0.ffn_down.weight",
                                                 "blk.1.ffn_down.weight"]


def test_per_layer_widths_are_held_to_the_metadata(tmp_path):
    """A pruned model's per-layer feed_forward_length array: each layer its own site; an entry
    that lies about its layer's tensors is a note."""
    path = _q4km(tmp_path, ff=[688, 768], down="F16", down_more_bits="Q6_K")
    sites = [s for s in gac_check.check(path, gpu="h100").sites if s.role is Role.INTERMEDIATE]
    assert [(s.value, s.notes) for s in sites] == [(688, []), (768, [])]
    data = bytearray(path.read_bytes())
    at = _after(bytes(data), b"llama.feed_forward_length") + 4 + 4 + 8 + 4  # entry [1]
    assert struct.unpack("<i", data[at:at + 4]) == (768,)
    data[at:at + 4] = struct.pack("<i", 700)
    path.write_bytes(bytes(data))
    sites = [s for s in gac_check.check(path, gpu="h100").sites if s.role is Role.INTERMEDIATE]
    assert sites[1].notes == ["the GGUF metadata says feed_forward_length[1]=700, tensors "
                              "have 768"]


def test_tied_embeddings_are_quantized_as_the_output_head(tmp_path):
    """Without output.weight llama.cpp quantizes token_embd as the head (Q6_K at Q4_K_M)."""
    m = dict(PRUNED, ff=768, tied=True)
    types = q4_k_m_types(m, "Q4_K", "Q6_K") | {"token_embd.weight": "Q6_K"}
    g = gac_check.check(write_gguf(tmp_path / "t.gguf", m, "Q4_K_M", types), gpu="h100").gguf
    assert g is not None and not g.disagreements


def test_gguf_verdicts_equal_the_prediction_for_the_hf_model(tmp_path):
    """The HF model checked with --target llama.cpp,quant=Q4_K_M predicts exactly what its
    GGUF (tensor names from gguf-py's own HF -> GGUF map) is judged to hold: each site's
    verdict, kernel and fix, and the hardware findings."""
    model = tiny_llama(hidden_size=256, intermediate_size=688, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512)
    hf = tmp_path / "hf"
    model.save_pretrained(hf)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    ne = {names.get_name(n, try_suffixes=(".weight",)): tuple(reversed(t.shape))
          for n, t in model.state_dict().items()}
    assert ne == dict(llama_tensors(PRUNED))  # the file below is this model's layout
    path = _q4km(tmp_path)
    predicted = gac_check.check(hf, gpu="h100", dtype="float16", target="llama.cpp,quant=Q4_K_M")
    judged = gac_check.check(path, gpu="h100", dtype="float16")

    def verdicts(result):
        out = {}
        for s in result.sites:
            v = result.contract.targets.of(s)[0]
            f = result.by_site.get(s.name)
            out[(s.role, s.layer)] = (s.value, v.verdict, v.kernel, v.fix_to,
                                      f.repair_to if f else None)
        return out

    assert verdicts(judged) == verdicts(predicted)
    assert {(r, lay) for r, lay in verdicts(judged) if r is Role.INTERMEDIATE} == {
        (Role.INTERMEDIATE, 0), (Role.INTERMEDIATE, 1)}


# ------------------------------------------------------------------ what is refused
def test_an_unknown_tensor_is_a_refusal(tmp_path):
    m = dict(PRUNED)
    path = write_gguf(tmp_path / "x.gguf", m, "Q4_K_M", q4_k_m_types(m),
                      extra=[("blk.0.ffn_gate_exps.weight", (256, 688, 4))])
    _one_line_refusal(gac(path), "1 tensor(s) gac-check does not read",
                      "'blk.0.ffn_gate_exps.weight'")


def test_a_layer_without_one_of_its_linears_is_a_refusal(tmp_path):
    """Without blk.1.attn_k layer 1 would have no attention sites (q, v and output are still
    read, as the hidden size's): refused, naming it."""
    m = dict(PRUNED)
    path = write_gguf(tmp_path / "x.gguf", m, "Q4_K_M", q4_k_m_types(m),
                      omit=("blk.1.attn_k.weight",))
    _one_line_refusal(gac(path), "lacks 1 tensor(s) its layers must have",
                      "'blk.1.attn_k.weight'")
    path = write_gguf(tmp_path / "y.gguf", m, "Q4_K_M", q4_k_m_types(m),
                      omit=tuple(n for n, _ in llama_tensors(m) if n.startswith("blk.1.")))
    _one_line_refusal(gac(path), "says block_count=2, its tensors have layers [0] (1)")


def test_a_linear_no_site_reads_is_a_refusal(tmp_path):
    """attn_q stored 1-D is no linear: no site reads it, so it is unaccounted, and refused."""
    m = dict(PRUNED)
    types = q4_k_m_types(m) | {"blk.0.attn_q.weight": "F32"}
    path = write_gguf(tmp_path / "x.gguf", m, "Q4_K_M", types, omit=("blk.0.attn_q.weight",),
                      extra=[("blk.0.attn_q.weight", (256 * 256,))])
    _one_line_refusal(gac(path), "1 tensor gac-check did not read, first blk.0.attn_q.weight "
                      "(float32 [65536])", "refusing to judge a model it did not read")


def test_a_tensor_twice_is_a_refusal(tmp_path):
    m = dict(PRUNED)
    path = write_gguf(tmp_path / "x.gguf", m, "Q4_K_M", q4_k_m_types(m))
    path.write_bytes(path.read_bytes().replace(b"blk.1.attn_k.weight", b"blk.1.attn_q.weight"))
    _one_line_refusal(gac(path), "holds tensor 'blk.1.attn_q.weight' twice")


def test_attention_without_a_head_dim_is_a_refusal(tmp_path):
    """Per-layer head counts and no key_length: head_dim cannot be known, so the attention
    sites would be missing: refused, not checked without them."""
    m = dict(PRUNED, ff=768, per_layer_heads=True)
    _one_line_refusal(gac(write_gguf(tmp_path / "h.gguf", m, "F16", {})), "gives no head_dim")


def test_an_ftype_whose_mix_is_not_modelled_is_refused(tmp_path):
    m = dict(PRUNED, ff=768)
    _one_line_refusal(gac(write_gguf(tmp_path / "a.gguf", m, "IQ3_M", {})),
                      "quantized as IQ3_M, whose type mix gac-check does not model")
    _one_line_refusal(gac(write_gguf(tmp_path / "b.gguf", m, None, {})),
                      "no general.file_type")


def test_an_architecture_not_read_is_refused(tmp_path):
    m = dict(PRUNED, ff=768)
    _one_line_refusal(gac(write_gguf(tmp_path / "a.gguf", m, "F16", {}, arch="gemma3")),
                      "architecture 'gemma3'")


def test_targets_that_contradict_the_file_are_refused(tmp_path):
    path = _q4km(tmp_path)
    _one_line_refusal(gac(path, "--target", "vllm,tp=2"), "runs on llama.cpp")
    _one_line_refusal(gac(path, "--target", "llama.cpp,quant=Q8_0"),
                      "quantized as Q4_K_M, not Q8_0")
    same = gac(path, "--target", "llama.cpp,quant=Q4_K_M", "--format", "json")
    assert same.returncode == 1 and json.loads(same.stdout)["gguf"]["fallbacks"] == 2


def test_repair_and_realign_refuse_a_gguf_with_the_commands_to_run(tmp_path):
    path = _q4km(tmp_path)
    before = tree_digest(tmp_path)
    for flag in ("--repair", "--realign"):
        run = gac(path, flag, tmp_path / "out")
        _one_line_refusal(run, "Repair the Hugging Face model", "convert_hf_to_gguf.py",
                          "llama-quantize OUT-f16.gguf OUT-Q4_K_M.gguf Q4_K_M", flag)
    assert tree_digest(tmp_path) == before


# ------------------------------------------------------------------ directories and splits
def test_a_directory_with_one_gguf_checks_it_and_with_two_asks_which(tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    _q4km(one)
    run = gac(one, "--format", "json")
    assert run.returncode == 1 and json.loads(run.stdout)["format"] == "gguf"
    _q4km(one, ff=768, name="other.gguf")
    _one_line_refusal(gac(one), "holds 2 GGUF files (m.gguf, other.gguf): name the one")


def test_a_directory_with_the_hf_model_beside_a_gguf_is_the_hf_model(tmp_path):
    tiny_llama().save_pretrained(tmp_path)
    _q4km(tmp_path)
    run = gac(tmp_path, "--format", "json")
    assert json.loads(run.stdout)["format"] == "dense", run.stderr


def test_a_split_gguf_is_read_whole_from_any_part(tmp_path):
    m = dict(PRUNED)
    w = gguf.GGUFWriter(tmp_path / "s.gguf", "llama", split_max_tensors=8)
    _fill(w, m)
    parts = sorted(tmp_path.glob("s-*-of-*.gguf"))
    assert len(parts) == 3
    for part in parts:
        run = gac(part, "--format", "json")
        assert run.returncode == 1, run.stderr
        g = json.loads(run.stdout)["gguf"]
        assert len(g["tensors"]) == 21 and g["fallbacks"] == 2
    parts[1].unlink()
    _one_line_refusal(gac(parts[0]), "part s-00002-of-00003.gguf is missing")


def _fill(w, m: dict) -> None:
    """What write_gguf writes, into a writer made elsewhere (a split writer)."""
    import numpy as np

    w.add_block_count(m["layers"])
    w.add_embedding_length(m["hidden"])
    w.add_feed_forward_length(m["ff"])
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_key_length(m["head_dim"])
    w.add_file_type(15)
    types = q4_k_m_types(m)
    for name, ne in llama_tensors(m):
        kind = types.get(name, "F32" if len(ne) == 1 else "F16")
        qt = gguf.GGMLQuantizationType[kind]
        shape = tuple(reversed(ne))
        arr = (np.zeros(shape, np.float32 if kind == "F32" else np.float16)
               if kind in ("F32", "F16")
               else np.zeros(gguf.quant_shape_to_byte_shape(shape, qt), np.uint8))
        w.add_tensor(name, arr, raw_dtype=None if kind in ("F32", "F16") else qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ------------------------------------------------------------------ hostile headers
def _patched(tmp_path: Path, at: int, fmt: str, value: int, cut: int | None = None) -> Path:
    data = bytearray(_q4km(tmp_path, name="src.gguf").read_bytes())
    if at >= 0:
        data[at:at + struct.calcsize(fmt)] = struct.pack(fmt, value)
    out = tmp_path / "bad.gguf"
    out.write_bytes(bytes(data[:cut]))
    return out


def _after(path_bytes: bytes, key: bytes) -> int:
    return path_bytes.index(key) + len(key)


@pytest.mark.parametrize("cut, words", [
    (3, "is truncated: the magic"),
    (20, "is truncated: the metadata count"),
    (700, "is truncated"),
    (-100, "is truncated: tensor 'output.weight''s data ends at byte"),
])
def test_a_truncated_file_is_one_line(tmp_path, cut, words):
    path = _patched(tmp_path, -1, "<Q", 0, cut)
    _one_line_refusal(gac(path), words)


def test_absurd_counts_and_lengths_are_one_line_at_once(tmp_path):
    """Each count and length is held to the bytes left before it is used: no loop over 2**62
    items, no allocation of them (gguf.GGUFReader loops forever on the uint8 array)."""
    src = _q4km(tmp_path, name="src.gguf").read_bytes()
    cases = [
        (8, "<Q", 1 << 62, "says it holds 4,611,686,018,427,387,904 tensors"),
        (16, "<Q", 1 << 62, "metadata entries, more than"),
        (24, "<Q", 1 << 60, "metadata key 0 at byte 32 needs"),
        (_after(src, b"tokenizer.ggml.tokens") + 8, "<Q", 1 << 62, "strings) at byte"),
        (_after(src, b"token_embd.weight") + 4, "<q", -5, "negative dimension"),
        (_after(src, b"token_embd.weight"), "<I", 9, "has 9 dimensions"),
        (_after(src, b"blk.0.attn_q.weight") + 4 + 16, "<I", 999, "ggml type 999"),
        (_after(src, b"blk.0.attn_q.weight") + 4 + 16 + 4, "<Q", 0, "starts at data offset 0"),
        (_after(src, b"blk.0.attn_q.weight") - len(b"blk.0.attn_q.weight") - 8, "<Q", 1 << 40,
         "name is 1,099,511,627,776 bytes"),
        (_after(src, b"general.architecture"), "<I", 99, "unknown value type 99"),
        (_after(src, b"tokenizer.ggml.tokens") + 4, "<I", 9, "an array of type 9"),
        (0, "<I", 0x46554747 + 1, "no GGUF magic"),
        (4, "<I", 3 << 24, "big-endian"),
        (4, "<I", 7, "GGUF version 7"),
    ]
    for at, fmt, value, words in cases:
        data = bytearray(src)
        data[at:at + struct.calcsize(fmt)] = struct.pack(fmt, value)
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(bytes(data))
        _one_line_refusal(gac(bad), words)


def test_a_lying_uint8_array_is_refused_where_gguf_reader_never_returns(tmp_path):
    """An array of 2**40 uint8 in a 700-byte file: gguf.GGUFReader reads empty slices past the
    end forever (not run here: it never returns); this reader refuses before the first item."""
    w = gguf.GGUFWriter(tmp_path / "a.gguf", "llama")
    w.add_key_value("llama.feed_forward_length", [1, 2], gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.UINT8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray((tmp_path / "a.gguf").read_bytes())
    at = _after(data, b"llama.feed_forward_length") + 8
    data[at:at + 8] = struct.pack("<Q", 1 << 40)
    (tmp_path / "a.gguf").write_bytes(bytes(data))
    _one_line_refusal(gac(tmp_path / "a.gguf"), "1,099,511,627,776 items")


def test_the_header_is_bounded(tmp_path, monkeypatch):
    path = _q4km(tmp_path)
    monkeypatch.setattr(gguf_header, "MAX_HEADER_BYTES", 4096)
    with pytest.raises(BadInput, match="header is larger than 4,096 bytes"):
        read_gguf_header(path)


# ------------------------------------------------------------------ other files, other outputs
def test_the_html_report_shows_the_types_and_bits(tmp_path):
    path = _q4km(tmp_path)
    run = gac(path, "--gpu", "h100", "--report", tmp_path / "r" / "report.html")
    assert run.returncode == 1, run.stderr
    page = (tmp_path / "r" / "report.html").read_text()
    assert '<h2 id="gguf">GGUF tensor types</h2>' in page
    assert "<code>blk.1.ffn_down.weight</code></td><td class=\"n\">688</td><td>Q6_K</td>" \
           "<td>F16</td><td class=\"n\">768</td>" in page
    assert "2 of 21 tensors fell back" in page


def test_an_f16_file_never_falls_back(tmp_path):
    m = dict(PRUNED)
    result = gac_check.check(write_gguf(tmp_path / "f.gguf", m, "F16", {}), gpu="h100")
    assert result.gguf is not None and result.gguf.bpw > 15
    assert not result.gguf.fallbacks and not result.gguf.disagreements
    assert {v.verdict for vs in result.contract.targets.by_site.values() for v in vs} == {"fast"}


def test_qwen2_biases_and_qwen3_norms_are_accounted(tmp_path):
    """qwen2's q/k/v biases are on its head_dim sites; qwen3's per-head q/k norms carry no
    width of their own: read, accounted, not sites."""
    m = dict(PRUNED, ff=768)
    biases = [(f"blk.{i}.attn_{x}.bias", (n,)) for i in range(2)
              for x, n in (("q", 256), ("k", 128), ("v", 128))]
    r = gac_check.check(write_gguf(tmp_path / "q2.gguf", m, "F16", {}, extra=biases,
                                   arch="qwen2"), gpu="h100")
    head = next(s for s in r.sites if s.role is Role.HEAD_DIM and s.layer == 0)
    assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"} <= set(head.tensors)
    norms = [(f"blk.{i}.attn_{x}_norm.weight", (64,)) for i in range(2) for x in "qk"]
    ckpt = gac_check.check(write_gguf(tmp_path / "q3.gguf", m, "F16", {}, extra=norms,
                                      arch="qwen3"), gpu="h100").checkpoint
    assert ckpt.auxiliary["blk.1.attn_k_norm.weight"] == "per-head k norm"


def test_a_gguf_on_the_hub_is_refused_with_the_download_command():
    run = gac("hf://org/name/model-Q4_K_M.gguf", env={"HF_HUB_OFFLINE": "1"})
    _one_line_refusal(run, "hf://org/name/model-Q4_K_M.gguf", "hf download ORG/NAME FILE.gguf")
    _one_line_refusal(gac("org/model-Q4_K_M.gguf", env={"HF_HUB_OFFLINE": "1"}),
                      "org/model-Q4_K_M.gguf: does not exist")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_headers_keep_the_contract(tmp_path_factory, data):
    """Bytes of a real Q4_K_M file's header flipped, overwritten with extreme integers, or the
    file cut: exit 0, 1 or 2, one line and no traceback when 2."""
    root = tmp_path_factory.mktemp("fuzz")
    src = bytearray(_q4km(root, name="seed.gguf", vocab=32).read_bytes())
    header = _data_start(root / "seed.gguf")
    infos = src.index(b"token_embd.weight") - 8  # the tensor infos, after the metadata
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        at = data.draw(st.one_of(st.integers(0, infos - 1), st.integers(infos, header - 1)),
                       label="at")
        if data.draw(st.booleans(), label="wide"):
            value = data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1]))
            src[at:at + 8] = struct.pack("<Q", value)[:len(src[at:at + 8])]
        else:
            src[at] ^= data.draw(st.integers(1, 255), label="xor")
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(src))), label="cut")
    bad = root / "bad.gguf"
    bad.write_bytes(bytes(src[:cut]))
    run = gac(bad, "--format", "json")
    assert run.returncode in (0, 1, 2), run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    if run.returncode == 2:
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    else:
        assert json.loads(run.stdout)["format"] == "gguf"
