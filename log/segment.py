"""One segment's read side: locating offsets, timestamps and read spans. Shared code.

``SegmentView`` holds the lookups used by both the writer (``Log``, in the log actor) and
``LogReader`` (in the fetch actor): binary search over the sparse index, a check of the entry
found (the batch there must start at the offset it names, else the index is ignored and
flagged), then a short scan of batch headers. Subclasses say where entries and bytes come from
and how far they may be trusted (``size``: bytes known to hold whole, valid batches). File
names of a segment are spelled here.
Invariant: nothing decodes records, except ``find_record_at_time`` (ListOffsets by timestamp),
which decodes the one batch it lands on.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

from odradek.log import index as ix
from odradek.core.records import HEADER_SIZE, BatchHeader, CorruptRecordError, record_times
from odradek.core.protocol import OdradekError

SEGMENT_RE = re.compile(r"(\d{20})\.(log|index|timeindex)((?:\.[a-z]+)?)")  # always fullmatch
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
# other names in a partition directory (docs/FORMAT.md)
CLEAN_SHUTDOWN = ".clean_shutdown"  # written by a clean close, removed by the next open
DELETED_SUFFIX = ".deleted"  # a segment file retention renamed; unlinked after file.delete.delay.ms
CLEANED_SUFFIX = ".cleaned"  # the compactor's output before its swap
SWAP_SUFFIX = ".swap"  # a compacted file ready to replace the original
TMP_SUFFIX = ".tmp"  # an atomic write in progress


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def segment_paths(directory: str, base_offset: int) -> tuple[str, str, str]:
    stem = os.path.join(directory, segment_name(base_offset))
    return stem + LOG_SUFFIX, stem + INDEX_SUFFIX, stem + TIMEINDEX_SUFFIX


class Located(NamedTuple):
    position: int
    header: BatchHeader


class SegmentView:
    """Read-side lookups over one segment. Subclasses provide the sources and ``pread``."""

    base_offset: int
    log_path: str
    size: int
    index_suspect: bool = False

    # -- provided by subclasses
    def pread(self, size: int, position: int) -> bytes:
        raise NotImplementedError

    def offset_source(self) -> tuple[object, int]:
        """(entry source, number of trusted entries) of the offset index."""
        raise NotImplementedError

    def time_source(self) -> tuple[object, int]:
        raise NotImplementedError

    # -- shared logic
    def header_at(self, position: int) -> BatchHeader | None:
        """The batch header at ``position`` if a whole batch lies there within ``size``."""
        if position + HEADER_SIZE > self.size:
            return None
        raw = self.pread(HEADER_SIZE, position)
        try:
            h = BatchHeader.read(raw)
        except CorruptRecordError:
            return None
        if h.batch_length < HEADER_SIZE - 12 or position + h.size > self.size:
            return None
        return h

    def _verified(self, entry: tuple[int, int] | None) -> Located | None:
        """The batch an index entry ``(rel, pos)`` points to, if it really starts there."""
        if entry is None:
            return None
        rel, pos = entry
        h = self.header_at(pos)
        if h is None or h.base_offset != self.base_offset + rel:
            self.index_suspect = True
            return None
        return Located(pos, h)

    def locate(self, offset: int) -> Located | None:
        """The first batch whose last offset is >= ``offset``, or None if none in this segment."""
        src, count = self.offset_source()
        hit = self._verified(ix.offset_floor(src, count, offset - self.base_offset)) if count else None
        pos = hit.position if hit else 0
        h = hit.header if hit else self.header_at(0)
        while h is not None:
            if h.last_offset >= offset:
                return Located(pos, h)
            pos += h.size
            h = self.header_at(pos)
        return None

    def span(self, first: Located, max_bytes: int, upper_bound: int | None) -> int:
        """Bytes from ``first`` to the end of the last whole batch within ``max_bytes`` and
        below ``upper_bound`` (exclusive offset); the first batch always counts."""
        start = first.position
        end = start + first.header.size
        limit = min(self.size, start + max(max_bytes, 0))
        if upper_bound is not None:
            stop = self.locate(upper_bound)
            if stop is not None:
                limit = min(limit, stop.position)
        if end >= limit:
            return end - start
        src, count = self.offset_source()
        jump = self._verified(ix.position_floor(src, count, limit)) if count else None
        pos = jump.position if jump is not None and jump.position > end else end
        h = self.header_at(pos)
        while h is not None and pos + h.size <= limit:
            pos += h.size
            h = self.header_at(pos)
        return pos - start

    def locate_time(self, timestamp: int) -> Located | None:
        """The first batch whose max timestamp is >= ``timestamp``."""
        src, count = self.time_source()
        floor = ix.time_floor_below(src, count, timestamp) if count else None
        hit = self.locate(self.base_offset + floor[1]) if floor else self.locate(self.base_offset)
        if hit is None:
            return None
        pos, h = hit
        while h is not None:
            if h.max_timestamp >= timestamp:
                return Located(pos, h)
            pos += h.size
            h = self.header_at(pos)
        return None

    def find_record_at_time(self, timestamp: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with timestamp >= ``timestamp``."""
        hit = self.locate_time(timestamp)
        if hit is None:
            return None
        h = hit.header
        try:  # offsets and timestamps only, streamed: no record is built (core/inflate.py bounds the rest)
            for offset, ts in record_times(self.pread(h.size, hit.position), h):
                if ts >= timestamp:
                    return offset, ts
        except OdradekError as exc:
            raise type(exc)(f"batch at offset {h.base_offset}: {exc.message}") from None
        return h.base_offset, h.max_timestamp

    def max_timestamp_from_index(self) -> int:
        src, count = self.time_source()
        last = ix.last_time_entry(src, count)
        return last[0] if last else -1
