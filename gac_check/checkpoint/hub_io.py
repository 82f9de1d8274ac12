"""Talking to the Hugging Face Hub for :mod:`gac_check.checkpoint.remote`: range reads, what
they cost, and a cache of what a commit holds.

Everything goes through huggingface_hub's shared HTTP client (``get_session``), so
``HF_ENDPOINT``, ``HF_TOKEN``, proxies and offline mode apply as they do to
``hf_hub_download``. Bytes are counted on that client (every response body it receives while a
check runs), not estimated. A commit never changes, so its file listing and its shards' header
bytes are kept under the Hub's assets cache (``cached_assets_path``) and a model checked once
can be checked again without the network; the cache is as untrusted as the network, and
every header read from it is validated again.
"""
from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx2
from huggingface_hub import constants
from huggingface_hub.utils import (
    build_hf_headers,
    cached_assets_path,
    get_session,
    hf_raise_for_status,
)

from gac_check.checkpoint.atomic import write_atomic
from gac_check.checkpoint.files import MAX_JSON_BYTES, open_regular
from gac_check.checkpoint.safetensors_header import MAX_HEADER_BYTES
from gac_check.errors import BadInput

COMMIT = re.compile(r"[0-9a-f]{40}$")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)$")
#: No cached listing or header is larger than the largest header or JSON file we accept.
MAX_CACHED_BYTES = max(MAX_HEADER_BYTES + 16, MAX_JSON_BYTES)


@dataclass
class Fetch:
    """What indexing a remote model cost: HTTP body bytes, responses, seconds, cache use."""

    bytes: int = 0
    requests: int = 0
    seconds: float = 0.0
    headers_cached: int = 0
    offline: bool = False


@contextmanager
def counted(fetch: Fetch) -> Iterator[None]:
    """Count the body bytes of every response huggingface_hub's shared client receives."""
    hooks = get_session().event_hooks["response"]
    seen: list[httpx2.Response] = []
    hook = seen.append
    hooks.append(hook)
    try:
        yield
    finally:
        if hook in hooks:
            hooks.remove(hook)
        fetch.requests += len(seen)
        fetch.bytes += sum(r.num_bytes_downloaded for r in seen)


def get_range(url: str, start: int, length: int, where: str) -> tuple[bytes, int | None]:
    """At most ``length`` bytes from ``start``, and the file's size where the server says it.

    A server that ignores the range and sends the whole file is read only as far as needed,
    then the connection is dropped: a missing Range feature must not cost the weights.
    """
    headers = {**build_hf_headers(), "Range": f"bytes={start}-{start + length - 1}",
               "Accept-Encoding": "identity"}
    with get_session().stream("GET", url, headers=headers,
                              timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
        if response.status_code >= 400:
            response.read()
            hf_raise_for_status(response)
        size = _size(response, start, where)
        skip = start if response.status_code == 200 else 0
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= skip + length:
                break
    return bytes(data[skip:skip + length]), size


def _size(response: httpx2.Response, start: int, where: str) -> int | None:
    if response.status_code == 206:
        m = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if not m or int(m.group(1)) != start:
            raise BadInput(f"{where}: the server answered a range request with other bytes "
                           f"({response.headers.get('Content-Range')!r})")
        return int(m.group(3))
    if response.status_code == 200:
        length = response.headers.get("Content-Length")
        return int(length) if length and length.isdigit() else None
    raise BadInput(f"{where}: the server answered a range request with HTTP "
                   f"{response.status_code}")


def reason(exc: BaseException) -> str:
    """An exception in a few words, for a one-line refusal."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass(frozen=True)
class HubCache:
    """``<HF assets cache>/gac-check/<org--name>/``: ``refs/<revision>`` (the commit it was
    last seen at), ``<commit>/listing.json`` and ``<commit>/<shard>.header`` (the shard's size
    as 8 bytes, then its first bytes through the end of its header).

    Writing is best effort: a read-only cache makes the next check slower, never this one fail.
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
        return {k: v if isinstance(v, int) else None for k, v in listing.items()}

    def save_listing(self, revision: str, commit: str, listing: dict[str, int | None]) -> None:
        self._store(commit, "listing.json", json.dumps(listing).encode())
        self._store("refs", quote(revision, safe=""), commit.encode())

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
        except (OSError, BadInput):
            return

    def _load(self, sub: str, name: str) -> bytes | None:
        """A cached file (regular files only: the cache is no more trusted than the network)."""
        try:
            with open_regular(self._dir() / sub / name) as fh:
                return fh.read(MAX_CACHED_BYTES)
        except BadInput:
            return None
