"""Opening and parsing files from strangers with bounded work: the one door every read uses.

A model directory is attacker-controlled: ``config.json`` can be a FIFO (opening it blocks
forever), a link can loop, a name can hold a NUL byte, and a JSON document can nest 100,000
levels deep or hold a 5,000-digit integer. Each of those used to surface as a hang, a
RecursionError or a ValueError far from the file. Here every such failure becomes one
:class:`~gac_check.errors.BadInput` naming the file, before any later code hashes, recurses
into or prints what was read.

Bounds (docs/security.md): regular files only (checked before opening and again on the open
descriptor, so a swap in between is caught); JSON at most :data:`MAX_JSON_DEPTH` levels deep
(safetensors' own parser refuses 128), integers of at most :data:`MAX_INT_DIGITS` digits,
finite numbers only, valid UTF-8 with no lone surrogates.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from gac_check.errors import BadInput

#: config.json, shard indexes and run documents larger than this are not configs.
MAX_JSON_BYTES = 64 * 1024 * 1024
#: Deepest nesting accepted: serde_json (safetensors' parser) refuses 128 levels.
MAX_JSON_DEPTH = 127
#: Longest integer literal accepted: past ~309 digits a number no longer fits a float, so no
#: config value needs more, and Python refuses to parse more than 4,300 anyway.
MAX_INT_DIGITS = 300

_KINDS = ((stat.S_ISDIR, "Is a directory"), (stat.S_ISFIFO, "Is a FIFO (named pipe)"),
          (stat.S_ISCHR, "Is a character device"), (stat.S_ISBLK, "Is a block device"),
          (stat.S_ISSOCK, "Is a socket"))


def not_regular(mode: int) -> str:
    """Why a file of this mode is refused, worded like the OSError a read would give."""
    kind = next((what for test, what in _KINDS if test(mode)), "Is not a regular file")
    return f"cannot read: {kind}; a regular file is expected"


def os_reason(exc: OSError, verb: str = "read") -> str:
    """An OSError as the few words a one-line refusal needs."""
    if exc.errno == errno.ELOOP:
        return "is a symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.ENOENT:
        return "does not exist (or is a link to nothing)"
    return f"cannot {verb}: {exc.strerror or exc}"


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a file name on this system (a NUL byte, a lone surrogate)."""
    if "\x00" in name:
        return "holds a NUL byte"
    try:
        os.fsencode(name)
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def regular_size(path: Path) -> int:
    """The size of ``path`` if it is (or links to) a regular file; else a one-line BadInput."""
    problem = name_problem(str(path))
    if problem:
        raise BadInput(f"file name {problem}", repr(str(path)))
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BadInput(os_reason(exc), path) from None
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(not_regular(st.st_mode), path)
    return st.st_size


@contextmanager
def open_regular(path: Path) -> Iterator[BinaryIO]:
    """Open a regular file for reading, never blocking on a FIFO or opening a device.

    The type is checked with ``stat`` before opening (so a device is never opened) and again
    with ``fstat`` on the descriptor, opened non-blocking, so a file swapped for a FIFO in
    between is caught instead of hanging. OSErrors while reading are refusals naming the file.
    """
    regular_size(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadInput(os_reason(exc), path) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BadInput(not_regular(mode), path)
    os.set_blocking(fd, True)
    try:
        with os.fdopen(fd, "rb") as fh:
            yield fh
    except OSError as exc:
        raise BadInput(os_reason(exc), path) from None


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict:
    """Read a JSON object (config, shard index, run document) or raise a one-line BadInput."""
    with open_regular(path) as fh:
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise BadInput(f"is larger than {max_bytes} bytes, too large for a JSON config", path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("is not UTF-8 text", path) from None
    data = parse_json(text, path)
    if not isinstance(data, dict):
        raise BadInput("must hold a JSON object", path)
    return data


class JsonRefused(ValueError):
    """Raised by a number hook inside ``json.loads``; becomes a BadInput naming the file."""


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonRefused(f"holds an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonRefused(f"holds the number {text[:24]}{'...' if len(text) > 24 else ''}, "
                          "too large for a float")
    return value


def _constant(text: str) -> float:
    raise JsonRefused(f"holds {text}, which is not JSON")


def parse_json(text: str, path: Path, *, what: str = "", parse_int: Callable | None = _int,
               object_pairs_hook: Callable | None = None, check: bool = True) -> object:
    """``json.loads`` with every failure a one-line BadInput and the result bounded.

    The C parser guards its own recursion (a RecursionError, never a crash); what it returns
    is then walked iteratively to refuse more than :data:`MAX_JSON_DEPTH` levels and strings
    that are not valid UTF-8 (a lone surrogate escape), so no later code recurses into or
    prints something unbounded. ``what`` prefixes messages ("header "). A caller whose own
    schema check bounds most of the document (a safetensors header) passes ``check=False``
    and calls :func:`check_tree` on the rest.
    """
    try:
        data = json.loads(text, parse_int=parse_int, parse_float=finite_float,
                          parse_constant=_constant, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise BadInput(f"{what}nests deeper than {MAX_JSON_DEPTH} levels", path) from None
    except JsonRefused as exc:
        raise BadInput(f"{what}{exc}", path) from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{what}is not valid JSON (line {exc.lineno}: {exc.msg})", path) from None
    except ValueError as exc:  # int() limits and the like: still the file's fault
        raise BadInput(f"{what}is not valid JSON ({exc})", path) from None
    if check:
        check_tree(data, path, what)
    return data


def check_tree(data: object, path: Path, what: str = "", depth: int = 1,
               float_range: bool = False) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH and strings that are not valid UTF-8;
    ``depth`` is the level ``data`` itself sits at in its document; ``float_range`` also
    refuses integers no float can hold (what serde_json refuses where it expects any number).
    """
    todo: list[tuple[object, int]] = [(data, depth)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, str):
            _utf8(value, path, what)
            continue
        if float_range and type(value) is int and abs(value) > sys.float_info.max:
            raise BadInput(f"{what}holds an integer too large for a float", path)
        if not isinstance(value, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            raise BadInput(f"{what}nests deeper than {MAX_JSON_DEPTH} levels", path)
        if isinstance(value, dict):
            for key in value:
                _utf8(key, path, what)
            todo.extend((v, depth + 1) for v in value.values())
        else:
            todo.extend((v, depth + 1) for v in value)


def _utf8(text: str, path: Path, what: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(f"{what}holds a string that is not valid UTF-8 (a lone surrogate "
                           "escape)", path) from None
