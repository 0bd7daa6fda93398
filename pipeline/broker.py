"""The connector's two conversations with the broker: planning (driver) and fetching (executors).

Runs in Spark's Python workers: ``Planner`` in the driver-side worker that plans a query
(metadata and ListOffsets through one ``BrokerConnection`` to a bootstrap server, opened per
call and closed before returning, since Spark never calls a stream reader's ``stop()``);
``RangeFetcher`` in an executor's task, which owns one connection to the partition's leader,
opened lazily when the task starts reading (readers are pickled to executors: nothing here
holds a socket before that). Neither is thread-safe; neither starts a thread.

Failures: retriable broker errors and lost connections (a broker restart) are retried with
backoff until ``kafkaConsumer.pollTimeoutMs`` passes without progress (executors) or
``fetchOffset.numRetries`` attempts (driver); then the task or query fails with a message
that names the partition and the last error. Data that retention deleted before it could be
read is reported through ``DataLoss``, which the caller turns into an error or a warning per
``failOnDataLoss``.

Isolation (``kafka.isolation.level``): with read_committed, ListOffsets' "latest" is the last
stable offset (``isolation_level`` 1), so no planned range reaches into an open transaction,
and fetches carry ``isolation_level`` 1; ``RangeFetcher`` drops the batches of aborted
transactions (from the aborted ranges each answer carries) and control batches before the
caller sees them. Offsets are never renumbered: what is dropped leaves gaps.
"""
from __future__ import annotations

import logging
import time
from typing import Iterator

from odradek.core import records as fmt
from odradek.network.client import BrokerConnection, parse_bootstrap
# one walk of a fetch answer's batches and the read_committed rule, shared with the client
from odradek.consumer import AbortedTransactions, split_batches
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.pipeline")

CLIENT_ID = "odradek-spark"
FETCH_MAX_WAIT_MS = 500
RETRY_BACKOFF = (0.05, 1.0)  # first and longest sleep between attempts, seconds



class DataLoss(Exception):
    """Records a query should read are gone (retention, DELETE_RECORDS, a deleted topic)."""


def retriable(exc: OdradekError) -> bool:
    return exc.code.retriable


def _connection(host: str, port: int, request_timeout_ms: int = 30_000) -> BrokerConnection:
    return BrokerConnection(host, port, client_id=CLIENT_ID, request_timeout_ms=request_timeout_ms)


class Planner:
    """Driver side: which partitions exist, and the offsets that bound what to read."""

    def __init__(self, bootstrap: str, retries: int = 3, retry_interval_ms: int = 1000,
                 read_committed: bool = False):
        self.servers = parse_bootstrap(bootstrap)
        self.retries = retries
        self.retry_interval = retry_interval_ms / 1000
        self.isolation_level = 1 if read_committed else 0  # 1: "latest" is the last stable offset

    def _request(self, api: ApiKey, body: dict) -> dict:
        """One request to the first bootstrap server that answers, retried on retriable errors."""
        last: OdradekError | None = None
        for attempt in range(self.retries + 1):
            for host, port in self.servers:
                conn = _connection(host, port)
                try:
                    return conn.request(api, body).body
                except OdradekError as exc:
                    last = exc
                    if not retriable(exc):
                        raise
                finally:
                    conn.close()
            if attempt < self.retries:
                time.sleep(self.retry_interval)
        raise OdradekError(f"{api.name} failed after {self.retries + 1} attempts on "
                           f"{', '.join(f'{h}:{p}' for h, p in self.servers)}: {last.message}", last.code)

    def metadata(self, topics: list[str] | None = None) -> dict:
        """``{"brokers": {node_id: (host, port)}, "topics": {name: [partition, ...]}}``; a
        requested topic that does not exist is absent from ``topics``."""
        body = self._request(ApiKey.METADATA, {"topics": topics, "allow_auto_topic_creation": False})
        brokers = {b["node_id"]: (b["host"], b["port"]) for b in body.get("brokers", [])}
        out: dict[str, list] = {}
        leaders: dict[tuple[str, int], int] = {}
        for t in body.get("topics", []):
            if t.get("error_code") or t.get("is_internal"):
                continue
            out[t["name"]] = sorted(p["index"] for p in t.get("partitions", []))
            for p in t.get("partitions", []):
                leaders[(t["name"], p["index"])] = p.get("leader", -1)
        return {"brokers": brokers, "topics": out, "leaders": leaders}

    def list_offsets(self, partitions: list[tuple[str, int]], timestamp) -> dict:
        """``{(topic, partition): offset}`` for one timestamp (-2 earliest, -1 latest, or ms) or
        per partition (``timestamp`` a dict). -1 in the answer: no record that late. With
        read_committed, -1 (latest) answers the last stable offset."""
        if not partitions:
            return {}
        by_topic: dict[str, list] = {}
        for t, p in partitions:
            ts = timestamp[(t, p)] if isinstance(timestamp, dict) else timestamp
            by_topic.setdefault(t, []).append({"index": p, "timestamp": ts})
        body = self._request(ApiKey.LIST_OFFSETS, {"isolation_level": self.isolation_level,
                                                   "topics": [{"name": t, "partitions": ps}
                                                              for t, ps in by_topic.items()]})
        out = {}
        for t in body.get("topics", []):
            for p in t.get("partitions", []):
                code = p.get("error_code", 0)
                if code:
                    raise OdradekError(f"ListOffsets of {t['name']}-{p['index']}: "
                                       f"{p.get('error_message') or ErrorCode.of(code).meaning}", ErrorCode.of(code))
                out[(t["name"], p["index"])] = p.get("offset", -1)
        missing = set(partitions) - set(out)
        if missing:
            raise OdradekError(f"ListOffsets answer lacks {sorted(missing)}", ErrorCode.UNKNOWN_SERVER_ERROR)
        return out


class RangeFetcher:
    """Executor side: the records of ``[start, end)`` of one partition, fetch by fetch.

    Pipelined: the next FETCH is sent as soon as the previous answer's batch headers are read,
    before its records are decoded, so the broker reads ahead while this process decodes.
    Yields ``(batches, view)`` per answer: the whole batches (``[(position, BatchHeader)]``)
    to decode from ``view``; the caller trims records outside the range. With
    ``read_committed`` the batches of aborted transactions and control batches are left out
    (the list may then be empty).
    """

    def __init__(self, bootstrap: str, leader: tuple[str, int] | None, topic: str, partition: int,
                 fetch_bytes: int, poll_timeout_ms: int, fail_on_data_loss: bool, read_committed: bool = False):
        self.bootstrap = bootstrap
        self.leader = leader
        self.topic, self.partition = topic, partition
        self.fetch_bytes = fetch_bytes
        self.poll_timeout = poll_timeout_ms / 1000
        self.fail_on_data_loss = fail_on_data_loss
        self.conn: BrokerConnection | None = None
        self.skipped = 0  # records lost to retention while failOnDataLoss=false
        self.read_committed = read_committed
        self.aborted = AbortedTransactions()  # read_committed: the aborted ranges met so far

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _conn(self) -> BrokerConnection:
        if self.conn is None:
            if self.leader is None:
                self.leader = self._find_leader()
            host, port = self.leader
            self.conn = _connection(host, port, request_timeout_ms=int(FETCH_MAX_WAIT_MS + 30_000))
        return self.conn

    def _find_leader(self) -> tuple[str, int]:
        meta = Planner(self.bootstrap, retries=0).metadata([self.topic])
        node = meta["leaders"].get((self.topic, self.partition), -1)
        if node in meta["brokers"]:
            return meta["brokers"][node]
        return parse_bootstrap(self.bootstrap)[0]

    def _send(self, offset: int) -> int:
        body = {"max_wait_ms": FETCH_MAX_WAIT_MS, "min_bytes": 1, "max_bytes": self.fetch_bytes,
                "isolation_level": 1 if self.read_committed else 0,
                "topics": [{"name": self.topic, "partitions": [
                    {"index": self.partition, "fetch_offset": offset, "partition_max_bytes": self.fetch_bytes}]}]}
        return self._conn().send(ApiKey.FETCH, body)

    def fetch(self, start: int, end: int) -> Iterator[tuple[list, memoryview, int]]:
        """Yield ``(batches, view, from_offset)`` until every offset below ``end`` was served."""
        pos = start
        corr = None
        deadline = time.monotonic() + self.poll_timeout
        backoff = RETRY_BACKOFF[0]
        last_error = "no answer yet"
        try:
            while pos < end:
                try:
                    if corr is None:
                        corr = self._send(pos)
                    resp = self._conn().receive(corr)
                    corr = None
                    batches, view, next_pos = self._answer(resp, pos)
                except (OdradekError, _Retry) as exc:
                    corr = None
                    if isinstance(exc, OdradekError) and (not retriable(exc)
                                                          or exc.code == ErrorCode.CORRUPT_MESSAGE):
                        raise
                    last_error = str(exc)
                    if time.monotonic() > deadline:
                        raise OdradekError(f"{self.name}: no progress at offset {pos} for "
                                           f"{self.poll_timeout:g}s (kafkaConsumer.pollTimeoutMs); "
                                           f"last error: {last_error}", ErrorCode.REQUEST_TIMED_OUT) from None
                    if isinstance(exc, OdradekError) and exc.code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                        self.close()
                        self.leader = None
                    time.sleep(backoff)
                    backoff = min(backoff * 2, RETRY_BACKOFF[1])
                    continue
                except DataLossSkip as skip:
                    pos = skip.offset
                    continue
                if next_pos > pos:
                    deadline = time.monotonic() + self.poll_timeout
                    backoff = RETRY_BACKOFF[0]
                    if next_pos < end:
                        corr = self._send(next_pos)  # read-ahead while this answer is decoded
                    yield batches, view, pos
                    pos = next_pos
        finally:
            if corr is not None:  # an answer we will not read: the connection is not reusable
                self.close()

    def _answer(self, resp, pos: int) -> tuple[list, memoryview, int]:
        topics = resp.body.get("topics") or []
        part = topics[0]["partitions"][0] if topics and topics[0].get("partitions") else None
        if part is None:
            raise OdradekError(f"{self.name}: fetch answer names no partition", ErrorCode.UNKNOWN_SERVER_ERROR)
        code = part.get("error_code", 0)
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            self._out_of_range(pos, part)
        if code:
            raise OdradekError(f"{self.name}: {part.get('error_message') or ErrorCode.of(code).meaning}",
                               ErrorCode.of(code))
        frames = resp.frames
        view = frames[0] if len(frames) == 1 else memoryview(b"".join(frames))
        size = part.get("records_size", len(view))
        batches, stop = split_batches(view, 0, min(size, len(view)))
        if not batches:
            if stop == "bad header":
                raise OdradekError(f"{self.name}: corrupt batch header at offset {pos}", ErrorCode.CORRUPT_MESSAGE)
            hw = part.get("high_watermark", -1)
            raise _Retry(f"{self.name}: no whole batch at offset {pos} (high watermark {hw}, {stop or 'empty'})")
        next_pos = batches[-1][1].next_offset
        if self.read_committed:
            self.aborted.add(part.get("aborted_transactions"))
            batches = [(at, h) for at, h in batches if not self.aborted.skips(h)]
        return batches, view, next_pos

    def _out_of_range(self, pos: int, part: dict) -> None:
        start = part.get("log_start_offset", -1)
        if start < 0 or pos >= start:  # beyond the end (truncation) or unknown: not ours to skip
            raise DataLoss(f"{self.name}: offset {pos} is out of range ({part.get('error_message')}); the "
                           f"partition may have been truncated or recreated")
        msg = (f"{self.name}: offsets {pos}..{start - 1} were deleted (retention or DeleteRecords) before "
               f"they were read")
        if self.fail_on_data_loss:
            raise DataLoss(msg + "; set failOnDataLoss=false to skip them")
        log.warning("%s; skipping them (failOnDataLoss=false)", msg)
        self.skipped += start - pos
        raise DataLossSkip(start)


class _Retry(Exception):
    """An answer without a whole batch although data should be there: fetch again."""


class DataLossSkip(Exception):
    def __init__(self, offset: int):
        super().__init__(offset)
        self.offset = offset


def check_crc(view, pos: int, h, name: str) -> None:
    if fmt.crc_of(view, pos, h.size) != h.crc:  # CRC-32C for a Kafka client's magic-2 batch
        raise OdradekError(f"{name}: CRC mismatch in the batch at offset {h.base_offset}", ErrorCode.CORRUPT_MESSAGE)
