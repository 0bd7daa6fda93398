"""Writing a DataFrame to Odradek topics: streaming exactly once per micro-batch task, batch
at-least-once (docs/PIPELINE.md, "Write options", says how).

Where it runs: ``write()`` in each executor task (one ``TopicWriter`` per task: one
connection per leader, opened on first use, closed before the task returns); ``commit`` and
``abort`` on the driver with the tasks' ``WriteCommit`` messages (the micro-batch id and the
offset ranges a task appended; the driver logs them and warns when a committed batch id comes
again).
Columns: ``value`` (binary or string) and optionally ``key`` (binary or string), ``topic``
(string; else the ``topic`` option), ``partition`` (int; else by key hash, as the bundled
Producer does, so a key lands on one partition whichever client wrote it; else one partition
per chunk of keyless rows, rotating), ``headers`` (``array<struct<key: string, value: binary>>``).
Invariants: once a task succeeded none of its rows is lost; without ``exactlyOnce`` (and in
batch writes) a retried batch may land twice (``batchIdHeader`` lets a consumer drop a re-run
micro-batch's records). With ``exactlyOnce`` (streaming, the default) a task writes through a
transactional ``Producer`` (``transactional.id`` ``<transactionalIdPrefix><queryId>-<task>``,
stable across retries and restarts) and records the micro-batch as done in the same
transaction (offset ``batchId + 1`` for the group of that name), so a micro-batch's rows are
visible to read_committed consumers once, given a replayable source and the same partitioning.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage)

from odradek.network.client import BrokerConnection, parse_bootstrap
from odradek.group import GroupAdmin
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.producer import Producer, encode_rows, partition_for_key
from odradek.types import TopicPartition
from odradek.pipeline import options as opt
from odradek.pipeline.broker import CLIENT_ID, RETRY_BACKOFF, Planner, retriable

log = logging.getLogger("odradek.pipeline")


@dataclass
class WriteCommit(WriterCommitMessage):
    """What one write task did: its rows and, per partition, the offsets it appended."""

    task: int
    attempt: int
    batch_id: int | None  # the micro-batch (streams), None for a batch write
    query_id: str | None
    rows: int = 0
    ranges: dict = field(default_factory=dict)  # "topic-partition" -> [first offset, last offset]
    skipped: bool = False  # exactly once: this task's rows of this micro-batch were already committed


def _task_info() -> tuple[int, int, int | None, str | None]:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, None, None
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    return (ctx.partitionId(), ctx.attemptNumber(), int(batch) if batch is not None else None,
            ctx.getLocalProperty("sql.streaming.queryId"))


class TopicWriter:
    """One task's producer: rows in, record batches out, acknowledged before ``finish`` returns."""

    def __init__(self, o: opt.WriteOptions, commit: WriteCommit):
        self.o = o
        self.commit = commit
        self.planner = Planner(o.bootstrap, retries=3, retry_interval_ms=500)
        self.partitions: dict[str, int] = {}  # topic -> partition count
        self.leaders: dict[tuple[str, int], tuple[str, int]] = {}
        self.conns: dict[tuple[str, int], BrokerConnection] = {}
        self.in_flight: list = []  # (conn, corr, (topic, partition), batch bytes, count, sent_at)
        self.sticky = commit.task
        self.header = None
        if o.batch_id_header and commit.batch_id is not None:
            self.header = (o.batch_id_header, f"{commit.query_id}:{commit.batch_id}".encode())

    # ---- rows -> batches ------------------------------------------------------------------------
    def write(self, rb: pa.RecordBatch) -> None:
        n = rb.num_rows
        if n == 0:
            return
        cols = {name.lower(): rb.column(i) for i, name in enumerate(rb.schema.names)}
        values = _binary_list(cols["value"])
        keys = _binary_list(cols["key"]) if "key" in cols else None
        topics = cols["topic"].to_pylist() if "topic" in cols else None
        parts = cols["partition"].to_pylist() if "partition" in cols else None
        headers = cols["headers"].to_pylist() if "headers" in cols else None
        default_topic = self.o.topic
        if topics is None and keys is None and parts is None and headers is None and self.header is None:
            self._route_plain(default_topic, values)
            return
        groups: dict[tuple[str, int], list] = {}
        sticky: dict[str, int] = {}
        for i in range(n):
            topic = self.o.topic or (topics[i] if topics else None)
            if not topic:
                raise ValueError(f"row {i} has no topic: set the topic option or fill the 'topic' column")
            count = self._count(topic)
            key = keys[i] if keys else None
            p = parts[i] if parts else None
            if p is None:
                if key is not None:
                    p = partition_for_key(key, count)
                else:
                    p = sticky.get(topic)
                    if p is None:
                        p = sticky[topic] = self._next_sticky(count)
            elif not 0 <= p < count:
                raise ValueError(f"row {i}: partition {p} does not exist in topic {topic!r} ({count} partitions)")
            hdrs = [(h["key"], h["value"]) for h in headers[i]] if headers and headers[i] else []
            if self.header:
                hdrs.append(self.header)
            groups.setdefault((topic, p), []).append((key, values[i], hdrs))
        for (topic, p), rows in groups.items():
            for lo in range(0, len(rows), self.o.batch_records):
                chunk = rows[lo:lo + self.o.batch_records]
                full = [(j, 0, k, v, h) for j, (k, v, h) in enumerate(chunk)]
                self._send(topic, p, full)

    def _route_plain(self, topic: str, values: list) -> None:
        count = self._count(topic)
        step = self.o.batch_records
        for lo in range(0, len(values), step):
            self._send(topic, self._next_sticky(count), values[lo:lo + step])

    def _next_sticky(self, count: int) -> int:
        p = self.sticky % count
        self.sticky += 1
        return p

    def _count(self, topic: str) -> int:
        n = self.partitions.get(topic)
        if n is None:
            meta = self.planner.metadata([topic])
            if topic not in meta["topics"]:
                raise OdradekError(f"topic {topic!r} does not exist (create it before writing to it)",
                                   ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            n = self.partitions[topic] = len(meta["topics"][topic])
            for tp, node in meta["leaders"].items():
                if node in meta["brokers"]:
                    self.leaders[tp] = tuple(meta["brokers"][node])
        return n

    # ---- batches -> broker ----------------------------------------------------------------------
    def _conn(self, tp) -> BrokerConnection:
        addr = self.leaders.get(tp) or parse_bootstrap(self.o.bootstrap)[0]
        conn = self.conns.get(addr)
        if conn is None:
            conn = self.conns[addr] = BrokerConnection(addr[0], addr[1], client_id=CLIENT_ID)
        return conn

    def _send(self, topic: str, p: int, rows: list) -> None:
        now = int(time.time() * 1000)
        batch = encode_rows(rows, now, now, self.o.compression)
        while len(self.in_flight) >= self.o.max_in_flight:
            self._complete(self.in_flight.pop(0))
        self._dispatch((topic, p), batch, len(rows), time.monotonic())

    def _dispatch(self, tp, batch: bytes, count: int, first_sent: float) -> None:
        body = {"acks": self.o.acks, "timeout_ms": 30000,
                "topics": [{"name": tp[0], "partitions": [{"index": tp[1], "frame": 0}]}]}
        conn = self._conn(tp)
        try:
            corr = conn.send(ApiKey.PRODUCE, body, [batch])
        except OdradekError as exc:
            self._retry_later(tp, batch, count, first_sent, exc)
            return
        if self.o.acks == 0:
            self.commit.rows += count  # acks=0: the broker does not answer, offsets unknown
            return
        self.in_flight.append((conn, corr, tp, batch, count, first_sent))

    def _complete(self, item) -> None:
        conn, corr, tp, batch, count, first_sent = item
        try:
            body = conn.receive(corr).body
            part = body["topics"][0]["partitions"][0]
            code = part.get("error_code", 0)
            if code:
                raise OdradekError(f"produce to {tp[0]}-{tp[1]}: {part.get('error_message') or ''}",
                                   ErrorCode.of(code))
        except OdradekError as exc:
            self._retry_later(tp, batch, count, first_sent, exc)
            return
        base = part["base_offset"]
        key = f"{tp[0]}-{tp[1]}"
        first, last = self.commit.ranges.get(key, (base, base + count - 1))
        self.commit.ranges[key] = [min(first, base), max(last, base + count - 1)]
        self.commit.rows += count

    def _retry_later(self, tp, batch: bytes, count: int, first_sent: float, exc: OdradekError) -> None:
        """Resend after a retriable error until the retry budget is spent (at-least-once)."""
        if not retriable(exc) and exc.code != ErrorCode.BROKER_NOT_AVAILABLE:
            raise exc
        waited = time.monotonic() - first_sent
        if waited > self.o.retry_timeout_ms / 1000:
            raise OdradekError(f"produce to {tp[0]}-{tp[1]} failed for {waited:.0f}s "
                               f"(kafkaProducer.retryTimeoutMs): {exc.message}", exc.code)
        log.info("produce to %s-%s: %s; retrying", tp[0], tp[1], exc.message)
        # Everything in flight on a broken connection fails too; drain it before resending.
        pending, self.in_flight = self.in_flight, []
        for item in pending:
            self._complete(item)
        time.sleep(min(RETRY_BACKOFF[1], RETRY_BACKOFF[0] * (1 + waited)))
        if exc.code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
            self.partitions.pop(tp[0], None)
            self._count(tp[0])
        self._dispatch(tp, batch, count, first_sent)

    def finish(self) -> WriteCommit:
        try:
            while self.in_flight:
                self._complete(self.in_flight.pop(0))
        finally:
            self.abandon()
        return self.commit

    def abandon(self) -> None:
        """The task failed: close the connections (what was sent may have landed)."""
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()


class TransactionalTopicWriter(TopicWriter):
    """One streaming task's rows in one transaction with the record that the micro-batch is
    done (the module's "Exactly once"). Routing is ``TopicWriter``'s; records go through the
    bundled transactional ``Producer`` instead of raw PRODUCE requests."""

    def __init__(self, o: opt.WriteOptions, commit: WriteCommit):
        super().__init__(o, commit)
        self.txn_id = f"{o.transactional_id_prefix}{commit.query_id}-{commit.task}"
        self.producer = Producer(o.bootstrap, transactional_id=self.txn_id, acks="all",
                                 compression=o.compression, client_id=CLIENT_ID,
                                 delivery_timeout_ms=o.retry_timeout_ms,
                                 transaction_timeout_ms=o.transaction_timeout_ms)
        self.first_tp: tuple[str, int] | None = None
        self.bounds: dict[tuple[str, int], list] = {}  # (topic, partition) -> [first future, last future]
        try:
            self.producer.init_transactions()  # fences an earlier attempt, aborts what it left open
            done = self._last_batch_done()
            commit.skipped = done is not None and done >= commit.batch_id
            if commit.skipped:
                log.info("micro-batch %d task %d: already committed by an earlier attempt (transactional "
                         "id %r): not written again", commit.batch_id, commit.task, self.txn_id)
            else:
                self.producer.begin_transaction()
        except BaseException:
            self.producer.close()
            raise

    def _last_batch_done(self) -> int | None:
        """The highest micro-batch id this task's group has committed, None if none."""
        with GroupAdmin(self.o.bootstrap, client_id=CLIENT_ID,
                        request_timeout_ms=min(self.o.retry_timeout_ms, 30000)) as admin:
            offsets = admin.committed(self.txn_id)
        return max(offsets.values()) - 1 if offsets else None

    def write(self, rb: pa.RecordBatch) -> None:
        if not self.commit.skipped:
            super().write(rb)

    def _send(self, topic: str, p: int, rows: list) -> None:
        send = self.producer.send
        futures = [send(topic, r, partition=p) if r.__class__ is bytes or r is None
                   else send(topic, r[3], key=r[2], partition=p, headers=r[4] or None) for r in rows]
        if not futures:
            return
        tp = (topic, p)
        if self.first_tp is None:
            self.first_tp = tp
        seen = self.bounds.get(tp)
        self.bounds[tp] = [seen[0] if seen else futures[0], futures[-1]]
        self.commit.rows += len(futures)

    def finish(self) -> WriteCommit:
        try:
            if not self.commit.skipped:
                if self.first_tp is not None:
                    tp = TopicPartition(*self.first_tp)
                    self.producer.send_offsets_to_transaction({tp: self.commit.batch_id + 1}, self.txn_id)
                self.producer.commit_transaction()
                for (topic, p), (first, last) in self.bounds.items():
                    self.commit.ranges[f"{topic}-{p}"] = [first.result().offset, last.result().offset]
        finally:
            self.producer.close()
        return self.commit

    def abandon(self) -> None:
        """The task failed part-way: abort its transaction, so none of its rows is ever read
        committed and the micro-batch is not recorded as done (the retry writes it all)."""
        try:
            if not self.commit.skipped:
                self.producer.abort_transaction(10)
        except Exception as exc:  # noqa: BLE001 - the coordinator aborts it anyway: the retry's init fences it
            log.warning("transactional id %r: abort after a failed task: %s", self.txn_id, exc)
        finally:
            self.producer.close()


def _binary_list(col: pa.Array) -> list:
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary())
    return col.to_pylist()


def _write(o: opt.WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteCommit:
    return write_task(o, WriteCommit(*_task_info()), batches)


def write_task(o: opt.WriteOptions, commit: WriteCommit, batches: Iterator[pa.RecordBatch]) -> WriteCommit:
    """One task's rows (``batches``), exactly once when it is a micro-batch's task and
    ``exactlyOnce`` holds. A task that fails part-way gives up what it wrote: the transaction
    is aborted (exactly once; the retry writes every row again), or the batches already sent
    stay (at-least-once)."""
    exactly_once = o.exactly_once and commit.batch_id is not None and commit.query_id is not None and o.acks != 0
    writer = (TransactionalTopicWriter if exactly_once else TopicWriter)(o, commit)
    try:
        for rb in batches:
            writer.write(rb)
    except BaseException:
        writer.abandon()
        raise
    return writer.finish()


def _summary(messages: list) -> tuple[int, dict]:
    rows, ranges = 0, {}
    for m in messages:
        if m is None:
            continue
        rows += m.rows
        for k, (a, b) in m.ranges.items():
            lo, hi = ranges.get(k, (a, b))
            ranges[k] = (min(lo, a), max(hi, b))
    return rows, dict(sorted(ranges.items()))


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, o: opt.WriteOptions, schema):
        self.o = o

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return _write(self.o, iterator)

    def commit(self, messages: list) -> None:
        rows, ranges = _summary(messages)
        log.info("write committed: %d rows, offsets %s", rows, ranges)

    def abort(self, messages: list) -> None:
        rows, ranges = _summary(messages)
        log.warning("write aborted: %d rows were already appended at %s and stay (at-least-once)", rows, ranges)


class StreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink. ``committed`` (driver side) maps each micro-batch id to its offsets."""

    def __init__(self, o: opt.WriteOptions, schema):
        self.o = o
        self.committed: dict[int, dict] = {}

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return _write(self.o, iterator)

    def commit(self, messages: list, batchId: int) -> None:
        rows, ranges = _summary(messages)
        stale = [m for m in messages if m is not None and m.batch_id is not None and m.batch_id != batchId]
        if batchId in self.committed or stale:
            log.warning("micro-batch %d was written again (a retry): %d rows at %s duplicate %s",
                        batchId, rows, ranges, self.committed.get(batchId))
        self.committed[batchId] = ranges
        log.info("micro-batch %d committed: %d rows, offsets %s", batchId, rows, ranges)

    def abort(self, messages: list, batchId: int) -> None:
        rows, ranges = _summary(messages)
        log.warning("micro-batch %d aborted: %d rows already appended at %s stay (at-least-once); "
                    "Spark will run it again under the same id", batchId, rows, ranges)
