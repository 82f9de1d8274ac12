"""One output file written through page-aligned buffers, with ``O_DIRECT`` where allowed.

A repaired checkpoint must be on disk before it is renamed into place (every file is fsynced),
so ordinary writes pay twice: every byte is first copied into the page cache, and then the whole
output is written back inside the final fsync, after everything else is done. Writing with
``O_DIRECT`` from page-aligned buffers pays once: the device reads the buffer, the page cache is
bypassed, and the fsync has only metadata left. Source bytes are read straight into the buffer
at their output position (``preadv``: the rows of a column-padded matrix land between their zeros
with no intermediate copy), and writing threads write full buffers while the next one is filled,
so reading the input and writing the output overlap. Two writers keep two writes in flight: one
``O_DIRECT`` write is one request at a time, and on a shared disk the second one in the queue is
what keeps pace with a ``cp``'s writeback (benchmarks/RESULTS.md, issue 42). Peak memory is the
few buffers.

Filesystems that refuse ``O_DIRECT`` (or an unaligned tail) get the same buffers through
ordinary writes. Figures: benchmarks/RESULTS.md, "Repair speed and memory".
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import queue
import threading
from pathlib import Path

from gac_check.errors import BadInput

#: Bytes per buffer: O_DIRECT writes of 2-8 MiB ran fastest here (2.8 GB/s; 16 MiB: 2.3 GB/s).
BUFFER = 4 << 20
#: Threads writing buffers, each its own write in flight (pwrite at the buffer's offset).
WRITERS = 2
#: Buffers in flight: one being filled, one per writer, spares so neither side waits.
BUFFERS = 6
#: O_DIRECT offsets and lengths: a multiple of every logical block size in use (512, 4096).
BLOCK = 4096
#: Buffers per preadv call (Linux's IOV_MAX).
IOV_MAX = 1024


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for ``fd``; False where the filesystem refuses it."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
    except OSError:
        return False
    return on


class Sink:
    """Bytes appended in order: :meth:`write` copies, :meth:`read` reads a source range into
    place (deferred, so consecutive ranges of one file become one ``preadv``).

    Use as a context manager; :meth:`close` (on success) writes the tail and re-raises any
    error of the writing thread. ``direct=False`` writes through the page cache.
    """

    def __init__(self, path: Path, direct: bool = True) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        self.direct = direct and _set_direct(self.fd, True)
        self.size = 0  # bytes appended so far
        self._buffers = [mmap.mmap(-1, BUFFER) for _ in range(BUFFERS)]
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        self._full: queue.SimpleQueue[tuple[mmap.mmap, int, int] | None] = queue.SimpleQueue()
        for buf in self._buffers:
            self._free.put(buf)
        self._error: BaseException | None = None
        self._sources: dict[Path, int] = {}
        self._reads: list[memoryview] = []
        self._read_src: Path | None = None
        self._read_start = self._read_end = 0
        self._threads = [threading.Thread(target=self._drain, name="gac-check writer",
                                          daemon=True) for _ in range(WRITERS)]
        for thread in self._threads:
            thread.start()
        self._buf = self._free.get()
        self._view = memoryview(self._buf)
        self._pos = 0

    # ------------------------------------------------------------------------------ filling
    def write(self, data) -> None:
        """Append bytes (anything with the buffer protocol)."""
        with memoryview(data) as raw:
            mv = raw.cast("B")
            while len(mv):
                k = min(len(mv), BUFFER - self._pos)
                self._view[self._pos:self._pos + k] = mv[:k]
                mv = mv[k:]
                self._advance(k)

    def read(self, src: Path, offset: int, length: int) -> None:
        """Append ``length`` bytes of ``src`` from ``offset`` (read when the buffer is due)."""
        while length > 0:
            k = min(length, BUFFER - self._pos)
            if self._reads and (src != self._read_src or offset != self._read_end
                                or len(self._reads) == IOV_MAX):
                self._do_reads()
            if not self._reads:
                self._read_src, self._read_start, self._read_end = src, offset, offset
            self._reads.append(self._view[self._pos:self._pos + k])
            self._read_end += k
            offset += k
            length -= k
            self._advance(k)

    def read_rows(self, src: Path, offset: int, row: int, pad: bytes, count: int) -> None:
        """Append ``count`` rows of ``src`` (``row`` bytes each, one after another from
        ``offset``), each followed by ``pad``: a column-padded matrix. The rows that fit in the
        buffer are laid out with their padding in one copy and read into place in one
        ``preadv``, so a row costs one slice, not two calls."""
        stride = row + len(pad)
        layout = b""
        while count:
            fit = min((BUFFER - self._pos) // stride, count, IOV_MAX)
            if fit == 0:  # the row that straddles two buffers goes piece by piece
                self.read(src, offset, row)
                self.write(pad)
                offset, count = offset + row, count - 1
                continue
            if len(layout) < fit * stride:
                layout = (bytes(row) + pad) * min(count, IOV_MAX, BUFFER // stride)
            region = self._view[self._pos:self._pos + fit * stride]
            region[:] = memoryview(layout)[: fit * stride]
            self._do_reads()
            self._read_src, self._read_start, self._read_end = src, offset, offset + fit * row
            self._reads = [region[j * stride: j * stride + row] for j in range(fit)]
            region.release()
            offset, count = offset + fit * row, count - fit
            self._advance(fit * stride)

    def _advance(self, k: int) -> None:
        self._pos += k
        self.size += k
        if self._pos == BUFFER:
            self._hand_over(BUFFER)
            self._buf = self._free.get()
            self._view = memoryview(self._buf)
            self._pos = 0
            if self._error is not None:
                raise self._error

    def _hand_over(self, n: int) -> None:
        """Fill the buffer's pending reads, then queue its first ``n`` bytes for writing."""
        self._do_reads()
        self._view.release()
        self._full.put((self._buf, n, self.size - self._pos))

    def _do_reads(self) -> None:
        views, src, pos = self._reads, self._read_src, self._read_start
        self._reads = []
        if not views or src is None:
            return
        fd = self._source(src)
        first = 0
        while first < len(views):
            got = os.preadv(fd, views[first:first + IOV_MAX], pos)
            if got == 0:
                raise BadInput("is truncated (a tensor's bytes end early)", src)
            pos += got
            while first < len(views) and got >= len(views[first]):
                got -= len(views[first])
                views[first].release()
                first += 1
            if got:
                views[first] = views[first][got:]

    def _source(self, src: Path) -> int:
        fd = self._sources.get(src)
        if fd is None:
            fd = self._sources[src] = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    # ------------------------------------------------------------------------------ writing
    def _drain(self) -> None:
        """A writing thread: buffers as they come (each at its own offset, so the order
        between writers does not matter); after an error, buffers only go back."""
        while (item := self._full.get()) is not None:
            buf, n, offset = item
            if self._error is None:
                try:
                    self._pwrite(buf, n, offset)
                except BaseException as exc:  # re-raised by the filling thread
                    self._error = exc
            self._free.put(buf)

    def _pwrite(self, buf: mmap.mmap, n: int, offset: int) -> None:
        if self.direct and n % BLOCK:
            # the tail: close has waited for every write before it
            self.direct = _set_direct(self.fd, False)
        with memoryview(buf) as whole:
            view = whole[:n]
            while len(view):
                direct = self.direct  # another writer may turn it off while this one writes
                try:
                    done = os.pwrite(self.fd, view, offset)
                except OSError as exc:
                    if exc.errno != errno.EINVAL or not direct:
                        raise
                    self.direct = _set_direct(self.fd, False)  # alignment refused: buffered
                    continue
                view = view[done:]
                offset += done
                if len(view) and self.direct:
                    self.direct = _set_direct(self.fd, False)  # a short write breaks alignment
            view.release()

    # ------------------------------------------------------------------------------ closing
    def close(self) -> None:
        """Write what is left, wait for the writing threads, and raise their error if any.

        An unaligned tail turns O_DIRECT off for the file, so it goes only once every buffer
        before it is written: a full buffer still queued would otherwise go through the page
        cache, and one writer's fall-back would depend on the other's timing."""
        try:
            if self.direct and self._pos % BLOCK:
                self._wait_written()
            self._hand_over(self._pos)
        finally:
            self._stop()
        if self._error is not None:
            raise self._error

    def _wait_written(self) -> None:
        """Until every buffer handed over is written (a writer gives each back when done)."""
        spare = [self._free.get() for _ in range(BUFFERS - 1)]
        for buf in spare:
            self._free.put(buf)

    def _stop(self) -> None:
        for _ in self._threads:
            self._full.put(None)
        for thread in self._threads:
            thread.join()
        self._view.release()
        for fd in self._sources.values():
            os.close(fd)
        self._sources.clear()
        os.close(self.fd)
        # the buffers are unmapped when the last view of them goes (a traceback may hold one)
        self._buffers.clear()

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.close()
        else:
            for view in self._reads:
                view.release()
            self._reads = []
            self._stop()
