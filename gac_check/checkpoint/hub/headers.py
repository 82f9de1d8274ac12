"""A Hub model's tensors from its safetensors headers, read by HTTP range requests: per shard
one range of :data:`FIRST_READ` bytes (a second only for a longer header), never the weights;
the header bytes validated exactly as a local file's (:mod:`.safetensors_header`), and kept per
commit once validated; a shard already downloaded into the Hub cache is read from there."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from gac_check.checkpoint.hub.files import HubCommit, about
from gac_check.checkpoint.hub.transport import content_size, get, over_budget, status_line
from gac_check.checkpoint.safetensors_header import (
    header_length,
    index_header,
    read_safetensors_header,
)
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput

#: The first range asked of every shard: the 8-byte length and, for all but the largest
#: headers (a 5 GB shard of ~100 tensors has a ~10 KB one), the whole header.
FIRST_READ = 16 * 1024
#: Shard headers fetched at once; a 70B model has 30 shards, and each costs one round trip.
WORKERS = 8


def hub_tensors(hub: HubCommit, names: list[str]) -> dict[str, TensorInfo]:
    """Every shard's header (fetched in parallel), merged as :mod:`.index` merges them."""
    with ThreadPoolExecutor(WORKERS) as pool:
        indexes = list(pool.map(lambda name: shard_header(hub, name), names))
    tensors: dict[str, TensorInfo] = {}
    for name, index in zip(names, indexes, strict=True):
        for tensor, info in index.items():
            if tensor in tensors:
                raise BadInput(f"{hub.where(name)}: tensor {tensor!r} is also in "
                               f"{tensors[tensor].file.name}")
            tensors[tensor] = info
    return tensors


def shard_header(hub: HubCommit, name: str) -> dict[str, TensorInfo]:
    """One shard's index: from the Hub cache, our header cache, or two range requests."""
    where = hub.where(name)
    local = hub.downloaded(name)
    if local is not None:  # downloaded before: read its header like a local file's
        hub.fetch.headers_cached += 1
        try:
            return read_safetensors_header(local)
        except BadInput as exc:
            raise about(exc, where) from None
    cached = hub.cache.header(hub.commit, name)
    if cached is not None:
        hub.fetch.headers_cached += 1
        return _index(hub, name, *cached)
    if hub.offline():
        raise BadInput(f"{where}: offline, and its header is not cached")
    try:
        head, size = _header_bytes(hub, name)
    except BadInput as exc:
        raise about(exc, where) from None
    index = _index(hub, name, head, size)
    hub.cache.save_header(hub.commit, name, head, size)
    return index


def _index(hub: HubCommit, name: str, head: bytes, size: int) -> dict[str, TensorInfo]:
    """Validate ``head`` (length prefix and header) for a file of ``size`` bytes."""
    file = hub.snapshot / name
    try:
        n = header_length(head[:8], size, file)
        if len(head) < 8 + n:
            raise BadInput("the header fetched is shorter than it claims", file)
        return index_header(head[8:8 + n], size, file)
    except BadInput as exc:
        raise about(exc, hub.where(name)) from None


def _header_bytes(hub: HubCommit, name: str) -> tuple[bytes, int]:
    """The length prefix and header of a shard, and the shard's size, by range requests."""
    where = hub.where(name)
    first, size = byte_range(hub, name, 0, FIRST_READ)
    listed = hub.listing.get(name)
    if size is None:
        size = listed
    if size is None:
        raise BadInput(f"{where}: the Hub gave no size for it")
    if listed is not None and listed != size:
        raise BadInput(f"{where}: the Hub lists {listed} bytes but serves {size}")
    n = header_length(first[:8], size, hub.snapshot / name)
    if len(first) < 8 + n:
        rest = 8 + n - len(first)
        if rest > hub.fetch.bytes_left():  # refused before a byte of it is asked for
            raise over_budget(f"{where}: its header of {n:,} bytes",
                              hub.fetch.limits.max_bytes)
        more, _ = byte_range(hub, name, len(first), rest)
        first += more
    return first[:8 + n], size


def byte_range(hub: HubCommit, name: str, start: int, length: int) -> tuple[bytes, int | None]:
    """At most ``length`` bytes from ``start``, and the file's size where the server says.

    A server that ignores the range and sends the whole file is read only as far as needed,
    then the connection is dropped: a missing Range feature must not cost the weights.
    """
    where = hub.where(name)
    answer = get(hub.url(name), hub.fetch, where, start + length,
                 headers={"Range": f"bytes={start}-{start + length - 1}"},
                 stop_at=start + length, commit=hub.commit)
    if answer.status >= 400:
        raise BadInput(status_line(where, answer))
    size = content_size(answer, start, where)
    skip = start if answer.status == 200 else 0
    return answer.body[skip:skip + length], size
