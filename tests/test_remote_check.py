"""``gac-check hf://ORG/NAME``: a Hub model checked from its headers, against a real server.

No internet: :mod:`tests.hub_server` serves real model directories on 127.0.0.1 the way the
Hub does (model info, resolve URLs, LFS redirects, HTTP range requests), and the real CLI runs
as a subprocess with ``HF_ENDPOINT`` pointed at it and a fresh ``HF_HOME`` (the local checks
it is compared with run in this process). The remote check must print exactly what the local
check prints for the same files, fetch a small fraction of
the weights (the server counts every body byte), and refuse missing repos, revisions, pickled
weights and broken connections in one line with exit code 2.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from gac_check.checkpoint.hub.remote import FIRST_READ
from tests import helpers
from tests.helpers import gac_on_terminal, slicegpt
from tests.hub_server import HubServer

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def llama(path: Path, intermediate: int, vocab: int = 4096, shard: str | None = None,
          pickled: bool = False, layers: int = 2) -> Path:
    """A real Llama; a 4096-token vocabulary makes the embeddings 512 KB each in bf16, so the
    weights dwarf the headers the way a real model's do. ``pickled``: the whole model in a
    torch.save pickle, as LLM-Pruner saves it."""
    model = helpers.tiny_llama(dtype=torch.bfloat16, vocab_size=vocab,
                               intermediate_size=intermediate, num_key_value_heads=2,
                               num_hidden_layers=layers)
    if pickled:
        path.mkdir(parents=True)
        model.config.save_pretrained(path)
        torch.save({"model": model}, path / "pytorch_model.bin")
        return path
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return path


def sliced(path: Path) -> Path:
    """SliceGPT's layout in safetensors, its slicing config a sidecar JSON that disagrees with
    the tensors once (so the check's notes depend on reading the sidecar)."""
    model = helpers.tiny_llama(num_hidden_layers=3)
    weights, conf = slicegpt(model, {"embedding": 40, "attn": 52, "mlp": 36})
    conf["attention_output_dimensions"]["1"] = 48
    path.mkdir()
    save_file(weights, path / "model.safetensors")
    (path / "tiny-llama_0.3.json").write_text(json.dumps(conf))
    model.config.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub")
    bad = llama(root / "bad", 256, vocab=128)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0" * 8)  # trailing data: safetensors refuses
    return {"sharded": llama(root / "sharded", 170, shard="300KB"),
            "single": llama(root / "single", 256),
            "deep": llama(root / "deep", 170, vocab=128, layers=24),  # a header > FIRST_READ
            "sliced": sliced(root / "sliced"),
            "pickled": llama(root / "pickled", 256, vocab=128, pickled=True),
            "bad": bad}


@pytest.fixture
def hub(models, tmp_path):
    with HubServer({"org/tiny": {"main": models["sharded"], "v2": models["single"]},
                    "org/single": {"main": models["single"]},
                    "org/deep": {"main": models["deep"]},
                    "org/sliced": {"main": models["sliced"]},
                    "org/pickled": {"main": models["pickled"]},
                    "org/bad": {"main": models["bad"]},
                    "org/gated": {"main": models["single"]}},
                   gated={"org/gated"}, token="hf_secret") as server:
        server.home = tmp_path / "hf-home"
        yield server


def gac(hub: HubServer, *args: object, cwd: Path | None = None,
        **env: str) -> subprocess.CompletedProcess:
    """The CLI against ``hub`` only: no HF_* or proxy variables of ours, ``env`` on top; a
    subprocess, since huggingface_hub reads them when it is first imported."""
    unset = {k: None for k in os.environ if k.startswith("HF_") or k in PROXY_VARS}
    return helpers.gac(*args, cwd=cwd, process=True, env={
        **unset, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(hub.home), "NO_PROXY": "*",
        "HF_HUB_DISABLE_TELEMETRY": "1", **env})


def check_here(model_dir: Path, *args: object) -> subprocess.CompletedProcess:
    """The local check the remote one must match: no Hub involved, so in this process."""
    return helpers.gac(model_dir, *args)


def same_but_name(local: str, remote: str, local_name: str, remote_name: str) -> None:
    assert local_name in local and remote_name in remote
    assert remote.replace(remote_name, "<model>") == local.replace(local_name, "<model>")


def commit_of(hub: HubServer, repo: str, rev: str = "main") -> str:
    return hub.hub[repo].revisions[rev].commit


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refusal: exit 2, nothing on stdout, no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gac-check: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.mark.parametrize(("ref", "model"), [
    ("hf://org/tiny", "sharded"),        # sharded: index + 3 shards, LFS redirects
    ("hf://org/tiny@v2", "single"),      # a revision: another tree, one model.safetensors
    ("hf://org/single", "single"),
    ("hf://org/deep", "deep"),           # its header is longer than the first range read
    ("hf://org/sliced", "sliced"),       # SliceGPT: widths from a sidecar JSON
])
def test_remote_check_prints_what_the_local_check_prints(hub, models, ref, model) -> None:
    rev = ref.partition("@")[2] or "main"
    name = f"hf://{ref[5:].partition('@')[0]}@{commit_of(hub, ref[5:].partition('@')[0], rev)}"
    for extra in ((), ("--format", "json")):
        local = check_here(models[model], "--gpu", "h100", *extra)
        remote = gac(hub, ref, "--gpu", "h100", *extra)
        assert remote.returncode == local.returncode and remote.stderr == local.stderr == ""
        same_but_name(local.stdout, remote.stdout, str(models[model].resolve()), name)
    assert json.loads(remote.stdout)["model_dir"] == name
    if model == "sliced":  # the widths SliceGPT's sidecar declares were read and compared
        assert "tiny-llama_0.3.json says attention_output_dimensions[1]=48" in remote.stdout



def test_a_long_header_takes_a_second_range_request(hub, models) -> None:
    weights = models["deep"] / "model.safetensors"
    n = int.from_bytes(weights.read_bytes()[:8], "little")
    assert n + 8 > FIRST_READ  # the fixture is what this test is about
    local = check_here(models["deep"], "--gpu", "h100", "--format", "json")
    for ranges in (True, False):  # with Range, and from a server that ignores it
        hub.reset()
        hub.ranges = ranges
        remote = gac(hub, "hf://org/deep", "--gpu", "h100", "--format", "json",
                     HF_HOME=str(hub.home / str(ranges)))
        assert json.loads(remote.stdout)["sites"] == json.loads(local.stdout)["sites"]
        gets = [rng for m, p, rng in hub.log if m == "GET" and p.startswith("/cdn/")]
        assert gets == [f"bytes=0-{FIRST_READ - 1}", f"bytes={FIRST_READ}-{n + 7}"]

def test_a_commit_id_is_a_revision_too(hub, models) -> None:
    commit = commit_of(hub, "org/tiny", "v2")
    local = check_here(models["single"], "--gpu", "a100")
    remote = gac(hub, f"hf://org/tiny@{commit}", "--gpu", "a100")
    same_but_name(local.stdout, remote.stdout, str(models["single"].resolve()),
                  f"hf://org/tiny@{commit}")


def test_bare_org_name_is_a_hub_model_unless_such_a_directory_exists(hub, models,
                                                                     tmp_path) -> None:
    remote = gac(hub, "org/single", "--gpu", "h100", cwd=tmp_path)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.startswith(f"gac-check hf://org/single@{commit_of(hub, 'org/single')}")
    llama(tmp_path / "org" / "single", 170, vocab=128)  # now a directory by that name exists
    local = gac(hub, "org/single", "--gpu", "h100", cwd=tmp_path)
    assert local.returncode == 1 and local.stdout.startswith("gac-check ")
    assert "hf://" not in local.stdout


def test_bytes_fetched_are_headers_not_weights(hub, models) -> None:
    proc = gac(hub, "hf://org/tiny", "--gpu", "h100", "--verbose")
    assert proc.returncode == 1, proc.stderr
    reported = int(re.search(r"fetched ([\d,]+) bytes", proc.stderr).group(1).replace(",", ""))
    assert reported == hub.bytes_sent  # the client's count is the server's
    shards = sorted(models["sharded"].glob("*.safetensors"))
    weights = sum(p.stat().st_size for p in shards)
    assert len(shards) >= 3 and weights > 1_000_000
    json_files = sum(p.stat().st_size for p in models["sharded"].glob("*.json"))
    assert hub.bytes_sent < json_files + len(shards) * FIRST_READ + 4096  # + listing, errors
    assert hub.bytes_sent < weights / 10
    weight_gets = [(path, rng) for method, path, rng in hub.log
                   if method == "GET" and path.startswith("/cdn/")]
    assert len(weight_gets) == len(shards) and all(rng for _, rng in weight_gets)


def test_second_check_reuses_the_cache_and_works_offline(hub, models) -> None:
    first = gac(hub, "hf://org/tiny", "--gpu", "h100")
    hub.reset()
    again = gac(hub, "hf://org/tiny", "--gpu", "h100", "--verbose")
    assert again.stdout == first.stdout
    assert [p for _, p, _ in hub.log if "/resolve/" in p or "/cdn/" in p] == []  # listing only
    hub.stop()  # the network is gone: the cached listing and headers still answer
    down = gac(hub, "hf://org/tiny", "--gpu", "h100", "--verbose")
    offline = gac(hub, "hf://org/tiny", "--gpu", "h100", "--verbose", HF_HUB_OFFLINE="1")
    for proc in (down, offline):
        assert proc.returncode == first.returncode and proc.stdout == first.stdout
        assert "offline, from the cache" in proc.stderr



def test_a_shard_already_in_the_hub_cache_is_read_from_there(hub, models) -> None:
    shards = sorted(models["sharded"].glob("*.safetensors"))
    download = ("from huggingface_hub import hf_hub_download; "
                f"hf_hub_download('org/tiny', {shards[0].name!r}, "
                f"revision={commit_of(hub, 'org/tiny')!r})")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    subprocess.run([sys.executable, "-c", download], check=True, timeout=60,
                   env=env | {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(hub.home)})
    hub.reset()
    proc = gac(hub, "hf://org/tiny", "--gpu", "h100", "--verbose")
    local = check_here(models["sharded"], "--gpu", "h100")
    same_but_name(local.stdout, proc.stdout, str(models["sharded"].resolve()),
                  f"hf://org/tiny@{commit_of(hub, 'org/tiny')}")
    assert f"{len(shards)} weight file header(s), 1 from the cache" in proc.stderr
    cdn = [p for m, p, _ in hub.log if m == "GET" and p.startswith("/cdn/")]
    assert len(cdn) == len(shards) - 1


def test_a_server_without_range_support_costs_no_weights(hub, models) -> None:
    hub.ranges = False  # every GET answers 200 with the whole file
    proc = gac(hub, "hf://org/tiny", "--gpu", "h100", "--verbose")
    local = check_here(models["sharded"], "--gpu", "h100")
    same_but_name(local.stdout, proc.stdout, str(models["sharded"].resolve()),
                  f"hf://org/tiny@{commit_of(hub, 'org/tiny')}")
    fetched = int(re.search(r"fetched ([\d,]+) bytes", proc.stderr).group(1).replace(",", ""))
    weights = sum(p.stat().st_size for p in models["sharded"].glob("*.safetensors"))
    assert fetched < weights / 4  # read as far as the headers, then hung up

def test_offline_without_a_previous_check_is_refused(hub) -> None:
    line = refusal(gac(hub, "hf://org/tiny", HF_HUB_OFFLINE="1"))
    assert "offline" in line and "never checked here before" in line


def test_missing_repo_is_one_line_and_exit_2(hub, tmp_path) -> None:
    line = refusal(gac(hub, "hf://org/nothing", "--gpu", "h100"))
    assert line == f"gac-check: hf://org/nothing: no such model on {hub.endpoint} (if it is " \
                   "private, set HF_TOKEN)"
    bare = refusal(gac(hub, "org/nothing", cwd=tmp_path))
    assert "org/nothing: no such directory here, and no such model" in bare


def test_missing_revision_is_refused(hub) -> None:
    assert "has no revision 'v9'" in refusal(gac(hub, "hf://org/tiny@v9"))


def test_server_dying_mid_request_is_a_clean_refusal(hub, models, tmp_path) -> None:
    shard = sorted(models["sharded"].glob("*.safetensors"))[1].name
    hub.die_on = shard
    report = tmp_path / "r.html"
    line = refusal(gac(hub, "hf://org/tiny", "--report", report))
    assert "hf://org/tiny" in line and "connection" in line and "nothing was checked" in line
    assert not report.exists() and not report.with_suffix(".json").exists()
    assert hub.stopped.wait(30), "the server never stopped"
    after = refusal(gac(hub, "hf://org/single"))  # and now nothing listens at all
    assert "cannot reach" in after and "never checked here before" in after



@pytest.mark.parametrize("body", [
    b"<html>a captive portal</html>",                              # not JSON
    b'{"id": "org/tiny", "sha": 5, "siblings": []}',               # no commit
    b'{"id": "org/tiny", "sha": "' + b"a" * 40 + b'", "siblings": [{"size": 3}]}',  # no names
    b'{"id": "org/tiny", "sha": "' + b"a" * 40 + b'", "siblings": [{"rfilename": 7}]}',
])
def test_a_server_that_is_not_a_hub_is_refused(hub, body) -> None:
    hub.info_body = body
    line = refusal(gac(hub, "hf://org/tiny"))
    assert line.startswith(f"gac-check: hf://org/tiny: {hub.endpoint} ")

def test_pickled_weights_are_refused_as_needing_a_download(hub) -> None:
    line = refusal(gac(hub, "hf://org/pickled"))
    assert "pytorch_model.bin: is a torch.save pickle" in line
    assert "would have to be downloaded" in line
    assert not any(p.endswith(".bin") for _, p, _ in hub.log if p.startswith("/cdn/")) and \
        not any(m == "GET" and p.endswith(".bin") for m, p, _ in hub.log)


def test_remote_headers_get_the_local_validation(hub, models) -> None:
    local = refusal(check_here(models["bad"]))
    remote = refusal(gac(hub, "hf://org/bad"))
    local_file = f"{models['bad'].resolve()}/model.safetensors"
    remote_file = f"hf://org/bad@{commit_of(hub, 'org/bad')}/model.safetensors"
    assert "has trailing data (8 bytes)" in local
    assert remote.replace(remote_file, "<file>") == local.replace(local_file, "<file>")


def test_gated_repo_needs_a_token(hub, models) -> None:
    line = refusal(gac(hub, "hf://org/gated"))
    assert "is gated" in line and "HF_TOKEN" in line
    ok = gac(hub, "hf://org/gated", "--gpu", "h100", HF_TOKEN="hf_secret")
    local = check_here(models["single"], "--gpu", "h100")
    assert ok.returncode == local.returncode == 0, ok.stderr


def test_repair_and_realign_refuse_remote_models(hub, tmp_path) -> None:
    for flag in ("--repair", "--realign"):
        line = refusal(gac(hub, "hf://org/tiny", flag, tmp_path / "out"))
        assert f"{flag} needs the weights" in line
    assert not (tmp_path / "out").exists()
    assert not hub.log  # refused before anything was fetched


def test_zoo_merges_several_models_into_one_report(hub, models, tmp_path) -> None:
    names = ["hf://org/tiny", "hf://org/tiny@v2", str(models["single"])]
    singles = [json.loads(gac(hub, n, "--gpu", "h100", "--format", "json").stdout)
               for n in names]
    listed = tmp_path / "zoo.txt"
    listed.write_text(f"# the release\n{names[1]}\n\n{names[2]}  # local copy\n")
    text = gac(hub, names[0], "--models-from", listed, "--gpu", "h100")
    assert text.returncode == 1, text.stderr  # org/tiny has an error-level site
    table = text.stdout[text.stdout.index("model zoo: 3 models against the h100 contract"):]
    rows = table.splitlines()[3:6]
    short = f"hf://org/tiny@{commit_of(hub, 'org/tiny')[:12]} "
    assert rows[0].strip().startswith(short.strip()) and "+" in rows[0]
    assert rows[2].strip().startswith(str(models["single"].resolve()))
    assert [r.split()[5] for r in rows] == [str(s["summary"]["misaligned"]) for s in singles]
    assert text.stdout.count("\ngac-check ") + text.stdout.startswith("gac-check ") == 3
    doc = json.loads(gac(hub, *names, "--gpu", "h100", "--format", "json").stdout)
    assert doc["schema"] == "gac-check-run/1" and doc["checks"] == singles
    report = tmp_path / "zoo.html"
    junit = tmp_path / "zoo.xml"
    assert gac(hub, *names, "--gpu", "h100", "--report", report, "--junit", junit,
               "--fail-on", "never").returncode == 0
    html = report.read_text()
    table = html[html.index('<h2 id="models">'):html.index('<h2 id="map">')]
    assert table.count("<tr") == 4  # a header and one row per model, in the order named
    shown = [f"org/tiny@{commit_of(hub, 'org/tiny')[:12]}",
             f"org/tiny@{commit_of(hub, 'org/tiny', 'v2')[:12]}", models["single"].name]
    assert [table.index(f">{m}</td>") for m in shown] == sorted(table.index(f">{m}</td>")
                                                              for m in shown)
    assert all(f'title="{s["model_dir"]}"' in table for s in singles)
    assert json.loads(report.with_suffix(".json").read_text())["checks"] == singles
    xml = junit.read_text()
    assert xml.count("<testsuite ") == 3
    merged = gac(hub, "report", "merge", report.with_suffix(".json"), "-o", tmp_path / "m.html")
    assert merged.returncode == 0, merged.stderr


def test_a_bad_model_in_a_zoo_refuses_the_whole_run(hub, models, tmp_path) -> None:
    report = tmp_path / "zoo.html"
    line = refusal(gac(hub, "hf://org/tiny", "hf://org/nothing", "--report", report))
    assert "hf://org/nothing: no such model" in line
    assert not report.exists()


def test_remote_names_are_checked_before_anything_is_fetched(hub) -> None:
    assert "not a Hub model id" in refusal(gac(hub, "hf://org/a--b"))
    assert "checks models, not datasets" in refusal(gac(hub, "hf://datasets/org/tiny"))
    assert "not a path inside it" in refusal(gac(hub, "hf://org/tiny/config.json"))
    assert not hub.log



def test_a_terminal_sees_no_download_bars_for_kilobytes(hub) -> None:
    """huggingface_hub draws a bar per file it downloads; for a few JSON files that is noise,
    and the remote check must read like the local one on a terminal too."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HF_") and k not in PROXY_VARS}
    env |= {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(hub.home), "NO_PROXY": "*"}
    code, seen = gac_on_terminal("hf://org/tiny", env=env, timeout=120)
    assert code == 1 and seen == ""
