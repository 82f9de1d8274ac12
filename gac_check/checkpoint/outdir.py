"""Writing an output directory all-or-nothing.

A repair of a 70B checkpoint can fail at tensor 600 of 700; the user must never be left with a
directory that looks like a model but is not. Everything is written into a temporary sibling
(same filesystem, so the final rename is atomic) and renamed into place only on success.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gac_check.checkpoint.atomic import umask
from gac_check.checkpoint.index import link_target
from gac_check.errors import BadInput


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


@contextmanager
def atomic_output_dir(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` when the block succeeds."""
    out = out.resolve()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    tmp.chmod(0o777 & ~umask())  # mkdtemp makes it 0700; OUT should look like any new dir
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists() and force:
        shutil.rmtree(out)
    tmp.rename(out)


def copy_side_files(src: Path, dst: Path, skip: set[str]) -> None:
    """Copy tokenizer files, READMEs and sub-folders the model directory carries.

    Links are followed (a hub snapshot is all links into its blobs), but only to where
    :func:`~gac_check.checkpoint.index.link_target` allows: ``notes.txt -> ~/.ssh/id_rsa`` must not
    land in OUT, at the top level or in a sub-folder.
    """
    def escaping(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if link_target(src, Path(folder) / n) is None}

    for item in src.iterdir():
        if item.name in skip or item.name.startswith(".") or link_target(src, item) is None:
            continue
        if item.is_dir():
            shutil.copytree(item, dst / item.name, ignore=escaping, ignore_dangling_symlinks=True)
        elif item.is_file():
            shutil.copy2(item, dst / item.name)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_file_names(model_dir: Path) -> set[str]:
    """The files a rewritten checkpoint replaces (weights and shard indexes): never copied
    beside the new ones, or a stale index would point at shards that are not there."""
    return {p.name for p in Path(model_dir).iterdir()
            if p.suffix in WEIGHT_SUFFIXES or p.name.endswith(".index.json")}
