"""The producer's sender thread (docs/CLIENT.md, "Producer": its delivery, ordering and
exactly-once paragraphs): ``_Sender`` drains closed batches from the accumulator, writes
PRODUCE requests to their leaders, reads the answers and resolves the futures;
``_Idempotence`` is its producer id, epoch and per-partition sequences. Everything here runs
on the sender thread.
"""
from __future__ import annotations

import collections
import logging
import struct
import time
import zlib
from typing import TYPE_CHECKING

from odradek.accumulator import Batch, RecordAccumulator
from odradek.core import kafka_batch
from odradek.core import records as fmt
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.cluster import NETWORK_ERRORS, STALE_METADATA, Cluster, Connection
from odradek.errors import error_for

if TYPE_CHECKING:
    from odradek.producer_txn import _Transactions

log = logging.getLogger("odradek.producer")


IDLE_WAIT = 1.0  # seconds the sender sleeps with nothing to do (any change wakes it)
_STAMP_PACK = fmt.PRODUCER_FIELDS.pack_into  # producerId, producerEpoch, baseSequence
OFFSET_PRODUCER_ID = fmt.OFFSET_PRODUCER_ID  # then producerEpoch and baseSequence (docs/FORMAT.md)
MAX_EPOCH = 32767
_CRC_PACK = struct.Struct(">I").pack_into  # a stamped batch's CRC, recomputed
_crc32 = zlib.crc32
# Refusals that wrote nothing and that a new producer epoch (or id) and sequence cure (KIP-360).
SEQUENCE_RESETS = (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID,
                   ErrorCode.INVALID_PRODUCER_ID_MAPPING)
LEADER_ERRORS = STALE_METADATA  # retried after a metadata refresh (the leader may have moved)
# Idempotence: batches of a partition stamped from its oldest unresolved one on. An Odradek
# leader recognises a retry among a producer's last 32 batches (log.producer_state.
# MAX_CACHED_BATCHES; Kafka keeps 5), so up to 32 closed batches of a partition go in its one
# request in flight instead of one request, and one round trip, each. With 5 the requests of
# a fast producer carried a third of the batches they do without idempotence: 21% of the
# throughput; with 16, 11%; with 32, 3% (docs/BENCHMARKS.md, "Exactly-once").
MAX_STAMPED = 32


class _Idempotence:
    """The idempotent producer's state, owned by the sender (its thread only): the producer id
    and epoch, and per partition its next sequence, its window of stamped batches, the
    (id, epoch) they carry and whether its leader refused its sequence (see the module doc)."""

    def __init__(self):
        # the producer id and epoch in use, each partition's next sequence
        self.producer_id, self.epoch = -1, 0
        self.next_seq: dict[tuple, int] = {}
        # each partition's window: the batches stamped with its id and epoch (``stamp_of``) from
        # its oldest unresolved one on (resolved ones behind it stay until it is resolved). The
        # partition's leader recognises a retry among the last batches it wrote of a producer
        # (log.producer_state.MAX_CACHED_BATCHES), so a window never holds more than MAX_STAMPED
        # (no more than those): a batch in doubt is always recognised if it was written.
        self.window: dict[tuple, collections.deque] = {}
        # the (producer id, epoch) a partition's window is stamped with: the current one, or an
        # older one until the partition has no batch in doubt (Kafka's producer switches each
        # partition to a bumped epoch only with nothing in flight there)
        self.stamp_of: dict[tuple, tuple] = {}
        # partitions whose leader refused their sequence: nothing new is stamped for them until
        # they switch to the current epoch (``switch_settled``)
        self.broken: set = set()
        self.resets = 0
        self.init_error: OdradekError | None = None  # InitProducerId refused for good

    def stamp(self, b: Batch, transactional: bool) -> None:
        """Give a batch about to be sent for the first time (or after a reset) the producer id,
        epoch and its partition's next sequence; the CRC covers them and is redone."""
        tp = (b.topic, b.partition)
        window = self.window.get(tp)
        if window is None:
            window = self.window[tp] = collections.deque()
        ident = self.stamp_of.get(tp)
        current = (self.producer_id, self.epoch)
        if ident != current and not window:  # nothing in doubt here: the partition takes the current epoch
            ident = self.stamp_of[tp] = current
            self.next_seq[tp] = 0
        pid, epoch = ident
        seq = self.next_seq.get(tp, 0)
        self.next_seq[tp] = (seq + b.count) & 0x7FFFFFFF  # Kafka's wrap after 2**31 - 1
        data = b.data if isinstance(b.data, bytearray) else bytearray(b.data)
        _STAMP_PACK(data, OFFSET_PRODUCER_ID, pid, epoch, seq)
        if transactional:
            data[fmt.OFFSET_ATTRIBUTES + 1] |= fmt.TRANSACTIONAL_BIT
        _CRC_PACK(data, fmt.OFFSET_CRC, kafka_batch.crc_of(data, 0, len(data)) if data[fmt.OFFSET_MAGIC] ==
                  kafka_batch.MAGIC else _crc32(memoryview(data)[fmt.CRC_START:]))  # CRC-32C for magic 2
        b.data = data
        b.stamp = (pid, epoch, seq)
        window.append(b)

    def switch_settled(self) -> None:
        """Move each refused partition to the current epoch once none of its batches is in
        doubt: a batch whose fate is unknown (answer lost) is first sent again with its own
        stamp, so the partition answers with the offsets it wrote or writes it once; were it
        stamped anew, a batch already written would be written a second time. Then the
        partition's sequence restarts at 0 and its unwritten batches are stamped anew (KIP-360).
        Other partitions go on meanwhile, each switching when it next has nothing in doubt."""
        now = time.monotonic()
        for tp in list(self.broken):
            window = self.window.get(tp, ())
            if any(not (b.unwritten or b.future.done()) for b in window):
                continue
            for b in window:
                if not b.future.done():
                    b.stamp, b.unwritten, b.retry_at = None, False, now
            self.window.pop(tp, None)
            self.stamp_of.pop(tp, None)
            self.broken.discard(tp)

    def waits_for_switch(self, b: Batch) -> bool:
        """A refused partition sends only its batches in doubt until it switches: new ones and
        refused ones wait for the new epoch (a batch in doubt behind a refused one is sent
        anyway: the partition refuses it, or recognises it if it was written)."""
        return (b.stamp is None or b.unwritten) and (b.topic, b.partition) in self.broken

    def earlier_unresolved(self, b: Batch) -> bool:
        """Is a batch stamped before ``b`` (same partition, same epoch) still unresolved?"""
        for x in self.window.get((b.topic, b.partition), ()):
            if x is b:
                return False
            if not x.future.done():
                return True
        return False

    def resolved(self, b: Batch) -> None:
        """A stamped batch is acknowledged or failed: its partition's window moves past the
        resolved batches at its head."""
        window = self.window.get((b.topic, b.partition))
        while window and window[0].future.done():
            window.popleft()

    def refused(self, b: Batch, code: int, message: str, retry_backoff: float) -> None:
        """A batch refused for its sequence (``SEQUENCE_RESETS``: nothing was written). If an
        earlier batch of its partition is still unresolved, that one decides: this one is sent
        again with the same stamp after it. If none is, the partition's leader no longer follows
        this producer's sequence (it lost or expired the producer's state, or an earlier batch
        failed for good): a new epoch is needed (a new id when the epoch is exhausted or the id
        refused). Sets the batch's ``retry_at``; the sender requeues it."""
        b.unwritten = True
        tp = (b.topic, b.partition)
        if self.earlier_unresolved(b):
            b.retry_at = time.monotonic() + retry_backoff  # after the earlier one
        else:
            if tp not in self.broken:
                log.info("%s on %s-%d (%s): the partition moves to a new producer epoch once none of its "
                         "batches is in doubt", ErrorCode.of(code).name, b.topic, b.partition, message)
                self.broken.add(tp)
                if b.stamp[:2] == (self.producer_id, self.epoch):  # else the producer has bumped already
                    self.resets += 1
                    if code == ErrorCode.INVALID_PRODUCER_ID_MAPPING or self.epoch >= MAX_EPOCH:
                        self.producer_id, self.epoch = -1, 0  # InitProducerId before the next stamp
                    else:
                        self.epoch += 1
                    log.info("producer epoch bumped to %d (id %d)", self.epoch, self.producer_id)
            b.retry_at = time.monotonic()


class _InFlight:
    """A partition's requests in flight: to which broker, how many, how many carry a retry."""
    __slots__ = ("node", "requests", "retries")

    def __init__(self, node: int, retry: bool):
        self.node, self.requests, self.retries = node, 1, int(retry)


class _Sender:
    """The sender thread's state and loop: everything here runs on that thread only. It takes
    closed batches from the accumulator (``drain``), sends them to their leaders through the
    connections it opens from the metadata (``cluster``), and resolves their futures; a
    transactional producer's ``txn`` (``_Transactions``) is set after construction."""

    def __init__(self, accumulator: RecordAccumulator, cluster: Cluster, *, acks: int, ack_timeout_ms: int,
                 idempotent: bool, retries: int, retry_backoff: float, max_in_flight: int,
                 max_in_flight_per_partition: int, max_request_size: int, request_timeout_ms: int, client_id: str):
        self.acc, self.cluster = accumulator, cluster
        self.txn: _Transactions | None = None
        self.acks, self.ack_timeout_ms, self.idempotent = acks, ack_timeout_ms, idempotent
        self.retries, self.retry_backoff = retries, retry_backoff
        self.max_in_flight, self.max_in_flight_per_partition = max_in_flight, max_in_flight_per_partition
        self.max_request_size, self.request_timeout_ms, self.client_id = max_request_size, request_timeout_ms, client_id
        self.conns: dict[int, Connection] = {}
        self.retry: list[Batch] = []  # encoded batches waiting to be sent (again)
        self.stopping = False
        self.stop_deadline: float | None = None
        self.metadata_wanted = False
        self.in_flight: dict[tuple, _InFlight] = {}  # (topic, partition) -> its requests in flight
        self.requests = self.batches = self.retried = 0
        self.idem = _Idempotence()  # the idempotent producer's per-partition state

    def stop(self, deadline: float | None) -> None:
        """Finish what is queued, giving up at ``deadline`` (monotonic; None: no limit)."""
        self.stop_deadline = deadline
        self.stopping = True

    def run(self) -> None:
        try:
            while True:
                earliest, seen, ready = self.acc.drain(time.monotonic(), force=self.stopping)
                self.retry.extend(ready)
                cluster = self.cluster
                if (self.metadata_wanted or cluster.stale()) and not cluster.refresh_due():
                    self._refresh_metadata()
                txn = self.txn
                if txn is not None:
                    txn.settle_early()
                self._send_ready()
                if txn is not None and txn._end is not None:
                    txn.send_end(self)
                if self.stopping:
                    if not self.retry and not any(c.in_flight for c in self.conns.values()):
                        break
                    if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                        break
                self._wait(earliest, seen)
        except Exception as exc:  # a bug here must not leave callers waiting forever
            log.exception("producer sender thread failed")
            self._fail_everything(error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"producer sender thread failed: {exc!r}"))
        finally:
            for c in self.conns.values():
                c.close("producer closed")
            self._fail_everything(error_for(ErrorCode.REQUEST_TIMED_OUT, "producer closed before the record was sent"))

    def _wait(self, earliest: float | None, seen: int) -> None:
        """Sleep until an answer arrives, a linger or retry deadline passes, or a caller
        opens or closes a batch (the wake pipe)."""
        now = time.monotonic()
        timeout = IDLE_WAIT if earliest is None else max(0.0, earliest - now)
        if self.retry:
            # only a batch whose backoff is still running has a time to wake for: one due
            # already that ``_send_ready`` kept waits for an answer (its partition's, or room in
            # a connection's window), which wakes ``wait_any``; counting it was a busy loop
            adding = self.txn.adding if self.txn is not None else ()
            due = [b.retry_at for b in self.retry if b.retry_at > now
                   and not (self.idem.broken and self.idem.waits_for_switch(b)) and (b.topic, b.partition) not in adding]
            if due:
                timeout = min(timeout, max(0.0, min(due) - now))
        if self.metadata_wanted:
            timeout = min(timeout, self.cluster.refresh_due(now))
        conns = list(self.conns.values())
        early = self.txn.early_conn() if self.txn is not None else None
        if early is not None:
            conns.append(early)  # its answer lets the partition's batches go
        self.acc.sleep(conns, now, timeout, seen)

    # ---- sending ------------------------------------------------------------------------------------
    def _send_ready(self) -> None:
        """Group the sendable batches by leader into requests (in order), respecting
        max_in_flight, max_request_size and retry backoff.

        Per-partition order: the batches are in creation order (one open batch per partition
        at a time), and a batch that must wait (backoff, no leader) holds back every later
        batch of its partition; a partition with batches still in flight to another broker
        (its old leader) waits for their answers before anything goes to the new leader."""
        if not self.retry:
            return
        idem = self.idem
        if idem.broken:
            idem.switch_settled()
        broken = idem.broken  # their batches in doubt go (with their own stamp), nothing else
        txn = self.txn
        now = time.monotonic()
        cluster = self.cluster
        in_flight = self.in_flight
        pending, self.retry = self.retry, []  # callbacks fired while sending may requeue into self.retry
        waiting, by_node = [], {}
        held: set = set()  # partitions whose earlier batch waits
        for batch in pending:
            if now > batch.deadline:
                self._fail(batch, error_for(ErrorCode.REQUEST_TIMED_OUT,
                                            f"{batch.topic}-{batch.partition}: not acknowledged within "
                                            f"delivery_timeout_ms ({batch.attempts} attempts)"))
                continue
            tp = (batch.topic, batch.partition)
            if broken and idem.waits_for_switch(batch):
                waiting.append(batch)  # its partition's later batches in doubt may still go
                continue
            if txn is not None and tp not in txn.partitions:
                added = txn.add_state(tp)
                if added is None and txn.may_go_unverified(tp, cluster):
                    added = True  # the partition's leader holds it until the coordinator stored the partition
                if added is None:  # AddPartitionsToTxn in flight: the adder wakes us
                    held.add(tp)
                    waiting.append(batch)
                    continue
                if added is not True:
                    self._fail(batch, added)
                    continue
            leader = cluster.leader(batch.topic, batch.partition)
            if leader < 0:
                self.metadata_wanted = True
                batch.retry_at = max(batch.retry_at, now + self.retry_backoff)
            if batch.retry_at > now or tp in held:
                held.add(tp)
                waiting.append(batch)
                continue
            busy = in_flight.get(tp)
            if busy is not None and busy.node != leader:
                held.add(tp)
                waiting.append(batch)
                continue
            by_node.setdefault(leader, []).append(batch)
        held_here = len(waiting)
        for node, batches in by_node.items():
            waiting.extend(self._send_to(node, batches))
        if self.retry:
            waiting.extend(self.retry)
        if self.retry or (held_here and len(waiting) > held_here):
            # Back in creation order: batches that went to ``_send_to`` but stayed (no connection,
            # limits) come after later batches of their partition that waited here (a retry time
            # a moment later). Out of order, an unstamped batch came before its partition's
            # stamped one in doubt, waited for room in the window that one holds, and held it
            # back: the partition sent nothing until delivery_timeout_ms (issue 16).
            waiting.sort(key=lambda b: b.created)
        self.retry = waiting

    def _send_to(self, node: int, batches: list) -> list:
        """Send batches to one broker in requests (up to ``max_in_flight`` of them, each at
        most ``max_request_size``); returns those that must wait. A partition with
        ``max_in_flight_per_partition`` requests in flight sends nothing more until one is
        answered, and a batch that does not fit holds back its partition's later ones.

        Idempotence (several requests of a partition in flight): a retried batch goes only
        when nothing of its partition is in flight, alone, and nothing else of the partition
        goes while it is in flight, so retries go one at a time in sequence order (Kafka's
        producer does the same). The leader's sequence check keeps the order of what is in
        flight: when a request is refused unwritten, the partition's later requests in flight
        are refused OUT_OF_ORDER_SEQUENCE_NUMBER and sent again after it (``_Idempotence.refused``)."""
        conn = self._conn(node)
        if conn is None:
            retry_at = time.monotonic() + self.retry_backoff  # one time for all: they stay together
            for b in batches:
                b.retry_at = retry_at
            self.metadata_wanted = True
            return batches
        idempotent = self.idempotent
        if idempotent and self.idem.producer_id < 0 and self.txn is not None:
            for b in batches:  # a transactional producer's id comes from init_transactions() only
                self._fail(b, self.txn.not_ready_error())
            return []
        if idempotent and self.idem.producer_id < 0 and not self._init_producer_id():
            if self.idem.init_error is not None:  # the broker will never give an id: say so now
                for b in batches:
                    self._fail(b, self.idem.init_error)
                return []
            retry_at = time.monotonic() + self.retry_backoff
            for b in batches:
                b.retry_at = retry_at
            return batches
        limit, in_flight = self.max_in_flight_per_partition, self.in_flight
        window = self.idem.window
        while batches and conn.in_flight < self.max_in_flight:
            group, rest, size, held = [], [], 0, set()
            retried: dict = {}  # idempotence: tp -> whether its batches here include a retry
            fresh: dict = {}  # idempotence: tp -> batches here to be stamped (they join its window)
            for b in batches:
                tp = (b.topic, b.partition)
                busy = in_flight.get(tp)
                if tp in held or (busy is not None and (busy.requests >= limit or busy.retries or b.attempts)) or \
                        (group and size + len(b.data) > self.max_request_size) or \
                        (idempotent and tp in retried and (retried[tp] or b.attempts)) or \
                        (idempotent and b.stamp is None and len(window.get(tp, ())) + fresh.get(tp, 0) >= MAX_STAMPED):
                    held.add(tp)  # a retried batch goes alone: the broker knows a retry by its one batch
                    rest.append(b)
                    continue
                if idempotent:
                    retried[tp] = b.attempts > 0
                    if b.stamp is None:
                        fresh[tp] = fresh.get(tp, 0) + 1
                group.append(b)
                size += len(b.data)
            if not group:
                break
            self._send_request(conn, node, group)
            batches = rest
        return batches

    def _conn(self, node: int) -> Connection | None:
        return self.cluster.connect(self.conns, node, self.client_id, self.request_timeout_ms, log)

    def _send_request(self, conn: Connection, node: int, group: list) -> None:
        """One PRODUCE request: a frame per partition holding its batches concatenated."""
        frames, topics, layout = [], {}, []
        by_tp: dict[tuple, list] = {}
        for b in group:
            by_tp.setdefault((b.topic, b.partition), []).append(b)
            if self.idempotent and b.stamp is None:
                self.idem.stamp(b, self.txn is not None)
        for (topic, partition), bs in by_tp.items():
            topics.setdefault(topic, []).append({"index": partition, "frame": len(frames)})
            frames.append(bs[0].data if len(bs) == 1 else b"".join(b.data for b in bs))
            layout.append(((topic, partition), bs))
        body = {"acks": self.acks, "timeout_ms": self.ack_timeout_ms,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
        txn = self.txn
        if txn is not None:
            body["transactional_id"] = txn.txn_id  # what the broker checks Write on (docs/SECURITY.md)
            if any(tp not in txn.partitions for tp, _ in layout):
                body["txn_unverified"] = True  # sent before AddPartitionsToTxn's answer (may_go_unverified)
        for b in group:
            b.attempts += 1
            b.unwritten = False
        in_flight = self.in_flight
        for tp, bs in layout:
            busy = in_flight.get(tp)
            retry = bs[0].attempts > 1  # a retry goes alone (``_send_to``)
            if busy is None:
                in_flight[tp] = _InFlight(node, retry)
            else:
                busy.requests += 1
                busy.retries += retry
        self.requests += 1
        self.batches += len(group)
        if self.acks == 0:
            conn.send(ApiKey.PRODUCE, body, frames, lambda frame, err: self._on_unacked(layout, err),
                      expect_response=False)
        else:
            conn.send(ApiKey.PRODUCE, body, frames, lambda frame, err: self._on_response(layout, frame, err, node))

    # ---- idempotence ----------------------------------------------------------------------------------
    def _init_producer_id(self) -> bool:
        """Ask any broker for a producer id (blocking the sender briefly, once per id)."""
        try:
            frame = self.cluster.request(ApiKey.INIT_PRODUCER_ID, {
                "transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1},
                timeout=self.request_timeout_ms / 1000)
        except OdradekError as exc:
            code, message = exc.code, exc.message
        else:
            body = frame.header.get("body") or {}
            code, message = body.get("error_code", 0), body.get("error_message") or ""
            if not code:
                self.idem.producer_id, self.idem.epoch = body["producer_id"], body["producer_epoch"]
                self.idem.init_error = None
                log.debug("producer id %d epoch %d", self.idem.producer_id, self.idem.epoch)
                return True
        if ErrorCode.of(code).retriable or code in NETWORK_ERRORS:
            log.info("InitProducerId failed (%s: %s); retrying after backoff", ErrorCode.of(code).name, message)
            return False
        self.idem.init_error = error_for(code, f"the broker refused InitProducerId, which the idempotent producer needs "
                                          f"({message or ErrorCode.of(code).meaning}); an older broker? "
                                          f"Pass enable_idempotence=False to send without it")
        return False

    def _refused_unwritten(self, b: Batch, code: int, message: str) -> bool:
        """A batch refused for its sequence (``SEQUENCE_RESETS``: nothing was written): sent
        again, after an earlier unresolved batch of its partition or with the partition moved
        to a new epoch (``_Idempotence.refused``). False if the batch may not be retried any
        more, or the producer is transactional (its epoch is the coordinator's: the
        transaction must abort)."""
        if b.attempts > self.retries or time.monotonic() + self.retry_backoff >= b.deadline:
            return False
        if self.txn is not None:
            return False
        self.idem.refused(b, code, message, self.retry_backoff)
        self.retried += 1
        self.retry.append(b)
        self.retry.sort(key=lambda x: x.created)
        return True

    # ---- answers ----------------------------------------------------------------------------------
    def _landed(self, layout: list) -> None:
        """A request's answer (or failure) arrived: its batches are no longer in flight."""
        in_flight = self.in_flight
        for tp, bs in layout:
            busy = in_flight.get(tp)
            if busy is not None:
                busy.requests -= 1
                busy.retries -= bs[0].attempts > 1
                if busy.requests <= 0:
                    del in_flight[tp]

    def _on_unacked(self, layout: list, err: OdradekError | None) -> None:
        self._landed(layout)
        for _, bs in layout:
            for b in bs:
                if err is None:
                    self._succeed(b, -1, None)
                else:
                    self._retry_or_fail(b, err)

    def _on_response(self, layout: list, frame, err: OdradekError | None, node: int) -> None:
        self._landed(layout)
        if err is not None:  # the whole request failed (connection lost, error body)
            if err.code in NETWORK_ERRORS:  # dead or silent (paused): ask the others for metadata first
                self.cluster.node_failed(node)
            for _, bs in layout:
                for b in bs:
                    self._retry_or_fail(b, err)
            return
        results = {}
        for t in frame.header["body"].get("topics", []):
            for part in t.get("partitions", []):
                results[(t["name"], part["index"])] = part
        for tp, bs in layout:
            part = results.get(tp)
            code = part.get("error_code", 0) if part is not None else ErrorCode.UNKNOWN_SERVER_ERROR
            if code:
                message = (part or {}).get("error_message") or ErrorCode.of(code).meaning
                e = error_for(code, f"produce to {tp[0]}-{tp[1]}: {message}")
                for b in bs:
                    if not (self.idempotent and code in SEQUENCE_RESETS and self._refused_unwritten(b, code, message)):
                        self._retry_or_fail(b, e)
                continue
            base = part.get("base_offset", -1)
            append_time = part.get("log_append_time_ms", -1)
            for b in bs:
                self._succeed(b, base, append_time)
                if base >= 0:
                    base += b.count

    def _retry_or_fail(self, batch: Batch, err: OdradekError) -> None:
        now = time.monotonic()
        if err.retriable and batch.attempts <= self.retries and now + self.retry_backoff < batch.deadline:
            if err.code in LEADER_ERRORS:
                self.metadata_wanted = True
            batch.retry_at = now + self.retry_backoff
            self.retried += 1
            self.retry.append(batch)
            self.retry.sort(key=lambda b: b.created)  # keep each partition's batches in order
            return
        self._fail(batch, err)

    def _succeed(self, batch: Batch, base: int, append_time) -> None:
        if batch.future.done():  # resolved once: a late answer for a failed batch changes nothing
            return
        batch.data = None  # handles may live on; the bytes need not
        batch.future.set_result((base, append_time))
        if batch.stamp is not None:
            self.idem.resolved(batch)
        self.acc.batch_done(batch)

    def _fail(self, batch: Batch, err: BaseException) -> None:
        if batch.future.done():
            return
        if self.txn is not None:
            self.txn.record_failed(err)
        batch.data = None
        batch.future.set_exception(err)
        if batch.stamp is not None:
            self.idem.resolved(batch)
        self.acc.batch_done(batch)

    def _fail_everything(self, err: OdradekError) -> None:
        for b in self.acc.incomplete():
            self._fail(b, err)
        self.retry = []

    def _refresh_metadata(self) -> None:
        """Ask any live broker (see ``Cluster``); refreshes stay ``retry_backoff_ms`` apart."""
        self.metadata_wanted = False
        cluster = self.cluster
        topics = sorted({b.topic for b in self.retry} | set(cluster.topics))
        if not topics:
            cluster.updated_at = time.monotonic()
            return
        try:
            cluster.refresh(topics, timeout=self.request_timeout_ms / 1000)
        except OdradekError as exc:
            log.info("metadata refresh failed (%s); retrying after backoff", exc)
            cluster.updated_at = time.monotonic()  # the periodic refresh waits; retries don't
            self.metadata_wanted = True
            retry_at = time.monotonic() + self.retry_backoff
            for b in self.retry:
                b.retry_at = max(b.retry_at, retry_at)
