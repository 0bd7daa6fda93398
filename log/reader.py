"""Read planning shared by ``Log`` and ``LogReader``; ``LogReader`` for other processes.

``plan_read`` and ``plan_offset_for_time`` map an offset or a timestamp to byte ranges of
segment files over ordered ``SegmentView``s (bisect on base offsets, the index, a short header
scan). ``LogReader(dir)`` is the fetch actor's (and the coordinators' replays) read-only view
of a directory the log actor writes; ``update(bounds)`` takes the ``LogBounds`` the log actor
sends and re-lists the directory when the segment set changed. A ``ReadResult`` names
``(path, position, length)`` slices of whole batches, served with ``os.sendfile`` or
``read_bytes()``.
Invariants: never writes; bytes and index entries beyond the bounds it was told are ignored,
whatever the files hold; not thread-safe (one reader per thread); a compaction swap may replace
a closed segment under the same name, so ``first_offset`` is checked against the first header
served (``read_bytes`` does) and a mismatch retried.
"""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from odradek.actors.messages import LogBounds
from odradek.log import index as ix
from odradek.core.errors import OffsetOutOfRangeError, StorageError
from odradek.log.files import descriptors
from odradek.core.records import BatchHeader, CorruptRecordError
from odradek.log.segment import LOG_SUFFIX, SEGMENT_RE, SegmentView, segment_paths

TAIL_HINTS = 1024  # tail positions a LogReader remembers (see LogReader._tail)
EARLIEST_TIMESTAMP = -2  # ListOffsets: the log start offset
LATEST_TIMESTAMP = -1  # ListOffsets: the log end offset
MAX_TIMESTAMP = -3  # ListOffsets v7+ (KIP-734): the first record with the largest timestamp


class FileSlice(NamedTuple):
    """Whole batches at ``position`` .. ``position + length`` of ``path``."""

    path: str
    position: int
    length: int
    first_offset: int  # base offset of the first batch in the slice
    next_offset: int = -1  # the offset after its last batch (records served: metrics), -1: not known


@dataclass(frozen=True)
class ReadResult:
    """What a read found: byte ranges of whole batches and the log's offsets at read time."""

    offset: int
    slices: tuple[FileSlice, ...]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int

    @property
    def size(self) -> int:
        return sum(s.length for s in self.slices)

    @property
    def first_offset(self) -> int | None:
        return self.slices[0].first_offset if self.slices else None

    def read_bytes(self) -> bytes:
        """The bytes of every slice (opened by path: usable from any process)."""
        parts = []
        for s in self.slices:
            fd = os.open(s.path, os.O_RDONLY)
            try:
                data = os.pread(fd, s.length, s.position)
            finally:
                os.close(fd)
            if len(data) != s.length or BatchHeader.read(data).base_offset != s.first_offset:
                raise StorageError(f"{s.path} changed under the read (compacted or truncated); retry")
            parts.append(data)
        return b"".join(parts)


def plan_read(segments: Sequence[SegmentView], bases: Sequence[int], offset: int, max_bytes: int,
              upper_bound: int | None, log_start: int, log_end: int, high_watermark: int) -> ReadResult:
    """Slices of whole batches from ``offset`` (see ``Log.read``)."""
    if offset < log_start or offset > log_end:
        raise OffsetOutOfRangeError(f"offset {offset} is outside [{log_start}, {log_end}]")
    bound = log_end if upper_bound is None else min(upper_bound, log_end)
    empty = ReadResult(offset, (), log_start, log_end, high_watermark)
    if offset >= bound:
        return empty
    i = max(bisect.bisect_right(bases, offset) - 1, 0)
    for j, seg in enumerate(segments[i:], i):
        hit = seg.locate(offset)
        if hit is None:
            continue  # offset lies past this segment's last batch (compaction gap)
        if hit.header.last_offset >= bound:
            return empty  # the batch straddles or lies past the bound: not visible yet
        length = seg.span(hit, max_bytes, bound)
        if length == hit.header.size:
            after = hit.header.last_offset + 1
        else:  # the batch after the slice starts there; none: the slice ends its segment
            h = seg.header_at(hit.position + length)
            after = h.base_offset if h is not None else bases[j + 1] if j + 1 < len(bases) else log_end
        sl = FileSlice(seg.log_path, hit.position, length, hit.header.base_offset, after)
        return ReadResult(offset, (sl,), log_start, log_end, high_watermark)
    return empty


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


def plan_offset_for_time(segments: Sequence[SegmentView], timestamp: int, log_start: int,
                         log_end: int) -> TimestampOffset | None:
    """The first record with timestamp >= ``timestamp`` (ListOffsets semantics).

    ``-2`` (earliest) gives the log start offset and ``-1`` (latest) the log end offset.
    Segments are skipped by their max timestamp (bisect on its running maximum), then the
    segment's time index and a short header scan find the batch; that one batch is decoded.
    """
    if timestamp == EARLIEST_TIMESTAMP:
        return TimestampOffset(-1, log_start)
    if timestamp == LATEST_TIMESTAMP:
        return TimestampOffset(-1, log_end)
    running, top = [], -(1 << 63)
    for seg in segments:
        top = max(top, seg.max_timestamp)
        running.append(top)
    for seg in segments[bisect.bisect_left(running, timestamp):]:
        found = seg.find_record_at_time(timestamp)
        if found is not None and found[0] >= log_start and found[0] < log_end:
            return TimestampOffset(found[1], found[0])
        if found is not None and found[0] < log_start:
            return TimestampOffset(found[1], log_start)
    return None


def plan_max_timestamp(segments: Sequence[SegmentView], log_start: int, log_end: int) -> TimestampOffset | None:
    """KIP-734 (ListOffsets ``-3``): the first record with the largest timestamp, None in an
    empty log. A sealed segment's largest timestamp is its time index's final entry; the
    active one's is the larger of its last time entry and the batch headers after it (a few
    headers: one index interval, no record inflated); then the record is found as for a time."""
    top = -1
    for seg in segments:
        top = max(top, _active_max_timestamp(seg) if getattr(seg, "active", False) else seg.max_timestamp)
    return plan_offset_for_time(segments, top, log_start, log_end) if top >= 0 else None


def _active_max_timestamp(seg: SegmentView) -> int:
    src, count = seg.time_source()
    last = ix.last_time_entry(src, count) if count else None
    top, hit = (last[0], seg.locate(seg.base_offset + last[1])) if last else (-1, seg.locate(seg.base_offset))
    pos, h = (hit.position, hit.header) if hit else (0, None)
    while h is not None:
        top = max(top, h.max_timestamp)
        pos += h.size
        h = seg.header_at(pos)
    return top


class ReaderSegment(SegmentView):
    """A read-only view of one segment for a process that does not own the log. Its files
    are read through the process's descriptor cache (``log.files.descriptors()``): a reader
    holds no descriptor of its own, whatever the number of segments and partitions."""

    def __init__(self, directory: str, base_offset: int, size: int, active: bool):
        self.base_offset = base_offset
        self.log_path, self.index_path, self.timeindex_path = segment_paths(directory, base_offset)
        self.size = size
        self.active = active
        self.next_offset_bound = 1 << 32
        self._descriptors = descriptors()
        with self._descriptors.use(self.log_path):  # FileNotFoundError if retention took it
            pass
        self._cache: dict[str, tuple] = {}
        self.max_timestamp = self.max_timestamp_from_index()

    def pread(self, size: int, position: int) -> bytes:
        return self._descriptors.pread(self.log_path, size, position)

    def _source(self, path: str, counter, bound: int) -> tuple[object, int]:
        if not self.active and path in self._cache:  # closed: immutable, count it once
            return self._cache[path]
        try:
            src = ix.FileSource(self._descriptors, path)  # probed with pread: nothing loaded, nothing mapped
        except FileNotFoundError:
            return ix.BufferSource(b""), 0
        found = (src, counter(src, bound))
        if not self.active:
            self._cache[path] = found
        return found

    def offset_source(self) -> tuple[object, int]:
        return self._source(self.index_path, ix.count_offset_entries, self.size)

    def time_source(self) -> tuple[object, int]:
        return self._source(self.timeindex_path, ix.count_time_entries, self.next_offset_bound)

    def close(self) -> None:
        """Drop this view's cached descriptors: the files may be replaced (compaction) or
        deleted (retention) before the next view opens them."""
        self._descriptors.forget(self.log_path, self.index_path, self.timeindex_path)
        self._cache.clear()


class LogReader:
    """Read-only access to a partition directory from another process (the fetch actor).

    Methods: ``update(bounds)`` (after the writer reports changes), ``read(offset, max_bytes,
    upper_bound)`` -> ``ReadResult``, ``offset_for_time(ts)``, ``close()``.
    """

    def __init__(self, directory: str, bounds: LogBounds):
        self.directory = directory
        self.bounds = bounds
        self._segments: list[ReaderSegment] = []
        self._bases: list[int] = []
        # Tail positions: every bounds update says "the batch at offset log_end_offset will
        # start at byte active_size of the active segment". Kept for the last TAIL_HINTS
        # updates, they let a caught-up reader (the common case: a consumer fetching from
        # the offset it was last told is the end) find its batch with no index search and
        # no header scan. Dropped whenever the active segment changes or shrinks.
        self._tail: dict[int, int] = {}
        self._relist()
        self._note_tail(bounds)

    def update(self, bounds: LogBounds) -> None:
        """Adopt the writer's latest bounds; re-list files if the segment set changed."""
        old = self.bounds
        self.bounds = bounds
        if (bounds.generation != old.generation or not self._segments
                or bounds.active_base_offset != self._segments[-1].base_offset):
            self._tail.clear()
            self._relist()
        else:
            if bounds.active_size < old.active_size or bounds.log_end_offset < old.log_end_offset:
                self._tail.clear()  # truncated: positions past the new end are void
            self._apply_active_bound()
        self._note_tail(bounds)

    def _note_tail(self, bounds: LogBounds) -> None:
        tail = self._tail
        tail[bounds.log_end_offset] = bounds.active_size
        if len(tail) > TAIL_HINTS:
            del tail[next(iter(tail))]  # oldest first: dicts keep insertion order

    def _relist(self) -> None:
        for seg in self._segments:
            seg.close()
        b = self.bounds
        bases = sorted(int(m.group(1)) for m in map(SEGMENT_RE.fullmatch, os.listdir(self.directory))
                       if m and m.group(2) == "log" and not m.group(3))
        bases = [x for x in bases if x <= b.active_base_offset]
        segs = []
        for base in bases:
            active = base == b.active_base_offset
            try:
                size = b.active_size if active else os.path.getsize(segment_paths(self.directory, base)[0])
                segs.append(ReaderSegment(self.directory, base, size, active))
            except FileNotFoundError:
                continue  # deleted by retention between listing and opening
        self._segments = segs
        self._bases = [s.base_offset for s in segs]
        self._apply_active_bound()

    def _apply_active_bound(self) -> None:
        if self._segments and self._segments[-1].active:
            seg = self._segments[-1]
            seg.size = self.bounds.active_size
            seg.next_offset_bound = self.bounds.log_end_offset - seg.base_offset
            # The active segment grows after its index was read: its largest timestamp is
            # unknown here, so a search by time must never skip it.
            seg.max_timestamp = (1 << 63) - 1

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> ReadResult:
        b = self.bounds
        start = self._tail.get(offset)
        if start is not None and self._segments and b.log_start_offset <= offset:
            found = self._read_tail(offset, start, max_bytes, upper_bound)
            if found is not None:
                return found
        return plan_read(self._segments, self._bases, offset, max_bytes, upper_bound,
                         b.log_start_offset, b.log_end_offset, b.high_watermark)

    def _read_tail(self, offset: int, start: int, max_bytes: int, upper_bound: int | None) -> ReadResult | None:
        """Whole batches from a known tail position, or None to take the indexed path."""
        b = self.bounds
        bound = b.log_end_offset if upper_bound is None else min(upper_bound, b.log_end_offset)
        if offset >= bound:
            return None  # plan_read answers empty (or out of range) with its own checks
        end = b.active_size if bound == b.log_end_offset else self._tail.get(bound)
        after = bound
        if end is None or end <= start:
            return None
        if end - start > max_bytes:  # stop at the last known batch boundary within max_bytes
            end, after = max(((p, o) for o, p in self._tail.items() if offset < o <= bound and p - start <= max_bytes),
                             default=(None, None))
            if end is None:
                return None  # the first batch alone is larger: plan_read serves it whole
        seg = self._segments[-1]
        return ReadResult(offset, (FileSlice(seg.log_path, start, end - start, offset, after),),
                          b.log_start_offset, b.log_end_offset, b.high_watermark)

    def offset_for_time(self, timestamp: int) -> TimestampOffset | None:
        b = self.bounds
        try:
            return plan_offset_for_time(self._segments, timestamp, b.log_start_offset, b.log_end_offset)
        except CorruptRecordError:
            return None

    def offset_for_max_timestamp(self) -> TimestampOffset | None:
        b = self.bounds
        try:
            return plan_max_timestamp(self._segments, b.log_start_offset, b.log_end_offset)
        except CorruptRecordError:
            return None

    def close(self) -> None:
        for seg in self._segments:
            seg.close()
        self._segments = []
        self._bases = []


def list_log_bases(names: Sequence[str]) -> list[int]:
    """Base offsets of the ``.log`` files among directory entries ``names``."""
    return sorted(int(n[:20]) for n in names if n.endswith(LOG_SUFFIX) and SEGMENT_RE.fullmatch(n))
