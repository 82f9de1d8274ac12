"""The one way gac-check writes a file another process may read, and the one lock it takes.

Reports, run documents and baselines are read by CI viewers and by concurrent pytest workers:
a reader must see the old file or the new one, never half of one, and a new file must get the
permissions any new file would get (``mkstemp`` alone leaves 0600, hiding a report from the CI
user that serves it). Baseline merges are read-modify-write, so they also need a lock.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Write ``data`` to a temporary sibling, fsync it, and rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fchmod(fh.fileno(), 0o666 & ~umask())
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def file_lock(lock: Path) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on the file ``lock`` (created if absent), across processes."""
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<file>.lock`` beside ``path`` (held across read-merge-write)."""
    lock = Path(path).with_name(Path(path).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock):
        yield
