"""Progress on stderr for the long steps (factorizing, compressing, sweeping).

On a terminal, a tqdm bar. Anywhere else (a CI log, a pipe) a bar's carriage returns are noise,
but silence is worse: a job that says nothing for minutes looks hung. There, a plain line every
:data:`LOG_INTERVAL` seconds says how far the step is. Never when the caller prints machine
output (``--format json``): ``enabled=False``.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: seconds between progress lines outside a terminal
LOG_INTERVAL = 10.0


def steps(items: Iterable[T], what: str, *, enabled: bool = True,
          total: int | None = None) -> Iterator[T]:
    """``items``, with a progress bar (terminal) or periodic lines (log) labelled ``what``."""
    if not enabled:
        return iter(items)
    if not sys.stderr.isatty():
        return _logged(items, what, total)
    from tqdm import tqdm  # a bar only on a terminal: a plain check does not pay its import

    return iter(tqdm(items, desc=what, total=total, file=sys.stderr, leave=False,
                     disable=None if enabled else True, dynamic_ncols=True))


def _logged(items: Iterable[T], what: str, total: int | None) -> Iterator[T]:
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    start = last = time.monotonic()
    for done, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - last >= LOG_INTERVAL:
            last = now
            of = f"/{total} ({100 * done / total:.0f}%)" if total else ""
            print(f"gac-check: {what} {done}{of}, {now - start:.0f} s", file=sys.stderr,
                  flush=True)
