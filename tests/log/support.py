"""Test support for the log library: a controllable clock, a fault-injecting file layer, and
helpers that read a whole log back as records."""
from __future__ import annotations

import errno
import os

from odradek.log.files import FileLayer
from odradek.core.records import decode_batch, encode_batch, iter_batches


class Clock:
    """A clock tests move by hand."""

    def __init__(self, now: int = 1_700_000_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Crash(BaseException):
    """Raised by FaultyFiles to stop the process 'here' (not an OSError: nothing handles it)."""


class FaultyFiles(FileLayer):
    """The real file layer, plus faults on demand.

    ``fail(op, err, match=None, times=1)`` makes the next ``times`` calls of ``op`` (whose path
    contains ``match`` if given) raise OSError(err); ``crash_at(n)`` raises Crash on the n-th
    mutating operation from now; ``short_writes`` makes pwrite write half of each request
    before failing with ENOSPC.
    """

    MUTATING = {"pwrite", "fsync", "ftruncate", "allocate", "rename", "unlink", "open_create"}

    def __init__(self):
        self.faults = []  # [op, errno, match, remaining]
        self.crash_in = None
        self.calls = {}
        self.paths = {}
        self.half_write_then_fail = False

    def fail(self, op: str, err: int = errno.EIO, match: str | None = None, times: int = 1):
        self.faults.append([op, err, match, times])

    def clear(self):
        self.faults.clear()
        self.crash_in = None
        self.half_write_then_fail = False

    def crash_at(self, n: int):
        self.crash_in = n

    def _hit(self, op: str, path: str = "") -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        if op in self.MUTATING and self.crash_in is not None:
            self.crash_in -= 1
            if self.crash_in < 0:
                self.crash_in = None
                raise Crash(f"crash before {op} {path}")
        for f in self.faults:
            if f[0] == op and f[3] > 0 and (f[2] is None or f[2] in path):
                f[3] -= 1
                raise OSError(f[1], os.strerror(f[1]), path)

    def open(self, path, flags, mode=0o644):
        self._hit("open_create" if flags & os.O_CREAT else "open", path)
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def close(self, fd):
        self.paths.pop(fd, None)
        super().close(fd)

    def pwrite(self, fd, data, position):
        path = self.paths.get(fd, "")
        if self.half_write_then_fail and len(data) > 1:
            self.half_write_then_fail = False
            self.fail("pwrite", errno.ENOSPC)
            return super().pwrite(fd, memoryview(data)[:len(data) // 2], position)
        self._hit("pwrite", path)
        return super().pwrite(fd, data, position)

    def pwritev(self, fd, buffers, position):
        # through pwrite, so the faults above (and half writes) apply to appends too
        return self.pwrite(fd, b"".join(bytes(b) for b in buffers), position)

    def fsync(self, fd):
        self._hit("fsync", self.paths.get(fd, ""))
        super().fsync(fd)

    def ftruncate(self, fd, size):
        self._hit("ftruncate", self.paths.get(fd, ""))
        super().ftruncate(fd, size)

    def allocate(self, fd, size):
        self._hit("allocate", self.paths.get(fd, ""))
        super().allocate(fd, size)

    def rename(self, src, dst):
        self._hit("rename", src)
        super().rename(src, dst)

    def unlink(self, path):
        self._hit("unlink", path)
        super().unlink(path)

    def fsync_dir(self, path):
        self._hit("fsync_dir", path)
        super().fsync_dir(path)


def batch(n: int = 3, key: bytes = b"k", size: int = 50, ts: int = 1_700_000_000_000, comp="lz4",
          tag: int = 0) -> bytes:
    """A batch of ``n`` records with distinguishable values."""
    return encode_batch([(key + b"%d" % i, b"%08d-%d-" % (tag, i) + b"x" * size) for i in range(n)],
                        comp, timestamp_ms=ts)


def log_records(lg) -> list:
    """Every record of the log from its start offset, decoded."""
    out = []
    offset = lg.log_start_offset
    while offset < lg.log_end_offset:
        data = lg.fetch(offset, 1 << 20)
        if not data:
            break
        last = None
        for pos, h in iter_batches(data):
            for r in decode_batch(memoryview(data)[pos:pos + h.size]):
                if r.offset >= offset:
                    out.append(r)
            last = h
        offset = last.next_offset
    return out


def log_batches(lg) -> list[bytes]:
    """Every batch (raw bytes) of the log, in order."""
    out = []
    offset = lg.log_start_offset
    while offset < lg.log_end_offset:
        data = lg.fetch(offset, 1 << 20)
        if not data:
            break
        for pos, h in iter_batches(data):
            out.append(bytes(data[pos:pos + h.size]))
            offset = h.next_offset
    return out
