"""Fuzzing gac-check's readers through the real CLI (issue 11).

Hypothesis mutates real files of a tiny Llama — its safetensors file, its shard index, its
config.json, its torch.save zip — and a real run document: bytes flipped, files truncated,
fields retyped (to floats, strings, 5,000-digit integers, 1e400, lone surrogates), offsets
shuffled, nesting inflated past every parser's limit. Each mutant runs through the CLI in a
subprocess with a time limit, and must keep the contract:

* exit 0, 1 or 2 (never 3, never a signal), exactly one ``gac-check:`` line on stderr when 2,
  never a traceback, never a hang;
* the input directory byte-for-byte unchanged, and nothing written (JUnit file, OUT) on refusal;
* for safetensors files, the same accept/refuse verdict as safetensors itself on the header,
  except where gac-check is stricter on purpose (a name given twice, an entry written as a JSON
  array, sub-byte dtypes; see gac_check/checkpoint/safetensors_header.py).

``make test`` takes a quarter of each target's examples (``GAC_FUZZ`` unset: every target still
runs, on a busy runner in seconds); ``make test-slow``, which CI runs too, takes them all
(``GAC_FUZZ=1``). For an occasional deep run, ``GAC_FUZZ=long`` multiplies them by 25, or
``GAC_FUZZ=<n>`` by n::

    GAC_FUZZ=long .venv/bin/python -m pytest -n 2 tests/test_fuzz.py
"""
from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from gac_check.checkpoint.safetensors_header import SUB_BYTE_TYPES, read_safetensors_header
from gac_check.errors import BadInput
from tests import helpers
from tests.helpers import tree_digest

_SCALE = os.environ.get("GAC_FUZZ")
#: examples per target, per example its base count stands for (a quarter when GAC_FUZZ is unset)
SCALE = 0.25 if _SCALE is None else 25 if _SCALE == "long" else max(1, int(_SCALE))
TIMEOUT = 60  # a mutant that takes longer is a hang: the contract says bounded work
#: the CLI as a subprocess, failing any mutant that runs past TIMEOUT
gac = partial(helpers.gac, timeout=TIMEOUT, process=True)


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=max(2, round(examples * SCALE)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------ seeds: real files

@pytest.fixture(scope="module")
def seeds(tiny_checkpoints: dict[str, Path],
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shared tiny checkpoints (conftest.py) and ``run``: the single one's JSON run."""
    proc = gac(tiny_checkpoints["single"], "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    run = tmp_path_factory.mktemp("seeds") / "run.json"
    run.write_text(proc.stdout)
    return {**tiny_checkpoints, "run": run}


@contextmanager
def model_copy(seed: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gac-fuzz-") as tmp:
        yield Path(shutil.copytree(seed, Path(tmp) / "model"))


def keeps_contract(proc: subprocess.CompletedProcess, before: dict[str, str], root: Path,
                   outputs: tuple[Path, ...] = ()) -> None:
    """The CLI contract for one mutant: exit code, stderr, input untouched, outputs."""
    assert proc.returncode in (0, 1, 2), (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if proc.returncode == 2:
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gac-check: "), proc.stderr[-3000:]
        for out in outputs:
            assert not out.exists(), f"{out} written although the input was refused"
            assert not list(out.parent.glob(f".{out.name}.*")), "a partial output was left"
    assert tree_digest(root) == before, "the input was modified"


# ------------------------------------------------------------------ strategies

#: JSON texts that attack a parser or a type check, spliced in raw (json.dumps cannot say them).
RAW_VALUES = ["-0", "1e400", "-1e400", "9" * 5000, "18446744073709551616",
              "18446744073709551615", "1.9", "NaN", "Infinity", "1E2", "0.0", "-1", "4.0",
              '"\\ud800"', '"a\\u0000b"', '"4"', "[]", "{}", "null", "true", '"F4"', '"C64"',
              '"BF16"', "[1, 2, 3]", "[0, 0]", '["U8", [4], [0, 4]]']
DEPTHS = [2, 60, 125, 126, 127, 128, 300, 5000, 100_000]


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids,
                                                               max_size=3),
    max_leaves=8)
#: A value as raw JSON text: an ordinary value, a raw attack, or a deep nest.
value_texts = st.one_of(
    json_values.map(json.dumps),
    st.sampled_from(RAW_VALUES),
    st.sampled_from(DEPTHS).map(nested),
)
PLACEHOLDER = "\x00gac-fuzz\x00"


def splice(doc: object, raw: str) -> str:
    """``doc`` as JSON with the one PLACEHOLDER string replaced by raw text."""
    return json.dumps(doc).replace(json.dumps(PLACEHOLDER), raw, 1)


@dataclass(frozen=True)
class Mutant:
    """One mutation: applied to the seed's bytes, printed by what it did (hypothesis shows
    this in a failure report instead of half a megabyte of bytes)."""

    what: str
    apply: Callable[[bytes], bytes]

    def __repr__(self) -> str:
        return f"Mutant({self.what[:300]!r})"


def fixed(what: str, data: bytes) -> Mutant:
    return Mutant(what, lambda _seed: data)


def flip(data: bytes, positions: list[int], xors: list[int]) -> bytes:
    buf = bytearray(data)
    for pos, x in zip(positions, xors, strict=False):
        if buf:
            buf[pos % len(buf)] ^= x
    return bytes(buf)


@st.composite
def byte_edits(draw: st.DrawFn, size: int, hot: int) -> Mutant:
    """Flip a few bytes (mostly in the first ``hot`` bytes, where the structure is), or
    truncate, or cut a range out."""
    kind = draw(st.sampled_from(["flip", "truncate", "cut"]))
    if kind == "flip":
        where = st.one_of(st.integers(0, max(hot, 1) - 1), st.integers(0, size - 1))
        positions = draw(st.lists(where, min_size=1, max_size=4))
        xors = draw(st.lists(st.integers(1, 255), min_size=len(positions),
                             max_size=len(positions)))
        return Mutant(f"xor bytes {dict(zip(positions, xors, strict=True))}",
                      lambda data: flip(data, positions, xors))
    cut = draw(st.integers(0, size))
    if kind == "truncate":
        return Mutant(f"truncate to {cut} bytes", lambda data: data[:cut])
    length = draw(st.integers(1, 64))
    return Mutant(f"cut bytes {cut}..{cut + length}",
                  lambda data: data[:cut] + data[cut + length:])


# ------------------------------------------------------------------ safetensors

def split_st(raw: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def join_st(header: str, data: bytes, length: int | None = None) -> bytes:
    blob = header.encode("utf-8", "surrogatepass")
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob) if length is None else length) + blob + data


@st.composite
def safetensors_mutants(draw: st.DrawFn, raw: bytes) -> Mutant:
    header, data = split_st(raw)
    names = sorted(n for n in header if n != "__metadata__")
    kind = draw(st.sampled_from(["bytes", "retype", "offsets", "gap", "depth", "length",
                                 "duplicate", "dtype"]))
    if kind == "bytes":
        return draw(byte_edits(len(raw), 8 + len(json.dumps(header))))
    if kind == "gap":
        return draw(gaps(header, data))
    text = draw(header_edits(header, names, kind))
    return fixed(f"header {text[1]}", join_st(text[0], data, text[2]))


@st.composite
def gaps(draw: st.DrawFn, header: dict, data: bytes) -> Mutant:
    """``k`` stray bytes inserted before one tensor (or after the last), it and every later
    tensor moved up by k: each size still right and nothing overlapping, so only the tiling
    rule can object."""
    names = sorted((n for n in header if n != "__metadata__"),
                   key=lambda n: header[n]["data_offsets"])
    name, k = draw(st.sampled_from([*names, None])), draw(st.integers(1, 64))
    if name is None:
        return fixed(f"header: {k} bytes after the last tensor",
                     join_st(json.dumps(header), data + b"\0" * k))
    at = header[name]["data_offsets"][0]
    for n in names[names.index(name):]:
        header[n]["data_offsets"] = [o + k for o in header[n]["data_offsets"]]
    return fixed(f"header: {k}-byte gap before {name!r}",
                 join_st(json.dumps(header), data[:at] + b"\0" * k + data[at:]))


@st.composite
def header_edits(draw: st.DrawFn, header: dict, names: list[str],
                 kind: str) -> tuple[str, str, int | None]:
    """(header text, what was done, declared length or None) for one structural edit."""
    name = draw(st.sampled_from(names))
    if kind == "retype":
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "entry", "metadata",
                                      "name", "extra"]))
        if field == "entry":
            header[name] = PLACEHOLDER
        elif field == "metadata":
            header["__metadata__"] = PLACEHOLDER
        elif field == "name":
            header[PLACEHOLDER] = header.pop(name)
            new = draw(st.sampled_from(['"\\ud800"', '"a\\u0000"', '""', '"\\ud83d\\ude00"']))
            return splice(header, new), f"renames {name!r} to {new}", None
        elif field == "extra":
            header[name]["extra"] = PLACEHOLDER
        else:
            value = list(header[name][field]) if field != "dtype" else header[name][field]
            if field != "dtype" and value and draw(st.booleans()):
                value[draw(st.integers(0, len(value) - 1))] = PLACEHOLDER
            else:
                value = PLACEHOLDER
            header[name][field] = value
        raw = draw(value_texts)
        return splice(header, raw), f"sets {name!r} {field} to {raw[:60]}", None
    if kind == "offsets":
        edit = draw(st.sampled_from(["shuffle", "shift", "share"]))
        if edit == "shuffle":
            order = draw(st.permutations(names))
            offsets = [header[n]["data_offsets"] for n in names]
            for n, o in zip(order, offsets, strict=True):
                header[n]["data_offsets"] = o
        elif edit == "shift":
            i = draw(st.integers(0, 1))
            header[name]["data_offsets"][i] = max(0, header[name]["data_offsets"][i]
                                                  + draw(st.integers(-16, 16)))
        else:
            header[name]["data_offsets"] = list(header[draw(st.sampled_from(names))]
                                                ["data_offsets"])
        return json.dumps(header), f"offsets: {edit} ({name!r})", None
    if kind == "depth":
        header[name]["extra"] = PLACEHOLDER
        depth = draw(st.sampled_from(DEPTHS))
        return splice(header, nested(depth)), f"nests {depth} lists in {name!r}", None
    if kind == "length":
        text = json.dumps(header)
        n = len(text) + (-len(text) % 8)
        length = draw(st.sampled_from([0, 1, 7, n - 1, n + 1, n + 8, 10**6, 100_000_001,
                                       2**63, 2**64 - 1]))
        return text, f"declares a {length}-byte header", length
    if kind == "duplicate":
        text = json.dumps(header)
        twice = draw(st.sampled_from([name, "__metadata__"]))
        entry = header.get(twice, {"format": "pt"})
        return (text[:-1] + f", {json.dumps(twice)}: {json.dumps(entry)}}}",
                f"names {twice!r} twice", None)
    dtype = draw(st.sampled_from(["F4", "F6_E2M3", "C64", "F8_E4M3FNUZ", "BOOL", "U8", "F64",
                                  "bf16", ""]))
    header[name]["dtype"] = dtype
    return json.dumps(header), f"sets {name!r} dtype to {dtype!r}", None


def safetensors_verdict(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="np") as f:
            f.keys()
    except Exception:  # any refusal by safetensors is its verdict
        return False
    return True


def our_verdict(path: Path) -> str | None:
    """None if gac-check's header reader accepts the file, else its one-line reason."""
    try:
        read_safetensors_header(path)
    except BadInput as exc:
        return str(exc)
    return None


def stricter_on_purpose(raw: bytes) -> bool:
    """The cases gac-check refuses although safetensors accepts: a tensor name given twice
    (safetensors keeps the last), an entry written as a JSON array, a sub-byte dtype."""
    (n,) = struct.unpack("<Q", raw[:8])
    pairs: list[list] = []
    json.loads(raw[8:8 + n], object_pairs_hook=lambda kv: pairs.append(kv) or dict(kv))
    top = pairs[-1]
    names = [k for k, _ in top]
    if len(set(names)) < len(names):
        return True
    entries = [v for k, v in top if k != "__metadata__"]
    return any(isinstance(v, list) or (isinstance(v, dict) and v.get("dtype") in SUB_BYTE_TYPES)
               for v in entries)


@fuzz_settings(40)
@given(data=st.data())
def test_fuzz_safetensors_file(seeds: dict[str, Path], data: st.DataObject) -> None:
    raw = (seeds["single"] / "model.safetensors").read_bytes()
    mutant = data.draw(safetensors_mutants(raw)).apply(raw)
    with model_copy(seeds["single"]) as d:
        (d / "model.safetensors").write_bytes(mutant)
        before, junit = tree_digest(d), d.parent / "junit.xml"
        proc = gac(d, "--format", "json", "--junit", junit)
        keeps_contract(proc, before, d, (junit,))
        theirs, ours = safetensors_verdict(d / "model.safetensors"), our_verdict(
            d / "model.safetensors")
        if not theirs:
            assert ours is not None, "safetensors refuses this header, gac-check read it"
        elif ours is not None:
            assert stricter_on_purpose(mutant), f"safetensors accepts; gac-check: {ours}"
        if ours is not None:
            assert proc.returncode == 2, "the header reader refused, the CLI did not"


@fuzz_settings(3)
@given(data=st.data())
def test_fuzz_repair_writes_nothing_it_should_not(seeds: dict[str, Path],
                                                 data: st.DataObject) -> None:
    raw = (seeds["single"] / "model.safetensors").read_bytes()
    mutant = data.draw(safetensors_mutants(raw)).apply(raw)
    with model_copy(seeds["single"]) as d:
        (d / "model.safetensors").write_bytes(mutant)
        before, out = tree_digest(d), d.parent / "out"
        proc = gac(d, "--repair", out, "--gpu", "a100")
        keeps_contract(proc, before, d, (out,))
        if proc.returncode != 2:
            assert safetensors_verdict(out / "model.safetensors")


# ------------------------------------------------------------------ shard index

@st.composite
def index_mutants(draw: st.DrawFn, raw: bytes, shards: list[str]) -> Mutant:
    doc = json.loads(raw)
    kind = draw(st.sampled_from(["bytes", "value", "retype", "retype", "depth", "drop"]))
    if kind == "bytes":
        return draw(byte_edits(len(raw), len(raw)))
    tensors = sorted(doc["weight_map"])
    name = draw(st.sampled_from(tensors))
    if kind == "value":
        shard = draw(st.sampled_from(
            [*shards, "../x.safetensors", "/etc/hostname", "a\x00b", "", ".", "missing",
             "config.json", "\udcff", "x/../" + shards[0], "./" + shards[-1], shards[0] + "/"]))
        doc["weight_map"][name] = shard
        return fixed(f"maps {name!r} to {shard!r}", json.dumps(doc).encode())
    if kind == "drop":
        del doc["weight_map"][name]
        return fixed(f"drops {name!r}", json.dumps(doc).encode())
    where = name if draw(st.booleans()) else draw(st.sampled_from(["weight_map", "metadata"]))
    if where == name:
        doc["weight_map"][name] = PLACEHOLDER
    else:
        doc[where] = PLACEHOLDER
    raw_value = draw(value_texts) if kind == "retype" else nested(draw(st.sampled_from(DEPTHS)))
    return fixed(f"sets {where!r} to {raw_value[:60]}",
                 splice(doc, raw_value).encode("utf-8", "surrogatepass"))


@fuzz_settings(30)
@given(data=st.data())
def test_fuzz_shard_index(seeds: dict[str, Path], data: st.DataObject) -> None:
    index = seeds["sharded"] / "model.safetensors.index.json"
    shards = sorted(p.name for p in seeds["sharded"].glob("*.safetensors"))
    mutant = data.draw(index_mutants(index.read_bytes(), shards)).apply(index.read_bytes())
    with model_copy(seeds["sharded"]) as d:
        (d / index.name).write_bytes(mutant)
        before, junit = tree_digest(d), d.parent / "junit.xml"
        keeps_contract(gac(d, "--junit", junit), before, d, (junit,))


# ------------------------------------------------------------------ config.json

CONFIG_FIELDS = ["hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                 "num_key_value_heads", "head_dim", "vocab_size", "architectures",
                 "model_type", "torch_dtype", "dtype", "truncation_ranks", "tie_word_embeddings",
                 "rope_scaling", "max_position_embeddings"]


@st.composite
def config_mutants(draw: st.DrawFn, raw: bytes) -> Mutant:
    doc = json.loads(raw)
    kind = draw(st.sampled_from(["bytes", "retype", "retype", "depth", "whole"]))
    if kind == "bytes":
        return draw(byte_edits(len(raw), len(raw)))
    if kind == "whole":
        text = draw(value_texts)
        return fixed(f"config is {text[:60]}", text.encode("utf-8", "surrogatepass"))
    field = draw(st.sampled_from(CONFIG_FIELDS))
    doc[field] = PLACEHOLDER
    raw_value = draw(value_texts) if kind == "retype" else nested(draw(st.sampled_from(DEPTHS)))
    return fixed(f"sets {field} to {raw_value[:60]}",
                 splice(doc, raw_value).encode("utf-8", "surrogatepass"))


@fuzz_settings(25)
@given(data=st.data())
def test_fuzz_config(seeds: dict[str, Path], data: st.DataObject) -> None:
    raw = (seeds["single"] / "config.json").read_bytes()
    mutant = data.draw(config_mutants(raw)).apply(raw)
    with model_copy(seeds["single"]) as d:
        (d / "config.json").write_bytes(mutant)
        before, junit = tree_digest(d), d.parent / "junit.xml"
        keeps_contract(gac(d, "--format", "json", "--junit", junit), before, d, (junit,))


# ------------------------------------------------------------------ torch zip

def with_pickle(raw: bytes, edit: Callable[[bytes], bytes]) -> bytes:
    """The archive with its data.pkl edited (stored, as torch.save stores it)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            member = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                member = edit(member)
            zout.writestr(info, member)
    return out.getvalue()


#: Opcodes that build structure: inserting them makes unbalanced, deep or self-referencing
#: pickles (MARK, TUPLE1, EMPTY_DICT, DUP, SETITEM, BINGET 0, MEMOIZE, REDUCE, BUILD, POP).
OPCODE_SNIPPETS = [b"(", b"\x85", b"}", b"2", b"s", b"h\x00", b"\x94", b"R", b"b", b"0",
                   b")" + b"\x85" * 5000, b"(" * 2000, b"]" + b"2a" * 3000,
                   b"\x8a\x09" + b"\xff" * 9, b"\x8b\xff\xff\x00\x00" + b"\x01" * 65535]


@st.composite
def torch_mutants(draw: st.DrawFn, raw: bytes) -> Mutant:
    kind = draw(st.sampled_from(["archive", "pickle", "insert", "insert"]))
    if kind == "archive":
        return draw(byte_edits(len(raw), len(raw)))
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        size = len(z.read(next(n for n in z.namelist() if n.endswith("/data.pkl"))))
    if kind == "pickle":
        edit = draw(byte_edits(size, size))
        return Mutant(f"data.pkl: {edit.what}", lambda seed: with_pickle(seed, edit.apply))
    at = draw(st.integers(2, size - 1))  # after PROTO
    snippet = b"".join(draw(st.lists(st.sampled_from(OPCODE_SNIPPETS), min_size=1,
                                     max_size=3)))
    return Mutant(f"data.pkl: insert {snippet[:40]!r} ({len(snippet)} bytes) at {at}",
                  lambda seed: with_pickle(seed, lambda pkl: pkl[:at] + snippet + pkl[at:]))


@fuzz_settings(25)
@given(data=st.data())
def test_fuzz_torch_zip(seeds: dict[str, Path], data: st.DataObject) -> None:
    raw = (seeds["torch"] / "pytorch_model.bin").read_bytes()
    mutant = data.draw(torch_mutants(raw)).apply(raw)
    with model_copy(seeds["torch"]) as d:
        (d / "pytorch_model.bin").write_bytes(mutant)
        before, junit = tree_digest(d), d.parent / "junit.xml"
        keeps_contract(gac(d, "--junit", junit), before, d, (junit,))


# ------------------------------------------------------------------ run documents

RUN_FIELDS = ["schema", "model_dir", "hardware", "sites", "summary", "findings", "label",
              "environment", "checks", "fail_on"]


@st.composite
def run_mutants(draw: st.DrawFn, raw: bytes) -> Mutant:
    doc = json.loads(raw)
    kind = draw(st.sampled_from(["bytes", "top", "site", "depth"]))
    if kind == "bytes":
        return draw(byte_edits(len(raw), len(raw)))
    if kind == "site" and doc.get("sites"):
        i = draw(st.integers(0, len(doc["sites"]) - 1))
        where = f"sites[{i}].{draw(st.sampled_from(sorted(doc['sites'][i])))}"
        doc["sites"][i][where.split(".", 1)[1]] = PLACEHOLDER
    else:
        where = draw(st.sampled_from(RUN_FIELDS))
        doc[where] = PLACEHOLDER
    raw_value = draw(value_texts) if kind != "depth" else nested(draw(st.sampled_from(DEPTHS)))
    return fixed(f"sets {where} to {raw_value[:60]}",
                 splice(doc, raw_value).encode("utf-8", "surrogatepass"))


@fuzz_settings(20)
@given(data=st.data())
def test_fuzz_report_merge(seeds: dict[str, Path], data: st.DataObject) -> None:
    mutant = data.draw(run_mutants(seeds["run"].read_bytes())).apply(seeds["run"].read_bytes())
    with tempfile.TemporaryDirectory(prefix="gac-fuzz-") as tmp:
        d = Path(tmp) / "runs"
        d.mkdir()
        (d / "a100.json").write_bytes(seeds["run"].read_bytes())
        (d / "h100.json").write_bytes(mutant)
        before, out = tree_digest(d), Path(tmp) / "merged.html"
        keeps_contract(gac("report", "merge", d / "a100.json", d / "h100.json", "-o", out),
                       before, d, (out,))
