"""Consumer: reads assigned partitions with pipelined long-poll fetches (docs/CLIENT.md,
"Consumer", says what each setting does and how).

    with Consumer("127.0.0.1:9092", auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("orders", 0)])
        for record in c:              # Record(topic, partition, offset, timestamp, key, value, headers)
            ...

Threads: none of its own; everything runs in the thread that calls ``poll`` (or iterates).
Not thread-safe: one consumer per thread.
Owns: each assigned partition's position (``position(tp)``: the offset of the next record
``poll`` returns; a partition without one gets it from ListOffsets per ``auto_offset_reset``),
its fetch in flight and its undecoded buffer; with ``group_id``, the group membership
(``odradek.group``: subscribe, heartbeats, commits).
Invariants: at most one FETCH in flight per partition, the next sent once the last answer's
batch headers are read, and at most ``max_partition_fetch_bytes`` of a partition buffered
undecoded, so memory stays near two fetches per partition; records come out in offset order
from the position on (a torn last batch is ignored, records before the position skipped);
control batches are never returned, and with ``isolation_level="read_committed"`` nothing
past the last stable offset nor of an aborted transaction.
"""
from __future__ import annotations

import collections
import functools
import gc
import itertools
import logging
import select
import time
import zlib
from operator import add
from typing import Iterable, NamedTuple, Optional

import msgpack

from odradek.core import inflate, kafka_batch
from odradek.core import records as fmt
from odradek.network.clientauth import ClientSecurity
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.network.connection import wait_any
from odradek.cluster import STALE_METADATA, Cluster, Connection
from odradek.errors import error_for
from odradek.types import Record, TopicPartition

log = logging.getLogger("odradek.consumer")

EARLIEST, LATEST = -2, -1
_RESETS = {"earliest": EARLIEST, "smallest": EARLIEST, "latest": LATEST, "largest": LATEST, "none": None}
_new_record = functools.partial(tuple.__new__, Record)
_tuple_new = tuple.__new__
_gc_enabled, _gc_disable, _gc_enable = gc.isenabled, gc.disable, gc.enable
_unpackb = msgpack.unpackb
_repeat = itertools.repeat
_read_header = fmt.HEADER.unpack_from
_HEADER_SIZE = fmt.HEADER_SIZE
_MAGIC = fmt.MAGIC
_MAGICS = (fmt.MAGIC, kafka_batch.MAGIC)  # native batches and Kafka's (written by Kafka producers)
try:  # a native batch's Records in C (odradek/_recordbuild.c, built by setup.py); optional:
    from odradek._recordbuild import records as _build_records  # else built in Python below
except ImportError:
    _build_records = None


# ---- fetch-answer parsing (pure; unit-tested without a broker) -------------------------------
def split_batches(view, start: int = 0, end: int | None = None) -> tuple[list, str | None]:
    """Whole batches in ``view[start:end]`` as ``[(position, BatchHeader), ...]``, and why the
    walk stopped early (None if every byte was used). A torn, zero-padded or otherwise
    unreadable tail ends the walk without an error: the caller decides what it means."""
    end = len(view) if end is None else end
    out = []
    pos = start
    while pos < end:
        if end - pos < _HEADER_SIZE:
            return out, "partial header"
        h = fmt.BatchHeader._make(_read_header(view, pos))
        if h.magic not in _MAGICS or h.batch_length < fmt.MIN_BATCH_LENGTH or h.record_count < 1 \
                or h.last_offset_delta < h.record_count - 1 or h.base_offset < 0:
            return out, "zero padding" if not any(bytes(view[pos:pos + _HEADER_SIZE])) else "bad header"
        if pos + h.size > end:
            return out, "partial batch"
        out.append((pos, h))
        pos += h.size
    return out, None


def decode_records(view, pos: int, h, topic: str, partition: int, min_offset: int = 0,
                   check_crc: bool = True) -> list:
    """The ``Record``s of the batch at ``view[pos:]`` with offsets >= ``min_offset``.
    Raises ``CorruptMessageError`` if the batch does not check out."""
    end = pos + h.size
    if h.magic == kafka_batch.MAGIC:
        return _decode_kafka(view, pos, h, topic, partition, min_offset, check_crc)
    if check_crc and zlib.crc32(view[pos + fmt.CRC_START:end]) != h.crc:
        raise error_for(ErrorCode.CORRUPT_MESSAGE, f"{topic}-{partition}: CRC mismatch in the batch at offset "
                        f"{h.base_offset}")
    # The cyclic GC is paused while the batch's objects are made (msgpack's own advice for
    # unpacking many containers): two tuples a record (a row, then its Record) set off a
    # young collection every ~350 records, and full ones, with nothing cyclic to find: up to
    # ~40% of a consumer's CPU, depending on when its loop frees the records (docs/
    # BENCHMARKS.md, "Client-side keyed produce and consume"). Restored only if this call
    # paused it, so a caller's own setting stands.
    collecting = _gc_enabled()
    if collecting:
        _gc_disable()
    try:
        return _decode_native(view, pos, end, h, topic, partition, min_offset)
    finally:
        if collecting:
            _gc_enable()


def _decode_native(view, pos: int, end: int, h, topic: str, partition: int, min_offset: int) -> list:
    """``decode_records`` of a native batch whose CRC checked out."""
    n = h.record_count
    try:
        data = view[pos + _HEADER_SIZE:end]
        if h.attributes & fmt.COMPRESSION_MASK:  # inflated within the bound (core/inflate.py)
            data = inflate.inflate(inflate.LZ4_BLOCK, data)
        rows = _unpackb(data, use_list=False, raw=False)
        if len(rows) != n:
            raise ValueError(f"{len(rows)} records, header says {n}")
        if _build_records is not None and h.last_offset_delta == n - 1:
            # the common shape (consecutive offsets, one time for the batch) in C; None: another shape
            log_time = h.attributes & fmt.TIMESTAMP_TYPE_BIT
            out = _build_records(Record, topic, partition, h.base_offset,
                                 h.max_timestamp if log_time else h.first_timestamp, rows, not log_time,
                                 min_offset - h.base_offset)
            if out is not None:
                return out
        ods, tds, keys, values, headers = zip(*rows)
    except OdradekError as exc:  # beyond the bound, or not lz4
        raise _unreadable(exc, topic, partition, h) from None
    except Exception as exc:  # lz4, msgpack and unpacking errors all mean a corrupt batch
        raise error_for(ErrorCode.CORRUPT_MESSAGE, f"{topic}-{partition}: batch at offset {h.base_offset} "
                        f"does not decode ({type(exc).__name__}: {exc})") from None
    base = h.base_offset
    consecutive = h.last_offset_delta == n - 1
    offsets = range(base, base + n) if consecutive else map(add, _repeat(base, n), ods)
    if h.attributes & fmt.TIMESTAMP_TYPE_BIT:
        stamps = _repeat(h.max_timestamp, n)
    elif tds.count(0) == n:  # every record has the batch's time (the bundled producer's default): one int
        stamps = _repeat(h.first_timestamp, n)
    else:
        stamps = map(add, _repeat(h.first_timestamp, n), tds)
    # tuple.__new__(Record, row) straight from map: a partial around it cost ~20% of the decode
    out = list(map(_tuple_new, _repeat(Record, n), zip(_repeat(topic, n), _repeat(partition, n), offsets, stamps,
                                                         keys, values, headers)))
    if base < min_offset:
        if consecutive:
            return out[min_offset - base:]
        return [r for r in out if r.offset >= min_offset]
    return out


def _decode_kafka(view, pos: int, h, topic: str, partition: int, min_offset: int, check_crc: bool) -> list:
    """``decode_records`` for a Kafka (magic 2) batch: all five codecs, varint records."""
    batch = view[pos:pos + h.size]
    if check_crc and kafka_batch.crc_of(batch, 0, h.size) != h.crc:
        raise error_for(ErrorCode.CORRUPT_MESSAGE, f"{topic}-{partition}: CRC-32C mismatch in the Kafka batch "
                        f"at offset {h.base_offset}")
    try:
        rows = kafka_batch.decode(batch, h, fmt.Record)
    except OdradekError as exc:  # corrupt, or inflating beyond the bound (core/inflate.py)
        raise _unreadable(exc, topic, partition, h) from None
    return [_new_record((topic, partition, r.offset, r.timestamp, r.key, r.value,
                         tuple((k, v) for k, v in r.headers)))
            for r in rows if r.offset >= min_offset]


def _unreadable(exc: OdradekError, topic: str, partition: int, h) -> Exception:
    """The consumer's error for a batch that does not decode: its code, naming the batch."""
    return error_for(exc.code, f"{topic}-{partition}: batch at offset {h.base_offset} does not decode: "
                     f"{exc.message}")


class AbortedTransactions:
    """Which batches a ``read_committed`` reader of one partition must not hand out: control
    batches (commit/abort markers) and, Kafka's consumer rule, a producer's transactional
    batches from its aborted transaction's first offset up to its abort marker.

    Fed with each fetch answer's ``aborted_transactions`` (``add``), then asked about every
    batch in offset order (``skips``). Pure; shared by the bundled ``Consumer`` and the Spark
    connector's fetcher (``odradek.pipeline.broker``)."""

    __slots__ = ("ahead", "aborting")

    def __init__(self):
        self.ahead: list = []  # (first_offset, producer_id) of aborted transactions not reached yet
        self.aborting: set = set()  # producer ids whose aborted transaction is being skipped

    def add(self, entries) -> None:
        """A fetch answer's ``aborted_transactions`` (``[{producer_id, first_offset}]``)."""
        for a in entries or ():
            entry = (a["first_offset"], a["producer_id"])
            if entry not in self.ahead:
                self.ahead.append(entry)
        self.ahead.sort()

    def skips(self, h) -> bool:
        """Whether the batch with header ``h`` (the next one in offset order) is hidden."""
        last = h.base_offset + h.last_offset_delta
        ahead = self.ahead
        while ahead and ahead[0][0] <= last:
            self.aborting.add(ahead.pop(0)[1])
        if h.attributes & fmt.CONTROL_BIT:
            self.aborting.discard(h.producer_id)  # the marker ends that producer's transaction
            return True
        return bool(h.attributes & kafka_batch.TRANSACTIONAL_BIT) and h.producer_id in self.aborting


class ConsumerGroupMetadata(NamedTuple):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: Optional[str]


class _Partition:
    """What the consumer knows of one assigned partition."""

    __slots__ = ("tp", "position", "fetch_offset", "reset", "in_flight", "epoch", "batches", "buffered",
                 "leftover", "retry_at", "high_watermark", "view", "aborted")

    def __init__(self, tp: TopicPartition):
        self.tp = tp
        self.position: int | None = None  # next offset poll returns
        self.fetch_offset: int | None = None  # next offset to fetch
        self.reset: int | None = None  # EARLIEST/LATEST when the position must be looked up
        self.in_flight = False
        self.epoch = 0  # bumped by seek: answers to older fetches are dropped
        self.batches: collections.deque = collections.deque()  # (view, pos, header), undecoded
        self.buffered = 0
        self.leftover: list = []  # decoded records not yet returned
        self.retry_at = 0.0
        self.high_watermark = -1
        self.aborted = AbortedTransactions()  # read_committed: what to skip

    def clear(self) -> None:
        self.aborted = AbortedTransactions()
        self.batches.clear()
        self.buffered = 0
        self.leftover = []
        self.epoch += 1
        self.in_flight = False


class Consumer:
    """Reads records from assigned partitions. See the module docstring."""

    def __init__(self, bootstrap_servers="127.0.0.1:9092", *, auto_offset_reset: str = "latest",
                 fetch_min_bytes: int = 1, fetch_max_wait_ms: int = 500,
                 max_partition_fetch_bytes: int = 1 << 20, fetch_max_bytes: int = 50 << 20,
                 max_poll_records: int = 500, check_crcs: bool = True, request_timeout_ms: int = 30000,
                 retry_backoff_ms: int = 100, consumer_timeout_ms: float | None = None,
                 client_id: str = "odradek-consumer", group_id: Optional[str] = None,
                 group_instance_id: Optional[str] = None, enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000, session_timeout_ms: Optional[int] = None,
                 heartbeat_interval_ms: int = 3000, max_poll_interval_ms: int = 300000,
                 group_assignor: Optional[str] = None, metadata_max_age_ms: int = 300000,
                 isolation_level: str = "read_uncommitted", **security):
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', got {isolation_level!r}")
        self.read_committed = isolation_level == "read_committed"
        if auto_offset_reset not in _RESETS:
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', got {auto_offset_reset!r}")
        if max_poll_records < 1 or max_partition_fetch_bytes < 1:
            raise ValueError("max_poll_records and max_partition_fetch_bytes must be >= 1")
        self.auto_offset_reset = _RESETS[auto_offset_reset]
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_poll_records = max_poll_records
        self.check_crcs = check_crcs
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff = retry_backoff_ms / 1000
        self.consumer_timeout = None if consumer_timeout_ms is None else consumer_timeout_ms / 1000
        self.client_id = client_id
        self._cluster = Cluster(bootstrap_servers, client_id, request_timeout_ms, retry_backoff_ms,
                                metadata_max_age_ms, ClientSecurity.from_options(security))  # TLS/SASL options
        self._parts: dict[TopicPartition, _Partition] = {}
        self._order: list[_Partition] = []
        self._rr = 0
        self._conns: dict[int, Connection] = {}
        self._errors: list[OdradekError] = []
        self._metadata_wanted = False
        self._iter_buffer: collections.deque = collections.deque()
        self._closed = False
        self._group = None
        if group_id is not None:
            from odradek.group import GroupMembership
            self._group = GroupMembership(
                self, group_id, group_instance_id=group_instance_id, session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=heartbeat_interval_ms, max_poll_interval_ms=max_poll_interval_ms,
                enable_auto_commit=enable_auto_commit, auto_commit_interval_ms=auto_commit_interval_ms,
                assignor=group_assignor)

    # ---- assignment and positions ----------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any earlier assignment). Unknown topics or
        partitions raise ``UnknownTopicOrPartitionError`` here."""
        tps = [TopicPartition(*tp) for tp in partitions]
        self._check_exist(tps)
        old = self._parts
        self._parts = {tp: old.get(tp) or _Partition(tp) for tp in tps}
        for p in self._parts.values():
            if p.position is None and p.reset is None:
                p.reset = self.auto_offset_reset  # None ('none'): poll raises until seek()
        self._order = list(self._parts.values())

    def assignment(self) -> set:
        return set(self._parts)

    def subscribe(self, topics=None, pattern=None, on_assign=None, on_revoke=None) -> None:
        """Join the group (``group_id``) for these topics or this regex; partitions come and go
        at the start of ``poll`` calls, announced to ``on_assign(set)`` / ``on_revoke(set)``."""
        self._need_group("subscribe()").subscribe(topics, pattern, on_assign, on_revoke)

    def unsubscribe(self) -> None:
        self._need_group("unsubscribe()").unsubscribe()

    def commit(self, offsets: Optional[dict] = None) -> None:
        """Commit ``{tp: offset}`` (default: the positions of every assigned partition); waits."""
        self._need_group("commit()").commit(offsets)

    def commit_async(self, offsets: Optional[dict] = None, callback=None):
        """Commit without waiting; ``callback(offsets, error_or_None)`` runs on a helper thread."""
        return self._need_group("commit_async()").commit_async(offsets, callback)

    def group_metadata(self) -> "ConsumerGroupMetadata":
        """What ``Producer.send_offsets_to_transaction`` needs to commit this consumer's
        offsets in a transaction (confluent-kafka's and kafka-python's shape)."""
        g = self._need_group("group_metadata()")
        return ConsumerGroupMetadata(g.group_id, getattr(g, "member_epoch", -1), getattr(g, "member_id", "") or "",
                                     getattr(g, "group_instance_id", None))

    def committed(self, partition: TopicPartition) -> Optional[int]:
        """The group's committed offset of ``partition`` (None if there is none)."""
        off = self._need_group("committed()").committed([partition]).get(TopicPartition(*partition), -1)
        return off if off >= 0 else None

    def _need_group(self, what: str):
        if self._group is None:
            raise ValueError(f"{what} needs a group_id")
        return self._group

    def _group_assign(self, tps, positions: Optional[dict] = None) -> None:
        """The group's assignment (called by ``odradek.group``): partitions that stay keep
        their state; new ones start at ``positions`` (committed offsets) or auto_offset_reset."""
        old = self._parts
        self._parts = {tp: old.get(tp) or _Partition(tp) for tp in tps}
        for tp, p in self._parts.items():
            if tp not in old:
                if positions and tp in positions:
                    p.position = p.fetch_offset = positions[tp]
                else:
                    p.reset = self.auto_offset_reset
        self._order = list(self._parts.values())

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next one ``poll`` returns for ``partition``."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        p = self._part(partition)
        p.clear()
        p.position = p.fetch_offset = offset
        p.reset = None

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or list(self._parts):
            self._seek_reset(tp, EARLIEST)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or list(self._parts):
            self._seek_reset(tp, LATEST)

    def _seek_reset(self, tp: TopicPartition, which: int) -> None:
        p = self._part(tp)
        p.clear()
        p.position = p.fetch_offset = None
        p.reset = which

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record ``poll`` will return (looked up if not known yet)."""
        p = self._part(partition)
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        while p.position is None:
            p.retry_at = 0.0
            self._resolve_positions()
            self._raise_errors()
            if p.position is not None or p.reset is None:
                break
            if time.monotonic() + self.retry_backoff >= deadline:
                raise error_for(ErrorCode.REQUEST_TIMED_OUT, f"position of {p.tp.topic}-{p.tp.partition}: "
                                f"no answer from its leader within request_timeout_ms")
            time.sleep(max(self.retry_backoff, self._cluster.refresh_due()))
            if self._metadata_wanted:
                self._refresh_metadata()
        return p.position

    def highwater(self, partition: TopicPartition) -> int | None:
        """The partition's high watermark as of the last fetch answer (None before one)."""
        hw = self._part(partition).high_watermark
        return hw if hw >= 0 else None

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        return self._list_offsets(list(partitions), EARLIEST)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        return self._list_offsets(list(partitions), LATEST)

    def offsets_for_times(self, timestamps: dict) -> dict:
        """``{tp: timestamp_ms}`` -> ``{tp: offset}`` of the first record at or after it (-1: none)."""
        out = {}
        for tp, ts in timestamps.items():
            out.update(self._list_offsets([tp], ts))
        return out

    def _part(self, tp) -> _Partition:
        p = self._parts.get(TopicPartition(*tp))
        if p is None:
            raise ValueError(f"partition {tp} is not assigned to this consumer (assign() it first)")
        return p

    # ---- poll: the hot path -----------------------------------------------------------------------
    def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> list:
        """Records from the assigned partitions, waiting up to ``timeout_ms`` for the first
        ones; an empty list if none arrived. Raises the error of a failed partition."""
        if self._closed:
            raise RuntimeError("poll() on a closed consumer")
        max_records = max_records or self.max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            if self._group is not None:
                self._group.on_poll()  # auto-commit, then apply assignment changes
            if any(p.position is None for p in self._order):
                self._resolve_positions()
            self._send_fetches()
            records = self._collect(max_records)
            if records:
                return records
            self._raise_errors()
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            self._wait(left)

    def _collect(self, max_records: int) -> list:
        """Decode buffered batches into records, partition by partition (rotating the start)."""
        out: list = []
        parts = self._order
        n = len(parts)
        for i in range(n):
            p = parts[(self._rr + i) % n]
            while len(out) < max_records and (p.leftover or p.batches):
                if not p.leftover:
                    self._decode_next(p)
                    continue
                take = p.leftover[:max_records - len(out)]
                p.leftover = p.leftover[len(take):]
                out += take
                if not p.leftover and not p.batches and p.fetch_offset is not None:
                    p.position = max(p.position, p.fetch_offset) if p.position is not None else p.fetch_offset
                else:
                    p.position = take[-1].offset + 1
            if len(out) >= max_records:
                break
        self._rr = (self._rr + 1) % n if n else 0
        return out

    def _decode_next(self, p: _Partition) -> None:
        view, pos, h = p.batches.popleft()
        p.buffered -= h.size
        if h.base_offset + h.last_offset_delta < p.position:
            return  # wholly before the position (a re-read after seek, or a compacted tail)
        if self._skipped(p, h):
            p.leftover = []
            p.position = max(p.position, h.base_offset + h.last_offset_delta + 1)
            return
        try:
            p.leftover = decode_records(view, pos, h, p.tp.topic, p.tp.partition, p.position, self.check_crcs)
        except OdradekError as exc:
            p.clear()  # drop what follows too; a later poll refetches from this position
            p.fetch_offset = p.position
            self._errors.append(exc)
            return  # the position stays at the batch: poll raises until the application seeks past it
        if not p.leftover:
            p.position = max(p.position, h.base_offset + h.last_offset_delta + 1)

    def _skipped(self, p: _Partition, h) -> bool:
        """Control batches (transaction markers) are never handed out; with read_committed,
        neither are the batches of an aborted transaction (Kafka's consumer rule: a producer
        is skipped from its aborted transaction's first offset to its abort marker)."""
        if not self.read_committed:
            return bool(h.attributes & fmt.CONTROL_BIT)
        return p.aborted.skips(h)

    # ---- fetching ---------------------------------------------------------------------------------
    def _send_fetches(self) -> None:
        """One FETCH per leader for the partitions ready to fetch (after a metadata refresh,
        if one is wanted and ``retry_backoff_ms`` has passed since the last)."""
        cluster = self._cluster
        if (self._metadata_wanted or cluster.stale()) and self._order and not cluster.refresh_due():
            self._refresh_metadata()
        now = time.monotonic()
        by_node: dict[int, list] = {}
        for p in self._order:
            if p.in_flight or p.fetch_offset is None or p.buffered >= self.max_partition_fetch_bytes \
                    or p.retry_at > now:
                continue
            leader = cluster.leader(p.tp.topic, p.tp.partition)
            if leader < 0:
                self._metadata_wanted = True
                p.retry_at = now + self.retry_backoff
                continue
            by_node.setdefault(leader, []).append(p)
        for node, parts in by_node.items():
            conn = self._conn(node)
            if conn is None:
                for p in parts:
                    p.retry_at = now + self.retry_backoff
                continue
            self._send_fetch(conn, parts)

    def _send_fetch(self, conn: Connection, parts: list) -> None:
        """Each partition carries the leader epoch the metadata names (-1: unknown), so a
        broker that is no longer its leader, or not yet, says so instead of serving it."""
        topics: dict[str, list] = {}
        sent = []
        leader_epoch = self._cluster.leader_epoch
        for p in parts:
            tp = p.tp
            topics.setdefault(tp.topic, []).append({"index": tp.partition, "fetch_offset": p.fetch_offset,
                                                    "current_leader_epoch": leader_epoch(tp.topic, tp.partition),
                                                    "partition_max_bytes": self.max_partition_fetch_bytes})
            p.in_flight = True
            sent.append((p, p.epoch, p.fetch_offset))
        body = {"replica_id": -1, "max_wait_ms": self.fetch_max_wait_ms, "min_bytes": self.fetch_min_bytes,
                "max_bytes": self.fetch_max_bytes, "isolation_level": 1 if self.read_committed else 0,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
        conn.send(ApiKey.FETCH, body, (), lambda frame, err: self._on_fetch(sent, frame, err))

    def _on_fetch(self, sent: list, frame, err: OdradekError | None) -> None:
        """A FETCH answer: queue each partition's whole batches (headers read, records not)."""
        live = [(p, off) for p, epoch, off in sent if p.epoch == epoch and self._parts.get(p.tp) is p]
        for p, _ in live:
            p.in_flight = False
        if err is not None:
            self._fetch_failed([p for p, _ in live], err)
            return
        frames = frame.frames
        payload = frames[0] if len(frames) == 1 else memoryview(b"".join(frames))
        results = {}
        at = 0
        for t in frame.header["body"].get("topics", []):
            for part in t.get("partitions", []):
                size = part.get("records_size", 0) or 0
                results[(t["name"], part["index"])] = (part, at, at + size)
                at += size
        for p, offset in live:
            found = results.get(p.tp)
            if found is None:
                continue
            part, start, end = found
            code = part.get("error_code", 0)
            if code:
                self._partition_error(p, code, part.get("error_message"))
                continue
            p.high_watermark = part.get("high_watermark", p.high_watermark)
            p.aborted.add(part.get("aborted_transactions"))
            self._queue_batches(p, offset, payload, start, end)

    def _queue_batches(self, p: _Partition, offset: int, payload, start: int, end: int) -> None:
        batches, stopped = split_batches(payload, start, end)
        if not batches:
            if stopped in ("partial batch", "partial header") and end - start >= self.max_partition_fetch_bytes:
                self._errors.append(error_for(ErrorCode.MESSAGE_TOO_LARGE,
                                              f"{p.tp.topic}-{p.tp.partition}: the batch at offset {offset} is larger "
                                              f"than max_partition_fetch_bytes ({self.max_partition_fetch_bytes}); "
                                              f"raise it to read on"))
                p.retry_at = time.monotonic() + 3600
            elif stopped == "bad header":
                self._errors.append(error_for(ErrorCode.CORRUPT_MESSAGE,
                                              f"{p.tp.topic}-{p.tp.partition}: unreadable batch header at offset "
                                              f"{offset}"))
                p.retry_at = time.monotonic() + self.retry_backoff
            return
        for pos, h in batches:
            p.batches.append((payload, pos, h))
            p.buffered += h.size
        p.fetch_offset = max(offset, batches[-1][1].base_offset + batches[-1][1].last_offset_delta + 1)

    def _partition_error(self, p: _Partition, code: int, message: str | None) -> None:
        err = ErrorCode.of(code)
        where = f"{p.tp.topic}-{p.tp.partition}"
        if err is ErrorCode.OFFSET_OUT_OF_RANGE:
            if self.auto_offset_reset is None:
                self._errors.append(error_for(code, f"{where}: offset {p.fetch_offset} is out of range "
                                              f"(auto_offset_reset='none'); seek to a valid offset"))
                p.retry_at = float("inf")
            else:
                log.info("%s: offset %s out of range; resetting to %s", where, p.fetch_offset,
                         "earliest" if self.auto_offset_reset == EARLIEST else "latest")
                p.clear()
                p.position = p.fetch_offset = None
                p.reset = self.auto_offset_reset
            return
        if err.retriable:
            # The position stays: the next fetch asks for the same offset (of the new leader).
            if err in STALE_METADATA:  # NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, ...: find the leader
                self._metadata_wanted = True
            # else UNKNOWN_LEADER_EPOCH (the broker has not heard of the election yet) and the
            # like: the same broker again, after the backoff.
            log.debug("fetch %s: %s; retrying", where, err.name)
            p.retry_at = time.monotonic() + self.retry_backoff
            return
        self._errors.append(error_for(code, f"fetch {where}: {message or err.meaning}"))
        p.retry_at = time.monotonic() + self.retry_backoff

    def _fetch_failed(self, parts: list, err: OdradekError) -> None:
        """The whole FETCH failed (a lost connection: the broker may be gone). The positions
        stay; the partitions are fetched again after a metadata refresh."""
        for p in parts:
            p.retry_at = time.monotonic() + self.retry_backoff
        if err.retriable:
            self._metadata_wanted = True
        else:
            self._errors.append(err)

    def _wait(self, timeout: float) -> None:
        conns = [c for c in self._conns.values() if c.in_flight]
        wake = self._group.wake_fd() if self._group is not None else None
        if not conns:  # nothing to wait for (backoff, no leader, no partitions yet)
            if wake is not None:
                select.select([wake], [], [], min(timeout, 1.0 if not self._order else self.retry_backoff))
            else:
                time.sleep(min(timeout, self.retry_backoff))
            return
        wait_any(conns, timeout, wake)

    def _conn(self, node: int) -> Connection | None:
        conn = self._cluster.connect(self._conns, node, self.client_id, self.request_timeout_ms, log)
        if conn is None:  # an unknown or unreachable node: its leadership may have moved
            self._metadata_wanted = True
        return conn

    # ---- metadata, offsets, errors -----------------------------------------------------------------
    def _check_exist(self, tps: list) -> None:
        if not tps:
            return
        body = self._cluster.refresh(sorted({tp.topic for tp in tps}))
        topics = {t["name"]: t for t in body.get("topics", [])}
        for tp in tps:
            t = topics.get(tp.topic)
            if t is None or t.get("error_code"):
                raise error_for((t or {}).get("error_code") or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"assign {tp.topic}-{tp.partition}: " +
                                ((t or {}).get("error_message") or f"topic '{tp.topic}' does not exist"))
            if not 0 <= tp.partition < len(t.get("partitions", [])):
                raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"assign {tp.topic}-{tp.partition}: topic '{tp.topic}' has "
                                f"{len(t.get('partitions', []))} partitions")

    def _refresh_metadata(self) -> None:
        self._metadata_wanted = False
        try:
            self._cluster.refresh(sorted({p.tp.topic for p in self._order}) or None,
                                  timeout=self.request_timeout_ms / 1000)
        except OdradekError as exc:
            log.info("metadata refresh failed: %s", exc)
            self._metadata_wanted = True
            for p in self._order:
                p.retry_at = max(p.retry_at, time.monotonic() + self.retry_backoff)

    def _resolve_positions(self) -> None:
        """ListOffsets for every partition waiting for a reset (one round, no waiting); a
        partition whose leader answered a retriable error is tried again after the backoff
        (and a metadata refresh, for leader errors). Other errors are kept for poll."""
        cluster = self._cluster
        if any(p.reset is not None and p.tp.topic not in cluster.topics for p in self._order) \
                and not cluster.refresh_due():
            self._refresh_metadata()
        now = time.monotonic()
        for which in (EARLIEST, LATEST):
            parts = [p for p in self._order if p.reset == which and p.retry_at <= now]
            if not parts:
                continue
            offsets, errors = self._list_offsets_once([p.tp for p in parts], which)
            for p in parts:
                off = offsets.get(p.tp)
                if off is not None and off >= 0:
                    p.position = p.fetch_offset = off
                    p.reset = None
                    continue
                exc = errors.get(p.tp)
                if exc is None:
                    continue
                p.retry_at = now + self.retry_backoff
                if not exc.retriable:
                    self._errors.append(exc)
                elif exc.code in STALE_METADATA:
                    self._metadata_wanted = True
        for p in self._order:
            if p.position is None and p.reset is None:
                self._errors.append(error_for(ErrorCode.OFFSET_OUT_OF_RANGE,
                                              f"{p.tp.topic}-{p.tp.partition} has no position and "
                                              f"auto_offset_reset='none': seek() first"))

    def _list_offsets(self, tps: list, timestamp: int, timeout: float | None = None) -> dict:
        """ListOffsets of each partition from its leader; retriable errors (a moved leader, a
        dead broker, an election) are retried after a metadata refresh and the backoff until
        ``timeout`` (default ``request_timeout_ms``); other errors raise."""
        deadline = time.monotonic() + (self.request_timeout_ms / 1000 if timeout is None else timeout)
        cluster = self._cluster
        if any(tp.topic not in cluster.topics for tp in tps):
            cluster.refresh(sorted({tp.topic for tp in tps} | set(cluster.topics)))
        out: dict = {}
        todo = list(tps)
        while True:
            got, errors = self._list_offsets_once(todo, timestamp)
            out.update(got)
            if not errors:
                return out
            fatal = next((e for e in errors.values() if not e.retriable), None)
            if fatal is not None:
                raise fatal
            first = next(iter(errors.values()))
            if time.monotonic() + self.retry_backoff >= deadline:
                raise first
            time.sleep(max(self.retry_backoff, cluster.refresh_due()))
            if any(e.code in STALE_METADATA for e in errors.values()):
                cluster.maybe_refresh(sorted({tp.topic for tp in errors} | set(cluster.topics)))
            todo = list(errors)

    def _list_offsets_once(self, tps: list, timestamp: int) -> tuple[dict, dict]:
        """One round of ListOffsets, a request per leader: ``({tp: offset}, {tp: error})``."""
        by_leader: dict[int, list] = {}
        for tp in tps:
            by_leader.setdefault(self._cluster.leader(tp.topic, tp.partition), []).append(tp)
        out, errors = {}, {}
        for leader, group in by_leader.items():
            if leader < 0:
                for tp in group:
                    errors[tp] = error_for(ErrorCode.LEADER_NOT_AVAILABLE, f"list offsets of {tp.topic}-"
                                           f"{tp.partition}: no leader known")
                continue
            try:
                got, errs = self._list_offsets_at(leader, group, timestamp)
            except OdradekError as exc:
                if exc.code in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT):
                    self._cluster.node_failed(leader)
                for tp in group:
                    errors[tp] = exc
                continue
            out.update(got)
            errors.update(errs)
        return out, errors

    def _list_offsets_at(self, leader: int, tps: list, timestamp: int) -> tuple[dict, dict]:
        by_topic: dict[str, list] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append({
                "index": tp.partition, "timestamp": timestamp,
                "current_leader_epoch": self._cluster.leader_epoch(tp.topic, tp.partition)})
        body = {"replica_id": -1, "isolation_level": 1 if self.read_committed else 0,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
        conn = self._conn(leader)
        if conn is None:
            raise error_for(ErrorCode.NETWORK_EXCEPTION, f"cannot connect to broker {leader}")
        resp = conn.request(ApiKey.LIST_OFFSETS, body, timeout=self.request_timeout_ms / 1000)
        out, errors = {}, {}
        for t in resp.header["body"].get("topics", []):
            for part in t.get("partitions", []):
                tp = TopicPartition(t["name"], part["index"])
                if part.get("error_code"):
                    errors[tp] = error_for(part["error_code"], f"list offsets of {tp.topic}-{tp.partition}: "
                                           f"{part.get('error_message') or ErrorCode.of(part['error_code']).meaning}")
                else:
                    out[tp] = part.get("offset", -1)
        return out, errors

    def _raise_errors(self) -> None:
        if self._errors:
            err = self._errors.pop(0)
            self._errors.clear()
            raise err

    # ---- iteration and lifecycle -------------------------------------------------------------------
    def __iter__(self) -> "Consumer":
        return self

    def __next__(self) -> Record:
        buf = self._iter_buffer
        if not buf:
            deadline = None if self.consumer_timeout is None else time.monotonic() + self.consumer_timeout
            while not buf:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise StopIteration
                buf.extend(self.poll(timeout_ms=min(left, 1.0) * 1000))
        return buf.popleft()

    def close(self) -> None:
        if self._closed:
            return
        if self._group is not None:
            self._group.close()  # a last auto-commit, then leave the group
        self._closed = True
        for conn in self._conns.values():
            conn.close("consumer closed")
        self._conns.clear()
        self._cluster.close()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
