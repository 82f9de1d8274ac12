"""torch's own reasons for refusing a kernel, wherever the build writes them.

``torch.backends.cuda.can_use_*_attention(params, debug=True)`` explains a refusal with
``TORCH_WARN``. Some builds turn that into a Python warning; others write it from C++ straight
to file descriptor 2, as torch 2.11 (CUDA 13) did on the first H200 run
(``[W1127 ... sdp_utils.cpp:255] Warning: Mem efficient attention requires last dimension of
inputs to be divisible by 8. ... (function check_head_dim_size_mem_efficient)``), where the
evidence run recorded "no reason given" and the log filled with the reasons. Both are caught.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: c10's log line: ``[W<date> <time> <file>:<line>] Warning: <message> (function <name>)``
_LOG_LINE = re.compile(r"\] Warning: (?P<message>.*?)(?: \(function \w+\))?\s*$")


def with_reasons(call: Callable[[], T]) -> tuple[T, list[str]]:
    """``call()``'s result and every warning it gave, Python's and torch's C++ ones, in order
    (each message once)."""
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            result = call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        written = sink.read().decode("utf-8", "replace")
    reasons = [str(w.message) for w in caught] + logged_warnings(written)
    return result, list(dict.fromkeys(reasons))


def logged_warnings(text: str) -> list[str]:
    """The messages of c10's warning lines in ``text``; other lines are not torch's reasons."""
    return [m.group("message") for line in text.splitlines() if (m := _LOG_LINE.search(line))]
