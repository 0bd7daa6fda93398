"""The durable log of one partition: segments, indexes, retention, flush, checkpoints, recovery.

Runs inside the partition's log actor and is called by nothing else: ``Log`` is single writer
and not thread-safe. Other processes read through ``LogReader`` (``log.reader``), told the
bounds (``Log.bounds()``) by the log actor. Formats: docs/FORMAT.md; flows:
docs/ARCHITECTURE.md (Storage). Time and I/O are injected: ``now_ms`` and ``files``
(``log.files.FileLayer``).
Invariants (the tests check them):
- segments are ordered by base offset, each batch's offsets below the next segment's base;
  only the last (active) segment is written;
- every byte below a segment's ``size`` is a whole, validated batch; an append writes the whole
  batch or nothing (a failed write is truncated away before the error is raised, or before the
  next append);
- log start <= high watermark <= log end, recovery point <= log end; offsets only grow;
- files are deleted only after a rename to ``.deleted``, or replaced by an atomic rename, so a
  crash at any point is recoverable;
- every ``OSError`` surfaces as ``StorageError`` (KAFKA_STORAGE_ERROR) with the log consistent.
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import os
import struct
import time
import zlib
from typing import Callable, NamedTuple

from odradek.core.config import LogConfig
from odradek.log.epochs import LeaderEpochCache
from odradek.core.errors import (CorruptRecordError, InvalidRecordError, OdradekError, OffsetOutOfRangeError,
                                RecordListTooLargeError, StorageError)
from odradek.log.files import FileLayer, system_now_ms
from odradek.core import kafka_batch
from odradek.log.producer_state import (DuplicateSequenceError, InvalidProducerEpochError, InvalidTxnStateError,
                                        OutOfOrderSequenceError, ProducerStateManager, last_sequence)
from odradek.core.kafka_batch import TRANSACTIONAL_BIT
from odradek.log.txn_index import AbortedTxn, TxnIndex
from odradek.log.recovery import RecoveryReport, log
from odradek.log.reader import (LogBounds, ReadResult, TimestampOffset, plan_offset_for_time,
                        plan_read)
from odradek.core.records import (APPEND_VIEW, COMPRESSION_LZ4, COMPRESSION_MASK, CONTROL_BIT, CRC_START, HEADER,
                                 HEADER_SIZE, KNOWN_ATTRIBUTE_BITS, LOG_OVERHEAD, MAGIC, PATCHED_HEAD,
                                 PATCHED_PREFIX, BatchHeader, Record, check_header, patch_base_offset,
                                 set_log_append_time, validate_batches)
from odradek.log.loader import CHECKPOINT, Checkpoint, LoadedLog, load_log
from odradek.log.segment import (CLEAN_SHUTDOWN, CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX,
                                 SEGMENT_RE, SWAP_SUFFIX, TIMEINDEX_SUFFIX, TMP_SUFFIX)
from odradek.log.segment_writer import LogSegment, create_segment

MAX_RELATIVE_OFFSET = (1 << 31) - 1
SCAN_CHUNK = 1 << 20  # bytes read at once when replaying batch headers into the producer state


class AppendInfo(NamedTuple):
    """What an append did: offsets given, time, and where the bytes went."""

    base_offset: int
    last_offset: int
    append_time_ms: int
    log_start_offset: int
    position: int  # byte position of the first batch in its segment
    segment_base: int  # base offset of that segment
    size: int  # bytes written
    duplicate: bool = False  # an idempotent producer's retry: nothing written, the original offsets


# named tuples from a tuple of every field, without a Python frame (``_make`` has one)
_append_info = functools.partial(tuple.__new__, AppendInfo)
_make_header = functools.partial(tuple.__new__, BatchHeader)


def _storage(op: str, e: OSError) -> StorageError:
    return StorageError(f"{op} failed: {e.strerror or e} (errno {e.errno})")


class Log:
    """One partition's log. Single writer: only the partition's log actor calls this.

    Not thread-safe. Public API: ``append``, ``append_as_follower``, ``read``, ``fetch``,
    ``offset_for_time``, ``end_offset_for_epoch``, ``truncate_to``,
    ``truncate_fully_and_start_at``, ``delete_records_before``, ``apply_retention``,
    ``delete_expired_files``, ``flush``, ``maybe_flush``, ``checkpoint``, ``roll``,
    ``bounds``, ``close``; properties ``log_start_offset``, ``log_end_offset``,
    ``high_watermark`` (settable, clamped), ``recovery_point``, ``latest_epoch``,
    ``segments``, ``size``; attribute ``leader_epochs`` (``log.epochs.LeaderEpochCache``).

    Leader epochs: a leader's append in a newer epoch records (epoch, first offset) in
    ``leader_epochs``; a follower's append records the epochs stamped in the leader's
    batches; truncations and log-start moves trim the cache, and opening the log trims it to
    the recovered [log start, log end]. A failed write of the cache's file does not fail the
    operation that changed it (memory is right): ``checkpoint`` writes it again.
    """

    def __init__(self, directory: str, config: LogConfig | None = None, *,
                 now_ms: Callable[[], int] = system_now_ms, files: FileLayer | None = None):
        self.dir = directory
        self.config = config or LogConfig()
        self._now = now_ms
        self._files = files or FileLayer()
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._log_end_offset = 0
        self._log_start_offset = 0
        self._recovery_point = 0
        self._high_watermark = 0
        self._durable_end = 0  # offsets below it are fsynced (the .log files; group commit or flush)
        self._truncations = 0  # a sync begun before a truncation vouches for nothing after it
        self._unflushed = 0
        self._last_flush_ms = self._now()
        self._unflushed_segments: list[LogSegment] = []
        self._pending_deletes: list[tuple[int, list[str]]] = []
        self._dirty_tail: tuple[LogSegment, int] | None = None
        self._generation = 0
        self._closed = False
        self.offline: str | None = None  # why the log is offline (take_offline), or None
        self.leader_epochs = LeaderEpochCache(directory, self._files)
        self.producers = ProducerStateManager(directory, self._files)
        self.txn_index = TxnIndex(directory, self._files)
        started = time.monotonic()
        self.recovery_report = self._load()
        # the file may be older or newer than the data that survived: trim it to the log
        self._update_epochs(self.leader_epochs.truncate_from_end, self._log_end_offset)
        self._update_epochs(self.leader_epochs.truncate_from_start, self._log_start_offset)
        try:
            self._rebuild_producer_state()
            self._sync_recovered()
        except OSError as e:
            self.abandon()
            raise _storage(f"loading the producer state of {directory}", e) from None
        except StorageError:
            self.abandon()
            raise
        self.recovery_report.seconds = time.monotonic() - started
        log.info("%s: %s", directory, self.recovery_report.summary())

    # ------------------------------------------------------------------ properties
    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        self._high_watermark = min(max(offset, self._log_start_offset), self._log_end_offset)

    @property
    def durable_end(self) -> int:
        """Offsets below this are on the disk: the ``.log`` bytes holding them were fsynced
        (by ``flush`` or a group commit, ``begin_sync``/``end_sync``). <= log end."""
        return self._durable_end

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the log's epoch cache (-1 if none)."""
        return self.leader_epochs.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OFFSET_FOR_LEADER_EPOCH: ``(largest known epoch <= epoch, offset where it ended)``
        (the next epoch's start, or the log end for the latest epoch); ``(-1, -1)`` if the
        cache is empty or ``epoch`` is below its first entry."""
        return self.leader_epochs.end_offset_for(epoch, self._log_end_offset)

    @property
    def segments(self) -> list[LogSegment]:
        """The segments, oldest first (read-only use; the last one is active)."""
        return list(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size(self) -> int:
        return sum(s.size for s in self._segments)

    def bounds(self) -> LogBounds:
        """What ``LogReader`` in another process needs to read safely (send after changes)."""
        a = self._segments[-1]
        return LogBounds(self._log_start_offset, self._log_end_offset, self._high_watermark,
                         a.base_offset, a.size, self._generation)

    # ------------------------------------------------------------------ append
    def append(self, batch, leader_epoch: int = -1, assign_offsets: bool = True,
               crc_checked: bool = False) -> AppendInfo:
        """Validate, assign offsets to and append one or more concatenated batches.

        ``leader_epoch`` is stamped into every batch header; when it is newer than
        ``latest_epoch`` the epoch cache records it as starting at the first batch's offset.
        -1 (the default; what producers send) means no epoch: nothing is recorded. The log
        actor always passes the partition's epoch (0 in single-broker mode).

        A writable buffer (bytearray, writable memoryview) is patched in place; a read-only
        one is never copied (see ``_patched``). Raises CorruptRecordError, RecordTooLargeError, RecordListTooLargeError,
        InvalidRecordError (follower offsets going backwards) or StorageError; on any error
        nothing was appended.

        ``crc_checked=True`` skips the CRC (all other checks stay): only for a caller that has
        just run ``validate_batches`` on these exact bytes (e.g. a request handler, so the CRC
        cost is spread over the handler pool). A bad CRC that slips in would later look like
        a torn tail to recovery, which would cut the log there.

        One path: the checks and offsets of the input, then the shared ``_commit``. The
        common case (exactly one sound batch, native or Kafka's magic 2, in a read-only
        buffer: bytes, a ZeroMQ frame, any buffer but a bytearray or a writable memoryview,
        which ``_patched`` patches in place; a leader's append with CreateTime; no failed
        write to repair) is recognized by the guard below and goes straight to the commit;
        anything else -- several batches, a writable buffer, a follower, LogAppendTime, any
        failed check -- leaves the guard having changed nothing, and ``_append_general``
        redoes the checks and raises the precise error. The guard's native test is
        ``check_header`` + ``validate_batches`` on locals (tests/log check that it never
        accepts what those refuse); a Kafka batch takes ``check_header`` itself.
        """
        if assign_offsets and self._dirty_tail is None and not self._closed:
            mv = memoryview(batch)
            cfg = self.config
            n = mv.nbytes
            if ((type(batch) is bytes or (mv.c_contiguous and mv.itemsize == 1 and (
                    mv.readonly or not isinstance(batch, (bytearray, memoryview)))))
                    and HEADER_SIZE <= n <= cfg.max_message_bytes and n <= cfg.segment_bytes
                    and cfg.message_timestamp_type == "CreateTime"):
                base0, blen, magic, crc, attributes, delta, _, pid, _, _, count = APPEND_VIEW.unpack_from(mv)
                h = None
                if blen + LOG_OVERHEAD != n:
                    pass
                elif magic == MAGIC:
                    if (count >= 1 and delta >= count - 1 and base0 >= 0 and not attributes & ~KNOWN_ATTRIBUTE_BITS
                            and attributes & COMPRESSION_MASK <= COMPRESSION_LZ4
                            and (crc_checked or zlib.crc32(mv[CRC_START:]) == crc)):
                        h = _make_header(HEADER.unpack_from(mv))
                elif magic == kafka_batch.MAGIC and (crc_checked or kafka_batch.crc_of(mv, 0, n) == crc):
                    h = _make_header(HEADER.unpack_from(mv))
                    try:
                        check_header(h)  # Kafka's rules for magic 2
                    except CorruptRecordError:
                        h = None
                if h is not None:
                    now = self._now()
                    base = self._log_end_offset
                    if pid >= 0 or attributes & TRANSACTIONAL_BIT:
                        dup = self._check_producers((h,))
                        if dup is not None:
                            return self._duplicate(dup)
                    # the 16 bytes an append rewrites, packed anew; the rest from the caller's buffer
                    parts = (PATCHED_HEAD.pack(base, blen, leader_epoch), mv[PATCHED_PREFIX:])
                    return self._commit((h,), (base,), base + delta, count, parts, n, now, leader_epoch, True)
        return self._append_general(batch, leader_epoch, assign_offsets, crc_checked)

    def _append_general(self, batch, leader_epoch: int, assign_offsets: bool,
                        crc_checked: bool) -> AppendInfo:
        """Any append: concatenated batches, writable buffers, followers, LogAppendTime."""
        if self._closed:
            self._check_open()
        cfg = self.config
        size = len(batch)
        headers = validate_batches(batch, cfg.max_message_bytes, not crc_checked)
        if size > cfg.segment_bytes:
            raise RecordListTooLargeError(f"{size} bytes do not fit in segment.bytes {cfg.segment_bytes}")
        now = self._now()
        bases, last, records = self._assign(headers, assign_offsets)
        if assign_offsets:
            dup = self._check_producers(headers)
            if dup is not None:
                return self._duplicate(dup)
        parts = self._patched(batch, headers, bases, leader_epoch, now) if assign_offsets else [batch]
        if self._dirty_tail is not None:
            self._repair_tail()
        return self._commit(headers, bases, last, records, parts, size, now, leader_epoch, assign_offsets)

    def _commit(self, headers, bases, last: int, records: int, parts, size: int, now: int,
                leader_epoch: int, assign_offsets: bool) -> AppendInfo:
        """The shared step of every append, once its batches are checked and their offsets
        assigned (``bases``; ``parts``: the bytes to write, patched): the segment (rolled if
        needed), the write (undone on failure), index entries, log end, producer state,
        leader epochs, flush policy."""
        cfg = self.config
        seg = self._segments[-1]
        oidx, tidx = seg.oidx, seg.tidx
        entries = len(headers) + 1  # index room: an entry per batch, one to seal the segment
        if (oidx is not None and seg.size and seg.size + size <= cfg.segment_bytes
                and now - seg.created_ms < cfg.segment_ms
                and oidx.count + entries < oidx.capacity and tidx.count + entries < tidx.capacity
                and oidx.count + entries <= oidx.allocated and tidx.count + entries <= tidx.allocated
                and last - seg.base_offset <= MAX_RELATIVE_OFFSET):
            seg.used = True  # the common case: room in the active segment, its time, its indexes
        else:
            seg = self._segment_for(size, len(headers), bases[0], last, now)  # wakes, rolls
            self._reserve_index(seg, entries)
        position = seg.size
        try:
            written = self._files.pwritev(seg.fd, parts, position)
            if written != size:  # a short write: finish it (or fail) in the loop
                self._files.write_all(seg.fd, memoryview(b"".join(parts))[written:], position + written)
        except OSError as e:
            self._undo_write(seg, position, e)  # cuts the file back, raises
        seg.size = position + size
        self._log_end_offset = last + 1
        # per batch: its index entries (LogAppendTime: stamped ``now``), then its producer's
        # state (a marker reads its batch back: after the size above)
        stamp = now if cfg.log_append_time else None
        at, rel0 = position, seg.base_offset
        for h, base in zip(headers, bases):
            n = h.batch_length + LOG_OVERHEAD
            seg.add_batch_entries(at, base - rel0, n, h.max_timestamp if stamp is None else stamp)
            at += n
            if h.producer_id >= 0:
                self._track_batch(h, base)
        epochs = self.leader_epochs
        if assign_offsets:
            if leader_epoch > epochs._latest:
                self._update_epochs(epochs.assign, leader_epoch, bases[0])
        else:  # a follower keeps the leader's epochs, stamped in each batch
            for h in headers:
                if h.partition_leader_epoch > epochs._latest:
                    self._update_epochs(epochs.assign, h.partition_leader_epoch, h.base_offset)
        self._unflushed += records
        if self._unflushed >= cfg.flush_messages or now - self._last_flush_ms >= cfg.flush_ms:
            self.flush()
        return _append_info((bases[0], last, now, self._log_start_offset, position, seg.base_offset, size, False))

    def _check_producers(self, headers) -> object:
        """The producer-state checks of a leader's append (``ProducerStateManager.check``),
        batch by batch as if each earlier one had been appended. Returns the original batch's
        metadata when the append is one batch that was appended before (a retry), else None;
        raises if any batch is out of sequence or fenced (nothing is appended then)."""
        pending: dict[int, tuple[int, int]] = {}  # pid -> (epoch, last seq) of earlier batches here
        for h in headers:
            pid = h.producer_id
            if h.attributes & TRANSACTIONAL_BIT and pid < 0:
                raise InvalidTxnStateError("a transactional batch without a producer id: nothing was written")
            if pid < 0 or h.attributes & CONTROL_BIT:
                continue
            last_seq = last_sequence(h.base_sequence, h.last_offset_delta)
            seen = pending.get(pid)
            if seen is None:
                dup = self.producers.check(pid, h.producer_epoch, h.base_sequence, last_seq)
                if dup is not None:
                    if len(headers) > 1:
                        raise DuplicateSequenceError(
                            f"producer {pid}: batch with sequences {h.base_sequence}..{last_seq} was appended "
                            f"before; send an idempotent producer's batches one per partition and request")
                    return dup
            elif h.producer_epoch != seen[0]:
                raise InvalidProducerEpochError(f"producer {pid}: epochs {seen[0]} and {h.producer_epoch} in "
                                                f"one append")
            elif h.base_sequence != seen[1] + 1:
                raise OutOfOrderSequenceError(f"producer {pid}: sequence {h.base_sequence} does not follow "
                                              f"{seen[1]} within one append")
            pending[pid] = (h.producer_epoch, last_seq)
        return None

    def _track_batch(self, h, base: int) -> None:
        """Record a batch appended at ``base`` (leader, follower, replay alike): an idempotent
        producer's sequence, the transaction it opens, or the one its marker closes."""
        pid = h.producer_id
        if pid < 0:
            return
        if h.attributes & CONTROL_BIT:
            if h.attributes & TRANSACTIONAL_BIT:
                self._track_marker(h, base)
            return
        self.producers.update(pid, h.producer_epoch, h.base_sequence,
                              last_sequence(h.base_sequence, h.last_offset_delta), base,
                              base + h.last_offset_delta, h.max_timestamp)
        if h.attributes & TRANSACTIONAL_BIT:
            self.producers.begin_txn(pid, h.producer_epoch, base, h.max_timestamp)

    def _track_marker(self, h, base: int) -> None:
        """A commit or abort marker at ``base``: the producer's transaction ends here; an
        abort goes to the aborted-transactions index (with the LSO it left)."""
        commit, coordinator_epoch = self._marker_of(h, base)
        first = self.producers.end_txn(h.producer_id, h.producer_epoch, h.max_timestamp, coordinator_epoch)
        if not commit and first >= 0:
            lso = self.producers.first_unstable_offset()
            self.txn_index.add(AbortedTxn(h.producer_id, first, base, base if lso is None else lso))

    def _marker_of(self, h, base: int) -> tuple[bool, int]:
        """The control record's type (key: version int16, type int16; 1 = commit) and the
        coordinator epoch in its value (version int16, coordinator epoch int32). Markers are
        written by ``append_marker`` only, always as one uncompressed magic-2 record."""
        seg = self._segment_of(base)
        hit = seg.locate(base) if seg is not None else None
        if hit is None:
            return False, -1
        batch = seg.pread(hit.header.size, hit.position)
        try:
            (rec,) = kafka_batch.decode(batch, BatchHeader._make(HEADER.unpack_from(batch, 0)), Record)
            commit = struct.unpack_from(">hh", rec.key)[1] == 1
        except Exception:  # noqa: BLE001 - an unreadable marker is taken as an abort (never exposes data)
            return False, -1
        try:
            return commit, struct.unpack_from(">hi", rec.value)[1]
        except (struct.error, TypeError):
            return commit, -1

    def _segment_of(self, offset: int):
        i = bisect.bisect_right(self._bases, offset) - 1
        return self._segments[i] if i >= 0 else None

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int = 0,
                      leader_epoch: int = -1) -> AppendInfo:
        """Append a transaction marker (a control batch, Kafka's layout: docs/FORMAT.md) for
        ``producer_id``: its transaction on this partition is committed or aborted."""
        self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        now = self._now()
        key = struct.pack(">hh", 0, 1 if commit else 0)
        value = struct.pack(">hi", 0, coordinator_epoch)
        batch = kafka_batch.encode([Record(0, now, key, value, [])], base_offset=0, first_timestamp=now,
                                   max_timestamp=now, attributes=CONTROL_BIT | TRANSACTIONAL_BIT,
                                   producer_id=producer_id, producer_epoch=producer_epoch)
        return self.append(batch, leader_epoch=leader_epoch, crc_checked=True)

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the earliest open transaction, else the high watermark."""
        first = self.producers.first_unstable_offset()
        return self._high_watermark if first is None else min(first, self._high_watermark)

    def _duplicate(self, dup) -> AppendInfo:
        """The answer to a retried batch: the offsets it got the first time, nothing written."""
        return AppendInfo(dup.first_offset, dup.last_offset, self._now(), self._log_start_offset, -1, -1, 0, True)

    def append_as_follower(self, batch) -> AppendInfo:
        """Append a leader's batches as they are: its offsets, epochs and timestamps.

        Each batch's partitionLeaderEpoch newer than ``latest_epoch`` starts an entry in the
        epoch cache at that batch's base offset. Offsets must not go backwards: a base offset
        below the log end (or below the previous batch's end) raises InvalidRecordError and
        nothing is appended (truncate first)."""
        return self.append(batch, assign_offsets=False)

    def _assign(self, headers, assign: bool) -> tuple[list, int, int]:
        """Base offsets for the batches: (base offsets, last offset, record count).

        A leader assigns them from the log end; a follower keeps the leader's and they must
        not go backwards."""
        next_offset, bases, records = self._log_end_offset, [], 0
        for h in headers:
            if not assign:
                if h.base_offset < next_offset:
                    raise InvalidRecordError(
                        f"follower append at offset {h.base_offset} is below the expected {next_offset}")
                next_offset = h.base_offset
            bases.append(next_offset)
            next_offset += h.last_offset_delta + 1
            records += h.record_count
        return bases, next_offset - 1, records

    def _patched(self, batch, headers, bases: list, leader_epoch: int, now: int) -> list:
        """The bytes to write, with base offsets and leader epochs patched.

        A writable buffer is patched in place; a read-only one (e.g. a ZeroMQ frame) is not
        copied: each batch's first 16 bytes are copied and patched, and the rest is written
        from the original buffer (one ``pwritev``). LogAppendTime rewrites covered bytes, so
        it patches a copy."""
        if _writable(batch) or self.config.log_append_time:
            buf = batch if _writable(batch) else bytearray(batch)
            pos = 0
            for h, base in zip(headers, bases):
                patch_base_offset(buf, base, leader_epoch, pos)
                if self.config.log_append_time:
                    set_log_append_time(buf, now, pos)
                pos += h.batch_length + 12
            return [buf]
        mv, parts, pos = memoryview(batch), [], 0
        for h, base in zip(headers, bases):
            head = bytearray(mv[pos:pos + PATCHED_PREFIX])
            patch_base_offset(head, base, leader_epoch)
            end = pos + h.batch_length + 12
            parts += (head, mv[pos + PATCHED_PREFIX:end])
            pos = end
        return parts

    def _reserve_index(self, seg: LogSegment, entries: int) -> None:
        """Index room for an append's entries (+1 for the entry that seals the segment),
        allocated before the batch is written: a full disk fails here, with nothing written."""
        try:
            seg.reserve_index(entries)
        except OSError as e:
            raise _storage(f"growing the indexes of {seg.log_path}", e) from None

    def _undo_write(self, seg: LogSegment, position: int, e: OSError):
        """A write at ``position`` failed: cut what it left (now, or before the next append)."""
        try:
            self._files.ftruncate(seg.fd, position)
        except OSError:
            self._dirty_tail = (seg, position)
        raise _storage(f"append to {seg.log_path}", e) from None

    def _repair_tail(self) -> None:
        """Cut bytes a failed write left behind (retried until it works)."""
        if self._dirty_tail is not None:
            seg, size = self._dirty_tail
            try:
                with seg.log_fd() as fd:
                    self._files.ftruncate(fd, size)
            except OSError as e:
                raise _storage(f"truncating the failed write in {seg.log_path}", e) from None
            self._dirty_tail = None

    def _update_epochs(self, change, *args) -> None:
        """Apply a change to the epoch cache. A failed write of its file is logged, not
        raised: the data change it follows is done and the cache in memory is right;
        ``checkpoint`` rewrites the file, and a stale file is trimmed to the log on open."""
        try:
            change(*args)
        except StorageError as e:
            log.warning("%s: %s; the leader-epoch checkpoint is rewritten at the next "
                        "checkpoint", self.dir, e)

    # ------------------------------------------------------------------ segments
    def _segment_for(self, size: int, batches: int, first: int, last: int, now: int) -> LogSegment:
        """The active segment (woken if suspended), rolled first if this append would not fit it."""
        seg = self._segments[-1]
        if seg.oidx is None:
            self._wake(seg)
        seg.used = True
        if seg.size == 0:
            if last - seg.base_offset > MAX_RELATIVE_OFFSET or first < seg.base_offset:
                return self._roll(first, now)
            return seg
        if (seg.size + size > self.config.segment_bytes
                or now - seg.created_ms >= self.config.segment_ms
                or not seg.index_room(batches + 1)
                or last - seg.base_offset > MAX_RELATIVE_OFFSET):
            return self._roll(first, now)
        return seg

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        self._check_open()
        if self._segments[-1].size == 0:
            return self._segments[-1]
        if self._segments[-1].oidx is None:  # sealed with its final time entry, trimmed
            self._wake(self._segments[-1])
        return self._roll(self._log_end_offset, self._now())

    def _wake(self, seg: LogSegment) -> None:
        """Reopen the writers of the active segment the process's budget suspended."""
        try:
            seg.activate(self.config.max_index_entries, self.config.index_interval_bytes)
        except OSError as e:
            raise _storage(f"reopening the active segment {seg.log_path}", e) from None

    def _roll(self, base_offset: int, now: int) -> LogSegment:
        old = self._segments[-1]
        if old.size:  # the producer state as of the new segment's start (Kafka's snapshot at roll)
            self._snapshot_producers(self._log_end_offset)
        try:
            new = self._create_segment(base_offset, now)
        except OSError as e:
            raise _storage(f"rolling a segment at {base_offset}", e) from None
        if old.size == 0:
            self._segments.pop().delete()
            self._bases.pop()
        else:
            old.seal(self._log_end_offset)
            self._unflushed_segments.append(old)
        self._segments.append(new)
        self._bases.append(base_offset)
        self._generation += 1
        return new

    def _create_segment(self, base_offset: int, now: int) -> LogSegment:
        return create_segment(self._files, self.dir, base_offset, now, self.config.max_index_entries,
                              self.config.index_interval_bytes)

    # ------------------------------------------------------------------ read
    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> ReadResult:
        """Whole batches from the one containing ``offset``: at least one batch (even if larger
        than ``max_bytes``), then more while they fit in ``max_bytes``, all below
        ``upper_bound`` (exclusive; e.g. the high watermark for consumers). Offsets outside
        [log start, log end] raise OffsetOutOfRangeError; at the end, the result is empty."""
        self._check_open()
        return plan_read(self._segments, self._bases, offset, max_bytes, upper_bound,
                         self._log_start_offset, self._log_end_offset, self._high_watermark)

    def fetch(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> bytes:
        """``read`` then the bytes, read through this log's open files."""
        result = self.read(offset, max_bytes, upper_bound)
        by_path = {s.log_path: s for s in self._segments}
        try:
            return b"".join(by_path[s.path].pread(s.length, s.position) for s in result.slices)
        except OSError as e:
            raise _storage("read", e) from None

    def offset_for_time(self, timestamp: int) -> TimestampOffset | None:
        """The first record with timestamp >= ``timestamp`` (-2 earliest, -1 latest)."""
        self._check_open()
        return plan_offset_for_time(self._segments, timestamp, self._log_start_offset, self._log_end_offset)

    # ------------------------------------------------------------------ flush, checkpoints
    def maybe_flush(self, now: int | None = None) -> bool:
        """Flush if ``flush.messages`` or ``flush.ms`` says so. Returns True if it flushed."""
        now = self._now() if now is None else now
        if self._unflushed and (self._unflushed >= self.config.flush_messages
                                or now - self._last_flush_ms >= self.config.flush_ms):
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """fsync every unflushed segment and index; the recovery point becomes the log end."""
        self._check_open()
        try:
            for seg in self._unflushed_segments:
                if not seg.closed:
                    seg.flush()
            if self._unflushed_segments:
                self._files.fsync_dir(self.dir)
            self._segments[-1].flush()
        except OSError as e:
            raise _storage("flush", e) from None
        self._unflushed_segments.clear()
        self._unflushed = 0
        self._last_flush_ms = self._now()
        self._recovery_point = self._durable_end = self._log_end_offset

    # ------------------------------------------------------------------ group commit
    def begin_sync(self) -> "SyncJob | None":
        """What one fsync of everything appended since the last one needs (group commit: the
        log actor runs ``SyncJob.run`` on a thread while appends go on, then ``end_sync`` on its
        loop); None if the log end is durable already. The job holds its own duplicates of the
        descriptors, so a roll or a close meanwhile cannot pull a file from under it. Raises
        StorageError if a descriptor cannot be had."""
        if self._closed or self._durable_end >= self._log_end_offset:
            return None
        segments = [s for s in self._unflushed_segments if not s.closed] + [self._segments[-1]]
        fds: list[int] = []
        try:
            for seg in segments:
                with seg.log_fd() as fd:
                    fds.append(os.dup(fd))
        except OSError as e:
            for fd in fds:
                os.close(fd)
            raise _storage(f"syncing {self.dir}", e) from None
        # a segment rolled since the last sync: its name must be durable too (its directory)
        return SyncJob(self._files, fds, self.dir if len(segments) > 1 else None, self._log_end_offset,
                       self._truncations, segments[:-1])

    def end_sync(self, job: "SyncJob") -> None:
        """On the log's thread, after ``job.run()`` returned: what it fsynced is durable (unless
        the log was truncated meanwhile: then bytes past the cut may be new ones, written after
        the fsync began, and the next sync covers them)."""
        if job.truncations != self._truncations or self._closed:
            return
        self._durable_end = max(self._durable_end, min(job.end, self._log_end_offset))
        if job.segments:
            self._unflushed_segments = [s for s in self._unflushed_segments if s not in job.segments]

    def _sync_recovered(self) -> None:
        """After an unclean start, what recovery kept past the recovery point may be in the
        page cache only (a kill -9 leaves it there): fsync it now, so that ``durable_end``,
        the log end from here on, is true."""
        if self._recovery_point < self._log_end_offset:
            self._unflushed_segments = [s for s, nxt in zip(self._segments, self._bases[1:])
                                        if nxt > self._recovery_point]
            self.flush()
        else:
            self._durable_end = self._log_end_offset

    def checkpoint(self) -> None:
        """Write log start offset, recovery point and high watermark atomically (and the
        leader-epoch cache's file, if a write of it failed earlier)."""
        data = Checkpoint(self._log_start_offset, self._recovery_point, self._high_watermark).encode()
        try:
            self._files.write_file_atomically(os.path.join(self.dir, CHECKPOINT), data)
        except OSError as e:
            raise _storage("checkpoint", e) from None
        self.leader_epochs.flush()

    # ------------------------------------------------------------------ truncation, deletion
    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is >= ``offset`` (a follower diverged).

        Truncation is by whole batch: a batch straddling ``offset`` goes too, and the log
        end becomes min(``offset``, that batch's base offset). Epochs starting at or after
        the new log end leave the epoch cache (all of them if the log is emptied).
        """
        self._check_open()
        if offset >= self._log_end_offset:
            # no data to cut; epochs recorded at the log end (none of their data written) go
            self._update_epochs(self.leader_epochs.truncate_from_end, self._log_end_offset)
            return
        try:
            if offset <= self._log_start_offset or offset <= self._bases[0]:
                self._truncate_fully(offset)
            else:
                self._truncate_within(offset)
        except OSError as e:
            raise _storage(f"truncate to {offset}", e) from None
        self._update_epochs(self.leader_epochs.truncate_from_end, self._log_end_offset)
        self._recovery_point = min(self._recovery_point, self._log_end_offset)
        self._high_watermark = min(self._high_watermark, self._log_end_offset)
        self._durable_end = min(self._durable_end, self._log_end_offset)  # the cut was fsynced
        self._truncations += 1
        self._generation += 1
        self.checkpoint()
        try:
            self.txn_index.keep(self._log_start_offset, self._log_end_offset)
            self._rebuild_producer_state()
        except OSError as e:
            raise _storage(f"rebuilding the producer state after truncating to {offset}", e) from None

    def _truncate_within(self, offset: int) -> None:
        i = bisect.bisect_right(self._bases, offset) - 1
        while len(self._segments) > i + 1:
            self._segments.pop().delete()
            self._bases.pop()
        seg = self._segments[-1]
        hit = seg.locate(offset) if seg.size else None
        if hit is None:
            new_size, new_end = seg.size, offset
        else:
            new_size, new_end = hit.position, min(offset, hit.header.base_offset)
        if seg.oidx is None:
            seg.activate(self.config.max_index_entries, self.config.index_interval_bytes)
        seg.truncate(new_size, new_end, self.config.index_interval_bytes)
        self._log_end_offset = max(new_end, seg.base_offset)
        self._unflushed_segments = [s for s in self._unflushed_segments if s in self._segments[:-1]]
        if self._log_end_offset < self._log_start_offset:
            # a whole-batch cut went below the log start: nothing visible is left
            self._truncate_fully(self._log_start_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start empty at ``offset`` (any offset >= 0, e.g. the
        leader's log start after OFFSET_OUT_OF_RANGE): log start = log end = high watermark
        = recovery point = ``offset``; the epoch cache is cleared."""
        self._check_open()
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot start the log at negative offset {offset}")
        try:
            self._truncate_fully(offset)
        except OSError as e:
            raise _storage(f"truncate fully and start at {offset}", e) from None
        self._recovery_point = self._high_watermark = self._durable_end = offset
        self._truncations += 1
        self._generation += 1
        self.checkpoint()

    def _truncate_fully(self, offset: int) -> None:
        """Drop everything and start empty at ``offset``; the epoch cache is cleared."""
        now = self._now()
        new = self._create_segment_replacing(offset, now)
        for seg in self._segments:
            if seg is not new:
                seg.delete()
        self._segments, self._bases = [new], [offset]
        self._unflushed_segments.clear()
        self._log_start_offset = self._log_end_offset = offset
        self._forget_all_but(offset)

    def _forget_all_but(self, offset: int) -> None:
        """The log restarted empty at ``offset``: no epochs, producers or aborted transactions."""
        self._update_epochs(self.leader_epochs.clear)
        self.producers.clear()
        self.producers.delete_snapshots(above=-1)
        self.txn_index.keep(offset, offset)

    def _create_segment_replacing(self, offset: int, now: int) -> LogSegment:
        for i, seg in enumerate(self._segments):
            if seg.base_offset == offset:
                self._segments.pop(i)
                self._bases.pop(i)
                seg.delete()
                break
        return self._create_segment(offset, now)

    def delete_records_before(self, offset: int) -> int:
        """Advance the log start offset to ``offset`` (<= high watermark); returns it.

        Whole segments below it are deleted at once (renamed ``.deleted``)."""
        self._check_open()
        if offset > self._high_watermark or offset < 0:
            raise OffsetOutOfRangeError(
                f"cannot delete records before {offset}: high watermark is {self._high_watermark}")
        if offset > self._log_start_offset:
            self._log_start_offset = offset
            self.checkpoint()
            self._update_epochs(self.leader_epochs.truncate_from_start, offset)
            self._delete_segments(self._breached_by_start())
        return self._log_start_offset

    def apply_retention(self) -> int:
        """Delete closed segments past ``retention.ms``/``retention.bytes`` or below the log start.

        Call periodically (the log actor's retention timer). Returns segments deleted.
        """
        self._check_open()
        doomed = self._breached_by_start()
        if self.config.delete:
            doomed = max(doomed, self._breached_by_time(), self._breached_by_size())
        self._delete_segments(doomed)
        self.delete_expired_files()
        return doomed

    def _breached_by_start(self) -> int:
        n = 0
        while n < len(self._segments) - 1 and self._segments[n + 1].base_offset <= self._log_start_offset:
            n += 1
        return n

    def _breached_by_time(self) -> int:
        if self.config.retention_ms < 0:
            return 0
        horizon = self._now() - self.config.retention_ms
        n = 0
        while n < len(self._segments) - 1:
            seg = self._segments[n]
            stamp = seg.max_timestamp if seg.max_timestamp >= 0 else seg.created_ms
            if stamp >= horizon:
                break
            n += 1
        return n

    def _breached_by_size(self) -> int:
        if self.config.retention_bytes < 0:
            return 0
        excess = self.size - self.config.retention_bytes
        n = 0
        while n < len(self._segments) - 1 and excess - self._segments[n].size >= 0:
            excess -= self._segments[n].size
            n += 1
        return n

    def _delete_segments(self, count: int) -> None:
        """Rename the oldest ``count`` segments to ``.deleted``; unlink them later."""
        if count <= 0:
            return
        doomed = []
        try:
            for seg in self._segments[:count]:
                for p in seg.all_paths:
                    if self._files.exists(p):
                        self._files.rename(p, p + DELETED_SUFFIX)
                        doomed.append(p + DELETED_SUFFIX)
                seg.close(trim=False)
                self._segments.pop(0)
                self._bases.pop(0)
        except OSError as e:
            raise _storage("deleting segments", e) from None
        finally:
            if doomed:
                self._pending_deletes.append((self._now() + self.config.file_delete_delay_ms, doomed))
                self._generation += 1
                self._unflushed_segments = [s for s in self._unflushed_segments if s in self._segments]
                self._log_start_offset = max(self._log_start_offset, self._bases[0])
                self._high_watermark = max(self._high_watermark, self._log_start_offset)
                self._recovery_point = max(self._recovery_point, self._log_start_offset)
                self.checkpoint()
                self._update_epochs(self.leader_epochs.truncate_from_start, self._log_start_offset)
                # snapshots of deleted segments go (the newest stays: it still holds every producer)
                self.producers.delete_snapshots(below=self._bases[0])
                with contextlib.suppress(OSError):
                    self.txn_index.keep(self._log_start_offset, 1 << 62)

    def delete_expired_files(self) -> int:
        """Unlink ``.deleted`` files whose ``file.delete.delay.ms`` has passed."""
        now, removed, keep = self._now(), 0, []
        for due, paths in self._pending_deletes:
            if due > now:
                keep.append((due, paths))
                continue
            for p in paths:
                try:
                    self._files.unlink(p)
                    removed += 1
                except FileNotFoundError:
                    pass
                except OSError:
                    keep.append((due, [p]))
        self._pending_deletes = keep
        return removed

    # ------------------------------------------------------------------ producer state
    def expire_producers(self, now_ms: int | None = None) -> int:
        """Forget producers idle longer than ``producer.id.expiration.ms`` (the log actor's
        timer); returns how many went."""
        return self.producers.expire(self._now() if now_ms is None else now_ms)

    def _snapshot_producers(self, offset: int) -> None:
        """Write the producer snapshot at ``offset``; a failure is logged, not raised (memory
        is right; the next roll or close writes one, and recovery replays the log anyway)."""
        try:
            self.producers.snapshot(offset)
        except StorageError as e:
            log.warning("%s: %s; the producer state is rebuilt from the log on recovery", self.dir, e.message)

    def _rebuild_producer_state(self) -> None:
        """The producer state of the log as it is: the latest snapshot at or below the log
        end, then every batch header after it (or the whole log without a snapshot)."""
        start = self.producers.load(self._log_end_offset)
        start = max(start, self._bases[0]) if start >= 0 else self._bases[0]
        replayed = self._replay_producers(start)
        if replayed:
            log.info("%s: producer state rebuilt from %d batch headers after offset %d (%d producers)",
                     self.dir, replayed, start, len(self.producers))

    def _replay_producers(self, start: int) -> int:
        """Feed the headers of batches at or after ``start`` to the producer state (header
        reads only, in ``SCAN_CHUNK`` reads). Returns the number of batches seen."""
        seen = 0
        for i, seg in enumerate(self._segments):
            if i + 1 < len(self._segments) and self._segments[i + 1].base_offset <= start:
                continue
            if not seg.size:
                continue
            pos = 0
            if start > seg.base_offset:
                hit = seg.locate(start)
                if hit is None:
                    continue
                pos = hit.position
            buf, buf_start = b"", pos
            while pos + HEADER_SIZE <= seg.size:
                if pos + HEADER_SIZE > buf_start + len(buf):
                    buf, buf_start = seg.pread(min(SCAN_CHUNK, seg.size - pos), pos), pos
                    if len(buf) < HEADER_SIZE:
                        break
                h = BatchHeader._make(HEADER.unpack_from(buf, pos - buf_start))
                if h.batch_length < HEADER_SIZE - LOG_OVERHEAD:
                    break
                if h.producer_id >= 0 and h.base_offset >= start:
                    self._track_batch(h, h.base_offset)
                seen += 1
                pos += h.size
        return seen

    # ------------------------------------------------------------------ compaction support
    def replace_segment(self, old: LogSegment, new: LogSegment) -> None:
        """Swap a closed segment's in-memory object (the cleaner did the files)."""
        i = self._segments.index(old)
        assert i < len(self._segments) - 1, "the active segment is never replaced"
        self._segments[i] = new
        self._generation += 1

    @property
    def files(self) -> FileLayer:
        return self._files

    def now_ms(self) -> int:
        return self._now()

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Flush, trim the indexes, write the checkpoint and the clean-shutdown marker."""
        if self._closed:
            return
        try:
            self._repair_tail()
            self.flush()
            self.checkpoint()
            self._snapshot_producers(self._log_end_offset)
            for seg in self._segments:
                seg.close(trim=True)
            marker = os.path.join(self.dir, CLEAN_SHUTDOWN)
            self._files.write_file_atomically(marker, b"")
        except OSError as e:
            raise _storage("close", e) from None
        finally:
            self._closed = True
            for seg in self._segments:
                try:
                    seg.close(trim=False)
                except OSError:
                    pass

    def abandon(self) -> None:
        """Drop the log without flushing or the marker: what a crash leaves (tests, shutdown
        after a storage error). Only releases file descriptors and maps."""
        for seg in self._segments:
            try:
                seg.close(trim=False)
            except OSError:
                pass
        self._closed = True

    def take_offline(self, reason: str) -> None:
        """Its directory failed (an fsync's EIO: Linux may have dropped the pages whose write
        failed, so a later fsync that succeeds would vouch for data that is not on the disk):
        dropped as by a crash, no flush, no checkpoint, no clean-shutdown marker, so the next
        start recovers it from what the disk holds; every later operation raises StorageError
        saying ``reason``. ``durable_end`` never moves again."""
        self.offline = reason
        self.abandon()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.dir} is offline: {self.offline}" if self.offline else
                               f"log {self.dir} is closed")

    # ------------------------------------------------------------------ loading
    def _load(self) -> RecoveryReport:
        """Open the directory (``log.loader``) and adopt what it found."""
        try:
            loaded = load_log(self.dir, self.config, self._files, self._now)
        except OSError as e:
            self.abandon()
            raise _storage(f"loading {self.dir}", e) from None
        self._adopt(loaded)
        if loaded.restarted_at is not None:
            try:
                self._forget_all_but(loaded.restarted_at)
            except OSError as e:
                self.abandon()
                raise _storage(f"loading {self.dir}", e) from None
        return loaded.report

    def _adopt(self, loaded: LoadedLog) -> None:
        """Take the state the loader returned: the one place it enters the log."""
        self._segments = loaded.segments
        self._bases = [s.base_offset for s in loaded.segments]
        self._log_start_offset = loaded.log_start_offset
        self._log_end_offset = loaded.log_end_offset
        self._recovery_point = loaded.recovery_point
        self._high_watermark = loaded.high_watermark

    def __repr__(self) -> str:
        return (f"Log({self.dir!r}, start={self._log_start_offset}, end={self._log_end_offset}, "
                f"hw={self._high_watermark}, segments={len(self._segments)})")


class SyncJob:
    """One group commit of a log (``Log.begin_sync``): ``run`` fsyncs its descriptors (and the
    directory when a segment rolled), on any thread, then closes them; ``error`` is the
    ``StorageError`` it met, if any. ``end``: the log end it makes durable."""
    __slots__ = ("files", "fds", "directory", "end", "truncations", "segments", "error")

    def __init__(self, files: FileLayer, fds: list, directory: str | None, end: int, truncations: int,
                 segments: list):
        self.files, self.fds, self.directory, self.end = files, fds, directory, end
        self.truncations, self.segments, self.error = truncations, segments, None

    def run(self) -> "SyncJob":
        try:
            for fd in self.fds:
                self.files.fsync(fd)
            if self.directory is not None:
                self.files.fsync_dir(self.directory)
        except OSError as e:
            self.error = _storage("fsync", e)
        finally:
            for fd in self.fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        return self


def _writable(buf) -> bool:
    if isinstance(buf, bytearray):
        return True
    return isinstance(buf, memoryview) and not buf.readonly and buf.contiguous


__all__ = ["AppendInfo", "Log", "LogSegment", "SyncJob", "ReadResult", "LogBounds", "OdradekError",
           "CLEAN_SHUTDOWN", "CHECKPOINT", "SEGMENT_RE", "LOG_SUFFIX", "INDEX_SUFFIX",
           "TIMEINDEX_SUFFIX", "DELETED_SUFFIX", "CLEANED_SUFFIX", "SWAP_SUFFIX", "TMP_SUFFIX"]
