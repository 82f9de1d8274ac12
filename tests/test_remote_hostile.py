"""``gac-check hf://...`` against a hostile Hub: every network step bounded, every answer checked.

A real HTTP server on 127.0.0.1 (:class:`tests.hub_server.HubServer` with :class:`Hostile`
answers) plays an attacker's endpoint: it trickles, stalls, floods, gzip-bombs, rate-limits,
fails, lists names no file may have, and answers a pinned commit with another. The real CLI
runs as a subprocess, measured: wall time, the bytes the server sent, the child's peak
resident memory (``wait4``), and what it left in the cache. Each case must end in the right
answer or one line and exit 2, for a few MB. Only the tests about time (a trickle, a stall, a
slow model) set ``--hub-timeout 1`` and hold the wall clock to :data:`SECONDS`; every other test
runs with :data:`PATIENT` seconds per read, so that a loaded runner (load 8 on 2 cores) slowing
the server's generated answer never turns a cap or a message into a timeout.
"""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests import helpers
from tests.hub_server import Hostile, HubServer

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
GIB = 1 << 30
MIB = 1 << 20
#: How long a case about time may take, start-up (imports) included, on a busy 2-core runner:
#: under the 60 s a hostile answer lasts (tests.hub_server.MAX_HOSTILE_SECONDS), which is what a
#: client without its own deadline would wait.
SECONDS = 45.0
#: ``--hub-timeout`` for the tests whose point is not time: a budget no loaded runner meets.
PATIENT = 60
#: What a server streaming a gigabyte may have pushed before the client hung up: the client
#: reads at most its cap (its peak RSS shows it), but the kernel's socket buffers take more
#: (5 MB seen on loopback; tcp_rmem may grow to 32 MB): far from the gigabyte, never flaky.
PUSHED = 40 * MIB


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    rss: int  # the child's peak resident memory, bytes


def model(path: Path) -> Path:
    m = helpers.tiny_llama(dtype=torch.bfloat16, vocab_size=128, intermediate_size=170,
                           num_key_value_heads=2, num_hidden_layers=2)
    m.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    sharded = root / "sharded"
    helpers.tiny_llama(dtype=torch.bfloat16, vocab_size=128, intermediate_size=170,
                       num_key_value_heads=2, num_hidden_layers=4).save_pretrained(
        sharded, max_shard_size="40KB")
    (sharded / "generation_config.json").unlink()  # no optional sidecar: every byte is needed
    heads7 = model(root / "heads7")  # config.json lies: 7 heads cannot split a width of 64
    cfg = json.loads((heads7 / "config.json").read_text())
    cfg.pop("head_dim", None)
    (heads7 / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 7}))
    return {"single": model(root / "single"), "sharded": sharded, "heads7": heads7}


@pytest.fixture
def hub(models, tmp_path):
    with HubServer({"org/m": {"main": models["single"]},
                    "org/sharded": {"main": models["sharded"]},
                    "org/heads7": {"main": models["heads7"]}}) as server:
        server.home = tmp_path / "hf-home"
        yield server


def gac(hub: HubServer, *args: object, timeout: float = 120, **env: str) -> Run:
    """The CLI against ``hub``, measured: seconds, and peak RSS from ``wait4`` (this child's
    alone, which ``RUSAGE_CHILDREN`` would not give); ``--hub-timeout`` :data:`PATIENT` unless
    the test sets its own, or sets the Hub's timeout variables (which the option would win
    over)."""
    if "--hub-timeout" not in args and not any(k.endswith("_TIMEOUT") for k in env):
        args = (*args, "--hub-timeout", PATIENT)
    child = {k: v for k, v in os.environ.items()
             if not k.startswith("HF_") and k not in PROXY_VARS and k != "GAC_DEBUG"}
    child |= {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(hub.home), "NO_PROXY": "*",
              "HF_HUB_DISABLE_TELEMETRY": "1", **env}
    out, err = (hub.home.parent / f"out-{n}" for n in "12")
    start = time.monotonic()
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "gac_check.cli", *map(str, args)],
                                stdout=o, stderr=e, env=child)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(proc.returncode, out.read_text(), err.read_text(), time.monotonic() - start,
               usage.ru_maxrss * 1024)


def refusal(run: Run) -> str:
    """The one stderr line of a refusal: exit 2, nothing on stdout."""
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gac-check: "), run.stderr
    return lines[0]


def timely_refusal(run: Run) -> str:
    """A refusal that the client's own deadline made, well before a hostile answer ends."""
    assert run.seconds < SECONDS, run.seconds
    return refusal(run)


def left_in_cache(hub: HubServer) -> dict[str, int]:
    """Every file under HF_HOME and its size (the Hub cache and ours)."""
    return {str(p.relative_to(hub.home)): p.stat().st_size
            for p in hub.home.rglob("*") if p.is_file()} if hub.home.exists() else {}


@pytest.fixture(scope="module")
def baseline(models, tmp_path_factory) -> Run:
    """An honest check of the same model: what a hostile one may not exceed by much."""
    with HubServer({"org/m": {"main": models["single"]}}) as server:
        server.home = tmp_path_factory.mktemp("baseline") / "hf-home"
        run = gac(server, "hf://org/m", "--gpu", "h100")
    assert run.returncode in (0, 1) and run.stderr == "", run.stderr
    return run


def small(run: Run, baseline: Run) -> None:
    """Peak memory within 32 MiB of an honest check's: nothing large was held (one 64 KB read
    of a gzip bomb inflated whole would be 64 MB)."""
    assert run.rss < baseline.rss + 32 * MIB, (run.rss, baseline.rss)


# ------------------------------------------------------------------------------- hangs

@pytest.mark.parametrize("how", [Hostile(rate=2, size=100_000),   # one byte every half second
                                 Hostile(stall=60)],               # never a status line
                         ids=["trickle", "silent"])
def test_a_listing_sent_slowly_or_never_times_out(hub, how) -> None:
    hub.hostile["info"] = how
    line = timely_refusal(gac(hub, "hf://org/m", "--hub-timeout", "1"))
    assert "never checked here before" in line
    assert ("took longer than 1 s to send it (--hub-timeout" in line) if how.rate else (
        "did not answer within 1 s (--hub-timeout; " in line), line


def test_a_header_range_sent_slowly_times_out(hub) -> None:
    hub.hostile["model.safetensors"] = Hostile(
        status=206, rate=4, size=16384, headers={"Content-Range": "bytes 0-16383/999999"})
    line = timely_refusal(gac(hub, "hf://org/m", "--hub-timeout", "1"))
    assert "model.safetensors: " in line and "took longer than 1 s to send it" in line
    assert not any(k.endswith(".header") for k in left_in_cache(hub))


def test_an_hour_of_retry_after_is_a_refusal_that_says_when(hub) -> None:
    hub.hostile["info"] = Hostile(status=429, headers={"Retry-After": "3600"}, prefix=b"{}",
                                  size=2)
    line = refusal(gac(hub, "hf://org/m"))
    assert "rate limited" in line and "wait 3600 s, until " in line and "retry then" in line
    assert hub.hostile["info"].served == 1  # no retry, no sleep
    hub.hostile["info"] = Hostile(status=429, headers={"Retry-After": "1"}, prefix=b"{}", size=2)
    line = refusal(gac(hub, "hf://org/m"))
    assert "rate limited" in line and "3 tries" in line
    assert hub.hostile["info"].served == 3


# ----------------------------------------------------------------- bytes, memory, disk

@pytest.mark.parametrize("how", [
    Hostile(prefix=b'{"sha": "', fill=b"a", size=GIB),                   # 1 GiB, said so
    Hostile(prefix=b'{"sha": "', fill=b"a", size=GIB, length=-1),        # 1 GiB, unannounced
    Hostile(prefix=b'{"sha": "', fill=b"a", size=GIB, gzip=True),        # 1 MB inflating to 1 GiB
], ids=["long", "unannounced", "gzip"])
def test_a_huge_listing_is_cut_at_its_cap(hub, baseline, how) -> None:
    hub.hostile["info"] = how
    run = gac(hub, "hf://org/m", "--hub-max-bytes", "1M")
    line = refusal(run)
    assert line.startswith("gac-check: hf://org/m: ")
    assert "1,048,576" in line
    assert hub.bytes_sent < PUSHED
    small(run, baseline)
    assert left_in_cache(hub) == {}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_config_without_a_size_served_as_a_gigabyte_is_cut(hub, baseline, gz) -> None:
    """A config is kilobytes: its own 1 MiB cap stops it, not the model's 16 MiB budget.
    The server's send buffer is its own (HOSTILE_SNDBUF), so what it pushed is what the client
    took: about 1 MiB at load 11 (before, autotuned buffers let 9.4 MB through at load 6)."""
    hub.listed_sizes["config.json"] = None
    hub.hostile["config.json"] = Hostile(prefix=b'{"a": "', fill=b"x", suffix=b'"}', size=GIB,
                                         gzip=gz, length=-1)
    run = gac(hub, "hf://org/m")
    line = refusal(run)
    assert "/config.json: " in line and "1,048,576 bytes gac-check reads of it" in line
    assert hub.hostile["config.json"].sent < 8 * MIB
    small(run, baseline)
    assert not any("config" in k for k in left_in_cache(hub))


def test_a_sidecar_listed_small_and_served_huge_is_skipped_not_fatal(hub, baseline) -> None:
    hub.extra_siblings.append({"rfilename": "rank.json", "size": 10})
    hub.hostile["rank.json"] = Hostile(prefix=b'{"a": "', fill=b"x", suffix=b'"}', size=GIB)
    run = gac(hub, "hf://org/m", "--gpu", "h100", "--verbose")
    assert run.returncode == baseline.returncode and run.stdout.splitlines()[1:] == \
        baseline.stdout.splitlines()[1:]
    notes = run.stderr.splitlines()
    assert len(notes) == 2 and "note: skipped the sidecar" in notes[0]
    assert "rank.json: is longer than the 10 bytes" in notes[0]
    read = int(re.search(r"fetched ([\d,]+) bytes", notes[1]).group(1).replace(",", ""))
    assert read < 256 * 1024  # what the client took in: the model's headers, not the sidecar
    assert hub.bytes_sent < baseline_bytes(hub) + PUSHED
    small(run, baseline)
    assert not any("rank" in k for k in left_in_cache(hub))


def baseline_bytes(hub: HubServer) -> int:
    return sum(p.stat().st_size for p in hub.hub["org/m"].revisions["main"].files().values()
               if p.suffix == ".json") + 64 * 1024


def test_a_header_claiming_99_mb_is_refused_before_it_is_fetched(hub, baseline) -> None:
    size = 200_000_000
    hub.listed_sizes["model.safetensors"] = size
    hub.hostile["model.safetensors"] = Hostile(
        status=206, headers={"Content-Range": f"bytes 0-16383/{size}"},
        prefix=struct.pack("<Q", 99_000_000) + b"{", size=16384)
    run = gac(hub, "hf://org/m")
    line = refusal(run)
    assert "model.safetensors: its header of 99,000,000 bytes" in line
    assert "16,777,216 bytes fetched" in line and "--hub-max-bytes" in line
    assert hub.hostile["model.safetensors"].served == 1 and hub.bytes_sent < 64 * 1024
    small(run, baseline)


@pytest.mark.parametrize(("count", "size"), [(200, 1_000_000), (2000, 20)])
def test_many_sidecars_cost_a_bounded_number_of_requests(hub, baseline, count, size) -> None:
    for i in range(count):
        name = f"side{i:04}.json"
        hub.extra_siblings.append({"rfilename": name, "size": size})
        hub.hostile[name] = Hostile(prefix=b'{"a": "', fill=b"x", suffix=b'"}', size=size)
    run = gac(hub, "hf://org/m", "--gpu", "h100")
    assert run.returncode == baseline.returncode, run.stderr
    assert run.stdout.splitlines()[1:] == baseline.stdout.splitlines()[1:]
    assert f"skipped {count + 1 - 16} more" in run.stderr  # + the model's generation_config
    assert len(hub.log) <= 30 and hub.bytes_sent < 3 * MIB


# ------------------------------------------------------------ wrong answers, messages

def test_a_pinned_commit_answered_with_another_is_refused(hub) -> None:
    commit = hub.hub["org/m"].revisions["main"].commit
    hub.sha_override = "b" * 40
    line = refusal(gac(hub, f"hf://org/m@{commit}"))
    assert f"answered with commit {'b' * 40} for the pinned commit {commit}" in line
    assert left_in_cache(hub) == {}


def test_listed_names_no_file_may_have_are_skipped_with_a_note(hub, baseline) -> None:
    for name in ("evil\x00.json", "..\\..\\evil.json", "x" * 300 + ".json", "../up.json",
                 "/abs.json"):
        hub.extra_siblings.append({"rfilename": name, "size": 3})
    long_ok = "y" * 250 + ".json"  # a legal name whose cache entry would be too long to store
    hub.extra_siblings.append({"rfilename": long_ok, "size": 2})
    hub.hostile[long_ok] = Hostile(prefix=b"{}", size=2)
    run = gac(hub, "hf://org/m", "--gpu", "h100")
    assert run.returncode == baseline.returncode, run.stderr
    assert run.stdout.splitlines()[1:] == baseline.stdout.splitlines()[1:]
    assert len(run.stderr.splitlines()) == 1
    assert "ignored 5 listed file name(s) that are not plain relative paths" in run.stderr
    assert hub.hostile[long_ok].served == 1  # read, used, just not cached


@pytest.mark.parametrize(("target", "status", "says"), [
    ("info", 500, "answered HTTP 500 (a server error) 3 time(s); try again later"),
    ("config.json", 502, "config.json: http://127.0.0.1:"),
    ("config.json", 403, "refused access (HTTP 403 forbidden)"),
    ("config.json", 404, "config.json: listed by the Hub, but not served (HTTP 404)"),
    ("info", 403, "refused access (HTTP 403 forbidden)"),
])
def test_each_failure_says_what_it_is_in_one_line(hub, target, status, says) -> None:
    hub.hostile[target] = Hostile(status=status, prefix=b"{}", size=2)
    line = refusal(gac(hub, "hf://org/m"))
    assert says in line and "offline" not in line
    assert hub.hostile[target].served == (3 if status >= 500 else 1)
    if status >= 500:
        assert f"HTTP {status} (a server error) 3 time(s)" in line


# ------------------------------------------------------------------- budgets per model

def test_the_byte_and_request_budgets_are_per_model_and_exact(hub, models) -> None:
    """An honest sharded model costs B bytes in R requests: B and R pass, one less refuses
    (listing, config, index and headers all count; nothing optional to skip)."""
    assert len(list(models["sharded"].glob("*.safetensors"))) >= 3
    ok = gac(hub, "hf://org/sharded", "--gpu", "h100", "--verbose")
    assert ok.returncode in (0, 1), ok.stderr
    m = re.search(r"fetched ([\d,]+) bytes \((\d+) HTTP response", ok.stderr)
    spent, requests = int(m.group(1).replace(",", "")), int(m.group(2))
    assert spent == hub.bytes_sent
    for flag, limit in (("--hub-max-bytes", spent), ("--hub-max-requests", requests)):
        hub.home = hub.home.with_name(f"home-{flag}")  # a cold cache: everything fetched again
        fits = gac(hub, "hf://org/sharded", "--gpu", "h100", flag, str(limit))
        assert fits.returncode == ok.returncode and fits.stdout == ok.stdout, fits.stderr
        hub.home = hub.home.with_name(f"home-{flag}-1")
        line = refusal(gac(hub, "hf://org/sharded", "--gpu", "h100", flag, str(limit - 1)))
        assert f"{limit - 1:,}" in line and flag in line


def test_a_model_read_slowly_file_after_file_stops_at_the_model_deadline(hub, baseline) -> None:
    """Each sidecar arrives in time for its own request (0.8 s < 1 s) but together they pass
    the model's 6 s: the rest are skipped as too slow, the check itself completes."""
    for i in range(10):
        hub.extra_siblings.append({"rfilename": f"slow{i}.json", "size": 8})
        hub.hostile[f"slow{i}.json"] = Hostile(prefix=b'{"a": 1}', size=8, rate=10)
    run = gac(hub, "hf://org/m", "--gpu", "h100", "--hub-timeout", "1")
    assert run.returncode == baseline.returncode, run.stderr
    assert run.stdout.splitlines()[1:] == baseline.stdout.splitlines()[1:]
    assert "took longer than 6 s (6 x --hub-timeout; too slow)" in run.stderr
    assert run.seconds < SECONDS


@pytest.mark.parametrize(("shard", "says"), [
    ("..\\..\\evil.safetensors", "whose name holds a backslash"),
    ("ok\x01.safetensors", "whose name holds a control character"),
    ("../evil.safetensors", "which is outside the model directory"),
])
def test_an_index_naming_a_shard_no_file_may_have_is_refused(hub, shard, says) -> None:
    """The shard index is required: a bad shard name in it is one line naming the index."""
    body = json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": shard}}).encode()
    hub.listed_sizes["model.safetensors.index.json"] = len(body)
    hub.hostile["model.safetensors.index.json"] = Hostile(prefix=body, size=len(body))
    line = refusal(gac(hub, "hf://org/sharded"))
    assert "/model.safetensors.index.json: refers to " in line and says in line
    assert not any(p.endswith("evil.safetensors") for _, p, _ in hub.log)


def test_a_hub_config_that_lies_about_heads_is_refused_naming_the_hub_file(hub) -> None:
    commit = hub.hub["org/heads7"].revisions["main"].commit
    line = refusal(gac(hub, "hf://org/heads7"))
    assert line.startswith(f"gac-check: hf://org/heads7@{commit}/config.json: says "
                           "num_attention_heads=7, which does not divide the attention width 64")


def test_redirect_loops_and_unknown_encodings_are_refused(hub) -> None:
    commit = hub.hub["org/m"].revisions["main"].commit
    here = f"/org/m/resolve/{commit}/config.json"
    hub.hostile["config.json"] = Hostile(status=302, headers={"Location": here}, size=GIB)
    line = refusal(gac(hub, "hf://org/m"))
    assert "config.json: " in line and "redirected it more than 3 times" in line
    assert hub.hostile["config.json"].served == 4 and hub.bytes_sent < PUSHED  # bodies unread
    hub.hostile["config.json"] = Hostile(headers={"Content-Encoding": "br"}, prefix=b"{}", size=2)
    line = refusal(gac(hub, "hf://org/m"))
    assert "config.json: " in line and "compressed as 'br', which gac-check does not" in line


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    from datetime import datetime, timedelta, timezone
    from email.utils import format_datetime

    import httpx2

    from gac_check.checkpoint.hub.transport import retry_after

    later = format_datetime(datetime.now(timezone.utc) + timedelta(hours=1), usegmt=True)
    assert retry_after(httpx2.Headers({"Retry-After": "3600"})) == 3600
    assert 3500 < retry_after(httpx2.Headers({"Retry-After": later})) <= 3600
    for junk in ("soon", "-5", "", "Wed, 99 Foo 2026"):
        assert retry_after(httpx2.Headers({"Retry-After": junk})) is None


# ------------------------------------------- held to what the server saw, not to our counters

PROBE = """
import json, sys, time, tracemalloc
from gac_check.checkpoint.hub import files, headers, listing
from gac_check.checkpoint.hub.limits import Limits
from gac_check.checkpoint.hub.remote import open_remote
from gac_check.errors import BadInput
limits = Limits(**json.loads(sys.argv[2]))
slowest = 0.0
def timed(get):
    def run(*args, **kwargs):
        global slowest
        start = time.monotonic()
        try:
            return get(*args, **kwargs)
        finally:
            slowest = max(slowest, time.monotonic() - start)
    return run
for module in (files, headers, listing):
    module.get = timed(module.get)
tracemalloc.start()
try:
    open_remote(sys.argv[1], limits)
    said = ""
except BadInput as exc:
    said = str(exc)
print(json.dumps({"slowest": slowest, "peak": tracemalloc.get_traced_memory()[1], "said": said}))
"""


@dataclass
class Probe:
    slowest: float  # the longest one request took (a call of hub.transport.get), imports excluded
    peak: int  # the client's own peak of Python allocations while reading (tracemalloc)
    said: str  # the refusal, or ""


def probe(hub: HubServer, ref: str, env: dict | None = None, **limits: object) -> Probe:
    """``open_remote`` in a child process against ``hub``, measured from inside: the longest
    request and the peak traced memory of reading the model, imports and start-up excluded."""
    child = {k: v for k, v in os.environ.items()
             if not k.startswith("HF_") and k not in PROXY_VARS}
    child |= {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(hub.home), "NO_PROXY": "*",
              "HF_HUB_DISABLE_TELEMETRY": "1", **(env or {})}
    out = subprocess.run([sys.executable, "-c", PROBE, ref, json.dumps(limits)], env=child,
                         capture_output=True, text=True, timeout=120, check=True)
    return Probe(**json.loads(out.stdout))


def test_a_gzip_bomb_costs_the_server_little_and_the_client_its_cap(hub) -> None:
    """A listing of 1 GiB gzipped to ~1 MB: the client inflates at most its 1 MiB cap (its own
    traced peak stays within 3 MiB of an honest read's) and hangs up, so the server sends a
    fraction of the bomb."""
    honest = probe(hub, "hf://org/m", max_bytes=MIB)
    assert honest.said == ""
    hub.home = hub.home.with_name("home-bomb")
    hub.hostile["info"] = Hostile(prefix=b'{"sha": "', fill=b"a", size=GIB, gzip=True)
    bomb = probe(hub, "hf://org/m", max_bytes=MIB)
    assert "past 1,048,576 bytes" in bomb.said or "1,048,576 bytes gac-check reads" in bomb.said
    assert bomb.peak < honest.peak + 3 * MIB, (bomb.peak, honest.peak)
    assert hub.hostile["info"].sent < 8 * MIB


def test_the_token_stays_on_the_endpoint_across_a_redirect(hub) -> None:
    """The Hub sends each shard to its CDN, another origin: the server on that origin never
    sees the token, the endpoint sees it on every request."""
    run = gac(hub, "hf://org/sharded", "--gpu", "h100", HF_TOKEN="hf_secret")
    assert run.returncode in (0, 1), run.stderr
    hub_side = [h for origin, _, h in hub.seen if origin == "hub"]
    cdn_side = [(p, h) for origin, p, h in hub.seen if origin == "cdn"]
    assert len(cdn_side) >= 3  # one per shard
    assert hub_side and all(h.get("authorization") == "Bearer hf_secret" for h in hub_side)
    assert [p for p, h in cdn_side if "authorization" in h] == []


def test_every_redirect_hop_is_a_request_against_the_budget(hub) -> None:
    """What --verbose counts is what reached the server, both origins, redirects included; a
    budget one short of that refuses, and the server sees no more than the budget."""
    ok = gac(hub, "hf://org/sharded", "--gpu", "h100", "--verbose")
    assert ok.returncode in (0, 1), ok.stderr
    requests = int(re.search(r"\((\d+) HTTP response", ok.stderr).group(1))
    cdn = sum(origin == "cdn" for origin, _, _ in hub.seen)
    assert cdn >= 3 and requests == len(hub.seen)
    hub.home = hub.home.with_name("home-short")
    hub.reset()
    line = refusal(gac(hub, "hf://org/sharded", "--hub-max-requests", str(requests - 1)))
    assert f"needs more than {requests - 1} HTTP requests" in line
    assert len(hub.seen) == requests - 1


def test_the_hubs_timeout_variables_are_honoured_and_the_option_wins(hub) -> None:
    """HF_HUB_ETAG_TIMEOUT times the listing, HF_HUB_DOWNLOAD_TIMEOUT the file reads, each a
    total deadline for the request; --hub-timeout, when given, wins over both."""
    hub.hostile["info"] = Hostile(rate=4, size=100_000)
    line = refusal(gac(hub, "hf://org/m", HF_HUB_ETAG_TIMEOUT="1", HF_HUB_DOWNLOAD_TIMEOUT="60"))
    assert "took longer than 1 s to send it (HF_HUB_ETAG_TIMEOUT; too slow)" in line
    assert hub.hostile["info"].sent <= 8  # 4 bytes a second for 1 s, not 3 s
    del hub.hostile["info"]
    hub.hostile["model.safetensors"] = Hostile(
        status=206, rate=4, size=16384, headers={"Content-Range": "bytes 0-16383/999999"})
    line = refusal(gac(hub, "hf://org/m", HF_HUB_DOWNLOAD_TIMEOUT="1", HF_HUB_ETAG_TIMEOUT="60"))
    assert "model.safetensors: " in line
    assert "took longer than 1 s to send it (HF_HUB_DOWNLOAD_TIMEOUT; too slow)" in line
    line = refusal(gac(hub, "hf://org/m", "--hub-timeout", "1", HF_HUB_DOWNLOAD_TIMEOUT="60"))
    assert "took longer than 1 s to send it (--hub-timeout; too slow)" in line


@pytest.mark.parametrize("value", ["soon", "2.5", "-1"])
def test_a_timeout_variable_huggingface_hub_cannot_read_is_one_line(hub, value) -> None:
    line = refusal(gac(hub, "hf://org/m", HF_HUB_DOWNLOAD_TIMEOUT=value))
    assert line.startswith(f"gac-check: HF_HUB_DOWNLOAD_TIMEOUT={value!r}: ")


def test_a_body_trickled_within_each_read_timeout_still_ends_at_the_deadline(hub) -> None:
    """One byte every 1.95 s, each inside a 2 s read timeout: a bound per read would wait
    until the byte after the deadline (3.9 s); the request's deadline (2 s) ends it."""
    hub.hostile["model.safetensors"] = Hostile(
        status=206, rate=1 / 1.95, size=16384, headers={"Content-Range": "bytes 0-16383/999999"})
    slow = probe(hub, "hf://org/m", timeout=2)
    assert "took longer than 2 s to send it (--hub-timeout" in slow.said
    assert 1.9 < slow.slowest < 3.2, slow.slowest


@pytest.mark.parametrize("flag", ["--hub-timeout", "--hub-max-bytes", "--hub-max-requests"])
def test_a_zero_hub_limit_is_refused(hub, flag) -> None:
    run = gac(hub, "hf://org/m", flag, "0")
    assert run.returncode == 2 and f"argument {flag}: must be a positive number" in run.stderr
    assert hub.seen == []


@pytest.mark.parametrize("limit", ["timeout", "max_bytes", "max_requests"])
def test_a_zero_limit_is_refused_by_the_api_too(limit) -> None:
    from gac_check.checkpoint.hub.limits import Limits
    from gac_check.errors import BadInput

    with pytest.raises(BadInput, match="must be a positive number"):
        Limits(**{limit: 0})
