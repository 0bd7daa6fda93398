"""The file layer and the clock the log uses: the only way ``log/`` touches the disk or time.

``FileLayer`` and ``system_now_ms`` are injected into ``Log`` and the cleaner, so tests can fail
any operation (ENOSPC, EIO), simulate a crash at the N-th one, and control time. Each method is
one system call (or a tiny loop of them) raising ``OSError`` as the OS does; the log turns it
into ``StorageError``. Index bytes go through ``mmap``; only index files' creation, allocation,
truncation, flushing and renaming come here. ``SyncBatch`` makes many new partitions durable
together (one commit, fsyncs in parallel).
Per process: ``DescriptorCache`` (``descriptors()``) holds the descriptors of files not being
written, a bounded LRU reopened on demand; ``ActiveSegments`` (``active_segments()``) bounds the
active segments holding their own descriptors and index maps, suspending the least recently
written.
Invariants: ``FileLayer`` is stateless and safe to share between logs and threads; the
descriptor cache never closes a descriptor in use, and is thread-safe.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import errno
import mmap
import os
import threading
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


SYNC_THREADS = 16  # fsyncs a SyncBatch runs at once (fsync releases the GIL; the file system groups them)


class SyncBatch(FileLayer):
    """A ``FileLayer`` that makes many new partitions durable together (a CreateTopics of
    1,000 partitions on one log actor): while ``deferring``, ``write_file_atomically`` writes
    only the temp file and ``fsync_dir`` only notes the directory; ``commit()`` then fsyncs
    every temp file (in parallel), renames each into place, fsyncs every directory noted once
    and, last, their parents (a new directory's own entry). One partition alone costs five
    fsyncs one after the other (``partition.metadata`` and the leader-epoch checkpoint, each
    with its directory, and the new segment's directory); in a batch it costs its two files
    and its directory, issued 16 at a time. After a crash before ``commit`` returns, each file
    is absent or whole, as with ``write_file_atomically`` (temp files are removed by the
    loader). After ``commit`` the layer is a plain ``FileLayer`` (the logs keep it).
    Only for directories created in the batch: nothing reads a deferred file before commit.
    """

    def __init__(self, threads: int = SYNC_THREADS):
        self.deferring = True
        self.threads = threads
        self._pending: dict[str, str] = {}  # final path -> its temp file, renamed by commit
        self._dirs: set[str] = set()

    def write_file_atomically(self, path: str, data: bytes) -> None:
        if not self.deferring:
            return super().write_file_atomically(path, data)
        tmp = path + ".tmp"
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.write_all(fd, data, 0)
        finally:
            self.close(fd)
        self._pending[path] = tmp
        self._dirs.add(os.path.dirname(path) or ".")

    def fsync_dir(self, path: str) -> None:
        if not self.deferring:
            return super().fsync_dir(path)
        self._dirs.add(path)

    def fsync_path(self, path: str) -> None:
        fd = self.open(path, os.O_RDONLY)
        try:
            self.fsync(fd)
        finally:
            self.close(fd)

    def commit(self, progress=None) -> None:
        """Make everything written durable; an ``OSError`` stops it (the caller fails the
        whole batch). The layer stops deferring whatever happens. ``progress(done, of)`` is
        called as the fsyncs complete (the caller's heartbeat during long work)."""
        self.deferring = False
        pending, dirs = self._pending, sorted(self._dirs)
        self._pending, self._dirs = {}, set()
        if not pending and not dirs:
            return
        parents = sorted({os.path.dirname(d) or "." for d in dirs} - set(dirs))
        of, done = len(pending) + len(dirs) + len(parents), 0

        def each(results) -> None:
            nonlocal done
            for _ in results:
                done += 1
                if progress is not None:
                    progress(done, of)

        with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:
            each(pool.map(self.fsync_path, pending.values()))
            for path, tmp in pending.items():
                self.rename(tmp, path)
            each(pool.map(self.fsync_dir, dirs))
            each(pool.map(self.fsync_dir, parents))


OPEN_FILES_PER_PROCESS = 1024  # the descriptor cache's size in each log actor and the fetch actor
# Active segments holding their own descriptors in one log actor: three each (the .log and the
# two index maps: CPython's mmap keeps a dup of the descriptor it maps). 20,000 partitions on
# two log actors held 30,000 descriptors each and ran them out of descriptors (EMFILE).
ACTIVE_SEGMENTS_PER_PROCESS = 2000


class DescriptorCache:
    """Open descriptors by ``(path, flags)``, at most ``capacity`` of them unused; the least
    recently used is closed first and reopened when needed again.

    ``use(path, flags, files)`` is a context manager giving the descriptor, pinned while in
    use (a log actor closes its logs in parallel threads: a descriptor in use is never closed
    under its user). ``forget(path)`` closes a path's descriptors (after their last user):
    call it when the file is deleted, renamed over or its segment closed, so that no stale
    descriptor of an old file is served. Thread-safe.
    """

    def __init__(self, capacity: int = OPEN_FILES_PER_PROCESS):
        self.capacity = capacity
        self._open: collections.OrderedDict[tuple[str, int], list] = collections.OrderedDict()  # [fd, users, files]
        self._lock = threading.Lock()
        self.opened = 0  # descriptors opened so far (stats, tests)

    def __len__(self) -> int:
        return len(self._open)

    @contextlib.contextmanager
    def use(self, path: str, flags: int = os.O_RDONLY, files: "FileLayer | None" = None):
        """``flags``: ``os.O_RDONLY`` or ``os.O_RDWR``."""
        entry = self._acquire((path, flags), files or FileLayer())
        try:
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0 and self._open.get((path, flags)) is not entry:  # forgotten while in use
                    entry[2].close(entry[0])
                self._evict()

    def pread(self, path: str, size: int, position: int, files: "FileLayer | None" = None) -> bytes:
        files = files or FileLayer()
        with self.use(path, os.O_RDONLY, files) as fd:
            return files.pread(fd, size, position)

    def _acquire(self, key: tuple[str, int], files: "FileLayer") -> list:
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                entry = self._open[key] = [files.open(key[0], key[1]), 0, files]
                self.opened += 1
            else:
                self._open.move_to_end(key)
            entry[1] += 1
            self._evict()
            return entry

    def _evict(self) -> None:
        """Close unused descriptors, least recently used first, down to ``capacity``."""
        if len(self._open) <= self.capacity:
            return
        for key in [k for k, e in self._open.items() if e[1] == 0][:len(self._open) - self.capacity]:
            entry = self._open.pop(key)
            entry[2].close(entry[0])

    def forget(self, *paths: str) -> None:
        with self._lock:
            for key in [(p, f) for p in paths for f in (os.O_RDONLY, os.O_RDWR)]:
                entry = self._open.pop(key, None)
                if entry is not None and entry[1] == 0:
                    entry[2].close(entry[0])

    def close_all(self) -> None:
        with self._lock:
            for key in [k for k, e in self._open.items() if e[1] == 0]:
                entry = self._open.pop(key)
                entry[2].close(entry[0])


_process_cache: tuple[int, DescriptorCache] | None = None


def descriptors() -> DescriptorCache:
    """This process's descriptor cache (one per process, made on first use)."""
    global _process_cache
    if _process_cache is None or _process_cache[0] != os.getpid():
        _process_cache = (os.getpid(), DescriptorCache())
    return _process_cache[1]


class ActiveSegments:
    """The active segments that hold their own descriptors and index maps in this process, at
    most ``capacity`` of them; past that, one written least recently is ``suspend()``ed (its
    writers flushed and closed, its descriptor closed) and woken again by its next write.

    Recency is a second chance (CLOCK) rather than a strict LRU, so the append path pays one
    attribute store (``segment.used = True``), not a lock and a reorder: an eviction skips, and
    clears, segments used since the last sweep. Segments come in through ``add`` (on
    activation) and leave through ``remove`` (sealed, closed or deleted) or eviction. Only the
    log actor's thread adds (so evicts); ``remove`` may come from its closing threads, hence
    the lock.
    """

    def __init__(self, capacity: int = ACTIVE_SEGMENTS_PER_PROCESS):
        self.capacity = capacity
        self._segments: collections.OrderedDict[int, object] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.suspended = 0  # evictions so far (stats, tests)

    def __len__(self) -> int:
        return len(self._segments)

    def add(self, segment) -> None:
        segment.used = True
        with self._lock:
            self._segments[id(segment)] = segment
            self._segments.move_to_end(id(segment))
            victims = self._victims(segment)
        for victim in victims:
            victim.suspend()

    def remove(self, segment) -> None:
        with self._lock:
            self._segments.pop(id(segment), None)

    def _victims(self, keep) -> list:
        victims, sweeps = [], 2 * len(self._segments)
        while len(self._segments) > self.capacity and sweeps:
            key, seg = self._segments.popitem(last=False)
            sweeps -= 1
            if seg is keep or seg.used:
                seg.used = False
                self._segments[key] = seg  # a second chance, at the back
            else:
                victims.append(seg)
        self.suspended += len(victims)
        return victims


_process_active: tuple[int, ActiveSegments] | None = None


def active_segments() -> ActiveSegments:
    """This process's active-segment budget (one per process, made on first use)."""
    global _process_active
    if _process_active is None or _process_active[0] != os.getpid():
        _process_active = (os.getpid(), ActiveSegments())
    return _process_active[1]
