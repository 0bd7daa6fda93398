"""Sparse offset and time indexes of a segment: entry formats, lookups, and the writer.

Formats (docs/FORMAT.md): ``.index`` entries ``(relative offset u32, position u32)``;
``.timeindex`` entries ``(timestamp i64, relative offset u32)``: every record below base +
relative offset has a timestamp <= timestamp. Lookups (``offset_floor``, ``position_floor``,
``time_floor_below``, ``count_*``) bisect an entry source: ``BufferSource`` over bytes or an
mmap, ``FileSource`` over a file another process writes (``pread``).
``IndexPolicy`` is the one rule deciding when an entry is due, followed by the append path, by
recovery and by the cleaner's rebuilds. ``IndexWriter`` (single writer: the partition's log
actor) appends through an mmap of a file grown a page at a time (doubling, up to
``segment.index.bytes``) and trims it when its segment rolls or the log closes.
Invariants: entries strictly increase in every field and none has position 0 / relative offset
0, so a preallocated file's zero fill ends the valid entries; entries are never trusted beyond
the caller's bound, and callers verify the batch an entry points to; a rebuilt index equals the
one appends would have written.
"""
from __future__ import annotations

import bisect
import os
import struct

OFFSET_ENTRY = struct.Struct(">II")  # relative offset, position
TIME_ENTRY = struct.Struct(">qI")  # timestamp, relative offset


class BufferSource:
    """Entries in a bytes-like buffer (bytes, bytearray, mmap)."""

    __slots__ = ("buf", "limit")

    def __init__(self, buf, limit: int | None = None):
        self.buf = buf
        self.limit = len(buf) if limit is None else limit

    def entry_bytes(self, i: int, size: int) -> bytes | None:
        start = i * size
        if start + size > self.limit:
            return None
        return self.buf[start:start + size]

    def capacity(self, size: int) -> int:
        return self.limit // size


class FileSource:
    """Entries read with ``pread`` from a file another process may be writing, through the
    process's descriptor cache (``log.files.DescriptorCache``): no descriptor is held."""

    __slots__ = ("cache", "path", "files", "file_size")

    def __init__(self, cache, path: str, files=None):
        """Raises FileNotFoundError if there is no such file."""
        self.cache, self.path, self.files = cache, path, files
        with cache.use(path, os.O_RDONLY, files) as fd:
            self.file_size = os.fstat(fd).st_size

    def entry_bytes(self, i: int, size: int) -> bytes | None:
        data = self.cache.pread(self.path, size, i * size, self.files)
        return data if len(data) == size else None

    def capacity(self, size: int) -> int:
        return self.file_size // size


def _offset_entry(src, i: int) -> tuple[int, int] | None:
    raw = src.entry_bytes(i, OFFSET_ENTRY.size)
    return None if raw is None else OFFSET_ENTRY.unpack(raw)


def _time_entry(src, i: int) -> tuple[int, int] | None:
    raw = src.entry_bytes(i, TIME_ENTRY.size)
    return None if raw is None else TIME_ENTRY.unpack(raw)


def count_offset_entries(src, end_position: int) -> int:
    """Number of leading entries that are real (position > 0) and below ``end_position``."""
    def invalid(i: int) -> bool:
        e = _offset_entry(src, i)
        return e is None or e[1] == 0 or e[1] >= end_position
    return bisect.bisect_left(range(src.capacity(OFFSET_ENTRY.size)), True, key=invalid)


def count_time_entries(src, end_relative_offset: int) -> int:
    """Number of leading entries that are real (rel > 0) and at most ``end_relative_offset``."""
    def invalid(i: int) -> bool:
        e = _time_entry(src, i)
        return e is None or e[1] == 0 or e[1] > end_relative_offset
    return bisect.bisect_left(range(src.capacity(TIME_ENTRY.size)), True, key=invalid)


def offset_floor(src, count: int, relative_offset: int) -> tuple[int, int] | None:
    """The last entry ``(rel, pos)`` with ``rel <= relative_offset`` among the first ``count``."""
    i = bisect.bisect_right(range(count), relative_offset, key=lambda j: _offset_entry(src, j)[0]) - 1
    return _offset_entry(src, i) if i >= 0 else None


def position_floor(src, count: int, position: int) -> tuple[int, int] | None:
    """The last entry ``(rel, pos)`` with ``pos <= position`` among the first ``count``."""
    i = bisect.bisect_right(range(count), position, key=lambda j: _offset_entry(src, j)[1]) - 1
    return _offset_entry(src, i) if i >= 0 else None


def time_floor_below(src, count: int, timestamp: int) -> tuple[int, int] | None:
    """The last entry ``(ts, rel)`` with ``ts < timestamp`` among the first ``count``."""
    i = bisect.bisect_left(range(count), timestamp, key=lambda j: _time_entry(src, j)[0]) - 1
    return _time_entry(src, i) if i >= 0 else None


def last_time_entry(src, count: int) -> tuple[int, int] | None:
    return _time_entry(src, count - 1) if count else None


MIN_TS = -(1 << 63)  # below every timestamp: no time entry yet


class IndexPolicy:
    """When to add index entries: one per ``interval`` bytes, never at position 0.

    ``before_batch`` returns the ``(offset entry, time entry or None)`` due before a batch
    at ``position`` with relative base offset ``rel``; ``after_batch`` accounts for it.
    """

    __slots__ = ("interval", "bytes_since", "max_ts", "last_time_ts")

    def __init__(self, interval: int, bytes_since: int = 0, max_ts: int = MIN_TS,
                 last_time_ts: int = MIN_TS):
        self.interval = interval
        self.bytes_since = bytes_since
        self.max_ts = max_ts
        self.last_time_ts = last_time_ts

    def before_batch(self, position: int, rel: int):
        if position == 0 or self.bytes_since < self.interval:
            return None
        self.bytes_since = 0
        time_entry = None
        if self.max_ts > self.last_time_ts:
            time_entry = (self.max_ts, rel)
            self.last_time_ts = self.max_ts
        return (rel, position), time_entry

    def after_batch(self, size: int, max_ts: int) -> None:
        self.bytes_since += size
        if max_ts > self.max_ts:
            self.max_ts = max_ts

    def final_time_entry(self, next_rel: int):
        """The entry sealing a segment: its max timestamp up to ``next_rel``."""
        if next_rel > 0 and self.max_ts > self.last_time_ts:
            self.last_time_ts = self.max_ts
            return (self.max_ts, next_rel)
        return None


ALLOCATION_CHUNK = 4096  # an active index file starts at one page and doubles as it fills


class IndexWriter:
    """An index file being appended to through an mmap of its allocated part.

    Not thread-safe; only the log actor (through ``Log``) calls it. ``capacity`` is the most
    entries the file may hold (``segment.index.bytes``; a full index rolls the segment), but
    only ``allocated`` entries are backed by the file and the map: it starts at one page
    (more if reopened with more entries) and doubles, up to ``capacity``, when ``reserve``
    (called by the log *before* it writes a batch) finds too little room. Every mapped byte
    is allocated on disk first (``files.allocate``: ``posix_fallocate``), so a store into
    the map never meets a full disk (SIGBUS); a full disk fails ``reserve`` instead, before
    the batch is written. (Preallocating ``capacity`` up front, as before, reserved 16.7 MiB
    of disk per partition at the default 10 MiB ``segment.index.bytes``: 83 GiB for 5,000
    partitions, and a create-topic time to match.)

    No descriptor is kept open: the map holds its own (CPython's mmap dups the one it is
    given), and the rare resize and trim reopen the file by path. One descriptor per index,
    not two, because a log actor hosts thousands of partitions.

    Invariants: ``count`` entries are valid, all within ``allocated``; the file is
    ``allocated * entry_size`` bytes (zeros after the entries) while open for writing and
    exactly ``count * entry_size`` after ``trim``.
    """

    def __init__(self, files, path: str, entry: struct.Struct, capacity: int, count: int):
        self.files = files
        self.path = path
        self.entry = entry
        self.capacity = capacity
        self.count = count
        self.allocated = 0
        self._map = None
        fd = files.open(path, os.O_RDWR | os.O_CREAT)
        try:
            old_size = files.fstat_size(fd)
            self._allocate(self._target(count + 2), fd)
        finally:
            files.close(fd)
        # zero old bytes past the valid entries (a torn or stale tail must not look valid);
        # what allocate added is zero already and is left untouched (no dirty pages)
        tail = count * entry.size
        stale_end = min(old_size, len(self._map))
        if stale_end > tail:
            self._map[tail:stale_end] = bytes(stale_end - tail)

    def _target(self, entries: int) -> int:
        """Entries to allocate for ``entries``: a power-of-two number of pages, <= capacity."""
        want = ALLOCATION_CHUNK
        while want < entries * self.entry.size:
            want *= 2
        return max(min(want // self.entry.size, self.capacity), 1)

    def _allocate(self, entries: int, fd: int) -> None:
        size = entries * self.entry.size
        self.files.allocate(fd, size)  # size the file, blocks reserved, before mapping
        new = self.files.mmap(fd, size)
        if self._map is not None:
            self._map.close()
        self._map = new
        self.allocated = entries

    def _reopen(self) -> int:
        return self.files.open(self.path, os.O_RDWR)

    def reserve(self, entries: int) -> None:
        """Make room for ``entries`` more appends (up to ``capacity``); OSError if the disk
        cannot give it (nothing changes then: the old map and entries stay)."""
        if self.count + entries > self.allocated and self.allocated < self.capacity:
            fd = self._reopen()
            try:
                self._allocate(self._target(self.count + entries), fd)
            finally:
                self.files.close(fd)

    @property
    def full(self) -> bool:
        return self.count >= self.capacity

    def source(self) -> BufferSource:
        return BufferSource(self._map, self.count * self.entry.size)

    def append(self, a: int, b: int) -> None:
        if self.count >= self.allocated:  # the log reserves before writing; this is a backstop
            self.reserve(1)
        at = self.count * self.entry.size
        self.entry.pack_into(self._map, at, a, b)
        self.count += 1

    def truncate_entries(self, count: int) -> None:
        """Keep the first ``count`` entries; zero the rest."""
        if count < self.count:
            start = count * self.entry.size
            self._map[start:self.count * self.entry.size] = bytes((self.count - count) * self.entry.size)
            self.count = count

    def entries_bytes(self) -> bytes:
        return self._map[:self.count * self.entry.size]

    def flush(self) -> None:
        self.files.msync(self._map)

    def trim_and_close(self) -> bytes:
        """Flush, shrink the file to its entries, close; return the entries' bytes."""
        data = self.entries_bytes()
        self.files.msync(self._map)
        self._map.close()
        fd = self._reopen()
        try:
            self.files.ftruncate(fd, len(data))
        finally:
            self.files.close(fd)
        return data

    def close_untrimmed(self) -> None:
        """Close without trimming (used when the log is dropped after a storage error)."""
        self._map.close()
