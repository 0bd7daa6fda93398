"""The transaction coordinator actor: producer ids (InitProducerId) and transactions.

Process: ``txn_coordinator`` (one per broker), started after the group coordinator and
before the request handlers.
Owns: the block of producer-id counters this broker is handing out (``log.producer_ids``:
single broker, a durable block file under the data directory; cluster mode, blocks claimed
in ZooKeeper's ``/latest_producer_id_block``, so no two brokers ever hand out the same id)
and the producer-id key the ids are tagged with (the log actors check the tag: a producer
id no coordinator handed out is refused); in single-broker mode, every transactional id's
``Transaction`` (``coordinator.transaction``, the pure state machine).

Accepts:
  txn_request {api, body}  forwarded by a request handler; answered straight to the
        client's processor:
        INIT_PRODUCER_ID {transactional_id, transaction_timeout_ms, producer_id, producer_epoch}
            -> {error_code, producer_id, producer_epoch}. Without a transactional id every
            call gets a new producer id at epoch 0 (a producer bumps its epoch itself,
            KIP-360). With one: the transactional id's producer id, its epoch bumped (an
            older instance is fenced: PRODUCER_FENCED); an open transaction is aborted first
            (CONCURRENT_TRANSACTIONS meanwhile: the client retries).
        ADD_PARTITIONS_TO_TXN (v0-3 shape: {transactional_id, producer_id, producer_epoch,
            topics: [{name, partitions}]}) -> {results: [{name, results: [{partition_index,
            partition_error_code}]}]}
        ADD_OFFSETS_TO_TXN {transactional_id, producer_id, producer_epoch, group_id}
        TXN_OFFSET_COMMIT {transactional_id, group_id, producer_id, producer_epoch, topics}: the
            offsets are kept in the transaction (and its durable record) until it ends
        END_TXN {transactional_id, producer_id, producer_epoch, committed} -> {error_code},
            answered once every partition's marker is written (so a committed transaction
            is readable by read_committed consumers when commit returns).
Sends: ``write_markers`` to the log actors hosting the transaction's partitions (single
broker: this broker leads every partition); ``txn_offsets_end`` to the group coordinator
for a transaction with offsets (AddOffsetsToTxn, TxnOffsetCommit): on commit they are
stored as the groups' committed offsets. Timer: every
``transaction.abort.timed.out.transaction.cleanup.interval.ms``, transactions open longer
than their ``transaction.timeout.ms`` are aborted and their producer fenced (epoch bumped).
In cluster mode transactional ids are refused with COORDINATOR_NOT_AVAILABLE (the state is
not replicated yet: docs/TRANSACTIONS.md). In cluster mode it keeps one ZooKeeper session,
opened on the first block of producer ids it needs.
"""
from __future__ import annotations

import logging
import time

from odradek.actors.message import Message
from odradek.actors.names import CONTROLLER, GROUP_COORDINATOR, PartitionBounds, log_host, partition_dir
from odradek.actors.runtime import Actor
from odradek.coordinator.transaction import COMPLETE, PREPARING, Transaction, TransactionManager, TxnState
from odradek.log.reader import LogReader
from odradek.log.records import decode_batch, encode_batch, iter_batches
from odradek.log import producer_ids
from odradek.network.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.txn")

OFFSETS_TOPIC = "__consumer_offsets"
STATE_TOPIC = "__transaction_state"  # one partition in single-broker mode (the coordinator's log)
WRITE_TIMEOUT = 30.0
READ_BYTES = 1 << 20
MARKER_TIMEOUT = 30.0  # seconds a log actor has to write markers before the coordinator retries
MARKER_RETRY = 0.5


def _now_ms() -> int:
    return int(time.time() * 1000)


def _str(body: dict, name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise OdradekError(f"{name} must be a non-empty string", ErrorCode.INVALID_REQUEST)
    return value


def _int(body: dict, name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise OdradekError(f"{name} must be an integer", ErrorCode.INVALID_REQUEST)
    return value


class TxnCoordinator(Actor):
    def on_start(self) -> None:
        config = self.args["config"]
        self.config = config
        self.data_dir = self.args["data_dir"]
        self.broker_id = int(self.args.get("broker_id", config["broker.id"]))
        self.cluster_mode = bool(config.get("zookeeper.connect"))
        self.zk = None
        self.block: tuple[int, int] | None = None  # (next counter, last counter) of the current block
        self.handed_out = 0
        self.key = producer_ids.load_key(config, self.data_dir)
        self.log_hosts = int(self.args.get("log_hosts", config.get("num.log.threads", 1)))
        self.txns = TransactionManager(self.next_producer_id, int(config.get("transaction.max.timeout.ms", 900000)))
        self.waiting_end: dict[str, list[Message]] = {}  # EndTxn requests answered when markers land
        self.markers_in_flight: set[str] = set()
        self.aborted_by_timeout = 0
        self.state_topic = False  # __transaction_state exists (created on the first transactional id)
        if not self.cluster_mode:
            self._load_state()
        interval = int(config.get("transaction.abort.timed.out.transaction.cleanup.interval.ms", 10000)) / 1000
        self.call_every(interval, self._expire)

    # ---- durable state: __transaction_state ------------------------------------------------
    def _state_host(self) -> str:
        return log_host(STATE_TOPIC, 0, self.log_hosts)

    def _load_state(self) -> None:
        """At start (blocking, before ready): replay ``__transaction_state`` if it exists;
        transactions found preparing get their markers written again."""
        snapshot = self.call(CONTROLLER, "get_metadata", timeout=30.0).fields
        if STATE_TOPIC not in (snapshot.get("topics") or {}):
            return
        self.state_topic = True
        bounds = None
        deadline = time.monotonic() + 60
        while bounds is None and time.monotonic() < deadline:
            for part in self.call(self._state_host(), "get_bounds", timeout=60.0).get("parts") or ():
                part = PartitionBounds(*part)
                if (part.topic, part.partition) == (STATE_TOPIC, 0) and part.leader:
                    bounds = part.bounds
            if bounds is None:
                time.sleep(0.1)
        if bounds is None:
            raise OdradekError(f"{STATE_TOPIC}-0 is not open on {self._state_host()}", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        loaded = 0
        if bounds.log_start_offset < bounds.log_end_offset:
            reader = LogReader(partition_dir(self.data_dir, STATE_TOPIC, 0), bounds)
            try:
                offset = bounds.log_start_offset
                while offset < bounds.log_end_offset:
                    result = reader.read(offset, READ_BYTES, upper_bound=bounds.log_end_offset)
                    if not result.slices:
                        break
                    data = result.read_bytes()
                    for pos, h in iter_batches(data):
                        for r in decode_batch(memoryview(data)[pos:pos + h.size]):
                            if r.offset >= offset and r.key is not None and r.value is not None:
                                try:
                                    self.txns.load(Transaction.from_record(r.key, r.value))
                                    loaded += 1
                                except ValueError as exc:
                                    log.warning("%s: record at %d skipped: %s", STATE_TOPIC, r.offset, exc)
                        offset = max(offset, h.next_offset)
            finally:
                reader.close()
        log.info("loaded %d transactional ids from %d records of %s", len(self.txns.txns), loaded, STATE_TOPIC)
        for t in self.txns.txns.values():
            if t.state in PREPARING:
                self.call_later(0, lambda t=t: self._write_markers(t))

    def _persist(self, t: Transaction, then, fail, attempt: int = 0) -> None:
        """Write ``t``'s record (acks=all), then ``then()``; ``fail(OdradekError)`` if it
        could not be stored (the client retries: COORDINATOR_NOT_AVAILABLE)."""
        if not self.state_topic:
            self._create_state_topic(lambda: self._persist(t, then, fail, attempt), fail)
            return
        key, value = t.to_record()

        def answered(reply: Message) -> None:
            code, why = (reply.error_code, reply.error_message) if reply.is_error else (0, "")
            if not reply.is_error:
                try:
                    part = reply.fields["body"]["topics"][0]["partitions"][0]
                    code, why = part.get("error_code") or 0, part.get("error_message") or ""
                except (KeyError, IndexError, TypeError):
                    code, why = int(ErrorCode.UNKNOWN_SERVER_ERROR), "malformed answer from the log actor"
            if code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER) and attempt < 50:
                self.call_later(0.1, lambda: self._persist(t, then, fail, attempt + 1))  # a partition being opened
                return
            if code:
                log.warning("%s: writing %r failed: %s", STATE_TOPIC, t.txn_id, why)
                fail(OdradekError(f"the transaction state could not be stored ({why}); retry",
                                  ErrorCode.COORDINATOR_NOT_AVAILABLE))
            else:
                then()

        self.request(self._state_host(), "produce",
                     {"acks": -1, "timeout_ms": int(WRITE_TIMEOUT * 1000), "parts": [[STATE_TOPIC, 0, 0]]},
                     [encode_batch([(key, value)])], callback=answered, timeout=WRITE_TIMEOUT)

    def _create_state_topic(self, then, fail) -> None:
        def created(reply: Message) -> None:
            result = {} if reply.is_error else reply.fields["body"]["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            if code not in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                why = reply.error_message if reply.is_error else result.get("error_message")
                fail(OdradekError(f"cannot create {STATE_TOPIC} ({why}); retry", ErrorCode.COORDINATOR_NOT_AVAILABLE))
                return
            log.info("created %s", STATE_TOPIC)
            self.state_topic = True
            self.call_later(0.2, then)  # the log actor opens the partition meanwhile (a write before gets retried)

        self.request(CONTROLLER, "create_topics", {"body": {"topics": [{
            "name": STATE_TOPIC, "num_partitions": 1, "replication_factor": 1,
            "configs": {"cleanup.policy": "compact"}}]}}, callback=created, timeout=60.0)

    def on_stop(self) -> None:
        if self.zk is not None:
            try:
                self.zk.stop()
                self.zk.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass

    def stats(self) -> dict:
        states: dict[str, int] = {}
        for t in self.txns.txns.values():
            states[t.state.value] = states.get(t.state.value, 0) + 1
        return {"producer_ids_handed_out": self.handed_out, "transactions": states,
                "transactions_aborted_by_timeout": self.aborted_by_timeout}

    def on_txn_request(self, msg: Message) -> None:
        api, body = msg.get("api"), msg.get("body")
        try:
            if not isinstance(body, dict):
                raise OdradekError("the request body must be a map", ErrorCode.INVALID_REQUEST)
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
            else:
                raise OdradekError(f"API {api!r} is not served by the transaction coordinator",
                                   ErrorCode.INVALID_REQUEST)
        except OdradekError as exc:
            self.reply_error(msg, exc.code, exc.message)

    def _answer_stored(self, msg: Message, t: Transaction, body: dict) -> None:
        """Answer ``msg`` with ``body`` once ``t``'s record is stored."""
        self._persist(t, lambda: self.reply(msg, {"body": body}),
                      lambda exc: self.reply_error(msg, exc.code, exc.message))

    def init_producer_id(self, msg: Message, body: dict) -> None:
        txn_id = body.get("transactional_id")
        if txn_id is not None and not isinstance(txn_id, str):
            raise OdradekError("transactional_id must be a string or null", ErrorCode.INVALID_REQUEST)
        if not txn_id:
            self.reply(msg, {"body": {"error_code": 0, "producer_id": self.next_producer_id(), "producer_epoch": 0}})
            return
        self._check_single_broker()
        timeout = body.get("transaction_timeout_ms", 60000)
        t = self.txns.txns.get(txn_id)
        try:
            expected_pid, expected_epoch = body.get("producer_id", -1), body.get("producer_epoch", -1)
            t = self.txns.init_producer_id(txn_id, timeout, _now_ms(),
                                           expected_pid if isinstance(expected_pid, int) else -1,
                                           expected_epoch if isinstance(expected_epoch, int) else -1)
        except OdradekError as exc:
            if exc.code == ErrorCode.CONCURRENT_TRANSACTIONS and t is not None and t.state in PREPARING:
                self._persist(t, lambda: self._write_markers(t), lambda _exc: None)  # abort the open one
            raise
        log.info("transactional id %r: producer %d epoch %d", txn_id, t.producer_id, t.epoch)
        self._answer_stored(msg, t, {"error_code": 0, "producer_id": t.producer_id, "producer_epoch": t.epoch})

    def _check_single_broker(self) -> None:
        if self.cluster_mode:
            raise OdradekError("transactions are not supported in cluster mode yet (docs/TRANSACTIONS.md); use an "
                               "idempotent producer without a transactional id", ErrorCode.COORDINATOR_NOT_AVAILABLE)

    def add_partitions(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
        self._check_single_broker()
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
        t = self.txns.txns.get(txn_id)
        before = (t.state, set(t.partitions)) if t is not None else None
        try:
            t = self.txns.add_partitions(txn_id, pid, epoch, wanted, _now_ms())
        except OdradekError as exc:
            log.info("AddPartitionsToTxn %r: %s", txn_id, exc.message)
            self.reply(msg, {"body": answer(int(exc.code))})
            return
        if before == (t.state, t.partitions):
            self.reply(msg, {"body": answer(0)})  # nothing new to store
            return
        self._persist(t, lambda: self.reply(msg, {"body": answer(0)}),
                      lambda exc: self.reply(msg, {"body": answer(int(exc.code))}))

    def add_offsets(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
        group = _str(body, "group_id")
        self._check_single_broker()
        t = self.txns.add_group(txn_id, pid, epoch, group, (OFFSETS_TOPIC, 0), _now_ms())
        self._answer_stored(msg, t, {"error_code": 0})

    def txn_offset_commit(self, msg: Message, body: dict) -> None:
        """The offsets are kept in the transaction's record (durable with it) and handed to
        the group coordinator when the transaction commits."""
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
        group = _str(body, "group_id")
        self._check_single_broker()
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
        tx = self.txns.commit_offsets(txn_id, pid, epoch, group, offsets, _now_ms())
        self._answer_stored(msg, tx, {"topics": results})

    def end_txn(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
        committed = body.get("committed")
        if not isinstance(committed, bool):
            raise OdradekError("committed must be true or false", ErrorCode.INVALID_REQUEST)
        self._check_single_broker()
        t = self.txns.end_txn(txn_id, pid, epoch, committed, _now_ms())
        if t.state in COMPLETE:
            self.reply(msg, {"body": {"error_code": 0}})
            return
        self.waiting_end.setdefault(txn_id, []).append(msg)

        def failed(exc: OdradekError) -> None:  # the PREPARE record is not stored: markers wait for a retry
            for waiting in self.waiting_end.pop(txn_id, ()):
                self.reply_error(waiting, exc.code, exc.message)
        self._persist(t, lambda: self._write_markers(t), failed)

    # ---- markers -------------------------------------------------------------------------
    def _write_markers(self, t) -> None:
        """Send the pending markers of ``t`` to the log actors hosting its partitions; when all
        landed the transaction completes and waiting EndTxn requests are answered."""
        if t.txn_id in self.markers_in_flight:
            return
        commit = t.state == TxnState.PREPARE_COMMIT
        per_host: dict[str, list] = {}
        groups = sorted(t.groups)
        for topic, partition in sorted(t.pending_markers):
            if topic == OFFSETS_TOPIC:  # the group coordinator stores (or, on abort, never sees) the offsets
                per_host[GROUP_COORDINATOR] = {g: t.offsets.get(g, []) for g in groups} if commit else {}
                continue
            per_host.setdefault(log_host(topic, partition, self.log_hosts), []).append(
                [topic, partition, t.producer_id, t.epoch, commit, 0])
        if not per_host:
            self._markers_done(t.txn_id, list(t.pending_markers))
            return
        self.markers_in_flight.add(t.txn_id)
        left = {"hosts": len(per_host), "written": [], "failed": False}

        def answered(reply: Message) -> None:
            if reply.is_error:
                left["failed"] = True
                log.warning("transaction %r: markers not written: %s", t.txn_id, reply.get("message"))
            else:
                parts = reply.get("parts")
                if parts is None:  # the group coordinator's answer
                    parts = [[OFFSETS_TOPIC, 0, reply.get("error_code") or 0, reply.get("message") or ""]]
                for topic, partition, code, message in parts:
                    if code == 0 or code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                        left["written"].append((topic, partition))
                    else:
                        left["failed"] = True
                        log.warning("transaction %r: marker on %s-%s failed: %s", t.txn_id, topic, partition, message)
            left["hosts"] -= 1
            if left["hosts"] == 0:
                self.markers_in_flight.discard(t.txn_id)
                self._markers_done(t.txn_id, left["written"])
                if left["failed"]:
                    self.call_later(MARKER_RETRY, lambda: self._write_markers(self.txns.txns[t.txn_id]))

        for host, markers in per_host.items():
            if host == GROUP_COORDINATOR:
                self.request(host, "txn_offsets_end", {"producer_id": t.producer_id, "offsets": markers,
                                                       "commit": commit}, callback=answered, timeout=MARKER_TIMEOUT)
            else:
                self.request(host, "write_markers", {"markers": markers}, callback=answered, timeout=MARKER_TIMEOUT)

    def _markers_done(self, txn_id: str, written) -> None:
        t = self.txns.markers_written(txn_id, written, _now_ms())
        if t.state in COMPLETE:
            log.info("transaction %r %s", txn_id, t.state.value)

            for msg in self.waiting_end.pop(txn_id, ()):
                self.reply(msg, {"body": {"error_code": 0}})
            # the COMPLETE record, not waited for: the markers are what makes the outcome
            # durable; if this record is lost, a restart finds PREPARE and writes them again
            self._persist(t, lambda: None, lambda _exc: None)

    def _expire(self) -> None:
        for t in self.txns.expire(_now_ms()):
            self.aborted_by_timeout += 1
            log.info("transaction %r open past its timeout (%d ms): aborted, producer %d fenced", t.txn_id,
                     t.timeout_ms, t.producer_id)
            self._persist(t, lambda t=t: self._write_markers(t), lambda _exc: None)

    def next_producer_id(self) -> int:
        if self.block is None or self.block[0] > self.block[1]:
            self.block = self._claim_block()
        counter = self.block[0]
        self.block = (counter + 1, self.block[1])
        self.handed_out += 1
        return producer_ids.make_producer_id(counter, self.key)

    def _claim_block(self) -> tuple[int, int]:
        try:
            if self.cluster_mode:
                if self.zk is None:
                    self.zk = producer_ids.zk_client(self.config)
                start, end = producer_ids.ZkBlockAllocator(self.zk, self.broker_id).next_block()
            else:
                start, end = producer_ids.FileBlockAllocator(self.data_dir).next_block()
        except OverflowError as exc:
            raise OdradekError(str(exc), ErrorCode.UNKNOWN_SERVER_ERROR) from None
        except Exception as exc:  # noqa: BLE001 - disk or ZooKeeper: retriable for the client
            log.warning("could not claim a block of producer ids: %s", exc)
            if self.zk is not None:
                try:
                    self.zk.stop()
                    self.zk.close()
                except Exception:  # noqa: BLE001
                    pass
                self.zk = None
            raise OdradekError(f"could not claim a block of producer ids ({exc}); retry",
                               ErrorCode.COORDINATOR_NOT_AVAILABLE) from None
        log.info("producer id block %d..%d claimed", start, end)
        return start, end
