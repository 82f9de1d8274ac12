"""torch's refusal reasons are caught whether a build raises them as Python warnings or writes
them from C++ to file descriptor 2 (gac_check.bench.torch_warnings)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

from gac_check.bench.torch_warnings import logged_warnings, with_reasons

#: two lines as torch 2.11 wrote them on the first H200 run (evidence.log, 2026-11-27)
H200_LINES = (
    "[W1127 12:26:11.805710220 sdp_utils.cpp:255] Warning: Mem efficient attention requires "
    "last dimension of inputs to be divisible by 8. Got Query.size(-1): 243, Key.size(-1): "
    "243, Value.size(-1): 243 instead. (function check_head_dim_size_mem_efficient)\n"
    "[W1127 12:26:11.805890197 sdp_utils.cpp:528] Warning: head_dim should be a multiple of 8 "
    "(function check_cudnn_tensor_shapes)\n")


def test_c10_lines_give_their_messages_and_nothing_else():
    got = logged_warnings("unrelated line\n" + H200_LINES + "Warning: not c10's format\n")
    assert got == ["Mem efficient attention requires last dimension of inputs to be divisible "
                   "by 8. Got Query.size(-1): 243, Key.size(-1): 243, Value.size(-1): 243 "
                   "instead.", "head_dim should be a multiple of 8"]


def test_what_is_written_to_fd_2_and_warned_in_python_are_both_reasons():
    def refuse() -> bool:
        warnings.warn("a python-side reason", UserWarning, stacklevel=1)
        os.write(2, H200_LINES.encode())  # as C++ writes it: below sys.stderr
        return False

    ok, reasons = with_reasons(refuse)
    assert ok is False
    assert reasons[0] == "a python-side reason"
    assert reasons[1:] == logged_warnings(H200_LINES)


def test_stderr_is_whole_again_afterwards():
    code = ("import os, sys; from gac_check.bench.torch_warnings import with_reasons; "
            "with_reasons(lambda: os.write(2, b'swallowed\\n')); "
            "os.write(2, b'after\\n'); print('end', file=sys.stderr)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert run.stderr == "after\nend\n"
