"""The transaction coordinator actor: producer ids (InitProducerId) and transactions.

Process: ``txn_coordinator`` (one per broker).
Owns: the transactions of the transactional ids whose ``__transaction_state`` partition
(``partition_for(id)``) this broker leads, through plain objects handed the actor's ``Outbox``,
the wall ``clock`` (ms) and the broker's ``TxnSite``: ``ProducerIds`` (txn_producer_ids),
``TxnStateLog`` (txn_state_log: the ``Transaction`` state machines of ``coordinator.transaction``,
the partitions' leadership, loading and records), ``MarkerWriter`` (txn_markers),
``PipelinedRequests`` (txn_pipeline) and ``TimeoutReaper`` (here: every
``transaction.abort.timed.out.transaction.cleanup.interval.ms`` it aborts the transactions open
past their ``transaction.timeout.ms``, their producer fenced). This module keeps the API
handlers: parse the request, call the part, answer.
Accepts:
  txn_request {api, body}  from a request handler, answered straight to the client's
      processor: INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, TXN_OFFSET_COMMIT,
      END_TXN (answered once every marker is written), WRITE_TXN_MARKERS (another broker's
      coordinator, or ``broker_id`` -1: an operator's abort), LIST_TRANSACTIONS,
      DESCRIBE_TRANSACTIONS, DESCRIBE_PRODUCERS (shapes: docs/PROTOCOL.md)
  create_state_topic {}  one-way, from the group coordinator (a FindCoordinator for a
      transactional id before ``__transaction_state`` exists)
Sends: ``produce`` (acks=all), ``get_bounds``, ``write_markers``, ``txn_check`` and
``describe_producers`` to log actors; ``txn_offsets_end`` to the group coordinator;
``get_metadata``, ``create_topics`` and ``get_broker_epochs`` to the controller;
WRITE_TXN_MARKERS over TCP to the leaders of partitions led elsewhere.
Invariants: requests for an id whose partition is being loaded get
COORDINATOR_LOAD_IN_PROGRESS, led elsewhere NOT_COORDINATOR; a WRITE_TXN_MARKERS from a
broker is served only if ``broker_epoch`` is that broker's live ZooKeeper registration
(STALE_BROKER_EPOCH otherwise).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from odradek.actors.message import Message
from odradek.actors.names import CONTROLLER, log_host
from odradek.actors.messages import (Chained, DescribeProducers, GetBounds, GetMetadata, PartitionProducers,
                                     ProducerState, Response, TxnAdded, TxnMarker, TxnPartsAdded)
from odradek.actors.runtime import Actor
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.transaction import COMPLETE, PREPARING, Transaction, TransactionManager, TxnState
from odradek.coordinator.txn_markers import MarkerWriter
from odradek.coordinator.txn_pipeline import PipelinedRequests
from odradek.coordinator.txn_producer_ids import ProducerIds
from odradek.coordinator.offsets_replay import bounds_of
from odradek.coordinator.txn_state_log import LOAD_RETRY, TxnSite, TxnStateLog
from odradek.network.clientauth import ClientSecurity
from odradek.core.fields import BadRequest, field
from odradek.core.protocol import OFFSETS_TOPIC, TXN_STATE_TOPIC, ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.txn")

METADATA_REFRESH = 1.0  # seconds between metadata polls in cluster mode (leadership of __transaction_state)
LOAD_DEADLINE = 60.0  # seconds a single broker waits at start for its __transaction_state partition to open


def wall_ms() -> int:
    """The coordinator's clock: wall-clock ms (transaction start times are shown to clients)."""
    return int(time.time() * 1000)


def _name(body: dict, name: str) -> str:
    """A required non-empty string field (``core.fields.field``, INVALID_REQUEST)."""
    value = field(body, name, str)
    if not value:
        raise BadRequest(f"field '{name}' must not be empty")
    return value


def _marker(entry) -> TxnMarker:
    """One of WRITE_TXN_MARKERS' ``markers``, read by name (INVALID_REQUEST if it is not one)."""
    m = TxnMarker._make(entry) if isinstance(entry, list) and len(entry) == len(TxnMarker._fields) else None
    if m is None or not (isinstance(m.topic, str) and isinstance(m.commit, bool) and all(
            isinstance(x, int) for x in (m.partition, m.producer_id, m.producer_epoch, m.coordinator_epoch))):
        raise OdradekError(f"each marker must be [topic, partition, producer_id, producer_epoch, commit, "
                           f"coordinator_epoch], got {entry!r}", ErrorCode.INVALID_REQUEST)
    return m


class TimeoutReaper:
    """Transactions open longer than their ``transaction.timeout.ms``: aborted with their
    producer fenced (``TransactionManager.expire``), each handed to ``abort(t)`` (its record
    written, then its markers). Owns the count of transactions it aborted."""

    def __init__(self, txns: TransactionManager, clock: Callable[[], int], abort: Callable[[Transaction], None]):
        self.txns, self.clock, self.abort = txns, clock, abort
        self.aborted = 0

    def tick(self) -> None:
        for t in self.txns.expire(self.clock()):
            self.aborted += 1
            log.info("transaction %r open past its timeout (%d ms): aborted, producer %d fenced", t.txn_id,
                     t.timeout_ms, t.producer_id)
            self.abort(t)


class TxnCoordinator(Actor):
    # ---- start and stop --------------------------------------------------------------------
    def on_start(self) -> None:
        config = self.args["config"]
        self.config = config
        broker_id = int(self.args.get("broker_id", config["broker.id"]))
        cluster_mode = bool(config.get("zookeeper.connect"))
        self.site = TxnSite(broker_id, cluster_mode, self.args["data_dir"],
                            int(self.args.get("log_hosts", config.get("num.log.threads", 1))),
                            int(config.get("transaction.state.log.num.partitions", 8)),
                            int(config.get("transaction.state.log.replication.factor", 3)))
        self.assemble(Outbox.of(self), wall_ms,
                      ProducerIds(config, self.site.data_dir, broker_id, cluster_mode),
                      ClientSecurity.inter_broker(config, broker_id, self.site.data_dir) if cluster_mode else None,
                      int(config.get("transaction.max.timeout.ms", 900000)))
        self.state.adopt(self.call(CONTROLLER, GetMetadata(), timeout=30.0).fields.snapshot,
                         load=None if cluster_mode else self._load_now)
        interval = int(config.get("transaction.abort.timed.out.transaction.cleanup.interval.ms", 10000)) / 1000
        self.call_every(interval, self.reaper.tick)
        if cluster_mode:
            self.call_every(METADATA_REFRESH, self.state.refresh_metadata)

    def assemble(self, outbox: Outbox, clock: Callable[[], int], producer_ids: ProducerIds, security,
                 max_timeout_ms: int) -> None:
        """Make the parts and hand each its collaborators (``self.site`` set first)."""
        self.now_ms, self.outbox = clock, outbox
        self.producer_ids = producer_ids
        txns = TransactionManager(producer_ids.next, max_timeout_ms)
        self.state = TxnStateLog(self.site, outbox, clock, txns, self._loaded, self._dropped)
        self.markers = MarkerWriter(self.site, self.state, outbox, clock, security, lambda i: self.pipeline.release(i))
        self.pipeline = PipelinedRequests(self.state, self.markers.in_flight, outbox, self.on_txn_request, self._end)
        self.reaper = TimeoutReaper(txns, clock, lambda t: self.state.persist(t, lambda: self.markers.write(t),
                                                                              lambda _exc: None))

    def _load_now(self, partition: int) -> None:
        """A single broker at start: its state loaded before it is ready (blocking)."""
        host = self.state.host_of(partition)
        deadline = time.monotonic() + LOAD_DEADLINE
        while time.monotonic() < deadline:
            bounds = bounds_of(self.call(host, GetBounds(), timeout=LOAD_DEADLINE).fields, partition, TXN_STATE_TOPIC)
            if bounds is not None:
                self.state.install(partition, bounds)
                return
            time.sleep(LOAD_RETRY)
        raise OdradekError(f"{TXN_STATE_TOPIC}-{partition} is not open on {host}", ErrorCode.COORDINATOR_NOT_AVAILABLE)

    def _loaded(self, transactions: list) -> None:
        """A partition loaded: the markers of its transactions found PREPARE_* written again."""
        for t in transactions:
            if t.state in PREPARING:
                self.call_later(0, lambda t=t: self.markers.write(t))

    def _dropped(self, txn_id: str, why: str) -> None:
        """``txn_id`` went to another broker: what waits for it is answered NOT_COORDINATOR and
        its parked requests go on (to be refused the same)."""
        self.pipeline.drop(txn_id, why)
        self.markers.drop(txn_id, why)
        self.pipeline.release(txn_id)

    def on_stop(self) -> None:
        self.markers.close()
        self.producer_ids.close()

    def stats(self) -> dict:
        states: dict[str, int] = {}
        for t in self.state.txns.txns.values():
            states[t.state.value] = states.get(t.state.value, 0) + 1
        return {"producer_ids_handed_out": self.producer_ids.handed_out, "transactions": states,
                "transactions_aborted_by_timeout": self.reaper.aborted,
                "state_partitions_led": sorted(self.state.owned),
                "state_partitions_loading": sorted(self.state.loading),
                "marker_requests_sent": self.markers.sent_remote,
                "marker_requests_received": self.markers.received_remote}

    def on_create_state_topic(self, msg: Message | None) -> None:
        self.state.create_state_topic()

    # ---- the requests ------------------------------------------------------------------------
    def on_txn_request(self, msg: Message) -> None:
        api, body = msg.fields
        try:
            if not isinstance(body, dict):
                raise OdradekError("the request body must be a map", ErrorCode.INVALID_REQUEST)
            if self.pipeline.park(api, body, msg):
                return
            if api == ApiKey.INIT_PRODUCER_ID:
                self.init_producer_id(msg, body)
            elif api == ApiKey.ADD_PARTITIONS_TO_TXN:
                self.add_partitions(msg, body)
            elif api == ApiKey.ADD_OFFSETS_TO_TXN:
                self.add_offsets(msg, body)
            elif api == ApiKey.END_TXN:
                self.end_txn(msg, body)
            elif api == ApiKey.TXN_OFFSET_COMMIT:
                self.txn_offset_commit(msg, body)
            elif api == ApiKey.WRITE_TXN_MARKERS:
                self.write_txn_markers(msg, body)
            elif api == ApiKey.LIST_TRANSACTIONS:
                self.list_transactions(msg, body)
            elif api == ApiKey.DESCRIBE_TRANSACTIONS:
                self.describe_transactions(msg, body)
            elif api == ApiKey.DESCRIBE_PRODUCERS:
                self.describe_producers(msg, body)
            else:
                raise OdradekError(f"API {api!r} is not served by the transaction coordinator",
                                   ErrorCode.INVALID_REQUEST)
        except OdradekError as exc:
            self.reply_error(msg, exc.code, exc.message)

    def _answer_stored(self, msg: Message, t: Transaction, body: dict,
                       failed: Callable[[OdradekError], None] | None = None, words: list = ()) -> None:
        """Answer ``msg`` with ``body`` once ``t``'s record is stored: the record's log actor
        sends that answer itself, chained to the write (one hop less on the way back to the
        client). If the record is not stored, nothing was sent: ``failed(exc)`` answers
        (by default with the error)."""
        if failed is None:
            def failed(exc: OdradekError) -> None:
                self.reply_error(msg, exc.code, exc.message)
        if not msg.reply_to:
            self.state.persist(t, lambda: None, failed, chain=list(words))
            return
        self.state.persist(t, lambda: self.answered_elsewhere(msg), failed,
                           chain=[*words, self.answer_chained(msg, Response(body))])

    def init_producer_id(self, msg: Message, body: dict) -> None:
        txn_id = body.get("transactional_id")
        if txn_id is not None and not isinstance(txn_id, str):
            raise OdradekError("transactional_id must be a string or null", ErrorCode.INVALID_REQUEST)
        if not txn_id:
            self.reply(msg, Response({"error_code": 0, "producer_id": self.producer_ids.next(), "producer_epoch": 0}))
            return
        self.state.check_owner(txn_id)
        timeout = body.get("transaction_timeout_ms", 60000)
        t = self.state.txns.txns.get(txn_id)
        try:
            expected_pid, expected_epoch = body.get("producer_id", -1), body.get("producer_epoch", -1)
            t = self.state.txns.init_producer_id(txn_id, timeout, self.now_ms(),
                                                 expected_pid if isinstance(expected_pid, int) else -1,
                                                 expected_epoch if isinstance(expected_epoch, int) else -1)
        except OdradekError as exc:
            if exc.code == ErrorCode.CONCURRENT_TRANSACTIONS and t is not None and t.state in PREPARING:
                self.state.persist(t, lambda: self.markers.write(t), lambda _exc: None)  # abort the open one
            raise
        log.info("transactional id %r: producer %d epoch %d", txn_id, t.producer_id, t.epoch)
        self._answer_stored(msg, t, {"error_code": 0, "producer_id": t.producer_id, "producer_epoch": t.epoch})

    def add_partitions(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = (_name(body, "transactional_id"), field(body, "producer_id", int),
                              field(body, "producer_epoch", int))
        topics = body.get("topics")
        if not isinstance(topics, list):
            raise OdradekError("topics must be a list", ErrorCode.INVALID_REQUEST)
        wanted = []
        for t in topics:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("partitions"), list):
                raise OdradekError("each topic must be {name, partitions: [int]}", ErrorCode.INVALID_REQUEST)
            wanted += [(t["name"], p) for p in t["partitions"] if isinstance(p, int) and not isinstance(p, bool)]

        def answer(code: int) -> dict:
            return {"results": [{"name": t["name"], "results": [{"partition_index": p, "partition_error_code": code}
                                                                 for p in t["partitions"]]} for t in topics]}
        try:
            self.state.check_owner(txn_id)
        except OdradekError as exc:
            self.reply(msg, Response(answer(int(exc.code))))
            return
        t = self.state.txns.txns.get(txn_id)
        before = (t.state, set(t.partitions)) if t is not None else None
        try:
            t = self.state.txns.add_partitions(txn_id, pid, epoch, wanted, self.now_ms())
        except OdradekError as exc:
            log.info("AddPartitionsToTxn %r: %s", txn_id, exc.message)
            self.reply(msg, Response(answer(int(exc.code))))
            return
        if before == (t.state, t.partitions):
            self.reply(msg, Response(answer(0)))  # nothing new to store
            return
        added = t.partitions if before is None or before[0] != TxnState.ONGOING else t.partitions - before[1]
        self._answer_stored(msg, t, answer(0), lambda exc: self.reply(msg, Response(answer(int(exc.code)))),
                            self._added_words(t, added))

    def _added_words(self, t: Transaction, added) -> list:
        """``txn_added`` for the log actors of this broker leading ``added`` partitions, sent by
        the record's log actor once it is stored: a batch the producer sent before it had the
        answer (``txn_unverified``) waits there for this word (docs/TRANSACTIONS.md)."""
        per_host: dict[str, list] = {}
        for topic, partition in added:
            if topic == OFFSETS_TOPIC or not self.state.leads(topic, partition):
                continue
            per_host.setdefault(log_host(topic, partition, self.site.log_hosts), []).append(
                TxnAdded(topic, partition, t.producer_id, t.epoch))
        return [Chained(host, TxnPartsAdded.TYPE, TxnPartsAdded(parts), 0) for host, parts in per_host.items()]

    def add_offsets(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = (_name(body, "transactional_id"), field(body, "producer_id", int),
                              field(body, "producer_epoch", int))
        group = _name(body, "group_id")
        self.state.check_owner(txn_id)
        t = self.state.txns.add_group(txn_id, pid, epoch, group, (OFFSETS_TOPIC, 0), self.now_ms())
        self._answer_stored(msg, t, {"error_code": 0})

    def txn_offset_commit(self, msg: Message, body: dict) -> None:
        """The offsets are kept in the transaction's record (durable with it) and handed to
        the group coordinator when the transaction commits."""
        txn_id, pid, epoch = (_name(body, "transactional_id"), field(body, "producer_id", int),
                              field(body, "producer_epoch", int))
        group = _name(body, "group_id")
        try:
            self.state.check_owner(txn_id)
        except OdradekError as exc:
            if exc.code == ErrorCode.NOT_COORDINATOR and self.markers.forward_offsets(msg, txn_id, body):
                return
            raise
        topics = body.get("topics")
        if not isinstance(topics, list):
            raise OdradekError("topics must be a list", ErrorCode.INVALID_REQUEST)
        offsets, results = [], []
        for t in topics:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("partitions"), list):
                raise OdradekError("each topic must be {name, partitions: [...]}", ErrorCode.INVALID_REQUEST)
            out = []
            for p in t["partitions"]:
                index, offset = (p.get("partition_index"), p.get("committed_offset")) if isinstance(p, dict) else (None, None)
                if not isinstance(index, int) or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                    raise OdradekError(f"{t['name']}: each partition needs an integer partition_index and a "
                                       f"committed_offset >= 0", ErrorCode.INVALID_REQUEST)
                epoch_ = p.get("committed_leader_epoch", -1)
                meta = p.get("committed_metadata")
                offsets.append([t["name"], index, offset, epoch_ if isinstance(epoch_, int) else -1,
                                meta if isinstance(meta, str) else ""])
                out.append({"partition_index": index, "error_code": 0})
            results.append({"name": t["name"], "partitions": out})
        tx = self.state.txns.commit_offsets(txn_id, pid, epoch, group, offsets, self.now_ms())
        self._answer_stored(msg, tx, {"topics": results})

    def end_txn(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = (_name(body, "transactional_id"), field(body, "producer_id", int),
                              field(body, "producer_epoch", int))
        committed = body.get("committed")
        if not isinstance(committed, bool):
            raise OdradekError("committed must be true or false", ErrorCode.INVALID_REQUEST)
        self.state.check_owner(txn_id)
        expect = body.get("expect")
        if expect is not None and committed:
            checks = self.pipeline.checks_for(txn_id, pid, epoch, expect)
            if checks:
                self.pipeline.check_then_end(msg, txn_id, pid, epoch, checks)
                return
        self._end(msg, txn_id, pid, epoch, committed)

    def _end(self, msg: Message, txn_id: str, pid: int, epoch: int, committed: bool) -> None:
        t = self.state.txns.end_txn(txn_id, pid, epoch, committed, self.now_ms())
        if t.state in COMPLETE:
            self.reply(msg, Response({"error_code": 0}))
            return
        self.markers.wait_end(txn_id, msg)
        # The markers this broker's log actors write go with the PREPARE record: its log actor
        # sends them once it is stored (one hop less). Otherwise (markers for other brokers,
        # partitions without a leader now), they go once the record's answer came.
        chain: list = []

        def failed(exc: OdradekError) -> None:  # the PREPARE record is not stored: markers wait for a retry
            self.markers.forget_chained(chain)
            if chain:
                self.markers.in_flight.discard(txn_id)
            self.markers.fail_end(txn_id, exc.code, exc.message)
            self.pipeline.release(txn_id)
        if self.markers.write(t, chain, msg):
            self.state.persist(t, lambda: None, failed, chain=chain)
        else:
            self.state.persist(t, lambda: self.markers.write(t), failed)

    def write_txn_markers(self, msg: Message, body: dict) -> None:
        """WRITE_TXN_MARKERS from another broker's coordinator (its identity checked by the
        marker writer) or from an operator (broker_id -1: abort markers only)."""
        broker = field(body, "broker_id", int)
        markers, offsets = body.get("markers") or [], body.get("offsets") or {}
        if not isinstance(markers, list) or not isinstance(offsets, dict):
            raise OdradekError("markers must be a list and offsets a map", ErrorCode.INVALID_REQUEST)
        markers = [_marker(m) for m in markers]
        if broker == -1:  # an operator's abort of a hanging transaction (odradek transactions abort)
            if body.get("commit") or offsets or any(m.commit for m in markers):
                raise OdradekError("broker_id -1 (an operator, not a broker) may only write abort markers, "
                                   "without offsets", ErrorCode.INVALID_REQUEST)
            log.info("operator abort: markers %s", markers)
            self.markers.write_here(msg, markers, {}, False, body.get("producer_id"))
            return
        if not self.site.cluster_mode:
            raise OdradekError("WRITE_TXN_MARKERS is sent between the brokers of a cluster; this broker runs alone",
                               ErrorCode.STALE_BROKER_EPOCH)
        self.markers.receive(msg, broker, field(body, "broker_epoch", int), markers, offsets,
                             bool(body.get("commit")), body.get("producer_id"))

    # ---- the admin APIs (odradek transactions, kafka-transactions.sh) ---------------------
    def list_transactions(self, msg: Message, body: dict) -> None:
        """LIST_TRANSACTIONS: the transactional ids coordinated here (as Kafka, per broker: a
        client asks every broker), filtered by state, producer id and age."""
        states = body.get("state_filters") or []
        pids = body.get("producer_id_filters") or []
        duration = body.get("duration_filter", -1)
        if not isinstance(states, list) or not isinstance(pids, list) or not isinstance(duration, int):
            raise OdradekError("state_filters and producer_id_filters must be lists, duration_filter an integer",
                               ErrorCode.INVALID_REQUEST)
        known = {s.value for s in TxnState}
        unknown = [s for s in states if s not in known]
        wanted = {s for s in states if s in known}
        now = self.now_ms()
        out = [{"transactional_id": t.txn_id, "producer_id": t.producer_id, "transaction_state": t.state.value}
               for t in sorted(self.state.txns.txns.values(), key=lambda t: t.txn_id)
               if (not wanted or t.state.value in wanted) and (not pids or t.producer_id in pids)
               and (duration < 0 or (t.started_ms >= 0 and t.state not in COMPLETE and now - t.started_ms >= duration))]
        self.reply(msg, Response({"error_code": 0, "unknown_state_filters": unknown, "transaction_states": out}))

    def describe_transactions(self, msg: Message, body: dict) -> None:
        """DESCRIBE_TRANSACTIONS: each id's state, from its coordinator (NOT_COORDINATOR from
        another broker, TRANSACTIONAL_ID_NOT_FOUND for an id never seen)."""
        ids = body.get("transactional_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise OdradekError("transactional_ids must be a list of non-empty strings", ErrorCode.INVALID_REQUEST)
        out = []
        for txn_id in ids:
            entry = {"transactional_id": txn_id, "error_code": 0, "transaction_state": "", "transaction_timeout_ms": 0,
                     "transaction_start_time_ms": -1, "producer_id": -1, "producer_epoch": -1, "topics": []}
            try:
                self.state.check_owner(txn_id)
                t = self.state.txns.txns.get(txn_id)
                if t is None:
                    raise OdradekError(f"transactional id {txn_id!r} is not known", ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)
            except OdradekError as exc:
                out.append({**entry, "error_code": int(exc.code), "error_message": exc.message})
                continue
            topics: dict[str, list] = {}
            for topic, partition in sorted(t.partitions):
                topics.setdefault(topic, []).append(partition)
            out.append({**entry, "transaction_state": t.state.value, "transaction_timeout_ms": t.timeout_ms,
                        "transaction_start_time_ms": t.started_ms, "producer_id": t.producer_id,
                        "producer_epoch": t.epoch,
                        "topics": [{"topic": n, "partitions": ps} for n, ps in topics.items()]})
        self.reply(msg, Response({"transaction_states": out}))

    def describe_producers(self, msg: Message, body: dict) -> None:
        """DESCRIBE_PRODUCERS: the producer state of partitions led here, from their log
        actors (NOT_LEADER_OR_FOLLOWER for the others)."""
        topics = body.get("topics")
        if not isinstance(topics, list):
            raise OdradekError("topics must be a list of {name, partition_indexes}", ErrorCode.INVALID_REQUEST)
        per_host: dict[str, list] = {}
        asked = []
        for t in topics:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) \
                    or not isinstance(t.get("partition_indexes"), list) \
                    or not all(isinstance(p, int) and not isinstance(p, bool) for p in t["partition_indexes"]):
                raise OdradekError("each topic must be {name, partition_indexes: [int]}", ErrorCode.INVALID_REQUEST)
            for p in t["partition_indexes"]:
                asked.append((t["name"], p))
                per_host.setdefault(log_host(t['name'], p, self.site.log_hosts), []).append([t["name"], p])
        found: dict[tuple, list] = {}
        left = {"n": len(per_host)}

        def answer() -> None:
            by_topic: dict[str, list] = {}
            for name, p in asked:
                code, why, producers = found.get((name, p), (int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                                                             f"{name}-{p} is not hosted here", []))
                by_topic.setdefault(name, []).append({
                    "partition_index": p, "error_code": code, "error_message": why or None,
                    "active_producers": [{"producer_id": s.producer_id, "producer_epoch": s.producer_epoch,
                                          "last_sequence": s.last_sequence, "last_timestamp": s.last_timestamp,
                                          "coordinator_epoch": -1,
                                          "current_txn_start_offset": s.current_txn_start_offset}
                                         for s in producers]})
            self.reply(msg, Response({"topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()]}))

        def answered(reply: Message, sent: list) -> None:
            if reply.is_error:
                for name, p in sent:
                    found[(name, p)] = (reply.error_code, reply.error_message, [])
            else:
                for part in reply.fields.parts:
                    part = PartitionProducers._make(part)
                    found[(part.topic, part.partition)] = (part.code, part.message,
                                                           [ProducerState._make(row) for row in part.producers])
            left["n"] -= 1
            if not left["n"]:
                answer()

        if not per_host:
            answer()
        for host, sent in per_host.items():
            self.request(host, DescribeProducers(sent),
                         callback=lambda reply, sent=sent: answered(reply, sent), timeout=30.0)
