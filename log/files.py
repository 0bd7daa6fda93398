"""The file layer and the clock the log uses: the only way ``log/`` touches the disk or time.

Both are injected into ``Log`` (and the cleaner) so tests can fail any operation (ENOSPC, EIO)
or simulate a crash at the N-th operation, and control time. ``FileLayer`` is stateless:
safe to share between logs and threads; each method is one system call (or a tiny loop of
them) and raises ``OSError`` as the OS does. The log turns ``OSError`` into ``StorageError``.

Index files are written through ``mmap`` (as Kafka does): their bytes are not routed through
this layer, only their creation, allocation, truncation, flushing and renaming.
"""
from __future__ import annotations

import errno
import mmap
import os
import time


def system_now_ms() -> int:
    """Wall-clock milliseconds: the default clock."""
    return int(time.time() * 1000)


class FileLayer:
    """Plain ``os`` calls. Subclass (in tests) to inject faults."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data, position: int) -> int:
        """Write ``data`` at ``position``; may write fewer bytes (the caller loops)."""
        return os.pwrite(fd, data, position)

    def pwritev(self, fd: int, buffers: list, position: int) -> int:
        """Write the buffers back to back at ``position`` in one call; may write fewer bytes."""
        if len(buffers) == 1:
            return os.pwrite(fd, buffers[0], position)
        return os.pwritev(fd, buffers, position)

    def pread(self, fd: int, size: int, position: int) -> bytes:
        return os.pread(fd, size, position)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def allocate(self, fd: int, size: int) -> None:
        """Make the file ``size`` bytes with blocks reserved (so mmap writes cannot hit ENOSPC)."""
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise

    def fstat_size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def mmap(self, fd: int, size: int) -> mmap.mmap:
        return mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)

    def msync(self, m: mmap.mmap) -> None:
        m.flush()

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def write_all(self, fd: int, data, position: int) -> None:
        """Write every byte of ``data`` at ``position`` (looping over short writes)."""
        view = memoryview(data)
        while view:
            n = self.pwrite(fd, view, position)
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            position += n
            view = view[n:]

    def write_file_durably(self, path: str, data: bytes) -> None:
        """Create or replace ``path`` with ``data`` and fsync it (not the directory)."""
        fd = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.write_all(fd, data, 0)
            self.fsync(fd)
        finally:
            self.close(fd)

    def write_file_atomically(self, path: str, data: bytes) -> None:
        """temp file, fsync, rename over ``path``, fsync the directory."""
        tmp = path + ".tmp"
        self.write_file_durably(tmp, data)
        self.rename(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")
