"""Writing an output directory all-or-nothing, even across ``kill -9`` and a full disk.

A repair of a 70B checkpoint can fail at tensor 600 of 700; the user must never be left with a
directory that looks like a model but is not. Everything is written into a hidden sibling,
``.OUT.<token>.partial`` (same filesystem, so the final rename is atomic), fsynced file by file
with its directories, and renamed into place only on success. With ``--force`` the old OUT is
renamed aside to ``.OUT.<token>.replaced`` first and deleted only once the new one is in, so
a kill between the two renames loses neither.

A run that is killed cannot clean up, so the next run for the same OUT does: the writer holds
an ``flock`` on its partial directory for as long as it lives (the kernel drops it when the
process dies), and any partial nobody holds is an orphan. An orphaned ``.replaced`` copy is put
back as OUT if OUT is missing (the swap was cut in half), else deleted (only the deletion was).
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gac_check.checkpoint.atomic import fsync_dir, umask
from gac_check.checkpoint.index import link_target
from gac_check.errors import BadInput

PARTIAL, REPLACED = ".partial", ".replaced"


def check_output_dir(out: Path, force: bool, *inputs: Path) -> None:
    """Refuse an OUT that is, holds or lies inside an input (``--force`` would delete the
    input), an existing OUT (unless force) that is not a directory, or a missing parent."""
    out = out.resolve()
    for src in inputs:
        src = src.resolve()
        if out == src or src in out.parents or out in src.parents:
            raise BadInput(f"output directory must not be the input {src}, inside it, or "
                           "contain it", out)
    if out.exists() and not force:
        raise BadInput("already exists (use --force to replace it)", out)
    if out.exists() and not out.is_dir():
        raise BadInput("exists and is not a directory; --force replaces directories only", out)
    if not out.parent.is_dir():
        raise BadInput("parent directory does not exist", out)
    if not os.access(out.parent, os.W_OK):
        raise BadInput("parent directory is not writable", out)
    recover_leftovers(out)  # an OUT missing only because a swap was cut in half comes back


@contextmanager
def atomic_output_dir(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` when the block succeeds.

    An OSError inside the block (a full disk, a read-only target) is re-raised naming the
    file it hit as it would be named in OUT, or OUT itself when the OS did not say.
    """
    out = out.resolve()
    recover_leftovers(out)
    tmp, lock = _new_partial(out)
    try:
        try:
            yield tmp
            _sync_tree(tmp)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), str(_as_in_out(exc, tmp, out)))\
                from None
        _swap_in(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock)


def _new_partial(out: Path) -> tuple[Path, int]:
    """A fresh ``.OUT.<token>.partial`` directory and a held lock on it.

    A cleaner may lock and delete the directory between ``mkdtemp`` and our lock; then the
    inode we locked is no longer the one at that name, and we start over.
    """
    for _ in range(8):
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=PARTIAL, dir=out.parent))
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(tmp).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            tmp.chmod(0o777 & ~umask())  # mkdtemp makes it 0700; OUT should look like any dir
            return tmp, fd
        os.close(fd)
    raise BadInput("could not create a working directory beside it", out)


def _as_in_out(exc: OSError, tmp: Path, out: Path) -> Path:
    """The path an OSError names, as the user will know it (inside OUT, not the partial).

    A failed ``write()`` names no file; the one being written is the newest in the partial.
    """
    where = Path(os.fsdecode(exc.filename)) if exc.filename else _newest_file(tmp)
    if where is None:
        return out
    try:
        return out / where.relative_to(tmp)
    except ValueError:
        return where


def _newest_file(root: Path) -> Path | None:
    newest, when = None, -1
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            try:
                mtime = path.lstat().st_mtime_ns
            except OSError:
                continue
            if mtime > when:
                newest, when = path, mtime
    return newest


def _sync_tree(root: Path) -> None:
    """fsync every file and directory under root, so the rename publishes data, not holes."""
    for folder, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(Path(folder))


def _swap_in(tmp: Path, out: Path, force: bool) -> None:
    """Rename the finished ``tmp`` to ``out``; an old OUT is set aside, then deleted."""
    if not os.path.lexists(out):
        try:
            tmp.rename(out)
        except OSError as exc:  # another run's OUT landed since the check: the same refusal
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            if not force:
                raise BadInput("already exists (use --force to replace it)", out) from None
            return _swap_in(tmp, out, force)
        fsync_dir(out.parent)
        return
    if not force:
        raise BadInput("already exists (use --force to replace it)", out)
    if out.is_symlink() or not out.is_dir():
        raise BadInput("exists and is not a directory; --force replaces directories only", out)
    aside = tmp.with_name(tmp.name.removesuffix(PARTIAL) + REPLACED)
    out.rename(aside)
    try:
        tmp.rename(out)
    except OSError:
        aside.rename(out)
        raise
    fsync_dir(out.parent)
    shutil.rmtree(aside, ignore_errors=True)


def recover_leftovers(out: Path) -> None:
    """Remove what killed runs left beside ``out``; put a set-aside OUT back if OUT is gone.

    Only names this module creates for this OUT are touched, and only when no live process
    holds the partial's lock.
    """
    out = Path(out)
    pattern = re.compile(re.escape(f".{out.name}.") + r"([a-z0-9_]{8})(\.partial|\.replaced)")
    try:
        names = os.listdir(out.parent)
    except OSError:
        return
    found: dict[str, set[str]] = {}
    for name in names:
        match = pattern.fullmatch(name)
        if match:
            found.setdefault(match.group(1), set()).add(match.group(2))
    for token, kinds in sorted(found.items()):
        partial = out.parent / f".{out.name}.{token}{PARTIAL}"
        aside = out.parent / f".{out.name}.{token}{REPLACED}"
        if PARTIAL in kinds and not _remove_if_orphaned(partial):
            continue  # a live run is writing it
        if REPLACED in kinds and _is_plain_dir(aside):
            if os.path.lexists(out):
                shutil.rmtree(aside, ignore_errors=True)
            else:
                aside.rename(out)


def _is_plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _remove_if_orphaned(partial: Path) -> bool:
    """Delete a partial directory nobody holds; False if a live writer holds its lock."""
    if not _is_plain_dir(partial):
        return True
    try:
        fd = os.open(partial, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(partial, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def copy_side_files(src: Path, dst: Path, skip: set[str]) -> None:
    """Copy tokenizer files, READMEs and sub-folders the model directory carries; never a
    dot-entry, at any depth (``.git``, ``.cache/huggingface``, an editor's ``.swp``): those are
    the user's tools' state, not the model's.

    Links are followed (a hub snapshot is all links into its blobs), but only to where
    :func:`~gac_check.checkpoint.index.link_target` allows: ``notes.txt -> ~/.ssh/id_rsa`` must not
    land in OUT, at the top level or in a sub-folder. Copies are new files (contents only), so
    they get the umask's mode like everything else in OUT, not the model directory's: a
    world-readable tokenizer must not stay world-readable under umask 077.
    """
    def escaping(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n.startswith(".") or link_target(src, Path(folder) / n)
                is None or _special(Path(folder) / n)}

    for item in src.iterdir():
        if item.name in skip or item.name.startswith(".") or link_target(src, item) is None:
            continue
        if item.is_dir():
            shutil.copytree(item, dst / item.name, ignore=escaping, ignore_dangling_symlinks=True,
                            copy_function=shutil.copyfile)
            _new_folder_modes(dst / item.name)
        elif item.is_file():
            shutil.copyfile(item, dst / item.name)


def _new_folder_modes(root: Path) -> None:
    """copytree copies each folder's mode from the source; give them a new folder's."""
    mode = 0o777 & ~umask()
    root.chmod(mode)
    for folder, subdirs, _ in os.walk(root):
        for name in subdirs:
            (Path(folder) / name).chmod(mode)


def _special(path: Path) -> bool:
    """A FIFO, socket or device: copying one would block or read a device, so it is skipped."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False  # dangling: copytree's ignore_dangling_symlinks handles it
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_file_names(model_dir: Path) -> set[str]:
    """The files a rewritten checkpoint replaces (weights and shard indexes): never copied
    beside the new ones, or a stale index would point at shards that are not there."""
    return {p.name for p in Path(model_dir).iterdir()
            if p.suffix in WEIGHT_SUFFIXES or p.name.endswith(".index.json")}
