"""Progress on stderr for the long steps (factorizing, compressing, sweeping), through tqdm.

Shown only on a terminal (tqdm's ``disable=None``) and never when the caller prints machine
output (``--format json``): a CI log or a pipe gets no carriage-return noise.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def steps(items: Iterable[T], what: str, *, enabled: bool = True,
          total: int | None = None) -> Iterator[T]:
    """``items``, with a progress bar labelled ``what`` where it helps a person."""
    return iter(tqdm(items, desc=what, total=total, file=sys.stderr, leave=False,
                     disable=None if enabled else True, dynamic_ncols=True))
