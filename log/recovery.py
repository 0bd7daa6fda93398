"""Validating scans of segment files, index rebuilding rules, and the recovery report.

Used by the loader while it opens a partition directory (single-threaded, before any append),
and by nothing else. ``scan_segment`` reads a ``.log`` in large buffered reads and checks every
batch: header fields, length within the file, CRC, offsets strictly increasing; it stops at the
first bad batch and says why, and the caller truncates there and deletes later segments. It adds
index entries by ``log.index.IndexPolicy``, so a rebuilt index equals the one appends wrote.
Invariant: never raises on bad data, only on I/O errors.
"""
from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field

from odradek.core import kafka_batch
from odradek.log.index import IndexPolicy
from odradek.core.records import CRC_START, HEADER_SIZE, BatchHeader, CorruptRecordError, check_header

log = logging.getLogger("odradek.log")

SCAN_CHUNK = 8 << 20


@dataclass
class ScanResult:
    valid_end: int  # bytes of the longest valid prefix
    next_offset: int  # offset after the last valid batch (or the floor given)
    batches: int
    offset_entries: list
    time_entries: list
    policy: IndexPolicy
    error: str | None = None  # why the scan stopped early (None: reached the end)


def scan_segment(files, fd: int, file_size: int, base_offset: int, start_position: int,
                 min_offset: int, policy: IndexPolicy, verify_crc: bool = True,
                 resume_at: int | None = None) -> ScanResult:
    """Walk batches from ``start_position``; every base offset must be >= ``min_offset``.

    ``resume_at``: the position of an existing index entry the scan starts from (no entry is
    added there again)."""
    pos = start_position
    next_offset = min_offset
    offset_entries, time_entries = [], []
    buf, buf_start = b"", pos
    batches = 0
    error = None
    while pos < file_size:
        if pos + HEADER_SIZE > buf_start + len(buf):
            buf, buf_start = files.pread(fd, SCAN_CHUNK, pos), pos
        if pos + HEADER_SIZE > buf_start + len(buf):
            error = f"torn header at byte {pos} ({file_size - pos} bytes left)"
            break
        h = BatchHeader.read(buf, pos - buf_start)
        try:
            check_header(h, pos)
        except CorruptRecordError as e:
            error = e.message
            break
        if h.base_offset < next_offset or h.base_offset - base_offset > 0xFFFFFFFF:
            error = f"batch at byte {pos}: offset {h.base_offset} out of order (expected >= {next_offset})"
            break
        end = pos + h.size
        if end > file_size:
            error = f"torn batch at byte {pos}: needs {h.size} bytes, {file_size - pos} left"
            break
        if end > buf_start + len(buf):
            buf, buf_start = files.pread(fd, max(SCAN_CHUNK, h.size), pos), pos
            if end > buf_start + len(buf):
                error = f"short read at byte {pos}"
                break
        if verify_crc:
            if h.magic == kafka_batch.MAGIC:  # Kafka's batches carry a CRC-32C
                crc = kafka_batch.crc_of(buf, pos - buf_start, h.size)
            else:
                with memoryview(buf) as mv:
                    crc = zlib.crc32(mv[pos - buf_start + CRC_START:end - buf_start])
            if crc != h.crc:
                error = f"batch at byte {pos} (offset {h.base_offset}): CRC mismatch"
                break
        due = None if pos == resume_at else policy.before_batch(pos, h.base_offset - base_offset)
        if due is not None:
            offset_entries.append(due[0])
            if due[1] is not None:
                time_entries.append(due[1])
        policy.after_batch(h.size, h.max_timestamp)
        next_offset = h.next_offset
        batches += 1
        pos = end
    return ScanResult(pos, next_offset, batches, offset_entries, time_entries, policy, error)


@dataclass
class RecoveryReport:
    """What opening a log found and did. ``clean`` is True after a clean shutdown."""

    clean: bool
    segments_loaded: int = 0
    segments_scanned: int = 0
    batches_scanned: int = 0
    bytes_scanned: int = 0
    truncated_at_position: int | None = None
    truncated_segment: int | None = None
    dropped_bytes: int = 0
    dropped_from_offset: int | None = None
    segments_deleted: list = field(default_factory=list)
    indexes_rebuilt: list = field(default_factory=list)
    files_removed: list = field(default_factory=list)
    swaps_completed: list = field(default_factory=list)
    reasons: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def lost_data(self) -> bool:
        return self.dropped_bytes > 0 or bool(self.segments_deleted)

    def summary(self) -> str:
        return (f"{'clean' if self.clean else 'unclean'} start: {self.segments_loaded} segments, "
                f"scanned {self.segments_scanned} ({self.bytes_scanned} bytes, {self.batches_scanned} batches), "
                f"dropped {self.dropped_bytes} bytes from offset {self.dropped_from_offset} "
                f"and {len(self.segments_deleted)} later segments, rebuilt {len(self.indexes_rebuilt)} indexes, "
                f"removed {len(self.files_removed)} leftover files in {self.seconds:.3f}s"
                + (f"; {'; '.join(self.reasons)}" if self.reasons else ""))
