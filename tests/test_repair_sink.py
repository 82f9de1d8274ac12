"""The repair's output stream (gac_check.padding.sink): bytes land exactly where they belong,
with O_DIRECT and without, across buffer boundaries and unaligned tails, and errors of either
side reach the caller instead of a short file or a hang."""
from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from gac_check.errors import BadInput
from gac_check.padding import sink as sink_mod
from gac_check.padding.sink import BLOCK, BUFFER, IOV_MAX, Sink


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, bytes]:
    data = np.random.default_rng(0).integers(0, 256, 3 * BUFFER + 12345, np.uint8).tobytes()
    path = tmp_path_factory.mktemp("src") / "source.bin"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("direct", [True, False])
def test_reads_writes_and_zeros_land_in_order(tmp_path, source, direct):
    """A column-padded matrix (rows read into place between zeros, more rows than one preadv
    takes), a large copy crossing buffers at an odd offset, plain bytes, and an unaligned tail."""
    path, data = source
    expected = bytearray()
    with Sink(tmp_path / "out", direct=direct) as out:
        out.write(b"header!")
        expected += b"header!"
        row, pad = 13, 3
        for i in range(IOV_MAX + 300):
            out.read(path, 5 + i * row, row)
            out.write(bytes(pad))
            expected += data[5 + i * row: 5 + (i + 1) * row] + bytes(pad)
        out.read(path, 7, 2 * BUFFER + 999)
        expected += data[7: 7 + 2 * BUFFER + 999]
        out.read(path, 1, 10)  # not contiguous with the last read: a new batch
        expected += data[1:11]
        assert out.size == len(expected)
    assert (tmp_path / "out").read_bytes() == bytes(expected)


def test_an_empty_file_and_a_file_of_exactly_one_buffer(tmp_path, source):
    path, data = source
    with Sink(tmp_path / "empty"):
        pass
    assert (tmp_path / "empty").read_bytes() == b""
    with Sink(tmp_path / "one") as out:
        out.read(path, 0, BUFFER)
    assert (tmp_path / "one").read_bytes() == data[:BUFFER]


def test_a_source_that_ends_early_is_bad_input(tmp_path, source):
    path, data = source
    with pytest.raises(BadInput, match="truncated"), Sink(tmp_path / "out") as out:
        out.read(path, len(data) - 10, 20)
    assert not any(t.name == "gac-check writer" for t in threading.enumerate())


def test_a_write_error_in_the_writing_thread_reaches_the_caller(source):
    """ENOSPC from the device (here /dev/full) is raised by the filling side, not swallowed."""
    path, _ = source
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with pytest.raises(OSError) as err, Sink(Path("/dev/full"), direct=False) as out:
        out.read(path, 0, 2 * BUFFER)
    assert err.value.errno == 28


def test_o_direct_refused_at_write_time_falls_back_to_buffered(tmp_path, source, monkeypatch):
    """A filesystem that accepts the flag but refuses the aligned write (EINVAL) still gets
    every byte, through ordinary writes."""
    path, data = source
    real = os.pwrite
    refused = []

    def pwrite(fd, view, offset):
        if os.O_DIRECT & fcntl.fcntl(fd, fcntl.F_GETFL):
            refused.append(offset)
            raise OSError(22, "Invalid argument")
        return real(fd, view, offset)

    monkeypatch.setattr(sink_mod.os, "pwrite", pwrite)
    with Sink(tmp_path / "out") as out:
        direct = out.direct
        out.read(path, 3, BUFFER + 5)
    assert (tmp_path / "out").read_bytes() == data[3: BUFFER + 8]
    assert refused or not direct



@pytest.mark.parametrize("row, pad", [(13, 3), (1, 1), (5000, 0), (BUFFER + 7, 2)])
def test_rows_with_padding_land_between_their_zeros(tmp_path, source, row, pad):
    """read_rows (a column-padded matrix in one go): rows of any width, tiny ones (more than
    one preadv holds), rows that straddle a buffer, rows wider than a buffer, after an odd
    header and before a plain read; padding that is not zeros shows where it went."""
    path, data = source
    count = min(3000, (len(data) - 11) // row)
    fill = bytes(range(1, pad + 1))
    expected = bytearray(b"hdr")
    with Sink(tmp_path / "out") as out:
        out.write(b"hdr")
        out.read_rows(path, 11, row, fill, count)
        out.read(path, 0, 5)
    for j in range(count):
        expected += data[11 + j * row: 11 + (j + 1) * row] + fill
    expected += data[:5]
    assert (tmp_path / "out").read_bytes() == bytes(expected)


def test_a_run_of_rows_is_only_equal_contiguous_rows_each_with_equal_zeros():
    from gac_check.padding.write import _row_run

    rows = [(0, 4), (None, 2), (4, 4), (None, 2), (8, 4), (None, 2)]
    assert _row_run(rows, 0) == 3 and _row_run(rows, 2) == 2 and _row_run(rows, 1) == 0
    assert _row_run([*rows[:4], (9, 4), (None, 2)], 0) == 2  # a gap in the source ends it
    assert _row_run([*rows[:3], (None, 3)], 0) == 1  # other zeros end it
    assert _row_run([*rows[:2], (4, 5), (None, 2)], 0) == 1  # another width ends it
    assert _row_run([(0, 4), (4, 4)], 0) == 0  # no zeros between: not rows


def test_two_writes_in_flight_both_refused_o_direct_fall_back_together(tmp_path, source,
                                                                         monkeypatch):
    """Two writers keep two writes in flight (the repair's pace on a shared disk); when both
    are refused O_DIRECT at once, each retries buffered, and not only the one that noticed
    first: every byte still arrives. The barrier holds each refused write until a second one
    is in flight, so with a single writer it breaks and the test fails."""
    path, data = source
    real = os.pwrite
    both = threading.Barrier(2, timeout=60)

    def pwrite(fd, view, offset):
        if os.O_DIRECT & fcntl.fcntl(fd, fcntl.F_GETFL):
            both.wait()
            raise OSError(22, "Invalid argument")
        return real(fd, view, offset)

    monkeypatch.setattr(sink_mod.os, "pwrite", pwrite)
    with Sink(tmp_path / "out") as out:
        if not out.direct:
            pytest.skip("this filesystem refuses O_DIRECT when it is set")
        out.read(path, 0, 3 * BUFFER)
    assert (tmp_path / "out").read_bytes() == data[: 3 * BUFFER]


def test_an_unaligned_tail_is_written_after_every_buffer_before_it(tmp_path, source,
                                                                    monkeypatch):
    """An unaligned tail turns O_DIRECT off for the file; handed to one writer while another
    still holds a full buffer, that buffer would go through the page cache. So the tail goes
    only once the writes before it are done. (Here a full buffer's write waits up to 2 s for a
    tail to overtake it; with the wait in ``close`` none can.)"""
    path, data = source
    real = os.pwrite
    tail_came = threading.Event()
    order: list[str] = []

    def pwrite(fd, view, offset):
        if len(view) % BLOCK:
            tail_came.set()
            order.append("tail")
        else:
            tail_came.wait(timeout=2)
            order.append("full")
        return real(fd, view, offset)

    monkeypatch.setattr(sink_mod.os, "pwrite", pwrite)
    with Sink(tmp_path / "out") as out:
        if not out.direct:
            pytest.skip("this filesystem refuses O_DIRECT")
        out.read(path, 3, BUFFER + 5)
    assert (tmp_path / "out").read_bytes() == data[3: BUFFER + 8]
    assert order == ["full", "tail"]
