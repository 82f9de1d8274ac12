"""Issue 11: the hostile corpus, one case per test, each through the real CLI in a subprocess.

The contract under attack: bad input is exit 2 with one line on stderr, an internal error exit
3 with one line, and never a hang, a crash, a traceback, a modified input, a half-written
output, or a file accepted that safetensors itself refuses. Every fixture is a real file: a
tiny Llama saved by ``save_pretrained`` or ``torch.save``, then edited byte by byte the way an
attacker would; FIFOs are real FIFOs, full disks are real (a 64 KiB tmpfs in a private mount
namespace, or ``RLIMIT_FSIZE``), kills are real ``SIGKILL``.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from gac_check.checkpoint.pickled.machine import MAX_OPCODES
from tests import helpers
from tests.helpers import SEED_LLAMA, tiny_llama, tree_digest

TIMEOUT = 60  # seconds: every case here finishes in a few; a hang fails instead of blocking
#: the CLI as a subprocess, failing any case that runs past TIMEOUT
gac = partial(helpers.gac, timeout=TIMEOUT, process=True)


def refused(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2, exactly one ``gac-check: ...`` line on stderr, holding each fragment."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("gac-check: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def accepted(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode in (0, 1), (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr


@pytest.fixture
def copy(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> Callable[[str], Path]:
    """An editable copy of one of the shared tiny checkpoints (conftest.py), by layout."""
    def make(kind: str) -> Path:
        return Path(shutil.copytree(tiny_checkpoints[kind], tmp_path / kind))
    return make


# ------------------------------------------------------------------ safetensors byte surgery

def read_st(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path: Path, header: dict | str, data: bytes) -> None:
    text = header if isinstance(header, str) else json.dumps(header)
    blob = text.encode("utf-8", "surrogatepass")
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def safetensors_accepts(path: Path) -> bool:
    """safetensors' own verdict on the file (its Rust parser, through safe_open)."""
    try:
        with safe_open(str(path), framework="np") as f:
            f.keys()
    except Exception:  # SafetensorError and friends: the verdict, not a test failure
        return False
    return True


def first_tensors(header: dict, count: int, like: str | None = None) -> list[str]:
    names = [n for n in header if n != "__metadata__"]
    if like:
        names = [n for n in names if like in n]
    return sorted(names, key=lambda n: header[n]["data_offsets"])[:count]


# ------------------------------------------------------------------ pickles: bounded work

def torch_zip_with(path: Path, pickle: bytes, base: Path | None = None) -> Path:
    """A real torch.save archive (``base``, else an empty dict's) whose data.pkl is replaced
    by ``pickle``, deflated the way an attacker shrinks a bomb."""
    if base is None:
        torch.save({}, path)
        base = path
    with zipfile.ZipFile(base) as zin:
        members = [(i, zin.read(i)) for i in zin.infolist()]
    with zipfile.ZipFile(path, "w") as zout:
        for info, data in members:
            if info.filename.endswith("/data.pkl"):
                zout.writestr(info.filename, pickle, compress_type=zipfile.ZIP_DEFLATED)
            else:
                zout.writestr(info, data)
    return path


def test_dict_key_nested_200000_tuples_deep_is_refused_not_a_segfault(tmp_path: Path) -> None:
    # PROTO 2, {}, then the key: () wrapped in 200,000 TUPLE1s; value None; SETITEM; STOP.
    pickle = b"\x80\x02}" + b")" + b"\x85" * 200_000 + b"Ns."
    f = torch_zip_with(tmp_path / "pytorch_model.bin", pickle)
    assert f.stat().st_size < 2048  # the corpus' file was 580 bytes
    refused(gac(tmp_path), "pytorch_model.bin", "nests tuples deeper than 1000 levels")


def test_opcode_bomb_stops_at_the_budget(tmp_path: Path,
                                         tiny_checkpoints: dict[str, Path]) -> None:
    weights = tiny_checkpoints["torch"] / "pytorch_model.bin"
    real = zipfile.ZipFile(weights)
    pkl = real.read(next(n for n in real.namelist() if n.endswith("/data.pkl")))
    # NONE, POP: two trivial opcodes per pair, a little more than the budget in all
    bomb = pkl[:2] + b"N0" * (MAX_OPCODES // 2 + 1) + pkl[2:]
    f = torch_zip_with(tmp_path / "pytorch_model.bin", bomb, weights)
    assert f.stat().st_size < 600_000 < len(bomb)  # the weights, plus ~10 KB for 10 MB of bomb
    refused(gac(tmp_path), "pytorch_model.bin", f"more than {MAX_OPCODES} opcodes")


def test_torch_save_protocol_0_is_read_like_protocol_2(tmp_path: Path,
                                                       tiny_checkpoints: dict[str, Path]) -> None:
    state = tiny_llama(None, **SEED_LLAMA).state_dict()
    docs = {}
    for proto in (0, 2):
        d = tmp_path / f"p{proto}"
        d.mkdir()
        shutil.copy(tiny_checkpoints["torch"] / "config.json", d)
        torch.save(state, d / "pytorch_model.bin", pickle_protocol=proto)
        proc = gac(d, "--format", "json")
        accepted(proc)
        doc = json.loads(proc.stdout)
        doc.pop("model_dir")
        docs[proto] = (proc.returncode, doc)
    with zipfile.ZipFile(tmp_path / "p0" / "pytorch_model.bin") as z:
        assert b"P('storage'" in z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert docs[0] == docs[2]


# ------------------------------------------------------------------ files that are not files

@pytest.mark.parametrize("kind,name", [("single", "model.safetensors"),
                                       ("single", "config.json"),
                                       ("torch", "pytorch_model.bin"),
                                       ("sharded", None)])
def test_fifo_where_a_file_is_expected_is_refused_not_waited_on(copy, kind: str,
                                                                name: str | None) -> None:
    d = copy(kind)
    name = name or sorted(p.name for p in d.glob("*.safetensors"))[1]  # a shard
    (d / name).unlink()
    os.mkfifo(d / name)
    refused(gac(d), name, "FIFO")


def test_fifo_sidecar_is_skipped_not_waited_on(copy) -> None:
    d = copy("single")
    plain = gac(d, "--format", "json")
    os.mkfifo(d / "slicing_config.json")
    with_fifo = gac(d, "--format", "json")
    accepted(with_fifo)
    assert with_fifo.returncode == plain.returncode
    assert json.loads(with_fifo.stdout)["sites"] == json.loads(plain.stdout)["sites"]


def test_fifo_given_to_report_merge_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "run.json")
    refused(gac("report", "merge", tmp_path / "run.json", "-o", tmp_path / "m.html"),
            "run.json", "FIFO")
    assert not (tmp_path / "m.html").exists()


def test_directory_named_like_the_weights_is_refused(copy) -> None:
    d = copy("single")
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").mkdir()
    refused(gac(d), "model.safetensors", "Is a directory")


def test_symlink_loop_between_shards_is_refused(copy) -> None:
    d = copy("sharded")
    shard = sorted(d.glob("*.safetensors"))[1]
    shard.unlink()
    shard.symlink_to("loop.safetensors")
    (d / "loop.safetensors").symlink_to(shard.name)
    refused(gac(d), "symlink loop")


def test_nul_byte_in_a_shard_name_is_refused(copy) -> None:
    d = copy("sharded")
    index = d / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    first = next(iter(doc["weight_map"]))
    doc["weight_map"][first] = "model\u0000.safetensors"
    index.write_text(json.dumps(doc))
    refused(gac(d), "model.safetensors.index.json", "NUL byte")


# ------------------------------------------------------------------ JSON that attacks the parser

def test_nesting_bomb_in_a_header_is_refused(copy) -> None:
    d = copy("single")
    header, data = read_st(d / "model.safetensors")
    text = json.dumps(header)[:-1] + ', "__bomb__": ' + "[" * 100_000 + "]" * 100_000 + "}"
    write_st(d / "model.safetensors", text, data)
    assert not safetensors_accepts(d / "model.safetensors")
    refused(gac(d), "model.safetensors", "nests deeper than 127 levels")


def test_nesting_bomb_in_config_is_refused(copy) -> None:
    d = copy("single")
    (d / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(gac(d), "config.json", "nests deeper than 127 levels")


def test_5000_digit_integers_are_refused(copy) -> None:
    d = copy("single")
    header, data = read_st(d / "model.safetensors")
    name = first_tensors(header, 1)[0]
    text = json.dumps(header).replace(json.dumps(header[name]["data_offsets"]),
                                      "[0, " + "9" * 5000 + "]", 1)
    write_st(d / "model.safetensors", text, data)
    assert not safetensors_accepts(d / "model.safetensors")
    refused(gac(d), "model.safetensors")
    d = copy("torch")
    (d / "config.json").write_text('{"hidden_size": ' + "7" * 5000 + "}")
    refused(gac(d), "config.json", "5000 digits")


def test_dimension_1e400_is_refused(copy) -> None:
    d = copy("single")
    header, data = read_st(d / "model.safetensors")
    name = first_tensors(header, 1)[0]
    text = json.dumps(header).replace(json.dumps(header[name]["shape"]), "[1e400, 64]", 1)
    write_st(d / "model.safetensors", text, data)
    assert not safetensors_accepts(d / "model.safetensors")
    refused(gac(d), "model.safetensors", "1e400")
    d = copy("torch")
    config = (d / "config.json").read_text()
    (d / "config.json").write_text(config.replace('"hidden_size": 64', '"hidden_size": 1e400'))
    refused(gac(d), "config.json", "1e400")


# ------------------------------------------------------------------ safetensors' own rules

def test_overlapping_offsets_are_refused_and_never_repaired(copy, tmp_path: Path) -> None:
    """Three projections re-pointed at the embedding's bytes: safetensors refuses the file,
    and --repair used to write the overlap out as a normal-looking checkpoint."""
    d = copy("single")
    header, data = read_st(d / "model.safetensors")
    embed = header["model.embed_tokens.weight"]
    victims = first_tensors(header, 3, like="mlp.down_proj")
    kept = [n for n in first_tensors(header, len(header)) if n not in victims]
    blob, pos = b"", 0
    for n in kept:  # re-lay the other tensors contiguously
        b, e = header[n]["data_offsets"]
        header[n]["data_offsets"] = [pos, pos + e - b]
        blob, pos = blob + data[b:e], pos + e - b
    size = 64 * 4  # the victims become float32 [1, 64] views of the embedding's first row
    for n in victims:
        header[n] = {"dtype": "F32", "shape": [1, 64],
                     "data_offsets": [embed["data_offsets"][0],
                                      embed["data_offsets"][0] + size]}
    write_st(d / "model.safetensors", header, blob)
    assert not safetensors_accepts(d / "model.safetensors")
    before = tree_digest(d)
    refused(gac(d), "model.safetensors", "overlaps")
    refused(gac(d, "--repair", tmp_path / "out"), "overlaps")
    assert not (tmp_path / "out").exists() and tree_digest(d) == before
    assert not list(tmp_path.glob(".out.*"))


def test_offsets_out_of_order_with_a_gap_are_refused(copy) -> None:
    d = copy("single")
    header, data = read_st(d / "model.safetensors")
    a, b = first_tensors(header, 2)  # a at byte 0, b right after it
    (a0, a1), (b0, b1) = header[a]["data_offsets"], header[b]["data_offsets"]
    # b first, then 8 stray bytes, then a; everything after them moves up by 8
    header[b]["data_offsets"] = [0, b1 - b0]
    header[a]["data_offsets"] = [b1 - b0 + 8, b1 - b0 + 8 + a1 - a0]
    blob = data[b0:b1] + b"\0" * 8 + data[a0:a1] + data[b1:]
    for n in header:
        if n not in (a, b, "__metadata__"):
            s, e = header[n]["data_offsets"]
            header[n]["data_offsets"] = [s + 8, e + 8]
    write_st(d / "model.safetensors", header, blob)
    assert not safetensors_accepts(d / "model.safetensors")
    refused(gac(d), "model.safetensors", "8-byte gap")


def test_offsets_listed_out_of_order_but_tiling_are_accepted(copy) -> None:
    """safetensors sorts by offset; so must we: listing order is not an error."""
    d = copy("single")
    header, data = read_st(d / "model.safetensors")
    shuffled = dict(sorted(header.items(), key=lambda kv: kv[0], reverse=True))
    write_st(d / "model.safetensors", shuffled, data)
    assert safetensors_accepts(d / "model.safetensors")
    accepted(gac(d))


@pytest.mark.parametrize("edit,why", [
    (lambda h, n: h[n].update(shape=[1.9, *h[n]["shape"][1:]]), "shape must be a list"),
    (lambda h, n: h[n].update(shape=[str(h[n]["shape"][0]), *h[n]["shape"][1:]]),
     "shape must be a list"),
    (lambda h, n: h.update({n + "\ud800": h.pop(n)}), "not valid UTF-8"),
], ids=["dimension 1.9", "dimension as a string", "lone surrogate in a name"])
def test_header_values_safetensors_refuses_are_refused(copy, edit, why: str) -> None:
    d = copy("single")
    header, data = read_st(d / "model.safetensors")
    edit(header, first_tensors(header, 1)[0])
    write_st(d / "model.safetensors", json.dumps(header), data)
    assert not safetensors_accepts(d / "model.safetensors")
    refused(gac(d), "model.safetensors", why)


def test_duplicate_tensor_names_are_refused(copy) -> None:
    """safetensors keeps the last of two equal names; gac-check refuses to guess (stricter)."""
    d = copy("single")
    header, data = read_st(d / "model.safetensors")
    name = first_tensors(header, 1)[0]
    text = json.dumps(header)[:-1] + f", {json.dumps(name)}: {json.dumps(header[name])}}}"
    write_st(d / "model.safetensors", text, data)
    refused(gac(d), "model.safetensors", f"names {name!r} twice")


# ------------------------------------------------------------------ report merge

@pytest.fixture
def run_json(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> Path:
    proc = gac(tiny_checkpoints["single"], "--format", "json")
    accepted(proc)
    path = tmp_path / "a100.json"
    path.write_text(proc.stdout)
    return path


@pytest.mark.parametrize("poison,why", [
    ('"summary": ' + "[" * 50_000 + "]" * 50_000, "nests deeper"),
    ('"summary": ' + "1" * 5000, "5000 digits"),
], ids=["deep nesting", "huge integer"])
def test_report_merge_refuses_hostile_json(run_json: Path, tmp_path: Path, poison: str,
                                           why: str) -> None:
    doc = run_json.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(doc.replace('"summary": {', poison + ', "was": {', 1))
    refused(gac("report", "merge", run_json, bad, "-o", tmp_path / "m.html"), "bad.json", why)
    assert not (tmp_path / "m.html").exists()


def small_fs(directory: Path, size: str, *command: object, readonly: bool = False
             ) -> subprocess.CompletedProcess:
    """Run ``command`` with a fresh tmpfs of ``size`` mounted on ``directory``, in a private
    mount namespace (nothing leaks to the machine); skip where namespaces are not allowed."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    options = f"size={size}" + (",ro" if readonly else "")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o {options} tmpfs "
                            f"'{directory}'"], capture_output=True, timeout=30)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace: {probe.stderr[-200:]!r}")
    script = f'mount -t tmpfs -o {options} tmpfs "$0" && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", script, str(directory),
                           *map(str, command)], capture_output=True, text=True,
                          timeout=TIMEOUT)


def test_report_merge_on_a_full_disk_names_the_file(run_json: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    proc = small_fs(full, "4k", sys.executable, "-m", "gac_check.cli", "report", "merge",
                    run_json, "-o", full / "merged.html")
    refused(proc, str(full / "merged.html"), "No space left on device")


def test_report_merge_into_a_read_only_directory_names_the_file(run_json: Path,
                                                                tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    proc = small_fs(ro, "1m", sys.executable, "-m", "gac_check.cli", "report", "merge",
                    run_json, "-o", ro / "merged.html", readonly=True)
    refused(proc, str(ro / "merged.html"), "Read-only file system")


# ------------------------------------------------------------------ outputs that survive kill -9

def big_model(root: Path) -> Path:
    """Large enough (~20 MB, misaligned) that a repair is still writing when it is killed."""
    tiny_llama(vocab_size=2000, hidden_size=256, intermediate_size=700,
               num_hidden_layers=4).save_pretrained(root)
    return root


def leftovers(parent: Path, out: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_partial_output_of_a_killed_repair_is_removed_by_the_next_run(tmp_path: Path) -> None:
    model, out = big_model(tmp_path / "model"), tmp_path / "out"
    for _attempt in range(5):
        proc = subprocess.Popen([sys.executable, "-m", "gac_check.cli", model, "--repair", out,
                                 "--gpu", "a100"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + TIMEOUT
        while proc.poll() is None and not leftovers(tmp_path, out) and \
                time.monotonic() < deadline:
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if leftovers(tmp_path, out):
            break
        shutil.rmtree(out, ignore_errors=True)  # it finished first: try again
    assert leftovers(tmp_path, out), "never caught the repair while it was writing"
    assert not out.exists()
    accepted(gac(model, "--repair", out, "--gpu", "a100"))
    assert out.is_dir() and leftovers(tmp_path, out) == []


def test_force_swap_cut_in_half_puts_the_old_output_back(tmp_path: Path, copy) -> None:
    """What a kill between 'old OUT aside' and 'new OUT in' leaves: OUT missing, the old copy
    at .OUT.<token>.replaced, the finished new one at .OUT.<token>.partial, nobody holding
    either. The next run must restore the old OUT rather than lose it."""
    model, out = copy("single"), tmp_path / "out"
    accepted(gac(model, "--repair", out, "--gpu", "a100"))
    old = tree_digest(out)
    out.rename(tmp_path / ".out.abcd1234.replaced")
    shutil.copytree(tmp_path / ".out.abcd1234.replaced", tmp_path / ".out.abcd1234.partial")
    refused(gac(model, "--repair", out, "--gpu", "a100"), "already exists")
    assert tree_digest(out) == old and leftovers(tmp_path, out) == []


def limit_file_size(limit: int) -> Callable[[], None]:
    def set_limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited: write() fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


def test_force_keeps_the_old_output_when_the_new_one_cannot_be_written(tmp_path: Path) -> None:
    model, out = big_model(tmp_path / "model"), tmp_path / "out"
    accepted(gac(model, "--repair", out, "--gpu", "a100"))
    old = tree_digest(out)
    proc = gac(model, "--repair", out, "--gpu", "a100", "--force",
               preexec_fn=limit_file_size(1 << 20))
    refused(proc, str(out / "model.safetensors"), "File too large")
    assert tree_digest(out) == old and leftovers(tmp_path, out) == []


def test_repair_on_a_full_disk_names_the_file_and_leaves_nothing(tmp_path: Path,
                                                                 copy) -> None:
    model, full = copy("single"), tmp_path / "full"
    full.mkdir()
    proc = small_fs(full, "64k", sys.executable, "-m", "gac_check.cli", model, "--repair",
                    full / "out", "--gpu", "a100")
    refused(proc, str(full / "out"), "No space left on device")


# ------------------------------------------------------------------ the one error boundary

def test_a_newline_in_a_path_still_makes_one_line(tmp_path: Path) -> None:
    line = refused(gac(tmp_path / "two\nlines"), "does not exist")
    assert "two\\nlines" in line


def test_permissions_of_outputs_are_those_of_any_new_file(tmp_path: Path, copy) -> None:
    model, out = copy("single"), tmp_path / "out"
    accepted(gac(model, "--repair", out, "--gpu", "a100"))
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
