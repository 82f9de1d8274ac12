"""Talking to the Hugging Face Hub for :mod:`gac_check.checkpoint.hub.remote`: bounded requests,
what they cost, and a cache of what a commit holds.

A Hub endpoint is as untrusted as a model directory: it can answer one byte a second, send a
gigabyte where a kilobyte was listed, inflate a megabyte of gzip into a gigabyte, ask for an
hour's wait, or redirect forever. So every request goes through :func:`get`, which bounds it
(docs/security.md, "Hub models"):

* **time**: a whole request, redirects included, ends at its deadline (the user's timeout,
  :mod:`.limits`: ``--hub-timeout`` or the Hub's own variables), however slowly its body
  trickles: what is left of it bounds the connect and the wait for the answer, and a watchdog
  shuts the socket when it passes mid-body; a whole model at most
  :data:`~.limits.MODEL_TIMEOUTS` times the timeout;
* **bytes**: each body is streamed against a cap (its own kind's, the size the listing gave,
  and what is left of the model's :attr:`Limits.max_bytes`); compressed bodies are inflated
  with the same cap on the output, never whole;
* **requests**: at most :attr:`Limits.max_requests` per model, redirects included; a 5xx or a
  429 is retried at most :data:`RETRIES` times, after at most :data:`MAX_WAIT` seconds (a
  longer ``Retry-After`` is a refusal that says when to retry).

Requests use huggingface_hub's shared HTTP client (``get_session``: proxies, ``HF_ENDPOINT``,
its headers and ``HF_TOKEN``), with redirects followed here so that each hop is counted and
bounded and a token never leaves the endpoint's origin. A commit never changes, so its listing,
its JSON files and its shards' header bytes are kept under the Hub's assets cache
(``cached_assets_path``), only once validated; the cache is as untrusted as the network.
"""
from __future__ import annotations

import contextlib
import email.utils
import json
import re
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

import httpx2
from huggingface_hub import constants
from huggingface_hub.utils import build_hf_headers, cached_assets_path, get_session

from gac_check.checkpoint.atomic import write_atomic
from gac_check.checkpoint.files import MAX_JSON_BYTES, open_regular
from gac_check.checkpoint.hub.limits import MODEL_TIMEOUTS, Limits
from gac_check.checkpoint.safetensors_header import MAX_HEADER_BYTES
from gac_check.errors import BadInput

COMMIT = re.compile(r"[0-9a-f]{40}$")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)$")
#: No cached listing or header is larger than the largest header or JSON file we accept.
MAX_CACHED_BYTES = max(MAX_HEADER_BYTES + 16, MAX_JSON_BYTES)

#: Retries of a request answered 429 or 5xx, and the longest wait before one.
RETRIES = 2
MAX_WAIT = 5.0
#: Redirects followed per request (the Hub sends LFS files to its CDN: one hop).
MAX_REDIRECTS = 3
#: Bytes of an error response's body ever read.
ERROR_BODY = 4096
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_INFLATE = {"gzip": 47, "x-gzip": 47, "deflate": 47}  # zlib: gzip or zlib header, detected


@dataclass
class Fetch:
    """What indexing a remote model cost, and the budget it is held to."""

    limits: Limits = field(default_factory=Limits)
    bytes: int = 0
    requests: int = 0
    seconds: float = 0.0
    headers_cached: int = 0
    offline: bool = False
    notes: list[str] = field(default_factory=list)
    deadline: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> None:
        self.deadline = time.monotonic() + self.limits.model_seconds

    def left(self) -> float:
        return self.deadline - time.monotonic() if self.deadline else float("inf")

    def bytes_left(self) -> int:
        return self.limits.max_bytes - self.bytes

    def request(self, where: str) -> None:
        with self._lock:
            if self.requests >= self.limits.max_requests:
                raise BadInput(f"{where}: needs more than {self.limits.max_requests} HTTP "
                               "requests for one model (raise --hub-max-requests to allow more)")
            self.requests += 1

    def spend(self, n: int, where: str) -> None:
        with self._lock:
            self.bytes += n
            if self.bytes > self.limits.max_bytes:
                raise over_budget(where, self.limits.max_bytes)


def over_budget(where: str, max_bytes: int) -> BadInput:
    return BadInput(f"{where}: reading it would take the model past {max_bytes:,} bytes "
                    "fetched (a header-only check needs far less; raise --hub-max-bytes to "
                    "allow more)")


class Unreachable(BadInput):
    """The endpoint could not be reached or did not answer in time: a cached copy may do."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.why = why


@dataclass
class Answer:
    status: int
    headers: httpx2.Headers
    body: bytes
    url: str


@dataclass(frozen=True)
class Request:
    """One logical request: where it is said to be from, and its bounds."""

    where: str
    cap: int
    seconds: float  # the user's timeout for it: a total deadline, redirects included
    said_by: str  # the option or variable that set ``seconds``
    stop_at: int | None = None
    commit: str | None = None


def get(url: str, fetch: Fetch, where: str, cap: int, *, headers: dict | None = None,
        stop_at: int | None = None, commit: str | None = None, listing: bool = False) -> Answer:
    """GET ``url``, bounded; a body longer than ``cap`` is refused (or, with ``stop_at``, read
    only that far and the connection dropped: a server that ignores ``Range``).

    Answers below 400 are returned; 429 and 5xx are retried (briefly), other errors are
    returned too, with at most :data:`ERROR_BODY` bytes of body, for the caller to word.
    ``commit``: the ``X-Repo-Commit`` the endpoint must answer with, if it names one.
    ``listing``: a metadata call (the model listing), timed as the Hub times those.
    """
    limits = fetch.limits
    seconds = limits.listing_timeout if listing else limits.download_timeout
    req = Request(where, cap, seconds, limits.said_by(listing), stop_at, commit)
    for attempt in range(RETRIES + 1):
        answer = _get_once(url, fetch, req, headers or {})
        if answer.status not in _RETRY_STATUS:
            return answer
        wait = retry_after(answer.headers)
        if answer.status == 429 and wait is not None and (
                wait > MAX_WAIT or wait > fetch.left() - seconds):
            raise BadInput(f"{where}: rate limited by {endpoint()} (HTTP 429); it asks to "
                           f"wait {wait:.0f} s, until {_clock(wait)}: retry then; nothing "
                           "was checked")
        wait = min(MAX_WAIT, 0.5 * 2 ** attempt if wait is None else wait)
        if attempt == RETRIES or wait > fetch.left() - seconds:
            break
        time.sleep(wait)
    if answer.status == 429:
        raise BadInput(f"{where}: rate limited by {endpoint()} (HTTP 429, {attempt + 1} "
                       "tries); retry in a few minutes; nothing was checked")
    raise BadInput(f"{where}: {endpoint()} answered HTTP {answer.status} (a server error) "
                   f"{attempt + 1} time(s); try again later; nothing was checked")


def _get_once(url: str, fetch: Fetch, req: Request, extra: dict) -> Answer:
    where = req.where
    if fetch.left() <= 0:
        raise Unreachable(where, too_slow(fetch, req, whole_model=True))
    deadline = min(time.monotonic() + req.seconds, fetch.deadline)
    origin = _origin(url)
    headers = {**build_hf_headers(), "Accept-Encoding": "identity", **extra}
    for _ in range(MAX_REDIRECTS + 1):
        fetch.request(where)
        step = max(0.05, deadline - time.monotonic())
        answered = False  # the status line came: a timeout after it is a body too slow
        try:
            with get_session().stream("GET", url, headers=headers, follow_redirects=False,
                                      timeout=httpx2.Timeout(step)) as response, \
                    _Watchdog(response, deadline) as watchdog:
                answered = True
                if req.commit and _origin(url) == origin:
                    served = response.headers.get("X-Repo-Commit")
                    if served is not None and served != req.commit:
                        raise BadInput(f"{where}: {endpoint()} served it from commit "
                                       f"{served[:40]!r}, not {req.commit}; nothing was "
                                       "checked")
                if response.is_redirect and "Location" in response.headers:
                    url = urljoin(url, response.headers["Location"])
                    if _origin(url) != origin:  # the token stays with the endpoint
                        headers = {k: v for k, v in headers.items()
                                   if k.lower() != "authorization"}
                    continue
                if response.status_code >= 400:
                    body = _read(response, fetch, req, ERROR_BODY, deadline, ERROR_BODY)
                else:
                    body = _read(response, fetch, req, req.cap, deadline, req.stop_at)
                if watchdog.fired.is_set():  # cut at the deadline: what came is not the body
                    raise Unreachable(where, too_slow(fetch, req, fetch.left() <= 0))
                return Answer(response.status_code, response.headers, body, url)
        except httpx2.TimeoutException as exc:
            if answered:
                raise Unreachable(where, too_slow(fetch, req, fetch.left() <= 0)) from None
            # the user's figure, not the step left of it: under load the request's own set-up
            # eats into it, and "within 0.987 s" says nothing the user set
            raise Unreachable(where, f"{endpoint()} did not answer within {req.seconds:.3g} s "
                              f"({req.said_by}; {type(exc).__name__}); nothing was checked"
                              ) from None
        except httpx2.ConnectError as exc:
            raise Unreachable(where, f"cannot reach {endpoint()} ({reason(exc)})") from None
        except httpx2.HTTPError as exc:
            if answered and time.monotonic() >= deadline:  # the watchdog shut the socket
                raise Unreachable(where, too_slow(fetch, req, fetch.left() <= 0)) from None
            raise BadInput(f"{where}: the connection to {endpoint()} failed ({reason(exc)}); "
                           "nothing was checked") from None
    raise BadInput(f"{where}: {endpoint()} redirected it more than {MAX_REDIRECTS} times; "
                   "nothing was checked")


class _Watchdog:
    """Shuts a response's socket at the request's deadline, so a body trickled a byte at a
    time, each byte within the read timeout, still ends when the user said: a read timeout
    alone bounds each wait, not the sum of them."""

    def __init__(self, response: httpx2.Response, deadline: float) -> None:
        stream = response.extensions.get("network_stream")
        self.sock = stream.get_extra_info("socket") if stream is not None else None
        self.fired = threading.Event()
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._shut)
        self.timer.daemon = True

    def __enter__(self) -> _Watchdog:
        if isinstance(self.sock, socket.socket):
            self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()

    def _shut(self) -> None:
        self.fired.set()
        with contextlib.suppress(OSError):  # the plain socket's, also under TLS: it wakes
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)  # a recv blocked on it


def _read(response: httpx2.Response, fetch: Fetch, req: Request, cap: int, deadline: float,
          stop_at: int | None) -> bytes:
    """The body, raw bytes counted against the model's budget and inflated (if the server
    compressed it anyway) with ``cap`` on the output; past ``cap``, refused."""
    where = req.where
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity", *_INFLATE):
        raise BadInput(f"{where}: {endpoint()} sent it compressed as {encoding[:40]!r}, which "
                       "gac-check does not inflate; nothing was checked")
    inflate = zlib.decompressobj(_INFLATE[encoding]) if encoding in _INFLATE else None
    length = response.headers.get("Content-Length", "")
    if stop_at is None and inflate is None and length.isdigit() and int(length) > cap:
        raise too_long(where, cap, int(length))
    budget = fetch.bytes_left()  # inflated, a body may not outgrow the model's budget either
    limit = min(cap, budget)
    out = bytearray()
    for chunk in response.iter_raw():
        fetch.spend(len(chunk), where)
        if time.monotonic() > deadline:
            raise Unreachable(where, too_slow(fetch, req, whole_model=fetch.left() <= 0))
        if inflate is not None:
            out += inflate.decompress(chunk, limit + 1 - len(out))
            if inflate.unconsumed_tail:
                out += b"\0"  # more than cap would come out of it
        else:
            out += chunk
        if stop_at is not None and len(out) >= stop_at:
            return bytes(out[:stop_at])
        if len(out) > limit:
            raise too_long(where, cap) if cap <= budget else over_budget(
                where, fetch.limits.max_bytes)
    return bytes(out)


def status_line(where: str, answer: Answer) -> str:
    """An HTTP error as one line: gated, forbidden, not served, or the status itself."""
    if answer.headers.get("X-Error-Code") == "GatedRepo":
        return (f"{where}: is gated; accept its conditions on the Hub and set HF_TOKEN (or "
                "run `hf auth login`)")
    if answer.status == 401:
        return (f"{where}: {endpoint()} asks for a token (HTTP 401 unauthorized); set "
                "HF_TOKEN to one that may read this model; nothing was checked")
    if answer.status == 403:
        return (f"{where}: {endpoint()} refused access (HTTP 403 forbidden); set HF_TOKEN to "
                "a token that may read this model; nothing was checked")
    if answer.status == 404:
        return f"{where}: listed by the Hub, but not served (HTTP 404)"
    return f"{where}: {endpoint()} answered HTTP {answer.status}; nothing was checked"


def too_slow(fetch: Fetch, req: Request, whole_model: bool) -> str:
    if whole_model:
        return (f"reading the model from {endpoint()} took longer than "
                f"{fetch.limits.model_seconds:.3g} s ({MODEL_TIMEOUTS} x "
                f"{fetch.limits.said_by(None)}; too slow); nothing was checked")
    return (f"{endpoint()} took longer than {req.seconds:.3g} s to send it ({req.said_by}; "
            "too slow); nothing was checked")


def too_long(where: str, cap: int, size: int | None = None) -> BadInput:
    sent = f" (it sends {size:,})" if size is not None else ""
    return BadInput(f"{where}: is longer than the {cap:,} bytes gac-check reads of it{sent}")


def retry_after(headers: httpx2.Headers) -> float | None:
    """``Retry-After`` in seconds (delay-seconds or an HTTP date), or None."""
    value = headers.get("Retry-After", "").strip()
    if value.isdigit():
        return float(value[:12])
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _clock(seconds: float) -> str:
    at = datetime.now(timezone.utc).timestamp() + min(seconds, 10 ** 9)
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def endpoint() -> str:
    return constants.ENDPOINT


def content_size(answer: Answer, start: int, where: str) -> int | None:
    """The whole file's size a range answer states (``Content-Range``), or a 200's length."""
    if answer.status == 206:
        m = _CONTENT_RANGE.match(answer.headers.get("Content-Range", ""))
        if not m or int(m.group(1)) != start:
            raise BadInput(f"{where}: the server answered a range request with other bytes "
                           f"({answer.headers.get('Content-Range', '')[:80]!r})")
        return int(m.group(3))
    if answer.status == 200:
        length = answer.headers.get("Content-Length", "")
        return int(length) if length.isdigit() else None
    raise BadInput(f"{where}: the server answered a range request with HTTP {answer.status}")


def reason(exc: BaseException) -> str:
    """An exception in a few words, for a one-line refusal."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@dataclass(frozen=True)
class HubCache:
    """``<HF assets cache>/gac-check/<org--name>/``: ``refs/<revision>`` (the commit it was
    last seen at), ``<commit>/listing.json``, ``<commit>/<file>.json`` (a JSON file as served,
    once it parsed) and ``<commit>/<shard>.header`` (the shard's size as 8 bytes, then its
    first bytes through the end of its header). Only what was validated is stored.

    Writing is best effort: a read-only cache (or a name too long for the filesystem) makes
    the next check slower, never this one fail.
    """

    repo_id: str

    def commit(self, revision: str) -> str | None:
        if COMMIT.match(revision):
            return revision
        raw = self._load("refs", quote(revision, safe=""))
        commit = raw.decode("ascii", "replace") if raw else ""
        return commit if COMMIT.match(commit) else None

    def listing(self, commit: str) -> dict[str, int | None] | None:
        raw = self._load(commit, "listing.json")
        try:
            listing = json.loads(raw) if raw else None
        except ValueError:
            return None
        if not isinstance(listing, dict):
            return None
        return {k: v if type(v) is int and v >= 0 else None for k, v in listing.items()}

    def save_listing(self, revision: str, commit: str, listing: dict[str, int | None]) -> None:
        self._store(commit, "listing.json", json.dumps(listing).encode())
        self._store("refs", quote(revision, safe=""), commit.encode())

    def file(self, commit: str, name: str) -> bytes | None:
        return self._load(commit, quote(name, safe="") + ".file")

    def save_file(self, commit: str, name: str, data: bytes) -> None:
        self._store(commit, quote(name, safe="") + ".file", data)

    def header(self, commit: str, name: str) -> tuple[bytes, int] | None:
        raw = self._load(commit, quote(name, safe="") + ".header")
        if raw is None or len(raw) < 16:
            return None
        return raw[8:], struct.unpack("<Q", raw[:8])[0]

    def save_header(self, commit: str, name: str, head: bytes, size: int) -> None:
        self._store(commit, quote(name, safe="") + ".header", struct.pack("<Q", size) + head)

    def _dir(self) -> Path:
        return Path(constants.HF_ASSETS_CACHE) / "gac-check" / self.repo_id.replace("/", "--")

    def _store(self, sub: str, name: str, data: bytes) -> None:
        try:
            folder = cached_assets_path("gac-check", namespace=self._dir().name, subfolder=sub)
            write_atomic(folder / name, data)
        except (OSError, BadInput, ValueError):
            return

    def _load(self, sub: str, name: str) -> bytes | None:
        """A cached file (regular files only: the cache is no more trusted than the network)."""
        try:
            with open_regular(self._dir() / sub / name) as fh:
                return fh.read(MAX_CACHED_BYTES)
        except BadInput:
            return None
