"""A small Hugging Face Hub look-alike on 127.0.0.1, so remote checks are tested offline.

It serves the endpoints huggingface_hub's clients call, shaped the way the Hub answers them:

* ``GET /api/models/{repo}[/revision/{rev}]`` (``HfApi.model_info``): ``sha`` and
  ``siblings`` with sizes; ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound`` when absent.
* ``HEAD|GET /{repo}/resolve/{rev}/{file}`` (``hf_hub_download``, range reads): small files
  answer directly with ``ETag`` and ``X-Repo-Commit``; weight files (LFS on the Hub) answer
  ``302`` to a content-addressed ``/cdn/{sha256}`` URL on a second port (another origin, as
  the Hub's CDN is) with ``X-Linked-Size`` and ``X-Linked-Etag``. Both honour
  ``Range: bytes=a-b`` with ``206`` and ``Content-Range: bytes a-b/size``.

Each repo is a set of revisions (a branch or tag name -> a commit id and a local directory
whose files are served). The server counts every body byte it sends (:attr:`bytes_sent`) so
tests can assert what a check costs, can require a token (gated repos), and can die in the
middle of a response (:attr:`die_on`) to test that a broken connection is a clean refusal.

It can also be hostile, as an attacker's endpoint would be (:class:`Hostile`, keyed by
``"info"`` for the listing or by a file name): answer one byte a second or not at all, send a
gigabyte (generated as it is sent, never held) where ten bytes were listed, gzip a gigabyte of
zeros into a megabyte, answer 429 with an hour's ``Retry-After``, 5xx, 403; list files that
are not there (:attr:`extra_siblings`) or answer a pinned commit with another
(:attr:`sha_override`). Every loop is bounded: by the body's size, :data:`MAX_HOSTILE_SECONDS`,
or the server stopping.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


#: No hostile answer lasts longer than this, whatever the client does.
MAX_HOSTILE_SECONDS = 60.0
#: A hostile answer's send buffer. Left to autotuning, loopback grows it to tcp_wmem's 4 MiB,
#: and what a test sees the server push then depends on how fast a loaded client reads; the
#: server owns its side, so "the server pushed less than N" measures the client.
HOSTILE_SNDBUF = 64 * 1024


@dataclass
class Hostile:
    """One misbehaving answer: after ``stall`` seconds, ``status`` with ``headers`` and a body
    of ``prefix``, ``fill`` repeated, then ``suffix``, ``size`` bytes in all, gzip-compressed
    on the fly if ``gzip`` (``size`` is then the inflated size), sent at ``rate`` bytes a
    second (0: at once). ``length``: the Content-Length sent (default: the true one; -1: none,
    the body ends when the connection closes)."""

    status: int = 200
    headers: dict = field(default_factory=dict)
    prefix: bytes = b""
    fill: bytes = b" "
    suffix: bytes = b""
    size: int = 0
    gzip: bool = False
    rate: float = 0.0
    stall: float = 0.0
    length: int | None = None
    served: int = 0  # how many times it answered
    sent: int = 0  # body bytes it wrote, all answers together


@dataclass
class Revision:
    commit: str
    root: Path

    def files(self) -> dict[str, Path]:
        return {p.relative_to(self.root).as_posix(): p
                for p in sorted(self.root.rglob("*")) if p.is_file()}


@dataclass
class Repo:
    revisions: dict[str, Revision]
    gated: bool = False

    def find(self, rev: str) -> Revision | None:
        if rev in self.revisions:
            return self.revisions[rev]
        return next((r for r in self.revisions.values() if r.commit == rev), None)


def commit_id(repo_id: str, rev: str, root: Path) -> str:
    """A commit id that changes with the files, so no cache can mistake one tree for another."""
    h = hashlib.sha1(f"{repo_id}\0{rev}".encode())
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + _oid(p).encode())
    return h.hexdigest()


@dataclass
class HubServer:
    """``HubServer({"org/name": {"main": dir}})`` then ``with server: ...`` (HF_ENDPOINT =
    :attr:`endpoint`). Repos named in ``gated`` answer only requests bearing ``token``."""

    repos: dict[str, dict[str, Path]]
    gated: set[str] = field(default_factory=set)
    token: str | None = None
    ranges: bool = True  # False: answer every GET with the whole file, as a server without Range
    delay: float = 0.0  # seconds before each answer: a network's round trip (benchmarks)
    info_body: bytes | None = None  # answer model info with this instead (a server gone wrong)
    die_on: str | None = None  # a file name: its GET is cut off halfway, then the server stops
    hostile: dict[str, Hostile] = field(default_factory=dict)  # "info" or a file name
    extra_siblings: list[dict] = field(default_factory=list)  # added to every listing
    sha_override: str | None = None  # the commit every listing claims
    listed_sizes: dict[str, object] = field(default_factory=dict)  # name -> size (None: omit)
    bytes_sent: int = 0
    log: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, range)
    #: Every request as it arrived: ("hub" or "cdn", path, its headers), so a test can hold the
    #: client to what the server saw, not to the client's own counters.
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # names lowercased
    #: Set once both sockets are closed: a server that :attr:`die_on` stops from its own thread,
    #: and a test must wait for that before it relies on nothing listening.
    stopped: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.hub = {name: Repo({rev: Revision(commit_id(name, rev, Path(d)), Path(d))
                                for rev, d in revs.items()}, gated=name in self.gated)
                    for name, revs in self.repos.items()}
        # The Hub and its CDN: two origins, so huggingface_hub stops at the redirect (and keeps
        # the token on the Hub) exactly as it does with huggingface.co and its CDN.
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self)) for _ in "hc"]
        self._threads = []
        for httpd in self._servers:
            httpd.daemon_threads = True
            self._threads.append(threading.Thread(target=httpd.serve_forever, daemon=True))
        hub, cdn = (f"http://127.0.0.1:{s.server_address[1]}" for s in self._servers)
        self.endpoint, self.cdn = hub, cdn

    def __enter__(self) -> HubServer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for httpd, thread in zip(self._servers, self._threads, strict=True):
            if thread.is_alive():
                httpd.shutdown()
            httpd.server_close()
        self.stopped.set()

    def count(self, n: int) -> None:
        with self._lock:
            self.bytes_sent += n

    def reset(self) -> None:
        with self._lock:
            self.bytes_sent = 0
            self.log.clear()
            self.seen.clear()


_OIDS: dict[tuple[Path, str], str] = {}
#: Files larger than this (the benchmark's sparse 5 GB shards) get an id from their name, size
#: and mtime rather than a hash of gigabytes of zeros; only a cache key depends on it.
HASHED_BYTES = 64 * 1024 * 1024
CHUNK = 1024 * 1024


def _oid(path: Path, algo: str = "sha256") -> str:
    st = path.stat()
    key = (path, f"{algo}:{st.st_size}:{st.st_mtime_ns}")
    if key not in _OIDS:
        h = hashlib.new(algo)
        if st.st_size > HASHED_BYTES:
            h.update(key[1].encode() + str(path).encode())
        else:
            h.update(path.read_bytes())
        _OIDS[key] = h.hexdigest()
    return _OIDS[key]


def _sha256(path: Path) -> str:
    return _oid(path)


def _generated(how: Hostile):
    """The body of a hostile answer, chunk by chunk (at most ``size`` bytes, or for gzip at
    most ``size`` bytes inflated): never held whole, so a gigabyte costs the server nothing."""
    left = how.size - len(how.suffix)
    if how.gzip:
        z = zlib.compressobj(9, zlib.DEFLATED, -15)
        crc, total = 0, 0
        packed = bytearray(gzip.compress(b"")[:10])  # the gzip header
    first = how.prefix
    while left > 0 or first:
        piece = first or how.fill * max(1, min(CHUNK, left) // len(how.fill))
        piece = piece[:max(left, len(first))]
        first = b""
        left -= len(piece)
        if how.gzip:  # sent in large writes, so a client reads a bomb in 64 KB gulps
            crc, total = zlib.crc32(piece, crc), total + len(piece)
            packed += z.compress(piece)
            if len(packed) >= 64 * 1024:
                yield bytes(packed)
                packed.clear()
        else:
            yield piece
    if how.suffix and how.gzip:
        crc, total = zlib.crc32(how.suffix, crc), total + len(how.suffix)
        packed += z.compress(how.suffix)
    elif how.suffix:
        yield how.suffix
    if how.gzip:
        trailer = crc.to_bytes(4, "little") + (total & 0xFFFFFFFF).to_bytes(4, "little")
        yield bytes(packed) + z.flush() + trailer


def _handler(server: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the Hub and huggingface_hub's client use

        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, head: bool) -> None:
            if server.delay:
                time.sleep(server.delay)
            path = urlsplit(self.path).path
            server.log.append((self.command, path, self.headers.get("Range", "")))
            origin = "cdn" if self.server is server._servers[1] else "hub"
            server.seen.append((origin, path, {k.lower(): v for k, v in self.headers.items()}))
            if path.startswith("/api/models/"):
                return self._model_info(unquote(path[len("/api/models/"):]))
            if path.startswith("/cdn/"):
                return self._cdn(path[len("/cdn/"):], head)
            m = re.match(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
            if not m:
                return self._error(404, "RepoNotFound")
            repo_id, rev, name = m.group(1), unquote(m.group(2)), unquote(m.group(3))
            return self._resolve(repo_id, rev, name, head)

        def _model_info(self, rest: str) -> None:
            repo_id, _, rev = rest.partition("/revision/")
            if server.info_body is not None:
                return self._send(200, server.info_body, {"Content-Type": "application/json"},
                                  head=False)
            if "info" in server.hostile:
                return self._hostile(server.hostile["info"])
            repo = server.hub.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound")
            revision = repo.find(rev or "main")
            if revision is None:
                return self._error(404, "RevisionNotFound")
            siblings = list(server.extra_siblings)
            for name, p in revision.files().items():
                entry = {"rfilename": name, "size": p.stat().st_size, "blobId": _oid(p, "sha1")}
                if name.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"sha256": _sha256(p), "size": p.stat().st_size,
                                    "pointerSize": 134}
                if name in server.listed_sizes:
                    entry["size"] = server.listed_sizes[name]
                    if entry["size"] is None:
                        del entry["size"]
                siblings.append(entry)
            body = json.dumps({"id": repo_id, "modelId": repo_id,
                               "sha": server.sha_override or revision.commit,
                               "private": False, "gated": "manual" if repo.gated else False,
                               "siblings": siblings}).encode()
            self._send(200, body, {"Content-Type": "application/json"}, head=False)

        def _resolve(self, repo_id: str, rev: str, name: str, head: bool) -> None:
            repo = server.hub.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound")
            if repo.gated and self.headers.get("Authorization") != f"Bearer {server.token}":
                return self._error(401, "GatedRepo")
            revision = repo.find(rev)
            if revision is None:
                return self._error(404, "RevisionNotFound")
            if name in server.hostile:
                return self._hostile(server.hostile[name])
            file = revision.files().get(name)
            extra = {"X-Repo-Commit": revision.commit}
            if file is None:
                return self._error(404, "EntryNotFound", extra)
            if name.endswith(LFS_SUFFIXES):  # the Hub sends LFS files to its CDN
                digest = _sha256(file)
                extra |= {"Location": f"{server.cdn}/cdn/{digest}", "X-Linked-Etag": f'"{digest}"',
                          "X-Linked-Size": str(file.stat().st_size), "ETag": '"pointer"'}
                return self._send(302, b"", extra, head)
            extra["ETag"] = f'"{_oid(file, "sha1")}"'
            self._content(file, extra, head)

        def _cdn(self, digest: str, head: bool) -> None:
            for repo in server.hub.values():
                for revision in repo.revisions.values():
                    for p in revision.files().values():
                        if p.name.endswith(LFS_SUFFIXES) and _sha256(p) == digest:
                            return self._content(p, {"ETag": f'"{digest}"'}, head)
            self._error(404, "EntryNotFound")

        def _content(self, file: Path, headers: dict, head: bool) -> None:
            size = file.stat().st_size
            die = file.name == server.die_on
            m = _RANGE.match(self.headers.get("Range", "")) if server.ranges else None
            if not m:
                return self._stream(file, size, headers, head, die)
            headers = {**headers, "Accept-Ranges": "bytes"}
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            if start >= size:
                headers["Content-Range"] = f"bytes */{size}"
                return self._send(416, b"", headers, head)
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            with file.open("rb") as fh:
                fh.seek(start)
                part = fh.read(end + 1 - start)
            self._send(206, part, headers, head, die=die)

        def _stream(self, file: Path, size: int, headers: dict, head: bool, die: bool) -> None:
            """The whole file, in chunks; a client that hangs up early just ends it."""
            if head or die or size <= CHUNK:
                return self._send(200, b"" if head else file.read_bytes(), headers, head,
                                  die=die, length=size)
            self._send(200, b"", headers, head=True, length=size)
            try:
                with file.open("rb") as fh:
                    while chunk := fh.read(CHUNK):
                        self.wfile.write(chunk)
                        server.count(len(chunk))
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _hostile(self, how: Hostile) -> None:
            """Answer as ``how`` says; every loop ends by size, time, or the server stopping."""
            how.served += 1
            end = time.monotonic() + MAX_HOSTILE_SECONDS
            stalled = time.monotonic() + min(how.stall, MAX_HOSTILE_SECONDS)
            while time.monotonic() < stalled and not server.stopped.is_set():
                time.sleep(0.05)
            body = _generated(how)
            length = how.length
            if length is None and not how.gzip:
                length = max(how.size, len(how.prefix) + len(how.suffix))
            self.send_response(how.status)
            for key, value in how.headers.items():
                self.send_header(key, value)
            if how.gzip:
                self.send_header("Content-Encoding", "gzip")
            if length is not None and length >= 0:
                self.send_header("Content-Length", str(length))
            self.send_header("Connection", "close")  # said, so a client never reuses it
            self.close_connection = True
            self.end_headers()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, HOSTILE_SNDBUF)
            try:
                for chunk in body:
                    if time.monotonic() > end or server.stopped.is_set():
                        break
                    if how.rate:
                        for i in range(len(chunk)):
                            if time.monotonic() > end or server.stopped.is_set():
                                break
                            self.wfile.write(chunk[i:i + 1])
                            self.wfile.flush()
                            server.count(1)
                            how.sent += 1
                            time.sleep(1 / how.rate)
                        continue
                    self.wfile.write(chunk)
                    server.count(len(chunk))
                    how.sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

        def _error(self, status: int, code: str, extra: dict | None = None) -> None:
            body = json.dumps({"error": code}).encode()
            self._send(status, body, {"X-Error-Code": code, "Content-Type": "application/json",
                                      **(extra or {})}, head=self.command == "HEAD")

        def _send(self, status: int, body: bytes, headers: dict, head: bool,
                  die: bool = False, length: int | None = None) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if head:
                return
            if die and not head:  # half the body, then the connection and the server go away
                self.wfile.write(body[: len(body) // 2])
                server.count(len(body) // 2)
                self.wfile.flush()
                self.close_connection = True
                threading.Thread(target=server.stop, daemon=True).start()
                return
            self.wfile.write(body)
            server.count(len(body))

    return Handler
