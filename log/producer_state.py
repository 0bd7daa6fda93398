"""Producer state of one partition: per producer id, its epoch and its last batches.

Kafka's producer state manager (KIP-98, KIP-360), owned by the partition's ``Log`` (single
writer, not thread-safe). From batch header fields only (no record decoded):
``check(pid, epoch, first_seq, last_seq)`` on the leader before an append: a repeat of one of
the last ``MAX_CACHED_BATCHES`` returns that batch's ``BatchMetadata`` (answered with its
original offsets, nothing written); an older epoch raises ``InvalidProducerEpochError``; a new
epoch not at sequence 0 or a gap raises ``OutOfOrderSequenceError`` (``2**31 - 1`` wraps to 0);
an unknown id at a sequence other than 0 raises ``UnknownProducerIdError``.
``update(...)`` after the leader's append, for every batch a follower copies and every batch
replayed on recovery. ``snapshot(offset)`` writes ``<20-digit offset>.snapshot`` (docs/FORMAT.md)
at each segment roll and clean close; on open the log loads the latest at or below its end and
replays the headers after it. ``expire(now)`` forgets producers idle past
``producer.id.expiration.ms``.
Invariants: snapshots are written with temp file, fsync, rename; a refused batch changes nothing.
"""
from __future__ import annotations

import array
import logging
import os
import struct
import zlib
from typing import NamedTuple

import msgpack

from odradek.core.errors import StorageError
from odradek.log.files import FileLayer
from odradek.core.protocol import ErrorCode, OdradekError

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
# Kafka's ProducerStateEntry.NumBatchesToRetain is 5 (its producers have at most 5 requests
# in flight); the bundled producer stamps up to this many batches of a partition in flight
# (odradek.producer_sender.MAX_STAMPED), several per request, so a leader keeps more. Kafka clients
# are served the same (a superset: more of their retries are recognised). Kept as four
# 8-byte integers a batch in one array (~1.1 KB for 32 batches; 16 named tuples took ~2.5 KB).
MAX_CACHED_BATCHES = 32
INT32_MAX = (1 << 31) - 1
NO_PRODUCER_ID = -1
DEFAULT_EXPIRATION_MS = 86400000  # Kafka's producer.id.expiration.ms
_SNAP_HEAD = struct.Struct(">HI")  # version u16 | crc32 of the rest u32

log = logging.getLogger("odradek.log")


class OutOfOrderSequenceError(OdradekError):
    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class DuplicateSequenceError(OdradekError):
    code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER


class InvalidProducerEpochError(OdradekError):
    code = ErrorCode.INVALID_PRODUCER_EPOCH


class UnknownProducerIdError(OdradekError):
    code = ErrorCode.UNKNOWN_PRODUCER_ID


class InvalidTxnStateError(OdradekError):
    code = ErrorCode.INVALID_TXN_STATE


class CoordinatorFencedError(OdradekError):
    code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class BatchMetadata(NamedTuple):
    """One appended batch of a producer: its sequences and the offsets the log gave it."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


class ProducerEntry:
    """What the partition knows of one producer id."""

    __slots__ = ("epoch", "window", "last_timestamp", "txn_first_offset", "coordinator_epoch")

    def __init__(self, epoch: int, last_timestamp: int = -1):
        self.epoch = epoch
        # its last batches, oldest first, at most MAX_CACHED_BATCHES: first_seq, last_seq,
        # first_offset, last_offset of each, flat (``batches`` reads them as BatchMetadata)
        self.window = array.array("q")
        self.last_timestamp = last_timestamp
        self.txn_first_offset = -1  # first offset of its open transaction here, -1: none
        self.coordinator_epoch = -1  # of the last marker written for it here, -1: none yet

    @property
    def batches(self) -> list[BatchMetadata]:
        w = self.window
        return [BatchMetadata(*w[i:i + 4]) for i in range(0, len(w), 4)]

    @batches.setter
    def batches(self, batches) -> None:
        self.window = array.array("q", [v for b in list(batches)[-MAX_CACHED_BATCHES:] for v in b])

    def add(self, first_seq: int, last_seq: int, first_offset: int, last_offset: int) -> None:
        w = self.window
        if len(w) >= 4 * MAX_CACHED_BATCHES:
            del w[:4]
        w.extend((first_seq, last_seq, first_offset, last_offset))

    def find(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with these sequences, if any."""
        w = self.window
        for i in range(0, len(w), 4):
            if w[i] == first_seq and w[i + 1] == last_seq:
                return BatchMetadata(*w[i:i + 4])
        return None

    @property
    def last_seq(self) -> int:
        return self.window[-3] if self.window else -1

    def __repr__(self) -> str:
        return f"ProducerEntry(epoch={self.epoch}, batches={self.batches}, ts={self.last_timestamp})"


def last_sequence(first_seq: int, last_offset_delta: int) -> int:
    """The last record's sequence: Kafka's wrap-around at ``2**31 - 1``."""
    if first_seq > INT32_MAX - last_offset_delta:
        return first_seq - (INT32_MAX - last_offset_delta) - 1
    return first_seq + last_offset_delta


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (last_seq == INT32_MAX and next_seq == 0)


def snapshot_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offset(name: str) -> int | None:
    """The offset a file name ``<20 digits>.snapshot`` stands for, else None."""
    if len(name) == 20 + len(SNAPSHOT_SUFFIX) and name.endswith(SNAPSHOT_SUFFIX) and name[:20].isdigit():
        return int(name[:20])
    return None


def encode_snapshot(producers: dict[int, ProducerEntry]) -> bytes:
    body = msgpack.packb([[pid, e.epoch, e.last_timestamp, [list(b) for b in e.batches], e.txn_first_offset,
                           e.coordinator_epoch] for pid, e in producers.items()])
    return _SNAP_HEAD.pack(SNAPSHOT_VERSION, zlib.crc32(body)) + body


def decode_snapshot(data: bytes) -> dict[int, ProducerEntry]:
    """Producers from a snapshot file's bytes; ``ValueError`` if they are not a sound one."""
    if len(data) < _SNAP_HEAD.size:
        raise ValueError("shorter than its header")
    version, crc = _SNAP_HEAD.unpack_from(data)
    body = data[_SNAP_HEAD.size:]
    if version != SNAPSHOT_VERSION:
        raise ValueError(f"version {version}, not {SNAPSHOT_VERSION}")
    if zlib.crc32(body) != crc:
        raise ValueError("CRC mismatch")
    out: dict[int, ProducerEntry] = {}
    try:
        for pid, epoch, ts, batches, *txn in msgpack.unpackb(body, strict_map_key=True):
            e = ProducerEntry(int(epoch), int(ts))
            e.txn_first_offset = int(txn[0]) if txn else -1
            e.coordinator_epoch = int(txn[1]) if len(txn) > 1 else -1
            e.batches = [BatchMetadata(*map(int, b)) for b in batches]
            out[int(pid)] = e
    except (TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed entries: {exc}") from None
    return out


class ProducerStateManager:
    """The producer ids of one partition. Single writer (its ``Log``)."""

    def __init__(self, directory: str, files: FileLayer | None = None,
                 expiration_ms: int = DEFAULT_EXPIRATION_MS):
        self.dir = directory
        self._files = files or FileLayer()
        self.expiration_ms = expiration_ms
        self.producers: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self.producers)

    def get(self, pid: int) -> ProducerEntry | None:
        return self.producers.get(pid)

    # ------------------------------------------------------------------ the leader's checks
    def check(self, pid: int, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """Is a batch of ``pid`` at ``epoch`` with sequences ``first_seq..last_seq`` the next one?

        Returns None (append it), or the metadata of the identical batch already appended
        (a duplicate: answer with its offsets, append nothing). Raises the errors the module
        docstring lists; nothing changes here."""
        if first_seq < 0:
            raise OutOfOrderSequenceError(
                f"producer {pid}: an idempotent batch needs a base sequence >= 0, got {first_seq}")
        e = self.producers.get(pid)
        if e is None:
            if first_seq != 0:
                raise UnknownProducerIdError(
                    f"producer {pid} is unknown to this partition (expired or never seen) and its batch starts "
                    f"at sequence {first_seq}, not 0; the producer must reset its sequences (bump its epoch)")
            return None
        if epoch < e.epoch:
            raise InvalidProducerEpochError(
                f"producer {pid}: epoch {epoch} is older than the current epoch {e.epoch} (a newer "
                f"instance took over this producer id)")
        if epoch > e.epoch:
            if first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"producer {pid}: the first batch of the new epoch {epoch} starts at sequence {first_seq}, not 0")
            return None
        if in_sequence(e.last_seq, first_seq):
            return None  # the next batch, the usual case: no retained batch can start there
        duplicate = e.find(first_seq, last_seq)
        if duplicate is not None:
            return duplicate
        raise OutOfOrderSequenceError(
            f"producer {pid} epoch {epoch}: sequence {first_seq} does not follow {e.last_seq} (a batch "
            f"before it is missing)")

    # ------------------------------------------------------------------ updates
    def update(self, pid: int, epoch: int, first_seq: int, last_seq: int, first_offset: int,
               last_offset: int, timestamp: int) -> None:
        """Record an appended batch (no checks: the leader's ``check`` came first, or a
        follower copies the leader, or recovery replays the log)."""
        e = self.producers.get(pid)
        if e is None:
            e = self.producers[pid] = ProducerEntry(epoch, timestamp)
        elif epoch != e.epoch:
            if epoch < e.epoch:  # replayed data of an older epoch (after a truncation): keep the newer
                return
            e.epoch = epoch
            e.batches = []
        e.add(first_seq, last_seq, first_offset, last_offset)
        if timestamp > e.last_timestamp:
            e.last_timestamp = timestamp

    # ------------------------------------------------------------------ transactions
    def begin_txn(self, pid: int, epoch: int, first_offset: int, timestamp: int) -> None:
        """A transactional batch at ``first_offset``: the producer's transaction is open here
        from its first such batch on (until its marker)."""
        e = self.producers.get(pid)
        if e is None:
            e = self.producers[pid] = ProducerEntry(epoch, timestamp)
        if e.txn_first_offset < 0:
            e.txn_first_offset = first_offset

    def end_txn(self, pid: int, epoch: int, timestamp: int, coordinator_epoch: int = -1) -> int:
        """A commit or abort marker of ``pid``, written by the coordinator of
        ``coordinator_epoch``: its transaction is closed here. Returns the transaction's first
        offset (-1 if none was open: a marker for a partition the producer wrote nothing to)."""
        e = self.producers.get(pid)
        if e is None:
            e = self.producers[pid] = ProducerEntry(epoch, timestamp)
        first, e.txn_first_offset = e.txn_first_offset, -1
        if coordinator_epoch > e.coordinator_epoch:
            e.coordinator_epoch = coordinator_epoch
        if epoch > e.epoch:
            e.epoch, e.batches = epoch, []
        if timestamp > e.last_timestamp:
            e.last_timestamp = timestamp
        return first

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest open transaction, None if none is open."""
        firsts = [e.txn_first_offset for e in self.producers.values() if e.txn_first_offset >= 0]
        return min(firsts) if firsts else None

    def check_marker(self, pid: int, epoch: int, coordinator_epoch: int) -> None:
        """May a marker of ``pid`` at ``epoch`` from the coordinator of ``coordinator_epoch``
        be written? Not from a producer epoch older than the current one
        (INVALID_PRODUCER_EPOCH), nor from a coordinator older than the one that wrote this
        producer's last marker here (TRANSACTION_COORDINATOR_FENCED: a deposed coordinator
        still retrying what its successor already decided, as Kafka fences it)."""
        e = self.producers.get(pid)
        if e is None:
            return
        if epoch < e.epoch:
            raise InvalidProducerEpochError(
                f"producer {pid}: a marker at epoch {epoch}, older than the current epoch {e.epoch}")
        if coordinator_epoch < e.coordinator_epoch:
            raise CoordinatorFencedError(
                f"producer {pid}: a marker from the transaction coordinator of epoch {coordinator_epoch}, "
                f"older than the coordinator epoch {e.coordinator_epoch} of its last marker here (that "
                f"coordinator was replaced)")

    def expire(self, now_ms: int) -> int:
        """Forget producers whose last batch is older than ``expiration_ms`` (never one with
        an open transaction); returns how many."""
        horizon = now_ms - self.expiration_ms
        doomed = [pid for pid, e in self.producers.items() if e.last_timestamp < horizon and e.txn_first_offset < 0]
        for pid in doomed:
            del self.producers[pid]
        return len(doomed)

    def clear(self) -> None:
        self.producers.clear()

    # ------------------------------------------------------------------ snapshots
    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files present, ascending."""
        try:
            names = self._files.listdir(self.dir)
        except OSError:
            return []
        return sorted(o for o in map(snapshot_offset, names) if o is not None)

    def snapshot(self, offset: int) -> None:
        """Write ``<offset>.snapshot``: the state after every batch below ``offset``."""
        path = os.path.join(self.dir, snapshot_name(offset))
        try:
            self._files.write_file_atomically(path, encode_snapshot(self.producers))
        except OSError as e:
            raise StorageError(f"writing {path} failed: {e.strerror or e} (errno {e.errno})") from None

    def load(self, log_end_offset: int) -> int:
        """Load the latest sound snapshot at or below ``log_end_offset``; snapshots above it
        (a truncated log's) and unreadable ones are deleted. Returns the offset replay starts
        from (the snapshot's, or -1 if there is none: replay the whole log)."""
        self.producers = {}
        for offset in reversed(self.snapshot_offsets()):
            path = os.path.join(self.dir, snapshot_name(offset))
            if offset > log_end_offset:
                self._unlink(path)
                continue
            try:
                with open(path, "rb") as f:
                    self.producers = decode_snapshot(f.read())
                return offset
            except (OSError, ValueError) as exc:
                log.warning("%s: producer snapshot %s unusable (%s): deleted, the log is replayed instead",
                            self.dir, path, exc)
                self._unlink(path)
        return -1

    def delete_snapshots(self, below: int | None = None, above: int | None = None, keep_latest: bool = True) -> None:
        """Delete snapshots below ``below`` (keeping the newest of them if ``keep_latest``)
        and above ``above``."""
        offsets = self.snapshot_offsets()
        newest = offsets[-1] if offsets and keep_latest else None
        for o in offsets:
            if (below is not None and o < below and o != newest) or (above is not None and o > above):
                self._unlink(os.path.join(self.dir, snapshot_name(o)))

    def _unlink(self, path: str) -> None:
        try:
            self._files.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not delete %s: %s", path, exc)
