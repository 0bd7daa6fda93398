"""The log actor: the single writer of a set of partition logs, and each one's replica role.

Process: ``log-<i>`` (``num.log.threads``); a partition lives on the one
``actors.names.placement`` picks. Owns each hosted partition's ``Log`` (segments, indexes,
checkpoints, epochs, producer state) and replica state (``PartitionLog``: role, leader epoch,
ISR, followers' progress, high watermark, the acks=all purgatory, transactional batches held).
Accepts (shapes: docs/PROTOCOL.md, docs/REPLICATION.md, ``odradek.actors.messages``):
  produce (Produce) + batch frames: from a handler, or a coordinator or the schema registry
      for its internal topic; answered ``Response`` to the client's processor (acks=all: once
      the high watermark passes it)
  delete_records / offset_for_leader_epoch / describe_log_dirs: from a handler
  assign / become: from the controller: open, close, configure; leader or follower
  follower_state / truncate / truncate_fully / replicate: from the replica fetcher (replicate
      is answered once its fsync has begun, or on a fast disk once it is done: the next
      FETCH then carries the proof; else ``fsynced`` follows)
  replica_progress: one-way, from the fetch actor: a follower fetched
  get_bounds (GetBounds): from the fetch actor, the coordinators and the schema registry ->
      Bounds
  watch: from the fetch actor: tell it these partitions' appends for a lease
  write_markers (WriteMarkers of [TxnMarker]): from the transaction coordinator -> PartOutcomes
  txn_check (TxnChecks of [TxnCheck]): from the transaction coordinator -> PartOutcomes (both
      kept by each partition's ``TxnPartition``, log/txn_partition.py)
  describe_producers (DescribeProducers): from the transaction coordinator -> Producers
  txn_added (TxnPartsAdded of [TxnAdded]): one-way, chained for the transaction coordinator: a
      partition joined a producer's transaction; its held batches are appended
Sends: ``get_assignment`` and ``alter_isr`` to the controller; ``bounds`` to the fetch actor
after each batch of messages (appends only for watched partitions); ``fsynced`` to the replica
fetcher; a request's chained ``then`` messages (``actors.messages.chain_sent``); ``shutdown`` to
the supervisor when its log directory fails.
Invariants: a partition's appends are serialized by this one loop; partitions open lazily in
the background and a request touching one not yet open opens it first, never refused for it;
a producer id a partition does not know must carry a coordinator's tag (``log.producer_ids``),
else INVALID_PRODUCER_ID_MAPPING; a retried batch is answered with its first append's offsets.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import shutil
import struct
import time
from statistics import median as _median

from odradek.actors.message import Message
from odradek.actors.names import CONTROLLER, FETCH_ACTOR, REPLICA_FETCHER, SUPERVISOR, partition_dir
from odradek.actors.runtime import Actor, MailboxFull
from odradek.log import cleaner, producer_ids
from odradek.core.config import LogConfig
from odradek.core.errors import StorageError
from odradek.log.epochs import epoch_mismatch
from odradek.log.files import FileLayer, SyncBatch
from odradek.log.log import Log
from odradek.core.records import HEADER_SIZE, LOG_OVERHEAD, OFFSET_LENGTH, OFFSET_PRODUCER_ID, BatchHeader
from odradek.log.segment import LOG_SUFFIX
from odradek.actors.messages import (AlterIsr, Assigned, Became, Bounds, Chained, Done, FollowerStatePart,
                                     FollowerStates, Fsynced, FsyncedEnd, GetAssignment, LogDirParts, PartOutcome,
                                     PartOutcomes, PartitionProducers, Produce, ProducerState, Producers, ReplicaEnd,
                                     ReplicaEnds, Response, Shutdown, TxnAdded, TxnCheck, TxnMarker, WriteMarkers,
                                     chain_sent)
from odradek.log.txn_partition import (MAX_TXN_CHECK_WAIT_MS, TXN_HOLD, CheckedPart, DelayedTxnCheck, HeldAppend,
                                       TxnPartition)
from odradek.core.protocol import ErrorCode, OdradekError, is_internal_topic

log = logging.getLogger("odradek.log")

CLOSE_THREADS = 16  # logs closed at once on stop (each close is mostly fsync)
SYNC_THREADS = 4  # group commits in flight at once, of different partitions (each mostly waits in fsync)
# A follower fsyncs a replicate's partitions on its loop, before answering, when they are few
# and the disk has been fast: its answer then says "fsynced", its fetcher's next FETCH tells
# the leader, and no thread hand-offs or progress report lie on the acknowledgement's path
# (issue 33's hop-by-hop trace: those hand-offs cost more than a fast disk's fsync). "Fast" is
# the median of the last INLINE_SYNC_WINDOW fsyncs (the leader's, on threads, count too) under
# INLINE_SYNC_MAX_S: a slow disk sends the fsyncs back to the threads, while the occasional
# slow fsync of a busy but fast disk does not (concurrent fsyncs here: p50 0.2-0.5 ms, p99
# 2-13 ms; a rule of "none over 2 ms" kept the inline path out of reach under load).
INLINE_SYNC_PARTS = 2
INLINE_SYNC_MAX_S = 0.002
INLINE_SYNC_WINDOW = 16
ALTER_ISR_TIMEOUT = 10.0  # seconds the controller has to record an ISR change
DEFAULT_PRODUCE_TIMEOUT_MS = 30000
PARTITION_METADATA = "partition.metadata"  # "version: 0\ntopic_id: <id>", as Kafka writes it
_BATCH_LENGTH = struct.Struct(">i")  # at OFFSET_LENGTH
_PRODUCER_ID = struct.Struct(">q")  # at OFFSET_PRODUCER_ID
_CHAINING = frozenset((Produce.TYPE, WriteMarkers.TYPE))  # the messages that may carry ``then: [Chained]``


# The background opening after a start: partitions per slice, and the most work a slice
# does before the loop serves messages again. ODRADEK_LOG_OPEN_PER_TURN=0 turns the
# background off (tests: every partition is then opened by the first request touching it).
OPEN_PER_TURN = int(os.environ.get("ODRADEK_LOG_OPEN_PER_TURN", "16"))
OPEN_SLICE_S = 0.02
EACH_SLICE = 128  # logs a timer's pass (retention, flush, checkpoint, compaction) handles per loop turn

MAX_FILE_NAME = 255  # bytes of one directory entry (ext4, xfs, tmpfs)


def doomed_dir(data_dir: str, topic: str, partition: int, unique: str) -> str:
    """Where a partition directory is renamed to be deleted: ``<topic>-<p>.<unique>-delete``
    with the topic cut short so that the name fits ``MAX_FILE_NAME`` (as Kafka does): a
    249-character topic would not fit otherwise, and the rename would fail."""
    suffix = f"-{partition}.{unique}-delete"
    return os.path.join(data_dir, topic[:MAX_FILE_NAME - len(suffix)] + suffix)


class Follower:
    """What the leader knows of one follower: its log end (the offset of its last fetch), how
    much of it the follower has fsynced (it says so in the fetch: ``fsynced_offset``; a fetch
    that does not say, as Kafka's cannot, vouches for its whole log end) and when it was last
    caught up (Kafka's lastCaughtUpTimeMs rule)."""
    __slots__ = ("log_end_offset", "fsynced_offset", "caught_up_ms", "last_fetch_ms", "leader_end_at_last_fetch")

    def __init__(self, now_ms: int):
        self.log_end_offset = -1  # unknown until it fetches
        self.fsynced_offset = -1
        self.caught_up_ms = now_ms
        self.last_fetch_ms = now_ms
        self.leader_end_at_last_fetch = -1

    def fetched(self, offset: int, leader_end: int, now_ms: int, fsynced: int | None = None) -> None:
        if offset >= leader_end:
            self.caught_up_ms = now_ms
        elif offset >= self.leader_end_at_last_fetch:
            self.caught_up_ms = max(self.caught_up_ms, self.last_fetch_ms)
        self.log_end_offset, self.last_fetch_ms, self.leader_end_at_last_fetch = offset, now_ms, leader_end
        synced = offset if fsynced is None else min(fsynced, offset)
        if offset >= self.fsynced_offset:
            # A progress report and a FETCH travel on two connections: one sent earlier may
            # arrive later, saying less. The follower's fsynced offset goes down only with a
            # truncation, and then its next FETCH is from below it (this branch not taken).
            synced = max(synced, self.fsynced_offset)
        self.fsynced_offset = synced


def _same_form(found: str, topic_id: str) -> bool:
    """Whether ``found`` (read from a partition.metadata) has the form of a topic id as this
    cluster writes them (``topic_id``'s length and alphabet: uuid4 hex): only then is it
    another topic's id, and not a torn or damaged file."""
    alphabet = set(topic_id) | set("0123456789abcdef")
    return len(found) == len(topic_id) and set(found) <= alphabet


class PartitionLog:
    """One hosted partition: its log and its replica state."""
    __slots__ = ("topic", "partition", "topic_id", "log", "leader", "leader_epoch", "isr", "replicas",
                 "zk_version", "followers", "waiting", "isr_change_in_flight", "pending_isr", "high_watermark_floor",
                 "txn", "on_synced")

    def __init__(self, topic: str, partition: int, topic_id: str, log_: Log):
        self.topic, self.partition, self.topic_id, self.log = topic, partition, topic_id, log_
        self.leader, self.leader_epoch = -1, -1
        self.isr: list[int] = []
        self.replicas: list[int] = []
        self.zk_version = -1
        self.followers: dict[int, Follower] = {}
        self.waiting: list = []  # (required offset, DelayedProduce), in append order
        self.isr_change_in_flight = False
        # An ISR change sent and not known to be refused: until it is, the high watermark counts
        # it too (Kafka's "maximal ISR"), so a write ZooKeeper applied whose answer was lost can
        # never let an acknowledged record miss a replica the controller may elect.
        self.pending_isr: list[int] = []
        # Leading: the log end when this leader took its epoch (or this actor reopened it). Every
        # record acknowledged before lies below it, and this leader's high watermark (a follower's
        # until now, or the last checkpoint's) may lie below them: until it reaches the floor,
        # "latest" is not answered (KIP-207's OFFSET_NOT_AVAILABLE), never an offset that went
        # back. -1 when following.
        self.high_watermark_floor = -1
        # the transaction work of the partition: the coordinator's txn_added words, the batches
        # held for them, the txn_checks waiting here (docs/TRANSACTIONS.md, "The commit path")
        self.txn = TxnPartition(topic, partition, log_)
        # [(offset, callback(error))]: run once the log is fsynced past ``offset`` (or with the
        # error of a failed fsync): acks=1 produces, a follower's replicate answer
        self.on_synced: list = []


class DelayedProduce:
    """An acks=all produce waiting for the high watermark of some of its partitions."""
    __slots__ = ("msg", "results", "waiting_on", "timer", "since")

    def __init__(self, msg: Message, results: dict):
        self.msg, self.results, self.timer = msg, results, None
        self.since = time.monotonic()  # for Kafka's remote time (held here waiting for the ISR)
        self.waiting_on: list[PartitionLog] = []  # one entry per partition still below the high watermark

    def body(self) -> dict:
        return _produce_body(self.results, self.since)


class DelayedMarkers(DelayedProduce):
    """Transaction markers written with acks=all (``write_markers {acks: -1}``), waiting for
    the high watermark as an acks=all produce does; answered ``{parts: [PartOutcome]}``.
    ``results`` is the list of per-marker entries."""
    __slots__ = ()

    def body(self) -> PartOutcomes:
        return PartOutcomes([PartOutcome(e["topic"], e["partition"], e["error_code"], e.get("error_message", ""))
                             for e in self.results])


class LogActor(Actor):
    # set in on_start (the group commit: ``_start_syncs``); these defaults are an actor without one
    flush_before_ack = False
    _sync_pool: concurrent.futures.ThreadPoolExecutor | None = None
    _unsynced: set = frozenset()
    _fsynced_out: dict | None = None
    _fsync_seconds: collections.deque | tuple = ()  # the last fsyncs' durations (on_start)
    dir_offline: str | None = None  # why the log directory is offline (a failed fsync), or None
    inline_syncs = thread_syncs = 0  # group commits run on the loop (_sync_inline, _sync_turn_inline) and on threads
    appends = 0  # batches appended (on_start)
    _appends_at_turn = 0  # ``appends`` when the last turn ended (after_batch)

    def on_start(self) -> None:
        self.data_dir = self.args["data_dir"]
        config = self.args["config"]
        self.broker_id = int(self.args.get("broker_id", config.get("broker.id", 0)))
        self.lag_max_ms = config.get("replica.lag.time.max.ms", 30000)
        self.config = config
        self.producer_expiration_ms = config.get("producer.id.expiration.ms", 86400000)
        self._pid_key: bytes | None = None  # the cluster's producer-id key (log.producer_ids)
        try:  # now, so no produce waits for it (in cluster mode it is read from ZooKeeper)
            self._pid_key = producer_ids.load_key(config, self.data_dir)
        except Exception as exc:  # noqa: BLE001 - disk or ZooKeeper: tried again on first need
            log.warning("producer-id key not loaded yet (%s): loaded when a producer id needs checking", exc)
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._dirty: set[tuple[str, int]] = set()
        self._leases: dict[tuple[str, int], float] = {}  # partition -> when the fetch actor's lease ends
        self._closed: list[tuple[str, int]] = []
        self._answers: list[tuple[Message, dict]] = []
        self.appends = 0
        # Durable by default (docs/RELIABILITY.md, "Durable by default"): an acknowledged record
        # is fsynced first (acks=1: on the leader; acks=all: on every in-sync replica). False is
        # Kafka's way: acknowledged from the page cache.
        self.flush_before_ack = bool(config.get("log.flush.before.ack", True))
        self._unsynced: set[tuple[str, int]] = set()  # appended since their last sync began
        self._syncing: set[tuple[str, int]] = set()  # a sync in flight (one per partition)
        # followed partitions whose durable end moved, to tell the replica fetcher (``fsynced``)
        self._fsynced_out: dict[tuple[str, int], int] = {}
        # how long the last fsyncs took (appended by the fsync threads too: a deque is thread-safe)
        self._fsync_seconds = collections.deque(maxlen=INLINE_SYNC_WINDOW)
        self._sync_pool = concurrent.futures.ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="fsync") \
            if self.flush_before_ack else None
        assignment = self.call(CONTROLLER, GetAssignment(self.name), timeout=60.0).fields
        # Opened lazily (see "Opening lazily" above): registered now without touching a file,
        # the internal topics first in the background order (their coordinators wait on them).
        self.unopened: dict[tuple[str, int], dict] = {}
        configs = assignment.configs or {}  # single-broker: each topic's config once
        for entry in sorted(assignment.open, key=lambda e: not is_internal_topic(e["topic"])):
            entry.setdefault("config", configs.get(entry["topic"]) or {})
            self.unopened[entry["topic"], entry["partition"]] = entry
        self._order = iter(list(self.unopened))  # the background's order (a request may open one first)
        self._to_open, self._announce_opening = len(self.unopened), bool(self.unopened)
        self._opening_began = time.monotonic()
        if self.unopened:
            self.call_later(0, self._open_some)
        self.after_batch()
        self.call_every(config["log.retention.check.interval.ms"] / 1000, self._retention)
        self.call_every(config["log.flush.scheduler.interval.ms"] / 1000, self._flush)
        self.call_every(config["log.flush.offset.checkpoint.interval.ms"] / 1000, self._checkpoint)
        self.call_every(config["log.cleaner.backoff.ms"] / 1000, self._clean)
        self.call_every(max(self.lag_max_ms / 2000, 0.05), self._shrink_isrs)

    def on_stop(self) -> None:
        """Close every log cleanly (flush, checkpoints, clean-shutdown marker). Closing is
        mostly fsync, which releases the GIL: thousands of partitions close in parallel
        threads within ``shutdown.timeout.ms`` instead of one after another."""
        def close(p: PartitionLog) -> None:
            try:
                p.log.close()
            except OdradekError as exc:
                log.error("closing %s-%d: %s", p.topic, p.partition, exc.message)

        if self._sync_pool is not None:
            self._sync_pool.shutdown(wait=True)  # no fsync left running on a file being closed
        with concurrent.futures.ThreadPoolExecutor(max_workers=CLOSE_THREADS) as pool:
            list(pool.map(close, self.logs.values()))

    def stats(self) -> dict:
        led = sum(1 for p in self.logs.values() if p.leader == self.broker_id)
        return {"partitions": len(self.logs) + len(self.unopened), "opening": len(self.unopened),
                "leading": led, "appends": self.appends,
                "syncs": {"inline": self.inline_syncs, "threads": self.thread_syncs},
                "under_replicated": sum(1 for p in self.logs.values()
                                        if p.leader == self.broker_id and len(p.isr) < len(p.replicas)),
                "delayed_produces": sum(len(p.waiting) for p in self.logs.values())}

    def metric_gauges(self) -> list:
        """One row per partition, read at scrape time: ``["partition", [topic, partition],
        [size, segments, log end, log start, high watermark, leading, under-replicated,
        under min ISR]]`` (``observe.catalogue.PARTITION_COLUMNS``; one row, not eight gauges,
        keeps a 10,000-partition answer small)."""
        me, out = self.broker_id, []
        for (topic, partition), p in self.logs.items():
            lg = p.log
            leading = p.leader == me
            out.append(["partition", [topic, partition],
                        [lg.size, len(lg.segments), lg.log_end_offset, lg.log_start_offset, lg.high_watermark,
                         int(leading), int(leading and len(p.isr) < len(p.replicas)),
                         int(leading and len(p.isr) < lg.config.min_insync_replicas)]])
        return out

    # ---- produce -----------------------------------------------------------------------
    def on_produce(self, msg: Message) -> None:
        acks, parts, timeout, errors, unverified, _then = msg.fields
        frames = msg.frames
        results: dict[str, list] = {}
        delayed = DelayedProduce(msg, results) if msg.reply_to and (
            acks == -1 or (acks == 1 and self.flush_before_ack)) else None
        for topic, partition, code, message in errors or ():
            results.setdefault(topic, []).append(_error(partition, code, message))
        unverified = delayed is not None and acks == -1 and unverified is True
        for topic, partition, frame in parts:
            if unverified:
                entry = self._hold_unverified(topic, partition, frames[frame], delayed)
                if entry is not None:
                    results.setdefault(topic, []).append(entry)
                    continue
            results.setdefault(topic, []).append(self._append(topic, partition, frames[frame], acks, delayed))
        if not msg.reply_to:  # acks=0 produces come one-way: nobody waits for an answer
            return
        if delayed is not None and delayed.waiting_on:
            if acks == 1:  # waits for the leader's fsync only: answered by _produce_synced
                return
            timeout = timeout if isinstance(timeout, int) and timeout >= 0 else DEFAULT_PRODUCE_TIMEOUT_MS
            delayed.timer = self.call_later(timeout / 1000, lambda: self._expire_produce(delayed))
            return
        # Answered in after_batch, once the fetch actor has been told of the new data:
        # a client that got its acknowledgement can read its record at once.
        self._answers.append((msg, _produce_body(results)))

    def _append(self, topic: str, partition: int, batch, acks: int, delayed: DelayedProduce | None) -> dict:
        p = self._partition((topic, partition))
        if p is None or p.leader != self.broker_id:
            return _error(partition, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                          f"{topic}-{partition}: broker {self.broker_id} is not its leader"
                          + ("" if p is None else f" (the leader is broker {p.leader})")
                          + "; refresh metadata and retry")
        min_isr = p.log.config.min_insync_replicas
        if acks == -1 and len(p.isr) < min_isr:
            return _error(partition, ErrorCode.NOT_ENOUGH_REPLICAS,
                          f"{topic}-{partition}: {len(p.isr)} in-sync replica(s) {p.isr}, "
                          f"min.insync.replicas is {min_isr}")
        try:
            self._check_producer_ids(p, batch)
            info = p.log.append(batch, leader_epoch=p.leader_epoch, crc_checked=True)  # the handler checked the CRC
        except OdradekError as exc:
            return _error(partition, exc.code, f"{topic}-{partition}: {exc.message}")
        self._data_changed((topic, partition))
        if self.flush_before_ack:
            self._unsynced.add((topic, partition))
        if not info.duplicate:  # an idempotent producer's retry is answered with the first append's offsets
            self.appends += 1
            self.metrics.inc("bytes_in", (topic,), info.size)
            self.metrics.inc("records_in", (topic,), info.last_offset - info.base_offset + 1)
        self._advance_high_watermark(p)
        append_time = info.append_time_ms if p.log.config.log_append_time else -1
        entry = {"index": partition, "error_code": 0, "base_offset": info.base_offset,
                 "log_append_time_ms": append_time, "log_start_offset": info.log_start_offset}
        if delayed is not None and acks == 1:
            if p.log.durable_end <= info.last_offset:  # acks=1 waits for the leader's fsync
                delayed.waiting_on.append(p)
                p.on_synced.append((info.last_offset + 1, lambda error: self._produce_synced(p, delayed, entry, error)))
        elif delayed is not None and p.log.high_watermark <= info.last_offset:
            delayed.waiting_on.append(p)
            p.waiting.append((info.last_offset + 1, delayed, entry))
        return entry

    def _produce_synced(self, p: PartitionLog, delayed: DelayedProduce, entry: dict, error) -> None:
        """An acks=1 produce's batch is on the leader's disk (or its fsync failed: ``error``)."""
        if error is not None:
            entry.update(error_code=int(error.code), error_message=f"{p.topic}-{p.partition}: {error.message}",
                         base_offset=-1)
        delayed.waiting_on.remove(p)
        if not delayed.waiting_on:
            self._answers.append((delayed.msg, delayed.body()))

    # ---- transactional batches sent before their partition joined the transaction -----------
    def _hold_unverified(self, topic: str, partition: int, batch, delayed: DelayedProduce) -> dict | None:
        """A produce marked ``txn_unverified``: its producer sent it without waiting for the
        answer to the partition's AddPartitionsToTxn. A transactional batch that would open
        its producer's transaction here is appended only once the coordinator said the
        partition is in that transaction (``txn_added``, sent when the coordinator stored
        it): were it appended before and the partition never stored, no marker would ever
        close it (a hanging transaction, KIP-890). Returns the answer row, filled in later,
        if the batch is held; None to append it now."""
        p = self._partition((topic, partition))
        if p is None or p.leader != self.broker_id:
            return None  # the usual append answers
        producer = p.txn.must_hold(batch)
        if producer is None:
            return None
        pid, epoch = producer
        entry = {"index": partition, "error_code": 0}
        held = HeldAppend(pid, epoch, batch, delayed, entry)
        held.timer = self.call_later(TXN_HOLD, lambda: self._release_held(p, [held], (
            ErrorCode.CONCURRENT_TRANSACTIONS, f"{topic}-{partition}: the transaction coordinator has not said yet "
                                               f"that this partition is in producer {pid}'s transaction; retry")))
        p.txn.hold(held)
        delayed.waiting_on.append(p)
        return entry

    def on_txn_added(self, msg: Message) -> None:
        """The transaction coordinator stored partitions in a producer's transaction
        (``parts``: [TxnAdded]; sent by the record's log actor once stored). Batches held for
        it are appended now, in the order they came. One-way."""
        self.answered_elsewhere(msg)  # nobody waits for an answer
        for entry in msg.fields.parts or ():
            try:
                added = TxnAdded._make(entry)
                p = self._partition((added.topic, added.partition))
            except (TypeError, ValueError):
                log.warning("%s: malformed txn_added entry %r", self.name, entry)
                continue
            if p is None or p.leader != self.broker_id:
                continue
            mine = p.txn.word_came(added)
            if mine:
                self._release_held(p, mine)

    def _release_held(self, p: PartitionLog, items: list, error: tuple | None = None) -> None:
        """Append ``items`` (held batches of ``p``, in order), or fail them with ``error``;
        answer each produce that waits for nothing more."""
        for held in items:
            if not p.txn.release(held):
                continue  # released already (the word and its timer crossed)
            delayed = held.delayed
            delayed.waiting_on.remove(p)
            if error is not None:
                held.entry.update(error_code=int(error[0]), error_message=error[1])
            else:
                held.entry.update(self._append(p.topic, p.partition, held.batch, -1, delayed))
            if not delayed.waiting_on:
                if delayed.timer is not None:
                    delayed.timer.cancel()
                self._answers.append((delayed.msg, delayed.body()))

    def _check_producer_ids(self, p: PartitionLog, batch) -> None:
        """Never trust a claimed producer id: one this partition does not know yet must carry
        the tag of an id a transaction coordinator handed out (``log.producer_ids``), else
        INVALID_PRODUCER_ID_MAPPING. Header reads only; the key is loaded once."""
        mv = memoryview(batch)
        n, pos = mv.nbytes, 0
        known = p.log.producers.producers
        while pos + HEADER_SIZE <= n:
            pid = _PRODUCER_ID.unpack_from(mv, pos + OFFSET_PRODUCER_ID)[0]
            if pid >= 0 and pid not in known:
                if self._pid_key is None:
                    try:
                        self._pid_key = producer_ids.load_key(self.config, self.data_dir)
                    except Exception as exc:  # noqa: BLE001 - disk or ZooKeeper: retriable
                        raise OdradekError(f"cannot check producer id {pid} yet ({exc}); retry",
                                           ErrorCode.COORDINATOR_NOT_AVAILABLE) from None
                if not producer_ids.is_handed_out(pid, self._pid_key):
                    raise OdradekError(f"producer id {pid} was not handed out by this cluster (InitProducerId "
                                       f"gives one)", ErrorCode.INVALID_PRODUCER_ID_MAPPING)
            step = _BATCH_LENGTH.unpack_from(mv, pos + OFFSET_LENGTH)[0] + LOG_OVERHEAD
            if step < HEADER_SIZE:
                break  # not a batch: the log's own checks refuse it
            pos += step

    def _expire_produce(self, delayed: DelayedProduce) -> None:
        """The produce's timeout passed: its unreplicated partitions fail REQUEST_TIMED_OUT."""
        for p in set(delayed.waiting_on):
            for held in p.txn.held_for(delayed):
                p.txn.release(held)
                held.entry.update(error_code=int(ErrorCode.REQUEST_TIMED_OUT),
                                  error_message=f"{p.topic}-{p.partition}: not in the producer's transaction in time")
            for _, d, entry in p.waiting:
                if d is delayed:
                    entry.update(error_code=int(ErrorCode.REQUEST_TIMED_OUT),
                                 error_message=f"{p.topic}-{p.partition}: not replicated to the ISR "
                                               f"{p.isr} in time (high watermark {p.log.high_watermark})")
            p.waiting = [w for w in p.waiting if w[1] is not delayed]
        delayed.waiting_on.clear()
        self.reply(delayed.msg, delayed.body())

    def _complete_waiting(self, p: PartitionLog, error: tuple[int, str] | None = None) -> None:
        """Answer the acks=all produces the high watermark has passed (or all, with ``error``)."""
        hw, done = p.log.high_watermark, 0
        for required, delayed, entry in p.waiting:
            if error is None and required > hw:
                break
            done += 1
            if error is not None:
                entry.update(error_code=int(error[0]), error_message=error[1])
            elif len(p.isr) < p.log.config.min_insync_replicas:
                entry.update(error_code=int(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND),
                             error_message=f"{p.topic}-{p.partition}: written, but the ISR shrank to {p.isr} "
                                           f"(min.insync.replicas {p.log.config.min_insync_replicas})")
            delayed.waiting_on.remove(p)
            if not delayed.waiting_on:
                if delayed.timer is not None:
                    delayed.timer.cancel()
                self._answers.append((delayed.msg, delayed.body()))
        if done:
            del p.waiting[:done]

    # ---- replication: the leader's side ---------------------------------------------------
    def _advance_high_watermark(self, p: PartitionLog) -> None:
        """High watermark = the smallest log end of the ISR (never moves back); then the
        acks=all produces and the transaction checks it lets through (after every append,
        marker, follower fetch and fsync). With ``log.flush.before.ack`` (the default) a
        replica's log end counts only as far as that replica has fsynced it: this leader's
        ``durable_end``, each follower's ``fsynced_offset``."""
        if p.leader != self.broker_id:
            return
        durable = self.flush_before_ack
        hw = p.log.durable_end if durable else p.log.log_end_offset
        for r in set(p.isr).union(p.pending_isr):
            if r != self.broker_id:
                f = p.followers.get(r)
                if f is None or f.log_end_offset < 0:
                    return  # a follower we have not heard from yet holds it where it is
                hw = min(hw, f.fsynced_offset if durable else f.log_end_offset)
        if hw > p.log.high_watermark:
            p.log.high_watermark = hw
            self._data_changed((p.topic, p.partition))
        if p.waiting:
            self._complete_waiting(p)
        if p.txn.checks:
            self._settle_txn_checks(p)

    def on_replica_progress(self, msg: Message) -> None:
        """A follower's fetch offset (the fetch actor checked who it is) is its log end, and
        its ``fsynced`` offset (optional fifth field) how much of that is on its disk. An
        offset beyond our log end, or below our log start, is not progress: nobody can have
        fetched what this leader does not have, and believing it would let a follower into
        the ISR, and past the high watermark, without the data."""
        now = _now_ms()
        for topic, partition, replica, offset, *fsynced in msg.fields.parts:
            p = self._partition((topic, partition))
            if p is None or p.leader != self.broker_id:
                continue
            f = p.followers.get(replica)
            if f is None or not isinstance(offset, int) or \
                    not p.log.log_start_offset <= offset <= p.log.log_end_offset:
                continue
            synced = fsynced[0] if fsynced else None
            if synced is not None and (not isinstance(synced, int) or isinstance(synced, bool)):
                continue
            f.fetched(offset, p.log.log_end_offset, now, synced)
            if replica not in p.isr and offset >= p.log.high_watermark and \
                    offset >= self._epoch_start(p):
                self._alter_isr(p, sorted(set(p.isr) | {replica}))
            self._advance_high_watermark(p)

    def _epoch_start(self, p: PartitionLog) -> int:
        """Where the current leader epoch began: the end of the one before it."""
        end = p.log.end_offset_for_epoch(p.leader_epoch - 1)[1] if p.leader_epoch > 0 else 0
        return max(end, 0)

    def _shrink_isrs(self) -> None:
        now = _now_ms()
        for p in self.logs.values():
            if p.leader != self.broker_id or len(p.isr) <= 1 or p.isr_change_in_flight:
                continue
            lagging = [r for r in p.isr if r != self.broker_id and
                       now - p.followers.setdefault(r, Follower(now)).caught_up_ms > self.lag_max_ms]
            if lagging:
                log.info("%s-%d: followers %s not caught up for %d ms: shrinking the ISR", p.topic, p.partition,
                         lagging, self.lag_max_ms)
                self._alter_isr(p, [r for r in p.isr if r not in lagging])

    def _alter_isr(self, p: PartitionLog, isr: list[int]) -> None:
        """Ask the controller actor to record the new ISR in ZooKeeper (conditional on the
        version this leader knows); apply it only once recorded. While a change's outcome is
        unknown it stays pending, and every pending change counts for the high watermark
        (``pending_isr``, Kafka's maximal ISR) until the state node's word is known: a later
        change never replaces an earlier one that ZooKeeper may have applied unheard."""
        if p.isr_change_in_flight:
            return
        p.isr_change_in_flight = True
        p.pending_isr = sorted(set(p.pending_isr) | set(isr))
        epoch = p.leader_epoch

        def recorded(reply: Message) -> None:
            p.isr_change_in_flight = False
            if reply.is_error:
                log.warning("%s-%d: ISR change to %s not recorded: %s", p.topic, p.partition, isr,
                            reply.error_message)
                held = reply.fields.detail
                if reply.error_code == ErrorCode.INVALID_UPDATE_VERSION and held:
                    self._adopt_held_isr(p, epoch, held)
                return  # else unknown (ZooKeeper unreachable, no answer): still pending, retried
            p.pending_isr = []  # written at the version we knew: no other change of ours landed
            if p.leader != self.broker_id or p.leader_epoch != epoch:
                return
            log.info("%s-%d: ISR %s -> %s", p.topic, p.partition, p.isr, isr)
            self.metrics.inc("isr_expands" if len(isr) > len(p.isr) else "isr_shrinks")
            p.isr, p.zk_version = list(isr), reply.fields.zk_version
            self._advance_high_watermark(p)
            self.after_batch()

        self.request(CONTROLLER, AlterIsr(p.topic, p.partition, epoch, isr, p.zk_version),
                     callback=recorded, timeout=ALTER_ISR_TIMEOUT)

    def _adopt_held_isr(self, p: PartitionLog, epoch: int, held: dict) -> None:
        """A refused ISR change, with what the state node holds. At this leader and epoch, the
        node's ISR is the one the controller elects from (an earlier change of ours landed
        though its answer was lost): adopt it and its version, so the high watermark waits
        for each of its replicas and the next change is written at the right version. Any
        other leader or epoch: we are deposed, the controller's LEADER_AND_ISR will say so;
        until then the pending changes keep counting."""
        if (held.get("leader"), held.get("leader_epoch")) != (self.broker_id, epoch) or \
                p.leader != self.broker_id or p.leader_epoch != epoch:
            return
        isr = list(held.get("isr") or [])
        log.info("%s-%d: ISR %s -> %s as ZooKeeper holds it (version %s): an earlier change landed unheard",
                 p.topic, p.partition, p.isr, isr, held.get("zk_version"))
        p.isr, p.zk_version, p.pending_isr = isr, held.get("zk_version", p.zk_version), []
        self._advance_high_watermark(p)
        self.after_batch()

    def on_offset_for_leader_epoch(self, msg: Message) -> None:
        out: dict[str, list] = {}
        for topic, partition, current, wanted in msg.fields.parts:
            entry = {"index": partition, "error_code": 0, "leader_epoch": -1, "end_offset": -1}
            p = self._partition((topic, partition))
            problem = self._epoch_problem(p, topic, partition, current)
            if problem is not None:
                entry.update(error_code=int(problem[0]), error_message=problem[1])
            elif isinstance(wanted, int):
                entry["leader_epoch"], entry["end_offset"] = p.log.end_offset_for_epoch(wanted)
            out.setdefault(topic, []).append(entry)
        self.reply(msg, Response({"topics": [{"name": t, "partitions": ps} for t, ps in out.items()]}))

    def _epoch_problem(self, p, topic, partition, current) -> tuple[int, str] | None:
        if p is None or p.leader != self.broker_id:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{topic}-{partition}: broker {self.broker_id} is not its leader"
        code = epoch_mismatch(current, p.leader_epoch)
        if code is not None:
            return code, f"{topic}-{partition}: leader epoch {current} requested, this leader is at {p.leader_epoch}"
        return None

    # ---- replication: the follower's side (from the replica fetcher) --------------------------
    def _follower(self, topic, partition, epoch=None) -> PartitionLog:
        p = self._partition((topic, partition))
        if p is None:
            raise OdradekError(f"{topic}-{partition} is not hosted by {self.name}", ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if p.leader == self.broker_id:
            raise OdradekError(f"{topic}-{partition}: this broker is its leader", ErrorCode.NOT_LEADER_OR_FOLLOWER)
        code = epoch_mismatch(epoch, p.leader_epoch) if epoch is not None else None
        if code is not None:
            raise OdradekError(f"{topic}-{partition}: follower is at leader epoch {p.leader_epoch}, not {epoch}", code)
        return p

    def _per_partition(self, msg: Message, fn, wait_for_sync: bool = True) -> None:
        """Run ``fn(*part)`` (it returns the partition) for each part; reply a ``ReplicaEnd``
        (``topic, partition, code, log_end_offset, fsynced_offset``) each: the offset below which this
        follower's log is on its disk, what the fetcher tells the leader. With
        ``log.flush.before.ack`` and ``wait_for_sync`` (a truncation) the reply waits until
        every partition's log end is fsynced, so it is the log end; without ``wait_for_sync``
        (``replicate``) it goes at once with what is fsynced so far, and the group commit's
        end is told to the replica fetcher on its own (``fsynced``, ``_synced``), so the
        fetcher's next FETCH never waits for this broker's disk. With the setting off a
        follower vouches for its log end as Kafka's does."""
        out: list[ReplicaEnd] = []
        waits = []
        for part in msg.fields.parts:
            topic, partition = part[0], part[1]
            try:
                p = fn(*part)
                end = synced = p.log.log_end_offset
                self._dirty.add((topic, partition))
                if self.flush_before_ack and p.log.durable_end < end:
                    synced = p.log.durable_end
                    self._unsynced.add((topic, partition))
                    if wait_for_sync:
                        waits.append((p, len(out)))
                out.append(ReplicaEnd(topic, partition, 0, end, synced))
            except OdradekError as exc:
                out.append(ReplicaEnd(topic, partition, int(exc.code), -1, -1))
                log.warning("%s-%d: %s", topic, partition, exc.message)
        if not waits:
            if self._unsynced and self._sync_pool is not None:
                if not wait_for_sync:
                    self._sync_inline(out)
                # a follower's fsync is what its leader's high watermark waits for: begun before
                # the answer wakes the fetcher (which would take the CPU first on a busy machine)
                self._start_syncs()
            self.reply(msg, ReplicaEnds(out))
            return
        left = [len(waits)]

        def synced(p: PartitionLog, i: int, error) -> None:
            out[i] = _synced_end(out[i], p.log.durable_end, error)
            left[0] -= 1
            if not left[0]:
                self._answers.append((msg, ReplicaEnds(out)))

        for p, i in waits:
            p.on_synced.append((out[i].log_end_offset, lambda error, p=p, i=i: synced(p, i, error)))

    def on_write_markers(self, msg: Message) -> None:
        """Transaction markers from the transaction coordinator (WriteTxnMarkers): a control
        batch per partition led here (``markers``: [TxnMarker]). Answers ``PartOutcomes``;
        with ``acks`` -1 (what the coordinator sends, as Kafka appends markers) once the high
        watermark passed each marker (NOT_ENOUGH_REPLICAS before writing when the ISR is below
        ``min.insync.replicas``; REQUEST_TIMED_OUT after ``timeout_ms``), so a marker the
        coordinator counts as written survives the leader's death."""
        body = msg.fields
        acks_all = body.acks == -1 and bool(msg.reply_to)
        results: list[dict] = []
        delayed = DelayedMarkers(msg, results)
        for entry in body.markers or ():
            try:
                marker = TxnMarker._make(entry)
                topic, partition = marker.topic, marker.partition
                p = self._partition((topic, partition))
                if p is None or p.leader != self.broker_id:
                    raise OdradekError(f"{topic}-{partition}: broker {self.broker_id} is not its leader",
                                       ErrorCode.NOT_LEADER_OR_FOLLOWER)
                if acks_all and len(p.isr) < p.log.config.min_insync_replicas:
                    raise OdradekError(f"{topic}-{partition}: {len(p.isr)} in-sync replica(s) {p.isr}, "
                                       f"min.insync.replicas is {p.log.config.min_insync_replicas}",
                                       ErrorCode.NOT_ENOUGH_REPLICAS)
                info = p.txn.write_marker(marker, p.leader_epoch)
                self._data_changed((topic, partition))
                if self.flush_before_ack:
                    self._unsynced.add((topic, partition))
                self._advance_high_watermark(p)
                row = {"topic": topic, "partition": partition, "error_code": 0}
                results.append(row)
                if acks_all and p.log.high_watermark <= info.last_offset:
                    delayed.waiting_on.append(p)
                    p.waiting.append((info.last_offset + 1, delayed, row))
            except (TypeError, ValueError) as exc:
                results.append({"topic": None, "partition": None, "error_code": int(ErrorCode.INVALID_REQUEST),
                                "error_message": f"malformed marker {entry!r}: {exc}"})
            except OdradekError as exc:
                results.append({"topic": topic, "partition": partition, "error_code": int(exc.code),
                                "error_message": exc.message})
        if delayed.waiting_on:
            timeout = body.timeout_ms
            timeout = timeout if isinstance(timeout, int) and timeout >= 0 else DEFAULT_PRODUCE_TIMEOUT_MS
            delayed.timer = self.call_later(timeout / 1000, lambda: self._expire_produce(delayed))
            return
        self._answers.append((msg, delayed.body()))  # in after_batch, once the fetch actor knows the new LSO

    def on_txn_check(self, msg: Message) -> None:
        """The transaction coordinator asks, before it commits a transaction whose client sent
        EndTxn without waiting for its produce answers (``expect``, docs/TRANSACTIONS.md):
        are producer ``pid``'s batches at ``epoch`` through sequence ``last_seq`` written here,
        in its open transaction, and replicated as acks=all requires? ``parts``: [TxnCheck];
        answered ``PartOutcomes`` once each is (0), or refused, or after ``wait_ms``
        (the produce may still be on its way: CONCURRENT_TRANSACTIONS then, the client ends it
        again once its records are acknowledged). The verdicts are the partition's ``txn``'s
        (``log.txn_partition``)."""
        check = DelayedTxnCheck(msg)
        for entry in msg.fields.parts or ():
            try:
                ask = TxnCheck._make(entry)
                ask = ask._replace(producer_id=int(ask.producer_id), producer_epoch=int(ask.producer_epoch),
                                   last_seq=int(ask.last_seq))
            except (TypeError, ValueError) as exc:
                check.rows.append(PartOutcome(None, None, int(ErrorCode.INVALID_REQUEST),
                                              f"malformed check {entry!r}: {exc}"))
                continue
            part = CheckedPart(ask, check)
            check.rows.append(part)
            p = self._partition((ask.topic, ask.partition))
            if p is None or p.leader != self.broker_id:
                part.code = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                part.message = f"{ask.topic}-{ask.partition}: broker {self.broker_id} is not its leader"
                continue
            p.txn.check(part, len(p.isr))
        if not check.waiting_on:
            self.reply(msg, check.body())
            return
        wait_ms = msg.fields.wait_ms
        if not (isinstance(wait_ms, int) and 0 <= wait_ms <= MAX_TXN_CHECK_WAIT_MS):
            wait_ms = MAX_TXN_CHECK_WAIT_MS
        check.timer = self.call_later(wait_ms / 1000, lambda: self._expire_txn_check(check))

    def _settle_txn_checks(self, p: PartitionLog) -> None:
        """After an append or a follower's progress: answer the checks that hold now."""
        for check in p.txn.settle(len(p.isr)):
            check.timer.cancel()
            self.reply(check.msg, check.body())

    def _expire_txn_check(self, check: DelayedTxnCheck) -> None:
        for txn in set(check.waiting_on):
            txn.expire(check)
        check.waiting_on.clear()
        self.reply(check.msg, check.body())

    def on_describe_producers(self, msg: Message) -> None:
        out = []
        for entry in msg.fields.parts:
            try:
                topic, partition = entry
                p = self._partition((topic, partition))
                if p is None:
                    raise OdradekError(f"{topic}-{partition} is not hosted here", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                if p.leader != self.broker_id:
                    raise OdradekError(f"{topic}-{partition}: broker {self.broker_id} is not its leader",
                                       ErrorCode.NOT_LEADER_OR_FOLLOWER)
                out.append(PartitionProducers(topic, partition, 0, "", [
                    ProducerState(pid, e.epoch, e.last_seq, e.last_timestamp, e.txn_first_offset)
                    for pid, e in sorted(p.log.producers.producers.items())]))
            except (TypeError, ValueError) as exc:
                out.append(PartitionProducers(None, None, int(ErrorCode.INVALID_REQUEST),
                                              f"malformed partition {entry!r}: {exc}", []))
            except OdradekError as exc:
                out.append(PartitionProducers(entry[0], entry[1], int(exc.code), exc.message, []))
        self.reply(msg, Producers(out))

    def on_describe_log_dirs(self, msg: Message) -> None:
        """DESCRIBE_LOG_DIRS: each hosted partition (``topics`` null: all; else
        ``[[topic, [partition]]]``) as ``[topic, partition, size of its segments in bytes,
        offset lag]``; the lag is Kafka's for a current log (how far the log end trails the
        high watermark). A partition still waiting to open is measured from its segment
        files, without opening it (lag 0)."""
        wanted = msg.fields.topics
        if wanted is None:
            keys = list(self.logs) + list(self.unopened)
        else:
            keys = [(t, i) for t, parts in wanted for i in parts if (t, i) in self.logs or (t, i) in self.unopened]
        out = []
        for key in keys:
            p = self.logs.get(key)
            if p is not None:
                out.append([*key, p.log.size, max(0, p.log.high_watermark - p.log.log_end_offset)])
            else:
                out.append([*key, _files_size(partition_dir(self.data_dir, *key)), 0])
        self.reply(msg, LogDirParts(out))

    def on_follower_state(self, msg: Message) -> None:
        out = []
        for topic, partition in msg.fields.parts:
            try:
                p = self._follower(topic, partition)
                out.append(FollowerStatePart(topic, partition, 0, p.log.latest_epoch, p.log.log_end_offset))
            except OdradekError as exc:
                out.append(FollowerStatePart(topic, partition, int(exc.code), -1, -1))
        self.reply(msg, FollowerStates(out))

    def on_truncate(self, msg: Message) -> None:
        """KIP-279: the leader said epoch E ended at offset X; cut to min(X, our end of E)."""
        def truncate(topic, partition, epoch, end_offset):
            p = self._follower(topic, partition)
            if epoch < 0 or end_offset < 0:
                target = p.log.high_watermark  # the leader knows no epoch of ours: fall back to the HW
            else:
                own_epoch, own_end = p.log.end_offset_for_epoch(epoch)
                target = end_offset if own_epoch < 0 else min(end_offset, own_end)
            if target < p.log.log_end_offset:
                log.info("%s-%d: truncating from %d to %d (leader epoch %d ends at %d)", topic, partition,
                         p.log.log_end_offset, target, epoch, end_offset)
                p.log.truncate_to(target)
            return p
        self._per_partition(msg, truncate)

    def on_truncate_fully(self, msg: Message) -> None:
        def truncate(topic, partition, offset):
            p = self._follower(topic, partition)
            log.info("%s-%d: starting empty at the leader's log start %d", topic, partition, offset)
            p.log.truncate_fully_and_start_at(offset)
            return p
        self._per_partition(msg, truncate)

    def on_replicate(self, msg: Message) -> None:
        frames = msg.frames

        def replicate(topic, partition, frame, epoch, high_watermark, log_start):
            p = self._follower(topic, partition, epoch)
            if isinstance(frame, int) and 0 <= frame < len(frames):
                batch = frames[frame]
                base = BatchHeader.read(batch).base_offset if len(batch) >= HEADER_SIZE else -1
                if 0 <= base < p.log.log_end_offset == p.log.log_start_offset:
                    # an empty log started inside the leader's first batch: start at the batch
                    p.log.truncate_fully_and_start_at(base)
                p.log.append_as_follower(batch)
                self.appends += 1
            p.log.high_watermark = min(high_watermark, p.log.log_end_offset)
            if log_start > p.log.log_start_offset and log_start <= p.log.high_watermark:
                p.log.delete_records_before(log_start)
            return p
        self._per_partition(msg, replicate, wait_for_sync=False)

    def on_delete_records(self, msg: Message) -> None:
        out: dict[str, list] = {}
        for topic, partition, offset in msg.fields.parts:
            p = self._partition((topic, partition))
            entry = {"index": partition, "low_watermark": -1, "error_code": 0}
            try:
                if p is None or p.leader != self.broker_id:
                    raise OdradekError(f"{topic}-{partition}: broker {self.broker_id} is not its leader",
                                       ErrorCode.NOT_LEADER_OR_FOLLOWER)
                if offset == -1:
                    offset = p.log.high_watermark
                if not isinstance(offset, int) or offset < 0 or offset > p.log.high_watermark:
                    raise OdradekError(f"offset {offset} is outside [0, {p.log.high_watermark}] (the high "
                                       f"watermark)", ErrorCode.OFFSET_OUT_OF_RANGE)
                entry["low_watermark"] = p.log.delete_records_before(offset)
                self._dirty.add((topic, partition))
            except OdradekError as exc:
                entry.update(error_code=int(exc.code), error_message=exc.message)
            out.setdefault(topic, []).append(entry)
        self.reply(msg, Response({"topics": [{"name": t, "partitions": ps} for t, ps in out.items()]}))

    # ---- assignment from the controller -------------------------------------------------
    def on_assign(self, msg: Message) -> None:
        """Each change is tried on its own; the reply lists the ones that failed (``failed``:
        ``[[topic, partition, error code, message]]``) so the controller never reports a
        creation or deletion that did not happen."""
        failed: list = []
        change = msg.fields
        self._create_durably(change.open, failed)
        for entry in change.configure:
            p = self._partition((entry["topic"], entry["partition"]))
            if p is not None:
                p.log.config = LogConfig.from_properties(entry["config"])
        for entry in change.close:
            self._attempt(failed, entry, lambda e: self._close_and_delete(
                e["topic"], e["partition"], e["topic_id"], delete=e.get("delete", True)))
        self._tell_fetch_actor_then(lambda: self.reply(msg, Assigned(len(self.logs), failed)))

    def _create_durably(self, entries, failed: list) -> None:
        """Open the partitions of an ``assign``. The ones whose directory does not exist yet
        (a topic being created) are written first and made durable together before the
        answer (``log.files.SyncBatch``: each file's contents, then each directory once,
        then the data directory) rather than one partition's fsyncs after another's: 1,000
        partitions took ~3 s on a quiet machine and 10-50 s under load (docs/BENCHMARKS.md,
        issue 18). If that fails, every partition of the batch fails and is removed."""
        batch, created = SyncBatch(), []
        # Thousands of partitions hold the loop for a long while (5,000 per log actor: past the
        # supervisor's 30 s liveness timeout under load, which killed the log actors and the
        # creation was never answered): say how far it is, which is a heartbeat too.
        total = len(entries)
        for i, entry in enumerate(entries):
            key = (entry["topic"], entry["partition"])
            new = key not in self.logs and not os.path.exists(partition_dir(self.data_dir, *key))
            self._attempt(failed, entry, lambda e: self._open_partition(e, batch if new else None))
            if new and key in self.logs:
                created.append(entry)
            self.report_progress(f"creating partitions: {i + 1}/{total}")
        try:
            batch.commit(lambda done, of: self.report_progress(f"making new partitions durable: {done}/{of}"))
        except OSError as exc:
            text = f"making the new partitions durable failed: {exc.strerror or exc} (errno {exc.errno})"
            log.error("%s; %d partitions removed", text, len(created))
            for e in created:
                failed.append([e["topic"], e["partition"], int(ErrorCode.KAFKA_STORAGE_ERROR), text])
                self._attempt([], e, lambda e: self._close_and_delete(e["topic"], e["partition"],
                                                                      e.get("topic_id", "")))
        self.report_progress(f"created {len(created)} of {total} partitions", done=True)

    @staticmethod
    def _attempt(failed: list, entry: dict, change) -> None:
        try:
            change(entry)
        except (OdradekError, OSError) as exc:
            code = exc.code if isinstance(exc, OdradekError) else ErrorCode.KAFKA_STORAGE_ERROR
            text = exc.message if isinstance(exc, OdradekError) else f"{exc.strerror or exc} (errno {exc.errno})"
            log.error("%s-%s: %s", entry["topic"], entry["partition"], text)
            failed.append([entry["topic"], entry["partition"], int(code), text])

    def _tell_fetch_actor_then(self, done) -> None:
        """The fetch actor learns of a change before the controller does, so a client that
        created a topic can fetch from it at once. If the fetch actor is down, it asks
        every log actor for bounds when it is back; acknowledge anyway."""
        self.request(FETCH_ACTOR, self._take_changes(), timeout=5.0, callback=lambda _r: done())

    def on_become(self, msg: Message) -> None:
        """LEADER_AND_ISR, this process's share: each partition becomes leader or follower at
        a leader epoch. An epoch older than the one we have is stale and refused."""
        out = []
        for entry in msg.fields.parts:
            key = (entry["topic"], entry["partition"])
            try:
                p = self._partition(key) or self._open_partition(entry)
                if entry["leader_epoch"] < p.leader_epoch:
                    raise OdradekError(f"{key[0]}-{key[1]}: leader epoch {entry['leader_epoch']} is older than "
                                       f"{p.leader_epoch}", ErrorCode.FENCED_LEADER_EPOCH)
                if "config" in entry:
                    p.log.config = LogConfig.from_properties(entry["config"])
                self._become(p, entry)
                out.append([key[0], key[1], 0])
            except OdradekError as exc:
                log.warning("%s", exc.message)
                out.append([key[0], key[1], int(exc.code)])
            except OSError as exc:  # a full or failing disk: this partition only, as Kafka's storage error
                log.error("%s-%d: cannot open the replica: %s", key[0], key[1], exc)
                out.append([key[0], key[1], int(ErrorCode.KAFKA_STORAGE_ERROR)])
        self._tell_fetch_actor_then(lambda: self.reply(msg, Became(out)))

    def _become(self, p: PartitionLog, entry: dict) -> None:
        leader, epoch = entry["leader"], entry["leader_epoch"]
        was_leader = p.leader == self.broker_id
        p.isr, p.replicas = list(entry.get("isr") or []), list(entry.get("replicas") or [])
        p.pending_isr = []  # the controller's word is the state now
        p.zk_version = entry.get("zk_version", p.zk_version)
        if leader == self.broker_id:
            now = _now_ms()
            if not was_leader or epoch != p.leader_epoch:
                p.followers = {r: Follower(now) for r in p.replicas if r != self.broker_id}
                p.log.leader_epochs.assign(epoch, p.log.log_end_offset)
                p.high_watermark_floor = p.log.log_end_offset
                log.info("%s-%d: leader at epoch %d, ISR %s, log end %d, high watermark %d", p.topic, p.partition,
                         epoch, p.isr, p.log.log_end_offset, p.log.high_watermark)
            else:
                for r in p.replicas:
                    p.followers.setdefault(r, Follower(now)) if r != self.broker_id else None
            p.leader, p.leader_epoch = leader, epoch
            self._advance_high_watermark(p)
        else:
            if was_leader or epoch != p.leader_epoch:
                log.info("%s-%d: follower of broker %d at epoch %d", p.topic, p.partition, leader, epoch)
            p.leader, p.leader_epoch = leader, epoch
            p.followers = {}
            p.high_watermark_floor = -1
            held = p.txn.not_leading()
            if held:
                self._release_held(p, held, (ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                             f"{p.topic}-{p.partition}: leadership moved to broker {leader}"))
            if p.waiting:
                self._complete_waiting(p, (ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                           f"{p.topic}-{p.partition}: leadership moved to broker {leader} before "
                                           f"the write was replicated; retry"))
        self._dirty.add((p.topic, p.partition))

    def _partition(self, key: tuple[str, int]) -> PartitionLog | None:
        """The hosted partition ``key``, opened (recovered if need be) right now if it is still
        waiting for the background opening: a request never finds it missing. None if not
        hosted here, or if it failed to open (a storage error: offline, logged)."""
        p = self.logs.get(key)
        if p is None and key in self.unopened:
            p = self._open_registered(key)
        return p

    def _open_registered(self, key: tuple[str, int]) -> PartitionLog | None:
        entry = self.unopened[key]
        self._attempt([], entry, self._open_partition)  # pops it from unopened
        p = self.logs.get(key)
        if p is not None and "leader" in entry:  # cluster mode: the role it had before
            self._become(p, entry)
        if not self.unopened:
            self._opened_all()
        return p

    def _open_some(self) -> None:
        """One slice of the background opening: up to ``OPEN_PER_TURN`` partitions or
        ``OPEN_SLICE_S`` of work, then the loop serves what arrived and the next slice runs."""
        if not self.unopened or OPEN_PER_TURN <= 0:
            return
        began = time.monotonic()
        for _ in range(OPEN_PER_TURN):
            if not self.unopened or time.monotonic() - began > OPEN_SLICE_S:
                break
            key = next(self._order, None)
            if key in self.unopened:
                self._open_registered(key)
        if self.unopened:
            done = self._to_open - len(self.unopened)
            self.report_progress(f"opening partitions: {done}/{self._to_open}")
            self.call_later(0, self._open_some)
        self.after_batch()

    def _opened_all(self) -> None:
        if self._to_open:
            self.report_progress(f"opened {self._to_open} partitions in "
                                 f"{time.monotonic() - self._opening_began:.1f}s", done=True)
            self._to_open = 0

    def on_watch(self, msg: Message) -> None:
        """From the fetch actor: it serves these partitions (a fetch, a list-offsets); tell it
        their appends for ``seconds`` (its lease, renewed while it serves them), opening any
        still waiting for the background opening. Their bounds go now, in ``after_batch``,
        then the answer (the same pipe: it has them when its retry runs)."""
        parts, seconds = msg.fields
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 < seconds <= 3600:
            raise OdradekError(f"seconds must be in (0, 3600], got {seconds!r}", ErrorCode.INVALID_REQUEST)
        until = time.monotonic() + seconds
        for part in parts or ():
            if isinstance(part, (list, tuple)) and len(part) == 2:
                key = (part[0], part[1])
                if self._partition(key) is not None:
                    self._leases[key] = until
                    self._dirty.add(key)
        if msg.reply_to:
            self._answers.append((msg, Done()))

    def _data_changed(self, key: tuple[str, int]) -> None:
        """An append, a marker or a high-watermark move: the fetch actor hears of it if it
        watches the partition (``on_watch``); else it asks when it next serves it."""
        if self._leases.get(key, 0.0) > time.monotonic():
            self._dirty.add(key)

    def _open_partition(self, entry: dict, files: FileLayer | None = None) -> PartitionLog:
        """Open (recovering if needed) a hosted partition. Single-broker ``assign`` entries
        carry no role: this broker leads it at epoch 0 with an ISR of one. ``files``: a
        ``SyncBatch`` for a new partition created with others (``_create_durably``)."""
        key = (entry["topic"], entry["partition"])
        if key in self.logs:
            return self.logs[key]
        self.unopened.pop(key, None)  # opened now, whatever the background order
        directory = partition_dir(self.data_dir, *key)
        files = files or FileLayer()
        write_id = self._claim_directory(key, entry.get("topic_id", ""))
        the_log = Log(directory, LogConfig.from_properties(entry["config"]), files=files)
        if write_id:  # after the load, which removes temp files (a batch's is still one until commit)
            try:
                files.write_file_atomically(os.path.join(directory, PARTITION_METADATA),
                                            f"version: 0\ntopic_id: {entry['topic_id']}\n".encode())
            except OSError:
                the_log.abandon()
                raise
        the_log.producers.expiration_ms = self.producer_expiration_ms
        report = the_log.recovery_report
        if getattr(report, "dropped_bytes", 0):
            log.warning("%s-%d recovered: %s", key[0], key[1], report.summary())
        p = self.logs[key] = PartitionLog(key[0], key[1], entry.get("topic_id", ""), the_log)
        if "leader" not in entry:  # single-broker mode
            self._become(p, {"leader": self.broker_id, "leader_epoch": 0, "isr": [self.broker_id],
                             "replicas": [self.broker_id]})
        self._dirty.add(key)
        return p

    def _claim_directory(self, key: tuple[str, int], topic_id: str) -> bool:
        """The directory of a partition of topic ``topic_id`` (KIP-516's ``partition.metadata``).
        One left by an earlier topic of the same name (deleted while this broker was down) is
        thrown away, never taken for this topic's log. True if ``partition.metadata`` is to
        be written (the caller does, once the log is loaded)."""
        directory = partition_dir(self.data_dir, *key)
        path = os.path.join(directory, PARTITION_METADATA)
        found = None
        try:
            with open(path) as f:
                found = dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line).get("topic_id")
        except (OSError, ValueError):
            pass
        if topic_id and found and found != topic_id and not _same_form(found, topic_id):
            # not an id at all (a torn or damaged file): the data is this topic's, never thrown away
            log.warning("%s: %s holds %r, not a topic id: rewritten with %s", directory, PARTITION_METADATA,
                        found[:80], topic_id)
            found = None
        elif topic_id and found and found != topic_id:
            log.warning("%s holds topic id %s, not %s: a deleted topic's log, removed", directory, found, topic_id)
            _delete_dir(directory, doomed_dir(self.data_dir, *key, found))
            found = None
        os.makedirs(directory, exist_ok=True)
        return bool(topic_id and found is None)

    def _close_and_delete(self, topic: str, partition: int, topic_id: str, delete: bool = True) -> None:
        self.unopened.pop((topic, partition), None)
        p = self.logs.pop((topic, partition), None)
        if p is not None:
            if p.txn.held:
                self._release_held(p, list(p.txn.held),
                                   (ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{topic}-{partition} was closed"))
            if p.waiting:
                self._complete_waiting(p, (ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{topic}-{partition} was closed"))
            self._run_synced(p, OdradekError(f"{topic}-{partition} was closed", ErrorCode.NOT_LEADER_OR_FOLLOWER))
            if delete:  # its files go: no checkpoint or marker to write first (a full disk refused them)
                p.log.abandon()
            else:
                p.log.close()
        self._dirty.discard((topic, partition))
        self._leases.pop((topic, partition), None)
        self._closed.append((topic, partition))
        directory = partition_dir(self.data_dir, topic, partition)
        if delete and os.path.isdir(directory):
            _delete_dir(directory, doomed_dir(self.data_dir, topic, partition, topic_id or str(int(time.time()))))

    # ---- the fetch actor ---------------------------------------------------------------
    def on_get_bounds(self, msg: Message) -> None:
        """Every open partition's bounds, and (``opening``) the ones still waiting to open: the
        fetch actor asks for those on demand. The internal topics' partitions are opened
        first: the coordinators asking load them at once."""
        for key in [k for k in self.unopened if is_internal_topic(k[0])]:
            self._partition(key)
        only = msg.fields.only  # a few partitions: not every one's bounds (10,000 of them) for them
        logs = self.logs.values() if only is None else [self.logs[k] for k in map(tuple, only) if k in self.logs]
        self.reply(msg, Bounds([self._bounds(pl) for pl in logs], [], self.name,
                               [list(k) for k in self.unopened] if only is None else []))

    def _bounds(self, p: PartitionLog) -> list:
        """The partition's ``PartitionBounds``, built as a plain list (after every batch of
        appends: no per-message constructor); its fields in that order."""
        return [p.topic, p.partition, *p.log.bounds(), p.leader_epoch, p.leader == self.broker_id, p.replicas,
                p.log.last_stable_offset, p.high_watermark_floor]

    def _take_changes(self) -> Bounds:
        parts = [self._bounds(self.logs[key]) for key in self._dirty if key in self.logs]
        closed, self._closed = self._closed, []
        self._dirty.clear()
        opening = []
        if self._announce_opening:  # once, at start: the partitions the fetch actor must ask for
            opening = [list(k) for k in self.unopened]
            self._announce_opening = False
        return Bounds(parts, closed, self.name, opening)

    # ---- group commit ------------------------------------------------------------------
    def _start_syncs(self) -> None:
        """One fsync per partition appended to since its last one began (group commit): it
        covers every batch appended until it starts, on a thread of ``_sync_pool`` while this
        loop goes on appending; a partition with a sync in flight waits for it to end
        (``_synced``), and the next one covers all that came meanwhile."""
        for key in [k for k in self._unsynced if k not in self._syncing]:
            self._unsynced.discard(key)
            p = self.logs.get(key)
            job = None if p is None else self._begin_sync(p)
            if job is None:
                continue
            self._syncing.add(key)
            self.thread_syncs += 1
            self._sync_pool.submit(self._run_sync_job, job).add_done_callback(
                lambda future, p=p, job=job: self.post(lambda: self._synced(p, job)))

    def _sync_inline(self, rows: list) -> None:
        """A follower's few appended partitions on a fast disk: fsync them here, before the
        answer (``rows``, whose fsynced offsets it updates; see INLINE_SYNC_PARTS). A partition
        with a sync in flight on a thread is left to it (their ends must not cross)."""
        keys = [(row.topic, row.partition) for row in rows
                if row.code == 0 and row.fsynced_offset < row.log_end_offset]
        if not self._may_sync_inline(keys):
            return
        for i, row in enumerate(rows):
            key = (row.topic, row.partition)
            p = self.logs.get(key)
            if key not in keys or p is None:
                continue
            self._unsynced.discard(key)
            job = self._sync_on_loop(p)
            if job is not None:
                if job.error is not None:
                    rows[i] = _synced_end(row, p.log.durable_end, job.error)
                    return
                p.log.end_sync(job)
                self._run_synced(p)
            rows[i] = _synced_end(row, p.log.durable_end, None)
            if p.log.durable_end < p.log.log_end_offset:
                self._unsynced.add(key)

    def _may_sync_inline(self, keys) -> bool:
        """These partitions may be fsynced on the loop: a few (INLINE_SYNC_PARTS), none with a
        sync in flight on a thread (their ends must not cross), on a fast disk (the median of
        the last INLINE_SYNC_WINDOW fsyncs under INLINE_SYNC_MAX_S)."""
        return 0 < len(keys) <= INLINE_SYNC_PARTS and not any(k in self._syncing for k in keys) and \
            (not self._fsync_seconds or _median(self._fsync_seconds) <= INLINE_SYNC_MAX_S)

    def _sync_on_loop(self, p: PartitionLog):
        """``p``'s group commit run here, on the loop (``_begin_sync``'s None: nothing to
        fsync); a failed one takes the directory offline (``job.error`` says so)."""
        job = self._begin_sync(p)
        if job is not None:
            self.inline_syncs += 1
            self._run_sync_job(job)
            if job.error is not None:
                self._fsync_failed(p, job)
        return job

    def _fsync_failed(self, p: PartitionLog, job) -> None:
        self._take_dir_offline(f"an fsync of {p.topic}-{p.partition} failed: {job.error.message}")

    def _begin_sync(self, p: PartitionLog):
        """``p``'s next group commit (``Log.begin_sync``), or None: nothing to fsync (what
        waited for it goes now) or it cannot begin (what waited gets the error)."""
        try:
            job = p.log.begin_sync()
        except OdradekError as exc:
            self._run_synced(p, exc)
            return None
        if job is None:
            self._run_synced(p)
        return job

    def _run_sync_job(self, job):
        """Run a group commit (on a thread, or on the loop: ``_sync_inline``), timed."""
        start = time.perf_counter()
        job.run()
        self._fsync_seconds.append(time.perf_counter() - start)
        return job

    def _synced(self, p: PartitionLog, job) -> None:
        """On the loop, a sync ended: the log's durable end moves, and what waited for it goes
        (acks=1 answers, a follower's replicate answer, the leader's high watermark)."""
        key = (p.topic, p.partition)
        self._syncing.discard(key)
        if self.logs.get(key) is not p:
            return  # closed meanwhile (its waiters were answered then)
        if job.error is not None:
            self._fsync_failed(p, job)
        else:
            self._sync_ended(p, job)
        self.after_batch()

    def _sync_ended(self, p: PartitionLog, job) -> None:
        """A group commit of ``p`` succeeded: its durable end moves and what waited for it goes
        (acks=1 answers, a follower's replicate answer, the leader's high watermark)."""
        p.log.end_sync(job)
        self._run_synced(p)
        self._advance_high_watermark(p)
        if 0 <= p.leader != self.broker_id:  # following: the fetcher tells the leader at once
            self._fsynced_out[(p.topic, p.partition)] = p.log.durable_end
        if p.log.durable_end < p.log.log_end_offset:
            self._unsynced.add((p.topic, p.partition))  # appended while it ran: the next fsync covers them

    def _take_dir_offline(self, why: str) -> None:
        """A failed fsync takes the log directory offline, as Kafka does: Linux may drop the
        pages whose write-back failed once it has reported the error, so a later fsync that
        succeeds would not prove them on the disk, and nothing in the directory is trusted
        again. Every partition of this actor goes offline (``Log.take_offline``: no flush, no
        clean-shutdown marker, so the next start recovers each from the disk); what waited for
        an fsync or the high watermark is refused KAFKA_STORAGE_ERROR, and so is every later
        request. The directory is the broker's only one (``log.dirs``' first), so the broker
        shuts down, as Kafka halts when its last log directory fails: in a cluster its drain
        hands leadership to the other in-sync replicas (docs/RELIABILITY.md, "Durable by
        default")."""
        if self.dir_offline is not None:
            return
        self.dir_offline = why
        log.critical("log directory %s is offline: %s; it is this broker's only log directory: the broker "
                     "shuts down (its partitions' leadership moves to other in-sync replicas)", self.data_dir, why)
        error = StorageError(f"the log directory is offline ({why})")
        for p in list(self.logs.values()):
            p.log.take_offline(why)
            self._run_synced(p, error)
            if p.waiting:
                self._complete_waiting(p, (error.code, f"{p.topic}-{p.partition}: {error.message}"))
        self._unsynced.clear()
        self.unopened.clear()  # never opened from an offline directory
        try:
            self.send(SUPERVISOR, Shutdown(f"log directory {self.data_dir} is offline: {why}"))
        except MailboxFull:
            log.critical("could not ask the supervisor to shut the broker down")

    def _run_synced(self, p: PartitionLog, error: OdradekError | None = None) -> None:
        """Run the ``on_synced`` callbacks the durable end has passed (every one, with ``error``)."""
        if not p.on_synced:
            return
        end, keep = p.log.durable_end, []
        for offset, callback in p.on_synced:
            if error is None and offset > end:
                keep.append((offset, callback))
            else:
                callback(error)
        p.on_synced = keep

    def after_batch(self) -> None:
        appended, self._appends_at_turn = self.appends - self._appends_at_turn, self.appends
        self._tell_fetcher()
        self._tell_fetch_actor()
        self._send_answers()
        if self._unsynced and self._sync_pool is not None:
            # after the fetch actor heard of the new data: a follower's FETCH parked there is
            # answered first (its fsync, not the leader's, is the longer path to the high
            # watermark), and a new fsync thread does not hold the GIL before these sends
            if self._sync_turn_inline(appended):  # what the fsyncs moved: high watermarks, durable ends
                self._tell_fetcher()
                self._tell_fetch_actor()
            else:
                self._start_syncs()
            self._send_answers()  # what a sync with nothing to do (or failing to begin) let go

    def _tell_fetcher(self) -> None:
        """The followed partitions whose durable end moved, to the replica fetcher (``fsynced``)."""
        if self._fsynced_out:
            try:
                self.send(REPLICA_FETCHER, Fsynced([FsyncedEnd(t, q, end) for (t, q), end in
                                                    self._fsynced_out.items()]))
                self._fsynced_out.clear()
            except MailboxFull:  # the next batch tries again
                pass

    def _tell_fetch_actor(self) -> None:
        """The partitions whose bounds moved since the last time, to the fetch actor."""
        if self._dirty or self._closed or self._announce_opening:
            dirty, closed, announce = set(self._dirty), list(self._closed), self._announce_opening
            try:
                self.send(FETCH_ACTOR, self._take_changes())
            except MailboxFull:  # the next batch tries again
                self._dirty, self._closed, self._announce_opening = dirty, closed, announce

    def _sync_turn_inline(self, appended: int) -> bool:
        """A quiet turn on a fast disk (at most INLINE_SYNC_PARTS batches ``appended`` in it,
        as many partitions to fsync, none with a sync in flight): fsync them here and now, as a
        follower does its replicate (``_sync_inline``). What waited for them (acks=1 answers,
        the high watermark) then goes in this turn, without the fsync thread's two hand-offs
        (issue 33: e2e at 1,000 records/s paid them on every record). A busy turn, or a slow
        disk, leaves the fsyncs to the threads, where appends go on beside them. True if done."""
        keys = self._unsynced
        if appended > INLINE_SYNC_PARTS or not self._may_sync_inline(keys):
            return False
        for key in list(keys):
            keys.discard(key)
            p = self.logs.get(key)
            job = None if p is None else self._sync_on_loop(p)
            if job is None:
                continue
            if job.error is not None:
                return True
            self._sync_ended(p, job)
        return True

    def _send_answers(self) -> None:
        answers, self._answers = self._answers, []
        for msg, fields in answers:
            self.reply(msg, fields)
            if msg.type in _CHAINING:
                self._send_chained(msg, fields)

    def _send_chained(self, msg: Message, answer) -> None:
        """A produce or write_markers with ``then: [Chained]`` (the
        transaction coordinator's records and markers): once every partition of it is written
        (and, acks=all, replicated), send those messages on the requester's behalf, answered
        to it under its ``corr`` (its next requests: the markers after the PREPARE record), or
        its answers to its own requesters (``Actor.answer_chained``): one hop less than its
        answer and its next message. Nothing is sent if a partition failed (the requester
        forgets them, or answers itself)."""
        then = msg.fields.then
        if not then or not chain_sent(answer) or not msg.reply_to:
            return
        for item in then:
            c = Chained._make(item) if isinstance(item, (list, tuple)) and len(item) == len(Chained._fields) else None
            if c is None or not (isinstance(c.to, str) and isinstance(c.type, str)
                                 and isinstance(c.fields, (list, tuple, type(None))) and isinstance(c.corr, int)):
                log.error("%s: dropping a malformed chained message from %s: %r", self.name, msg.reply_to, item)
                continue
            try:
                self.send_chained(c, msg.reply_to)
            except MailboxFull:  # the requester's timeout retries it
                log.warning("%s: could not pass %r on to %s: its mailbox is full", self.name, c.type, c.to)

    # ---- timers ------------------------------------------------------------------------
    def _each(self, what: str, fn, changes_bounds: bool = True, keys: list | None = None, start: int = 0) -> None:
        """Run ``fn(log)`` on every log; a truthy result (when ``changes_bounds``) means the
        log's bounds changed and the fetch actor must hear of it. ``EACH_SLICE`` logs per loop
        turn: a checkpoint is two fsyncs, and 10,000 partitions in one go held the loop past
        ``supervisor.liveness.timeout.ms`` (the supervisor killed the actor)."""
        keys = list(self.logs) if keys is None else keys
        for key in keys[start:start + EACH_SLICE]:
            p = self.logs.get(key)
            if p is None or p.log.offline:
                continue  # closed meanwhile, or its directory offline: not touched again
            try:
                if fn(p.log) and changes_bounds:
                    self._dirty.add(key)
            except OdradekError as exc:
                log.error("%s of %s-%d failed: %s", what, key[0], key[1], exc.message)
        self.after_batch()
        if start + EACH_SLICE < len(keys):
            self.call_later(0, lambda: self._each(what, fn, changes_bounds, keys, start + EACH_SLICE))

    def _retention(self) -> None:
        self._each("retention", lambda lg: (lg.apply_retention() or 0) + (lg.delete_expired_files() or 0))
        self._each("producer expiration", Log.expire_producers, changes_bounds=False)

    def _flush(self) -> None:
        self._each("flush", Log.maybe_flush, changes_bounds=False)

    def _checkpoint(self) -> None:
        self._each("checkpoint", Log.checkpoint, changes_bounds=False)

    def _clean(self) -> None:
        self._each("compaction", lambda lg: lg.config.compact and cleaner.clean(lg).cleaned)


def _delete_dir(directory: str, doomed: str) -> None:
    """Rename ``directory`` to ``doomed`` (the name is free at once for a new topic; the
    controller removes ``-delete`` leftovers at start), then remove it. If the rename fails,
    remove it in place; an OSError means the directory (or part of it) is still there."""
    try:
        os.rename(directory, doomed)
    except OSError as exc:
        log.warning("could not rename %s to %s (%s): removing it in place", directory, doomed, exc)
        shutil.rmtree(directory)
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _files_size(directory: str) -> int:
    """The bytes of a partition directory's segment files (0 if it is missing)."""
    try:
        with os.scandir(directory) as entries:
            return sum(e.stat().st_size for e in entries if e.name.endswith(LOG_SUFFIX) and e.is_file())
    except OSError:
        return 0


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _synced_end(row: ReplicaEnd, durable_end: int, error) -> ReplicaEnd:
    """A follower's answer row once its partition's fsync ended: how much of its log end is on
    disk now, or the fsync's error."""
    if error is not None:
        return row._replace(code=int(error.code), fsynced_offset=-1)
    return row._replace(fsynced_offset=min(durable_end, row.log_end_offset))


def _produce_body(results: dict, held_since: float | None = None) -> Response:
    """The produce answer; ``remote_ms`` (the processor's remote-time histogram) when it
    waited for the ISR since ``held_since``."""
    return tuple.__new__(Response, ({"topics": [{"name": t, "partitions": ps} for t, ps in results.items()]}, [],
                                    0.0 if held_since is None else (time.monotonic() - held_since) * 1000))


def _error(partition: int, code: int, message: str) -> dict:
    return {"index": partition, "error_code": int(code), "error_message": message,
            "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1}
