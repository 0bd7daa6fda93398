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
        END_TXN {transactional_id, producer_id, producer_epoch, committed} -> {error_code},
            answered once every partition's marker is written (so a committed transaction
            is readable by read_committed consumers when commit returns).
Sends: ``write_markers`` to the log actors hosting the transaction's partitions (single
broker: this broker leads every partition). Timer: every
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
from odradek.actors.runtime import Actor
from odradek.coordinator.topics import placement
from odradek.coordinator.transaction import COMPLETE, TransactionManager, TxnState
from odradek.log import producer_ids
from odradek.network.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.txn")

OFFSETS_TOPIC = "__consumer_offsets"
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
        interval = int(config.get("transaction.abort.timed.out.transaction.cleanup.interval.ms", 10000)) / 1000
        self.call_every(interval, self._expire)

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
                self.reply(msg, {"body": self.init_producer_id(body)})
            elif api == ApiKey.ADD_PARTITIONS_TO_TXN:
                self.reply(msg, {"body": self.add_partitions(body)})
            elif api == ApiKey.ADD_OFFSETS_TO_TXN:
                self.reply(msg, {"body": self.add_offsets(body)})
            elif api == ApiKey.END_TXN:
                self.end_txn(msg, body)
            else:
                raise OdradekError(f"API {api!r} is not served by the transaction coordinator",
                                   ErrorCode.INVALID_REQUEST)
        except OdradekError as exc:
            self.reply_error(msg, exc.code, exc.message)

    def init_producer_id(self, body: dict) -> dict:
        txn_id = body.get("transactional_id")
        if txn_id is not None and not isinstance(txn_id, str):
            raise OdradekError("transactional_id must be a string or null", ErrorCode.INVALID_REQUEST)
        if not txn_id:
            return {"error_code": 0, "producer_id": self.next_producer_id(), "producer_epoch": 0}
        self._check_single_broker()
        timeout = body.get("transaction_timeout_ms", 60000)
        t = self.txns.txns.get(txn_id)
        try:
            expected_pid, expected_epoch = body.get("producer_id", -1), body.get("producer_epoch", -1)
            t = self.txns.init_producer_id(txn_id, timeout, _now_ms(),
                                           expected_pid if isinstance(expected_pid, int) else -1,
                                           expected_epoch if isinstance(expected_epoch, int) else -1)
        except OdradekError as exc:
            if exc.code == ErrorCode.CONCURRENT_TRANSACTIONS and t is not None:
                self._write_markers(t)  # the aborted transaction's markers (no-op if already on the way)
            raise
        log.info("transactional id %r: producer %d epoch %d", txn_id, t.producer_id, t.epoch)
        return {"error_code": 0, "producer_id": t.producer_id, "producer_epoch": t.epoch}

    def _check_single_broker(self) -> None:
        if self.cluster_mode:
            raise OdradekError("transactions are not supported in cluster mode yet (docs/TRANSACTIONS.md); use an "
                               "idempotent producer without a transactional id", ErrorCode.COORDINATOR_NOT_AVAILABLE)

    def add_partitions(self, body: dict) -> dict:
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
        code = 0
        try:
            self.txns.add_partitions(txn_id, pid, epoch, wanted, _now_ms())
        except OdradekError as exc:
            code = int(exc.code)
            log.info("AddPartitionsToTxn %r: %s", txn_id, exc.message)
        return {"results": [{"name": t["name"], "results": [{"partition_index": p, "partition_error_code": code}
                                                             for p in t["partitions"]]} for t in topics]}

    def add_offsets(self, body: dict) -> dict:
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
        group = _str(body, "group_id")
        self._check_single_broker()
        self.txns.add_group(txn_id, pid, epoch, group, (OFFSETS_TOPIC, 0), _now_ms())
        return {"error_code": 0}

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
        self._write_markers(t)

    # ---- markers -------------------------------------------------------------------------
    def _write_markers(self, t) -> None:
        """Send the pending markers of ``t`` to the log actors hosting its partitions; when all
        landed the transaction completes and waiting EndTxn requests are answered."""
        if t.txn_id in self.markers_in_flight:
            return
        commit = t.state == TxnState.PREPARE_COMMIT
        per_host: dict[str, list] = {}
        for topic, partition in sorted(t.pending_markers):
            if topic == OFFSETS_TOPIC:  # offsets are not stored through markers yet
                continue
            per_host.setdefault(f"log-{placement(topic, partition, self.log_hosts)}", []).append(
                [topic, partition, t.producer_id, t.epoch, commit, 0])
        if not per_host:
            self._markers_done(t.txn_id, list(t.pending_markers))
            return
        self.markers_in_flight.add(t.txn_id)
        left = {"hosts": len(per_host), "written": [(tp, p) for tp, p in t.pending_markers if tp == OFFSETS_TOPIC],
                "failed": False}

        def answered(reply: Message) -> None:
            if reply.is_error:
                left["failed"] = True
                log.warning("transaction %r: markers not written: %s", t.txn_id, reply.get("message"))
            else:
                for topic, partition, code, message in reply.get("parts") or ():
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
            self.request(host, "write_markers", {"markers": markers}, callback=answered, timeout=MARKER_TIMEOUT)

    def _markers_done(self, txn_id: str, written) -> None:
        t = self.txns.markers_written(txn_id, written, _now_ms())
        if t.state in COMPLETE:
            log.info("transaction %r %s", txn_id, t.state.value)
            for msg in self.waiting_end.pop(txn_id, ()):
                self.reply(msg, {"body": {"error_code": 0}})

    def _expire(self) -> None:
        for t in self.txns.expire(_now_ms()):
            self.aborted_by_timeout += 1
            log.info("transaction %r open past its timeout (%d ms): aborted, producer %d fenced", t.txn_id,
                     t.timeout_ms, t.producer_id)
            self._write_markers(t)

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
