"""The one way gac-check writes a file another process may read, and the one lock it takes.

Reports, run documents and baselines are read by CI viewers and by concurrent pytest workers:
a reader must see the old file or the new one, never half of one, and a new file must get the
permissions any new file would get (``mkstemp`` alone leaves 0600, hiding a report from the CI
user that serves it). Baseline merges are read-modify-write, so they also need a lock: on the
file's directory, so nothing but the file is left beside it.

A writer killed mid-write leaves its ``.<name>.<token>.partial`` temporary behind; it holds an
``flock`` on it while alive, so the next write of the same file removes any temporary nobody
holds. Every OSError is re-raised naming the file being written: "No space left on device"
alone does not say where.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path


def umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the names in it (a rename) survive a crash, not only the data."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path | str, data: str | bytes, replace: bool = True) -> None:
    """Write ``data`` to a temporary sibling, fsync it, and rename it over ``path``;
    ``replace=False``: link it in only if ``path`` does not exist (else FileExistsError), so
    of two racing writers exactly one lands and the other is told. Missing parent directories
    are created (as pytest does for ``--junitxml``)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(path)
        fd, tmp = _locked_temp(path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fchmod(fh.fileno(), 0o666 & ~umask())
            os.fsync(fh.fileno())
            if replace:  # still holding the lock: no cleaner mistakes it for an orphan
                os.replace(tmp, path)
            else:
                os.link(tmp, path)
                os.unlink(tmp)
        fsync_dir(path.parent)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise


def _locked_temp(path: Path) -> tuple[int, str]:
    """A new temporary beside ``path``, locked; retried if a cleaner took it before the lock."""
    import tempfile  # only when writing: a plain check writes nothing

    for _ in range(8):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                return fd, tmp
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(errno.EAGAIN, "could not create a temporary file beside it", str(path))


def _remove_orphans(path: Path) -> None:
    """Delete temporaries of ``path`` left by killed writers (nobody holds their lock)."""
    pattern = re.compile(re.escape(f".{path.name}.") + r"[a-z0-9_]{8}\.partial")
    for name in os.listdir(path.parent):
        if not pattern.fullmatch(name):
            continue
        orphan = path.parent / name
        try:
            fd = os.open(orphan, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            orphan.unlink(missing_ok=True)
        except OSError:
            continue  # held: a live writer
        finally:
            os.close(fd)


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
    """An exclusive lock for a read-merge-write of ``path``, across processes.

    The lock is an ``flock`` on the directory holding ``path`` (created if absent), not on a
    ``<file>.lock`` beside it: a baseline lives in the user's repository, and a lock file left
    there would show up in ``git status`` (a lock file cannot be deleted safely while another
    process may be waiting on it). It serialises every locked write in that directory, which
    for a few baseline files is no cost. Works on local file systems (Linux, macOS).
    """
    parent = Path(path).parent
    parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock
