"""One segment as its writer sees it: the active segment's files and index writers, sealing,
truncation, index rebuilds.

Runs inside the partition's log actor (through ``Log`` and ``log.loader``); single writer, not
thread-safe. ``LogSegment`` extends ``log.segment.SegmentView`` with the write side: an active
segment holds its own ``.log`` descriptor and two ``IndexWriter``s (entries by
``log.index.IndexPolicy``); a closed one reads through the process's descriptor cache
(``log.files.descriptors()``). ``create_segment`` starts a new active segment;
``LogSegment.delete`` removes one at once (no ``.deleted`` rename: for empty segments,
truncation and recovery cuts).
"""
from __future__ import annotations

import contextlib
import os

from odradek.log import index as ix
from odradek.log.files import FileLayer, active_segments, descriptors
from odradek.log.index import MIN_TS, IndexPolicy
from odradek.log.recovery import log
from odradek.log.segment import SegmentView, segment_paths


class LogSegment(SegmentView):
    """A segment as the writer sees it. While active: its own ``.log`` descriptor (``fd``)
    and index writers. Closed: no descriptor of its own; its files are read through the
    process's descriptor cache (``log.files.descriptors()``), so a log of thousands of
    segments costs a bounded number of descriptors.

    Single writer (the log actor, through ``Log``).
    """

    def __init__(self, files: FileLayer, directory: str, base_offset: int, fd: int | None, size: int,
                 created_ms: int):
        self.files = files
        self.base_offset = base_offset
        self.log_path, self.index_path, self.timeindex_path = segment_paths(directory, base_offset)
        self.fd = fd  # only while active (or being made active)
        self.closed = False
        self._descriptors = descriptors()
        self.size = size
        self.created_ms = created_ms
        self.max_timestamp = -1
        self.oidx: ix.IndexWriter | None = None
        self.tidx: ix.IndexWriter | None = None
        self.policy: IndexPolicy | None = None
        self.used = False  # written since the active-segment budget last looked (log.files.ActiveSegments)
        self._closed_sources: dict[str, tuple] = {}

    @contextlib.contextmanager
    def log_fd(self):
        """A descriptor of the ``.log``: its own if active, else one from the cache (read-write,
        pinned while in use)."""
        if self.fd is not None:
            yield self.fd
        else:
            with self._descriptors.use(self.log_path, os.O_RDWR, self.files) as fd:
                yield fd

    # -- read side (SegmentView)
    def pread(self, size: int, position: int) -> bytes:
        if self.fd is not None:
            return self.files.pread(self.fd, size, position)
        with self.log_fd() as fd:
            return self.files.pread(fd, size, position)

    def offset_source(self):
        if self.oidx is not None:
            return self.oidx.source(), self.oidx.count
        return self._closed_source(self.index_path, ix.count_offset_entries, self.size)

    def time_source(self):
        if self.tidx is not None:
            return self.tidx.source(), self.tidx.count
        return self._closed_source(self.timeindex_path, ix.count_time_entries, 1 << 32)

    def _closed_source(self, path: str, counter, bound: int):
        """A closed segment's index, probed with ``pread`` through the descriptor cache."""
        found = self._closed_sources.get(path)
        if found is None:
            try:
                src = ix.FileSource(self._descriptors, path, self.files)
            except FileNotFoundError:
                src = ix.BufferSource(b"")
            found = self._closed_sources[path] = (src, counter(src, bound))
        return found

    # -- write side
    def activate(self, capacity: int, interval: int) -> None:
        """Open index writers over the existing valid entries; recompute the index policy.

        Used when a segment becomes the active one, and to wake an active segment that the
        process's budget suspended (``suspend``). Writers already open (recovery activates the
        active segment a second time) are closed first: each holds a mapping and its
        descriptor. Both writers open or neither does (OSError)."""
        self._release_writers()
        if self.fd is None:
            self.fd = self.files.open(self.log_path, os.O_RDWR)
        osrc, ocount = self._closed_source(self.index_path, ix.count_offset_entries, self.size)
        tsrc, tcount = self._closed_source(self.timeindex_path, ix.count_time_entries, 1 << 32)
        ocount, tcount = min(ocount, capacity - 1), min(tcount, capacity - 1)
        self._closed_sources.clear()
        self._descriptors.forget(self.index_path, self.timeindex_path)  # the writers map their own
        oidx = ix.IndexWriter(self.files, self.index_path, ix.OFFSET_ENTRY, capacity, ocount)
        try:
            tidx = ix.IndexWriter(self.files, self.timeindex_path, ix.TIME_ENTRY, capacity, tcount)
        except BaseException:
            oidx.close_untrimmed()
            raise
        self.oidx, self.tidx = oidx, tidx
        self._reset_policy(interval)
        active_segments().add(self)

    def suspend(self) -> None:
        """Give back the descriptors and maps of an active segment that has not been written
        to for a while (the process's budget, ``log.files.ActiveSegments``, asks): writers
        flushed and closed untrimmed, ``.log`` descriptor closed. It stays the active segment;
        reads go through the descriptor cache, and the next write wakes it (``activate``)."""
        if self.oidx is None:
            return
        try:
            self.oidx.flush()
            self.tidx.flush()
        except OSError as e:  # the index is rebuilt from the log on recovery if it matters
            log.warning("flushing the index of %s before suspending it: %s", self.log_path, e)
        self._release_writers()
        if self.fd is not None:
            fd, self.fd = self.fd, None
            self.files.close(fd)

    def _release_writers(self) -> None:
        if self.oidx is not None:
            oidx, tidx, self.oidx, self.tidx = self.oidx, self.tidx, None, None
            try:
                oidx.close_untrimmed()
            finally:
                tidx.close_untrimmed()

    def _reset_policy(self, interval: int) -> None:
        """Index policy state from the last entries plus a short scan of the tail."""
        osrc, ocount = self.offset_source()
        last = ix.offset_floor(osrc, ocount, 1 << 33) if ocount else None
        tlast = ix.last_time_entry(*self.time_source())
        pos = last[1] if last else 0
        max_ts = tlast[0] if tlast else MIN_TS
        h = self.header_at(pos)
        while h is not None:
            max_ts = max(max_ts, h.max_timestamp)
            pos += h.size
            h = self.header_at(pos)
        self.policy = IndexPolicy(interval, self.size - (last[1] if last else 0), max_ts,
                                  tlast[0] if tlast else MIN_TS)
        self.max_timestamp = max(max_ts, -1)

    def add_batch_entries(self, position: int, rel: int, size: int, max_ts: int) -> None:
        due = self.policy.before_batch(position, rel)
        if due is not None:
            self.oidx.append(*due[0])
            if due[1] is not None:
                self.tidx.append(*due[1])
        self.policy.after_batch(size, max_ts)
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts

    def index_room(self, entries: int) -> bool:
        return self.oidx.count + entries < self.oidx.capacity and self.tidx.count + entries < self.tidx.capacity

    def reserve_index(self, entries: int) -> None:
        """Allocate room for ``entries`` more entries in both indexes (OSError if no disk)."""
        self.oidx.reserve(entries)
        self.tidx.reserve(entries)

    def seal(self, next_offset: int) -> None:
        """The segment stops being active: final time entry, trim both index files."""
        active_segments().remove(self)
        if self.oidx is None:
            return
        final = self.policy.final_time_entry(next_offset - self.base_offset)
        if final is not None and self.tidx.count < self.tidx.capacity:
            self.tidx.append(*final)
        odata = self.oidx.trim_and_close()
        tdata = self.tidx.trim_and_close()
        self.oidx = self.tidx = None
        fd, self.fd = self.fd, None  # closed from now on: reads go through the descriptor cache
        self.files.close(fd)
        self._closed_sources[self.index_path] = (ix.BufferSource(odata), len(odata) // ix.OFFSET_ENTRY.size)
        self._closed_sources[self.timeindex_path] = (ix.BufferSource(tdata), len(tdata) // ix.TIME_ENTRY.size)

    def truncate(self, new_size: int, next_offset: int, interval: int) -> None:
        """Cut the log at ``new_size`` (a batch boundary) and drop index entries past it."""
        self.files.ftruncate(self.fd, new_size)
        self.files.fsync(self.fd)
        self.size = new_size
        osrc, _ = self.offset_source()
        tsrc, _ = self.time_source()
        ocount = ix.count_offset_entries(osrc, new_size)
        tcount = ix.count_time_entries(tsrc, next_offset - self.base_offset)
        self.oidx.truncate_entries(ocount)
        self.tidx.truncate_entries(tcount)
        self._reset_policy(interval)

    def write_indexes(self, offset_entries: list, time_entries: list, capacity: int) -> None:
        """Replace both index files with the given entries (after a rebuild)."""
        if self.oidx is not None:
            self.oidx.truncate_entries(0)
            self.tidx.truncate_entries(0)
            self.reserve_index(min(max(len(offset_entries), len(time_entries)), capacity - 1) + 1)
            for e in offset_entries[:capacity - 1]:
                self.oidx.append(*e)
            for e in time_entries[:capacity - 1]:
                self.tidx.append(*e)
            return
        odata = b"".join(ix.OFFSET_ENTRY.pack(*e) for e in offset_entries)
        tdata = b"".join(ix.TIME_ENTRY.pack(*e) for e in time_entries)
        self.files.write_file_atomically(self.index_path, odata)
        self.files.write_file_atomically(self.timeindex_path, tdata)
        self._descriptors.forget(self.index_path, self.timeindex_path)  # the old files' descriptors
        self._closed_sources[self.index_path] = (ix.BufferSource(odata), len(offset_entries))
        self._closed_sources[self.timeindex_path] = (ix.BufferSource(tdata), len(time_entries))

    def flush(self) -> None:
        with self.log_fd() as fd:
            self.files.fsync(fd)
        if self.oidx is not None:
            self.oidx.flush()
            self.tidx.flush()

    def close(self, trim: bool = True) -> None:
        try:
            if self.oidx is not None:
                if trim:
                    self.oidx.trim_and_close()
                    self.tidx.trim_and_close()
                else:
                    self.oidx.close_untrimmed()
                    self.tidx.close_untrimmed()
        finally:
            active_segments().remove(self)
            self.oidx = self.tidx = None
            self.closed = True
            self._descriptors.forget(*self.all_paths)
            if self.fd is not None:
                fd, self.fd = self.fd, None
                self.files.close(fd)

    def delete(self) -> None:
        """Close and unlink the segment's files now (a segment that is not kept)."""
        self.close(trim=False)
        for p in self.all_paths:
            try:
                self.files.unlink(p)
            except FileNotFoundError:
                pass

    @property
    def all_paths(self) -> tuple[str, str, str]:
        return self.log_path, self.index_path, self.timeindex_path


def read_file(files: FileLayer, path: str) -> bytes:
    """The whole file, or b'' if it does not exist."""
    try:
        fd = files.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        return files.pread(fd, files.fstat_size(fd), 0)
    finally:
        files.close(fd)


def create_segment(files: FileLayer, directory: str, base_offset: int, now: int, capacity: int,
                   interval: int) -> LogSegment:
    """A new, empty, active segment at ``base_offset`` (stale index files of that name are
    removed first). OSError if a file cannot be made; nothing is left open then."""
    path = segment_paths(directory, base_offset)[0]
    fd = files.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    seg = LogSegment(files, directory, base_offset, fd, 0, now)
    for p in seg.all_paths[1:]:
        if files.exists(p):
            files.unlink(p)
    try:
        seg.activate(capacity, interval)
    except BaseException:
        seg.close(trim=False)
        raise
    return seg
