"""The transaction coordinator actor: producer ids (InitProducerId) and transactions.

Process: ``txn_coordinator`` (one per broker), started after the group coordinator and
before the request handlers.
Owns: the block of producer-id counters this broker is handing out (``log.producer_ids``:
single broker, a durable block file under the data directory; cluster mode, blocks claimed
in ZooKeeper's ``/latest_producer_id_block``, so no two brokers ever hand out the same id)
and the producer-id key the ids are tagged with (the log actors check the tag: a producer
id no coordinator handed out is refused); the ``Transaction`` of every transactional id it
coordinates (``coordinator.transaction``, the pure state machine).

Which transactional ids (as Kafka): the coordinator of id T is the leader of
``__transaction_state`` partition ``partition_for(T)`` (one partition on a single broker,
``transaction.state.log.num.partitions`` in a cluster, replicated
``transaction.state.log.replication.factor`` times). Leadership follows the metadata
snapshot (polled from the controller every ``METADATA_REFRESH``): a partition gained is
loaded (``get_bounds`` from its log actor, then its files replayed read-only up to the log
end; requests for its ids meanwhile: COORDINATOR_LOAD_IN_PROGRESS), a partition lost is
dropped (its ids' waiting EndTxn answered NOT_COORDINATOR); ids of a partition led elsewhere:
NOT_COORDINATOR. A loaded transaction found PREPARE_COMMIT/ABORT gets its markers written
again; one found ONGOING is aborted when its timeout passes (or when its producer
restarts). FindCoordinator key_type 1 is answered by the group coordinator from the same
snapshot; it asks this actor to create the topic (``create_state_topic``).

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
        WRITE_TXN_MARKERS {broker_id, broker_epoch, markers: [[topic, partition, producer_id,
            producer_epoch, commit, coordinator_epoch]], producer_id, commit, offsets: {group:
            [[topic, partition, offset, leader_epoch, metadata]]}} -> {error_code, parts:
            [[topic, partition, error_code, message]], groups: [[group, error_code, message]]}:
            another broker's coordinator writing markers to partitions led here (and a
            committed transaction's offsets to groups coordinated here). Cluster mode only;
            the request is authorized as ClusterAction by the handler, and ``broker_epoch``
            must be the live ZooKeeper registration of ``broker_id`` (as a follower's fetch,
            log/fetch_actor.py), else STALE_BROKER_EPOCH: the identity is checked, not
            believed.
        LIST_TRANSACTIONS {state_filters, producer_id_filters, duration_filter} -> {error_code,
            unknown_state_filters, transaction_states: [{transactional_id, producer_id,
            transaction_state}]}: the ids coordinated here (a client asks every broker);
        DESCRIBE_TRANSACTIONS {transactional_ids} -> {transaction_states: [{error_code,
            transactional_id, transaction_state, transaction_timeout_ms,
            transaction_start_time_ms, producer_id, producer_epoch, topics: [{topic,
            partitions}]}]} (NOT_COORDINATOR, TRANSACTIONAL_ID_NOT_FOUND per id);
        DESCRIBE_PRODUCERS {topics: [{name, partition_indexes}]} -> Kafka's shape, from the
            log actors (``describe_producers``) of the partitions led here;
        WRITE_TXN_MARKERS with ``broker_id`` -1: an operator's abort (``odradek transactions
            abort``), abort markers only, no identity to check beyond the handler's
            ClusterAction.
  create_state_topic {}  (one-way, from the group coordinator's FindCoordinator)
Sends: ``write_markers`` to the log actors hosting the transaction's partitions led here,
WRITE_TXN_MARKERS (TCP, one worker thread and connection per broker, ``MarkerPeer``) to the
leaders of the others, retried every ``MARKER_RETRY`` until each leader accepted;
``txn_offsets_end`` to the group coordinator (here or, through WRITE_TXN_MARKERS, on the
broker leading the group's ``__consumer_offsets`` partition) for a committed transaction
with offsets (AddOffsetsToTxn, TxnOffsetCommit); ``produce`` (acks=all) of the transaction
records, ``get_bounds`` to log actors; ``get_metadata``, ``create_topics`` and
``get_broker_epochs`` to the controller. Timer: every
``transaction.abort.timed.out.transaction.cleanup.interval.ms``, transactions open longer
than their ``transaction.timeout.ms`` are aborted and their producer fenced (epoch bumped).
In cluster mode it keeps one ZooKeeper session, opened on the first block of producer ids it
needs.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from odradek.actors.message import REPLY, Message
from odradek.actors.names import CONTROLLER, GROUP_COORDINATOR, LogBounds, PartitionBounds, chain_sent, log_host
from odradek.actors.runtime import Actor
from odradek.coordinator.internal_replay import InternalReplay
from odradek.coordinator.offsets import offsets_leaders, partition_for
from odradek.coordinator.transaction import COMPLETE, PREPARING, Transaction, TransactionManager, TxnState
from odradek.log.records import encode_batch
from odradek.log import producer_ids
from odradek.network.client import BrokerConnection
from odradek.network.clientauth import ClientSecurity
from odradek.network.protocol import OFFSETS_TOPIC, TXN_STATE_TOPIC, ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.txn")

WRITE_TIMEOUT = 30.0
MARKER_TIMEOUT = 30.0  # seconds a log actor (or another broker) has to write markers before the coordinator retries
MARKER_RETRY = 0.5
# seconds a finished transaction's COMPLETE record waits for its id's next record (the next
# transaction's first AddPartitionsToTxn), which replaces it: one write per transaction saved
# for a producer committing often. Safe to lose: a coordinator that loads PREPARE_COMMIT/ABORT
# writes the markers again and then COMPLETE, as after a crash between the two records.
COMPLETE_DEFER = 1.0
# markers are answered once replicated to the ISR (as Kafka appends them with acks=all), before
# the coordinator's own request timeout
PARKED_APIS = (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN)  # see TxnCoordinator.parked
# ... and, while an EndTxn's records are being checked (``TxnCoordinator.checking``), every
# request that could change the transaction
CHECK_PARKED_APIS = PARKED_APIS + (ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.INIT_PRODUCER_ID)
# milliseconds a log actor waits for the batches an EndTxn with ``expect`` names (they were
# sent just before it, on another connection) before the coordinator answers "not yet"
TXN_CHECK_WAIT_MS = 2000
MARKERS_ACKS_ALL = {"acks": -1, "timeout_ms": int((MARKER_TIMEOUT - 5) * 1000)}
METADATA_REFRESH = 1.0  # seconds between metadata polls in cluster mode (leadership of __transaction_state)
LOAD_RETRY = 0.1  # seconds between get_bounds attempts while the log actor does not lead the partition yet
CONNECT_TIMEOUT_MS = 1000
STOP_JOIN_TIMEOUT = 3.0


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


def topic_leaders(snapshot: dict, topic: str) -> dict[int, int]:
    """``{partition: leader}`` of ``topic`` in a metadata snapshot (-1: no leader)."""
    meta = (snapshot.get("topics") or {}).get(topic)
    if not isinstance(meta, dict):
        return {}
    state = meta.get("state") or []
    out = {}
    for p in range(meta.get("partitions") or 0):
        s = state[p] if p < len(state) and isinstance(state[p], dict) else {}
        out[p] = s.get("leader") if isinstance(s.get("leader"), int) else -1
    return out


class MarkerPeer:
    """One other broker: a worker thread with its own blocking ``BrokerConnection`` sends
    WRITE_TXN_MARKERS (and forwarded TXN_OFFSET_COMMITs) one at a time and posts each
    outcome, ``done(body, error)``, to the actor's loop (threads never touch the actor's
    sockets)."""

    def __init__(self, broker: int, host: str, port: int, client_id: str, post: Callable, security=None):
        """``security``: the inter-broker listener's TLS/SASL (``ClientSecurity.inter_broker``),
        None for PLAINTEXT: ``host:port`` is the other broker's inter-broker listener."""
        self.broker, self.address = broker, (host, int(port))
        self._post = post
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.conn = BrokerConnection(host, int(port), client_id=client_id, connect_timeout_ms=CONNECT_TIMEOUT_MS,
                                     reconnect_backoff_ms=50, reconnect_backoff_max_ms=500, security=security)
        self.thread = threading.Thread(target=self._run, name=f"txn-markers-{broker}", daemon=True)
        self.thread.start()

    def submit(self, body: dict, timeout: float, done: Callable, api: int = ApiKey.WRITE_TXN_MARKERS) -> None:
        self._jobs.put((api, body, timeout, done))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            api, body, timeout, done = job
            try:
                outcome = (self.conn.request(api, body, timeout=timeout).body, None)
            except OdradekError as exc:
                outcome = (None, exc)
            except Exception as exc:  # noqa: BLE001 - a socket oddity: report it, keep the thread
                outcome = (None, OdradekError(f"{type(exc).__name__}: {exc}", ErrorCode.NETWORK_EXCEPTION))
            self._post(lambda done=done, outcome=outcome: done(*outcome))

    def close(self) -> None:
        self._jobs.put(None)
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass


class TxnCoordinator(Actor):
    def on_start(self) -> None:
        config = self.args["config"]
        self.config = config
        self.data_dir = self.args["data_dir"]
        self.broker_id = int(self.args.get("broker_id", config["broker.id"]))
        self.cluster_mode = bool(config.get("zookeeper.connect"))
        self.peer_security = ClientSecurity.inter_broker(config, self.broker_id, self.data_dir) \
            if self.cluster_mode else None
        self.zk = None
        self.block: tuple[int, int] | None = None  # (next counter, last counter) of the current block
        self.handed_out = 0
        self.key = producer_ids.load_key(config, self.data_dir)
        self.log_hosts = int(self.args.get("log_hosts", config.get("num.log.threads", 1)))
        self.txns = TransactionManager(self.next_producer_id, int(config.get("transaction.max.timeout.ms", 900000)))
        self.waiting_end: dict[str, list[Message]] = {}  # EndTxn requests answered when markers land
        self.markers_in_flight: set[str] = set()
        # AddPartitionsToTxn / AddOffsetsToTxn for an id whose markers are in flight, handled
        # once they land (``_release_parked``): the EndTxn answer may reach the client before
        # the markers' answer reaches us (it is chained to the markers), and its next
        # transaction must not be refused CONCURRENT_TRANSACTIONS for that.
        self.parked: dict[str, list[Message]] = {}
        # EndTxn requests with ``expect`` whose records the partitions' log actors are checking
        # (txn id -> [the request, answers still due, first problem]); the id's other requests
        # are parked meanwhile
        self.checking: dict[str, list] = {}
        self.complete_due: dict[str, tuple] = {}  # txn id -> (Transaction, Timer): its COMPLETE record, deferred
        self.aborted_by_timeout = 0
        self.snapshot: dict = {"topics": {}}
        self.snapshot_ms = 0  # wall-clock ms when it was adopted
        self.metadata_version = -1
        self.partitions = 0  # of __transaction_state; 0: not created yet (on the first transactional id)
        self.owned: dict[int, int] = {}  # partition -> leader epoch, loaded: its transactional ids are ours
        self.loading: dict[int, int] = {}  # partition -> leader epoch, being loaded
        self.creating = False
        self.peers: dict[int, MarkerPeer] = {}  # other brokers, for WRITE_TXN_MARKERS
        self.broker_epochs: dict[int, int] = {}  # live broker id -> czxid of its registration (cluster mode)
        self.markers_sent_remote = 0
        self.markers_received_remote = 0
        self._adopt(self.call(CONTROLLER, "get_metadata", timeout=30.0).fields, starting=True)
        interval = int(config.get("transaction.abort.timed.out.transaction.cleanup.interval.ms", 10000)) / 1000
        self.call_every(interval, self._abort_timed_out)
        if self.cluster_mode:
            self.call_every(METADATA_REFRESH, self._refresh_metadata)

    # ---- which transactional ids are ours: the leadership of __transaction_state -----------
    def _refresh_metadata(self) -> None:
        self.request(CONTROLLER, "get_metadata",
                     callback=lambda reply: None if reply.is_error else self._adopt(reply.fields), timeout=10.0)

    def _adopt(self, snapshot: dict, starting: bool = False) -> None:
        version = snapshot.get("version", -1)
        if not isinstance(version, int) or version < self.metadata_version:
            return
        self.metadata_version, self.snapshot, self.snapshot_ms = version, snapshot, _now_ms()
        leaders = offsets_leaders(snapshot, self.broker_id, TXN_STATE_TOPIC)
        led = {p: epoch for p, (leader, epoch) in enumerate(leaders) if leader == self.broker_id}
        self.partitions = len(leaders)
        for p in list(self.owned) + list(self.loading):
            if p not in led:
                self._unload(p)
        for p, epoch in sorted(led.items()):
            if p in self.owned:
                self.owned[p] = epoch  # still led: a newer leader epoch alone (an ISR change) needs no reload
            elif p in self.loading:
                self.loading[p] = epoch
            else:
                self._load(p, epoch, blocking=starting and not self.cluster_mode)

    def _partition_of(self, txn_id: str) -> int:
        return partition_for(txn_id, self.partitions) if self.partitions else 0

    def _state_host(self, partition: int) -> str:
        return log_host(TXN_STATE_TOPIC, partition, self.log_hosts)

    def _check_owner(self, txn_id: str) -> None:
        """Raise unless ``txn_id``'s transactions are coordinated (and loaded) here."""
        if not self.partitions:
            if not self.cluster_mode:
                return  # single broker: created with the first transaction record
            self.on_create_state_topic(None)
            raise OdradekError(f"{TXN_STATE_TOPIC} is being created; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        p = self._partition_of(txn_id)
        if p in self.owned:
            return
        if p in self.loading:
            raise OdradekError(f"{TXN_STATE_TOPIC}-{p} (transactional id {txn_id!r}) is being loaded; retry",
                               ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        leader = topic_leaders(self.snapshot, TXN_STATE_TOPIC).get(p, -1)
        raise OdradekError(f"transactional id {txn_id!r} is coordinated by the leader of {TXN_STATE_TOPIC}-{p} "
                           f"({'none now' if leader < 0 else f'broker {leader}'}), not broker {self.broker_id}: "
                           f"FindCoordinator (key_type 1) and retry", ErrorCode.NOT_COORDINATOR)

    def _load(self, partition: int, epoch: int, blocking: bool) -> None:
        """Replay ``__transaction_state-<partition>`` (newly led): blocking at start on a
        single broker (state before ready), else a ``get_bounds`` request retried until the
        log actor leads the partition."""
        self.loading[partition] = epoch
        if blocking:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                bounds = self._bounds_in(self.call(self._state_host(partition), "get_bounds", timeout=60.0), partition)
                if bounds is not None:
                    self._install(partition, bounds)
                    return
                time.sleep(LOAD_RETRY)
            raise OdradekError(f"{TXN_STATE_TOPIC}-{partition} is not open on {self._state_host(partition)}",
                               ErrorCode.COORDINATOR_NOT_AVAILABLE)

        def answered(reply: Message) -> None:
            if self.loading.get(partition) is None:
                return  # unloaded meanwhile
            bounds = None if reply.is_error else self._bounds_in(reply, partition)
            if bounds is None:
                self.call_later(LOAD_RETRY, lambda: self._retry_load(partition))
            else:
                self._install(partition, bounds)
        self.request(self._state_host(partition), "get_bounds", callback=answered, timeout=30.0)

    def _retry_load(self, partition: int) -> None:
        if partition in self.loading:
            self._load(partition, self.loading[partition], blocking=False)

    @staticmethod
    def _bounds_in(reply: Message, partition: int) -> LogBounds | None:
        for part in reply.get("parts") or ():
            part = PartitionBounds(*part)
            if (part.topic, part.partition) == (TXN_STATE_TOPIC, partition) and part.leader:
                return part.bounds
        return None

    def _install(self, partition: int, bounds: LogBounds) -> None:
        loaded = []
        files = InternalReplay(self.data_dir, TXN_STATE_TOPIC, partition, bounds)
        try:
            for r in files.records():
                if r.key is None or r.value is None:
                    continue  # a tombstone: no state of its own
                try:
                    loaded.append(Transaction.from_record(r.key, r.value))
                except ValueError as exc:
                    files.skip(r.offset, str(exc))
        finally:
            files.close()
        latest = {t.txn_id: t for t in loaded}  # the last record of each id wins (compacted topic)
        epoch = self.loading.pop(partition)
        self.owned[partition] = epoch
        for t in latest.values():
            self.txns.load(t)
        log.info("%s-%d loaded (leader epoch %d): %d transactional ids from %d records", TXN_STATE_TOPIC, partition,
                 epoch, len(latest), len(loaded))
        for t in latest.values():
            if t.state in PREPARING:
                self.call_later(0, lambda t=t: self._write_markers(t))

    def _unload(self, partition: int) -> None:
        self.loading.pop(partition, None)
        if self.owned.pop(partition, None) is None:
            return
        gone = [i for i in self.txns.txns if self._partition_of(i) == partition]
        for txn_id in gone:
            del self.txns.txns[txn_id]
            self.markers_in_flight.discard(txn_id)
            checking = self.checking.pop(txn_id, None)
            if checking is not None:
                self.reply_error(checking[0], ErrorCode.NOT_COORDINATOR,
                                 f"transactional id {txn_id!r}: broker {self.broker_id} no longer coordinates it "
                                 f"({TXN_STATE_TOPIC}-{partition} moved); FindCoordinator and retry")
            for waiting in self.waiting_end.pop(txn_id, ()):
                self.reply_error(waiting, ErrorCode.NOT_COORDINATOR,
                                 f"transactional id {txn_id!r}: broker {self.broker_id} no longer coordinates it "
                                 f"({TXN_STATE_TOPIC}-{partition} moved); FindCoordinator and retry")
            self._release_parked(txn_id)
        log.info("%s-%d unloaded (another broker leads it): %d transactional ids dropped", TXN_STATE_TOPIC,
                 partition, len(gone))

    def _current(self, t: Transaction) -> bool:
        """``t`` is still the loaded state of its id (not dropped or reloaded meanwhile)."""
        return self.txns.txns.get(t.txn_id) is t

    # ---- durable state: __transaction_state ------------------------------------------------
    def _persist(self, t: Transaction, then, fail, attempt: int = 0, chain: list | None = None) -> None:
        """Write ``t``'s record (acks=all), then ``then()``; ``fail(OdradekError)`` if it
        could not be stored (the client retries: COORDINATOR_NOT_AVAILABLE, or
        NOT_COORDINATOR once leadership moved). ``chain``: messages (``[to, type, fields,
        corr]``: requests whose answers are ``expect``-ed here, or the answer to one of our
        requesters, ``answer_chained``) the log actor sends once the record is
        stored, none if it is not (``fail`` then forgets them)."""
        if not self.partitions:
            if self.cluster_mode:
                self.on_create_state_topic(None)
                fail(OdradekError(f"{TXN_STATE_TOPIC} is being created; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE))
            else:
                self._create_state_topic(lambda: self._persist(t, then, fail, attempt, chain), fail)
            return
        due = self.complete_due.pop(t.txn_id, None)
        if due is not None:
            due[1].cancel()  # this record replaces the deferred COMPLETE one
        key, value = t.to_record()
        partition = self._partition_of(t.txn_id)

        def answered(reply: Message) -> None:
            code, why = (reply.error_code, reply.error_message) if reply.is_error else (0, "")
            if not reply.is_error:
                try:
                    part = reply.fields["body"]["topics"][0]["partitions"][0]
                    code, why = part.get("error_code") or 0, part.get("error_message") or ""
                except (KeyError, IndexError, TypeError):
                    code, why = int(ErrorCode.UNKNOWN_SERVER_ERROR), "malformed answer from the log actor"
            if code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER) and attempt < 50 \
                    and partition in self.owned:
                self.call_later(0.1, lambda: self._persist(t, then, fail, attempt + 1, chain))  # a partition being opened
                return
            if code:
                log.warning("%s: writing %r failed: %s", TXN_STATE_TOPIC, t.txn_id, why)
                lost = code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH) \
                    or partition not in self.owned
                fail(OdradekError(f"the transaction state could not be stored ({why}); retry",
                                  ErrorCode.NOT_COORDINATOR if lost else ErrorCode.COORDINATOR_NOT_AVAILABLE))
            else:
                then()

        fields = {"acks": -1, "timeout_ms": int(WRITE_TIMEOUT * 1000), "parts": [[TXN_STATE_TOPIC, partition, 0]]}
        if chain:
            fields["then"] = chain
        self.request(self._state_host(partition), "produce", fields, [encode_batch([(key, value)])],
                     callback=answered, timeout=WRITE_TIMEOUT)

    def _create_state_topic(self, then, fail) -> None:
        """Single broker: one partition, created with the first transaction record."""
        def created(reply: Message) -> None:
            result = {} if reply.is_error else reply.fields["body"]["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            if code not in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                why = reply.error_message if reply.is_error else result.get("error_message")
                fail(OdradekError(f"cannot create {TXN_STATE_TOPIC} ({why}); retry",
                                  ErrorCode.COORDINATOR_NOT_AVAILABLE))
                return
            log.info("created %s", TXN_STATE_TOPIC)
            self.partitions = max(self.partitions, 1)
            self.owned.setdefault(0, 0)
            self.call_later(0.2, then)  # the log actor opens the partition meanwhile (a write before gets retried)

        self.request(CONTROLLER, "create_topics", {"body": {"topics": [{
            "name": TXN_STATE_TOPIC, "num_partitions": 1, "replication_factor": 1,
            "configs": {"cleanup.policy": "compact"}}]}}, callback=created, timeout=60.0)

    def on_create_state_topic(self, msg: Message | None) -> None:
        """Cluster mode: create ``__transaction_state`` through the controller (once at a
        time; the metadata poll then brings its partitions and their leaders)."""
        if self.partitions or self.creating or not self.cluster_mode:
            return
        self.creating = True
        n = int(self.config.get("transaction.state.log.num.partitions", 8))
        rf = int(self.config.get("transaction.state.log.replication.factor", 3))

        def created(reply: Message) -> None:
            self.creating = False
            result = {} if reply.is_error else reply.fields["body"]["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            if code not in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                log.info("cannot create %s yet: %s", TXN_STATE_TOPIC,
                         reply.error_message if reply.is_error else result.get("error_message"))
                return
            log.info("created %s (%d partitions, replication factor %d)", TXN_STATE_TOPIC, n, rf)
            self._refresh_metadata()

        self.request(CONTROLLER, "create_topics", {"body": {"topics": [{
            "name": TXN_STATE_TOPIC, "num_partitions": n, "replication_factor": rf,
            "configs": {"cleanup.policy": "compact"}}]}}, callback=created, timeout=60.0)

    def on_stop(self) -> None:
        for peer in self.peers.values():
            peer.close()
        deadline = time.monotonic() + STOP_JOIN_TIMEOUT
        for peer in self.peers.values():
            peer.thread.join(max(0.0, deadline - time.monotonic()))
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
                "transactions_aborted_by_timeout": self.aborted_by_timeout,
                "state_partitions_led": sorted(self.owned), "state_partitions_loading": sorted(self.loading),
                "marker_requests_sent": self.markers_sent_remote,
                "marker_requests_received": self.markers_received_remote}

    def on_txn_request(self, msg: Message) -> None:
        api, body = msg.get("api"), msg.get("body")
        try:
            if not isinstance(body, dict):
                raise OdradekError("the request body must be a map", ErrorCode.INVALID_REQUEST)
            if api in CHECK_PARKED_APIS and (self.markers_in_flight or self.checking or self.parked):
                # An id's requests are handled in the order they came: once one is parked, so
                # is every later one (a pipelined EndTxn follows its AddPartitionsToTxn on the
                # same connection, and must not overtake it)
                txn_id = body.get("transactional_id")
                if isinstance(txn_id, str) and (txn_id in self.checking or txn_id in self.parked or (
                        txn_id in self.markers_in_flight and api in PARKED_APIS)):
                    self.parked.setdefault(txn_id, []).append(msg)
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
            self._persist(t, lambda: None, failed, chain=list(words))
            return
        self._persist(t, lambda: self.answered_elsewhere(msg), failed,
                      chain=[*words, self.answer_chained(msg, {"body": body})])

    def init_producer_id(self, msg: Message, body: dict) -> None:
        txn_id = body.get("transactional_id")
        if txn_id is not None and not isinstance(txn_id, str):
            raise OdradekError("transactional_id must be a string or null", ErrorCode.INVALID_REQUEST)
        if not txn_id:
            self.reply(msg, {"body": {"error_code": 0, "producer_id": self.next_producer_id(), "producer_epoch": 0}})
            return
        self._check_owner(txn_id)
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

    def add_partitions(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
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
            self._check_owner(txn_id)
        except OdradekError as exc:
            self.reply(msg, {"body": answer(int(exc.code))})
            return
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
        added = t.partitions if before is None or before[0] != TxnState.ONGOING else t.partitions - before[1]
        self._answer_stored(msg, t, answer(0), lambda exc: self.reply(msg, {"body": answer(int(exc.code))}),
                            self._added_words(t, added))

    def _added_words(self, t: Transaction, added) -> list:
        """``txn_added`` for the log actors of this broker leading ``added`` partitions, sent by
        the record's log actor once it is stored: a batch the producer sent before it had the
        answer (``txn_unverified``) waits there for this word (docs/TRANSACTIONS.md)."""
        per_host: dict[str, list] = {}
        for topic, partition in added:
            if topic == OFFSETS_TOPIC or not self._leads_here(topic, partition):
                continue
            per_host.setdefault(log_host(topic, partition, self.log_hosts), []).append(
                [topic, partition, t.producer_id, t.epoch])
        return [[host, "txn_added", {"parts": parts}, 0] for host, parts in per_host.items()]

    def add_offsets(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
        group = _str(body, "group_id")
        self._check_owner(txn_id)
        t = self.txns.add_group(txn_id, pid, epoch, group, (OFFSETS_TOPIC, 0), _now_ms())
        self._answer_stored(msg, t, {"error_code": 0})

    def txn_offset_commit(self, msg: Message, body: dict) -> None:
        """The offsets are kept in the transaction's record (durable with it) and handed to
        the group coordinator when the transaction commits."""
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
        group = _str(body, "group_id")
        try:
            self._check_owner(txn_id)
        except OdradekError as exc:
            if exc.code == ErrorCode.NOT_COORDINATOR and self._forward_offsets(msg, txn_id, body):
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
        tx = self.txns.commit_offsets(txn_id, pid, epoch, group, offsets, _now_ms())
        self._answer_stored(msg, tx, {"topics": results})

    def _forward_offsets(self, msg: Message, txn_id: str, body: dict) -> bool:
        """TXN_OFFSET_COMMIT reaches the *group's* coordinator (Kafka clients send it there;
        Kafka keeps the pending offsets with the group), but here the transaction holds them:
        a broker that does not coordinate ``txn_id`` passes the request on to the one that
        does and relays its answer. False if that broker is not known now."""
        leader = topic_leaders(self.snapshot, TXN_STATE_TOPIC).get(self._partition_of(txn_id), -1)
        address = (self.snapshot.get("brokers") or {}).get(str(leader)) if leader >= 0 else None
        if not self.cluster_mode or leader == self.broker_id or not address or not address[1]:
            return False

        def done(answer: dict | None, error: OdradekError | None) -> None:
            if error is not None:
                self.reply_error(msg, error.code, f"broker {leader}, the coordinator of transactional id "
                                                  f"{txn_id!r}: {error.message}")
            else:
                self.reply(msg, {"body": answer})
        self._broker_peer(leader, address).submit(body, MARKER_TIMEOUT, done, api=ApiKey.TXN_OFFSET_COMMIT)
        return True

    def _broker_peer(self, broker: int, address) -> MarkerPeer:
        peer = self.peers.get(broker)
        if peer is None or peer.address != (address[0], int(address[1])):
            if peer is not None:
                peer.close()
            peer = self.peers[broker] = MarkerPeer(broker, address[0], address[1],
                                                   f"broker-{self.broker_id}-txn", self.post, self.peer_security)
        return peer

    def end_txn(self, msg: Message, body: dict) -> None:
        txn_id, pid, epoch = _str(body, "transactional_id"), _int(body, "producer_id"), _int(body, "producer_epoch")
        committed = body.get("committed")
        if not isinstance(committed, bool):
            raise OdradekError("committed must be true or false", ErrorCode.INVALID_REQUEST)
        self._check_owner(txn_id)
        expect = body.get("expect")
        if expect is not None and committed:
            checks = self._checks_for(txn_id, pid, epoch, expect)
            if checks:
                self._check_then_end(msg, txn_id, pid, epoch, checks)
                return
        self._end(msg, txn_id, pid, epoch, committed)

    # ---- EndTxn sent before the produce answers (the bundled producer's ``expect``) -----------
    def _checks_for(self, txn_id: str, pid: int, epoch: int, expect) -> dict:
        """``expect``: ``[[topic, partition, last_seq]]``, the partitions whose produce answers
        the client had not received when it sent EndTxn, each with the last sequence it sent
        there. Returns ``{log host: [[topic, partition, pid, epoch, last_seq]]}`` to check
        before committing, {} if the transaction is not open (the usual EndTxn path answers:
        a retry, a fenced producer). Every partition must be in the transaction and led by
        this broker (else CONCURRENT_TRANSACTIONS: the client waits for its answers and ends
        the transaction again without ``expect``)."""
        t = self.txns.txns.get(txn_id)
        if t is None or t.producer_id != pid or t.epoch != epoch:
            return {}  # the usual path refuses it (fenced, unknown id)
        if t.state != TxnState.ONGOING:  # never "a retried commit": the client sent batches of an open one
            raise OdradekError(f"transactional id {txn_id!r}: no open transaction to commit (state "
                               f"{t.state.value}); its partitions were not added", ErrorCode.INVALID_TXN_STATE)
        if not isinstance(expect, list) or len(expect) > len(t.partitions):
            raise OdradekError("expect must be a list of [topic, partition, last_seq], one per partition of the "
                               "transaction at most", ErrorCode.INVALID_REQUEST)
        by_host: dict = {}
        for entry in expect:
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in entry[1:])):
                raise OdradekError(f"malformed expect entry {entry!r}: [topic, partition, last_seq]",
                                   ErrorCode.INVALID_REQUEST)
            topic, partition, last_seq = entry
            if (topic, partition) not in t.partitions:
                raise OdradekError(f"transactional id {txn_id!r}: {topic}-{partition} is not in the transaction "
                                   f"(AddPartitionsToTxn first)", ErrorCode.INVALID_TXN_STATE)
            if not self._leads_here(topic, partition):
                raise OdradekError(f"{topic}-{partition} is led by another broker: its records cannot be checked "
                                   f"here; end the transaction again once they are acknowledged",
                                   ErrorCode.CONCURRENT_TRANSACTIONS)
            by_host.setdefault(log_host(topic, partition, self.log_hosts), []).append(
                [topic, partition, pid, epoch, last_seq])
        return by_host

    def _check_then_end(self, msg: Message, txn_id: str, pid: int, epoch: int, by_host: dict) -> None:
        """Ask each partition's log actor whether the client's batches are written there (and
        replicated), then commit as any EndTxn; the id's other requests wait meanwhile. A
        partition that does not confirm in time fails the EndTxn (CONCURRENT_TRANSACTIONS),
        the transaction staying open."""
        state = self.checking[txn_id] = [msg, len(by_host), None]

        def answered(reply: Message) -> None:
            if reply.is_error:
                state[2] = state[2] or reply.error_message
            else:
                for topic, partition, code, message in reply.get("parts") or ():
                    if code:
                        state[2] = state[2] or message or f"{topic}-{partition}: {ErrorCode.of(code).name}"
            state[1] -= 1
            if state[1] or self.checking.get(txn_id) is not state:
                return
            del self.checking[txn_id]
            try:
                if state[2]:
                    raise OdradekError(f"transactional id {txn_id!r} not committed, its records are not all "
                                       f"stored yet: {state[2]}; end it again once they are acknowledged",
                                       ErrorCode.CONCURRENT_TRANSACTIONS)
                self._end(msg, txn_id, pid, epoch, True)
            except OdradekError as exc:
                self.reply_error(msg, exc.code, exc.message)
            self._release_parked(txn_id)

        for host, parts in by_host.items():
            self.request(host, "txn_check", {"parts": parts, "wait_ms": TXN_CHECK_WAIT_MS}, callback=answered,
                         timeout=TXN_CHECK_WAIT_MS / 1000 + 5)

    def _leads_here(self, topic: str, partition: int) -> bool:
        """This broker leads the partition (by the latest metadata): its log actor is ours."""
        return not self.cluster_mode or topic_leaders(self.snapshot, topic).get(partition) == self.broker_id

    def _forget_chained(self, chain: list) -> None:
        """Chained messages that will not be sent: forget the requests among them (an answer
        to our requester carries the requester's correlation id, not one of ours)."""
        for item in chain:
            if item[1] != REPLY:
                self.cancel_request(item[3])

    def _end(self, msg: Message, txn_id: str, pid: int, epoch: int, committed: bool) -> None:
        t = self.txns.end_txn(txn_id, pid, epoch, committed, _now_ms())
        if t.state in COMPLETE:
            self.reply(msg, {"body": {"error_code": 0}})
            return
        self.waiting_end.setdefault(txn_id, []).append(msg)
        # The markers this broker's log actors write go with the PREPARE record: its log actor
        # sends them once it is stored (one hop less). Otherwise (markers for other brokers,
        # partitions without a leader now), they go once the record's answer came.
        chain: list = []

        def failed(exc: OdradekError) -> None:  # the PREPARE record is not stored: markers wait for a retry
            self._forget_chained(chain)
            if chain:
                self.markers_in_flight.discard(txn_id)
            for waiting in self.waiting_end.pop(txn_id, ()):
                self.reply_error(waiting, exc.code, exc.message)
            self._release_parked(txn_id)
        if self._write_markers(t, chain, msg):
            self._persist(t, lambda: None, failed, chain=chain)
        else:
            self._persist(t, lambda: self._write_markers(t), failed)

    # ---- markers -------------------------------------------------------------------------
    def _route_markers(self, t: Transaction, commit: bool) -> tuple[dict, dict, list, bool]:
        """Where ``t``'s pending markers go: ``({log host or group coordinator: markers or
        offsets}, {broker: {"markers", "offsets"}}, [partitions with nothing to write],
        some group's offsets have nowhere to go now)``, from the latest snapshot's leaders.
        A partition without a leader now is left pending (retried)."""
        local: dict = {}
        remote: dict[int, dict] = {}
        nothing = []
        unrouted = False
        p = self._partition_of(t.txn_id)
        coordinator_epoch = max(self.owned.get(p, 0), 0)
        leaders_of: dict[str, dict[int, int]] = {}

        def leader(topic: str, partition: int) -> int | None:
            if topic not in leaders_of:
                leaders_of[topic] = topic_leaders(self.snapshot, topic)
            return leaders_of[topic].get(partition)  # None: the topic or partition is gone

        for topic, partition in sorted(t.pending_markers):
            if topic == OFFSETS_TOPIC:  # the groups' coordinators store (or, on abort, never see) the offsets
                offsets = {g: t.offsets[g] for g in sorted(t.groups) if t.offsets.get(g)} if commit else {}
                if not offsets:
                    nothing.append((topic, partition))
                    continue
                n = len(offsets_leaders(self.snapshot, self.broker_id))
                for g, entries in offsets.items():
                    at = leader(OFFSETS_TOPIC, partition_for(g, n)) if n else self.broker_id
                    at = self.broker_id if at is None or not self.cluster_mode else at
                    if at == self.broker_id:
                        local.setdefault(GROUP_COORDINATOR, {})[g] = entries
                    elif at >= 0:
                        remote.setdefault(at, {"markers": [], "offsets": {}})["offsets"][g] = entries
                    else:
                        unrouted = True  # the group's coordinator has no leader now: retried
                continue
            at = leader(topic, partition) if self.cluster_mode else self.broker_id
            if at is None and self.snapshot_ms > t.updated_ms + 1000:
                nothing.append((topic, partition))  # deleted: nothing left to mark
            elif at is None:
                self._refresh_metadata()  # a topic newer than our snapshot: retried with the next one
            elif at == self.broker_id:
                local.setdefault(log_host(topic, partition, self.log_hosts), []).append(
                    [topic, partition, t.producer_id, t.epoch, commit, coordinator_epoch])
            elif at >= 0:
                remote.setdefault(at, {"markers": [], "offsets": {}})["markers"].append(
                    [topic, partition, t.producer_id, t.epoch, commit, coordinator_epoch])
        return local, remote, nothing, unrouted

    def _write_markers(self, t: Transaction, chain: list | None = None, end: Message | None = None) -> bool:
        """Send the pending markers of ``t`` to the log actors hosting its partitions here and
        to the leaders of the others; when all landed the transaction completes and waiting
        EndTxn requests are answered. What failed is retried after ``MARKER_RETRY``.
        With ``chain`` (before the PREPARE record is stored): only if every marker goes to an
        actor of this broker, their messages are put in ``chain`` for the record's log actor
        to send, and True is returned; else nothing is done and False returned. If then the
        markers go to one log actor and ``end`` (the EndTxn request) is all that waits, that
        log actor answers it once they are written (one hop less)."""
        if t.txn_id in self.markers_in_flight or not self._current(t) or t.state not in PREPARING:
            return False
        commit = t.state == TxnState.PREPARE_COMMIT
        local, remote, nothing, unrouted = self._route_markers(t, commit)
        if chain is not None and (remote or nothing or unrouted or not local):
            return False
        if nothing:
            self._markers_done(t, nothing)
            if not self._current(t) or t.state not in PREPARING:
                return False
        if not local and not remote:
            self.call_later(MARKER_RETRY, lambda: self._write_markers(t))  # leaders unknown for now
            return False
        self.markers_in_flight.add(t.txn_id)
        left = {"n": len(local) + len(remote), "written": [], "failed": False,
                "offsets_unrouted": unrouted}

        def parts_done(parts, offsets_ok: bool | None) -> None:
            for topic, partition, code, message in parts:
                if code == 0 or code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    left["written"].append((topic, partition))
                elif code == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                    left["failed"] = True  # a newer coordinator owns the id: it goes with our next snapshot
                    log.warning("transaction %r: marker on %s-%s refused, a newer coordinator wrote one (%s)",
                                t.txn_id, topic, partition, message)
                    self._refresh_metadata()
                else:
                    left["failed"] = True
                    log.info("transaction %r: marker on %s-%s not written (%s); retrying", t.txn_id, topic,
                             partition, message)
            if offsets_ok is False:
                left["failed"] = True

        def one_done() -> None:
            left["n"] -= 1
            if left["n"]:
                return
            self.markers_in_flight.discard(t.txn_id)
            if self._current(t):
                # the offsets' pseudo-partition is done once every group's offsets are stored
                written = [w for w in left["written"] if w[0] != OFFSETS_TOPIC]
                if not left["failed"] and not left["offsets_unrouted"] and (OFFSETS_TOPIC, 0) in t.pending_markers:
                    written.append((OFFSETS_TOPIC, 0))
                self._markers_done(t, written)
                if t.state in PREPARING:
                    self.call_later(MARKER_RETRY, lambda: self._write_markers(t))
            self._release_parked(t.txn_id)

        def local_answered(reply: Message) -> None:
            if reply.is_error:
                left["failed"] = True
                log.info("transaction %r: markers not written: %s", t.txn_id, reply.get("message"))
            elif reply.get("parts") is None:  # the group coordinator's answer
                parts_done([], not reply.get("error_code"))
                if reply.get("error_code"):
                    log.info("transaction %r: offsets not stored: %s", t.txn_id, reply.get("message"))
            else:
                if answer_with is not None and chain_sent(reply.fields):  # its log actor answered the EndTxn
                    waiting = self.waiting_end.get(t.txn_id)
                    if waiting is not None and answer_with in waiting:
                        waiting.remove(answer_with)
                        if not waiting:
                            del self.waiting_end[t.txn_id]
                    self.answered_elsewhere(answer_with)
                parts_done(reply.get("parts"), None)
            one_done()

        answer_with = None  # the EndTxn the markers' log actor answers (then not we)
        if chain is not None and end is not None and len(local) == 1 and GROUP_COORDINATOR not in local \
                and end.reply_to and self.waiting_end.get(t.txn_id) == [end]:
            answer_with = end
        for host, markers in local.items():
            if host == GROUP_COORDINATOR:
                type_, fields = "txn_offsets_end", {"producer_id": t.producer_id, "offsets": markers, "commit": commit}
            else:
                type_, fields = "write_markers", {"markers": markers, **MARKERS_ACKS_ALL}
                if answer_with is not None:
                    fields["then"] = [self.answer_chained(answer_with, {"body": {"error_code": 0}})]
            if chain is None:
                self.request(host, type_, fields, callback=local_answered, timeout=MARKER_TIMEOUT)
            else:
                chain.append([host, type_, fields, self.expect(local_answered, host, type_, MARKER_TIMEOUT)])

        def remote_answered(broker: int, body: dict | None, error: OdradekError | None) -> None:
            if error is not None:
                left["failed"] = True
                log.info("transaction %r: WRITE_TXN_MARKERS to broker %d failed: %s", t.txn_id, broker,
                         error.message)
                if error.code == ErrorCode.STALE_BROKER_EPOCH:
                    self.broker_epochs = {}  # ours may have changed (a new registration): ask again
            else:
                parts_done(body.get("parts") or (), all(code == 0 for _g, code, _m in body.get("groups") or ()))
            one_done()

        for broker, request in remote.items():
            self._send_remote(broker, {"producer_id": t.producer_id, "commit": commit, **request},
                              lambda body, error, b=broker: remote_answered(b, body, error))
        return True

    def _send_remote(self, broker: int, request: dict, done: Callable) -> None:
        """WRITE_TXN_MARKERS to ``broker`` with this broker's identity (its id and the epoch of
        its live registration, which the receiver checks)."""
        address = (self.snapshot.get("brokers") or {}).get(str(broker))
        if not address or not address[1]:
            done(None, OdradekError(f"broker {broker}'s address is not known here", ErrorCode.LEADER_NOT_AVAILABLE))
            return

        def with_epoch(epoch: int | None) -> None:
            if epoch is None:
                done(None, OdradekError(f"broker {self.broker_id}'s own registration is not known yet",
                                        ErrorCode.STALE_BROKER_EPOCH))
                return
            peer = self._broker_peer(broker, address)
            self.markers_sent_remote += 1
            peer.submit({"broker_id": self.broker_id, "broker_epoch": epoch, **request}, MARKER_TIMEOUT, done)
        self._broker_epoch(self.broker_id, with_epoch)

    def _broker_epoch(self, broker: int, then: Callable, refresh: bool = False) -> None:
        """``then(epoch)`` of ``broker``'s live registration (None if it has none), from the
        cache or, when missing or ``refresh``, from the broker agent."""
        if broker in self.broker_epochs and not refresh:
            then(self.broker_epochs[broker])
            return

        def learned(reply: Message) -> None:
            if not reply.is_error:
                self.broker_epochs = {int(b): int(e) for b, e in (reply.get("epochs") or {}).items()}
            then(self.broker_epochs.get(broker))
        self.request(CONTROLLER, "get_broker_epochs", callback=learned, timeout=10.0)

    def write_txn_markers(self, msg: Message, body: dict) -> None:
        """WRITE_TXN_MARKERS from another broker's coordinator: its identity checked, then the
        markers written by the log actors leading their partitions here, and the offsets
        stored by this broker's group coordinator."""
        broker = _int(body, "broker_id")
        markers, offsets = body.get("markers") or [], body.get("offsets") or {}
        if not isinstance(markers, list) or not isinstance(offsets, dict):
            raise OdradekError("markers must be a list and offsets a map", ErrorCode.INVALID_REQUEST)
        for m in markers:
            if not (isinstance(m, list) and len(m) == 6 and isinstance(m[0], str)
                    and all(isinstance(x, int) for x in (m[1], m[2], m[3], m[5])) and isinstance(m[4], bool)):
                raise OdradekError(f"each marker must be [topic, partition, producer_id, producer_epoch, commit, "
                                   f"coordinator_epoch], got {m!r}", ErrorCode.INVALID_REQUEST)
        if broker == -1:  # an operator's abort of a hanging transaction (odradek transactions abort)
            if body.get("commit") or offsets or any(m[4] for m in markers):
                raise OdradekError("broker_id -1 (an operator, not a broker) may only write abort markers, "
                                   "without offsets", ErrorCode.INVALID_REQUEST)
            log.info("operator abort: markers %s", markers)
            self._write_here(msg, markers, {}, False, body.get("producer_id"))
            return
        if not self.cluster_mode:
            raise OdradekError("WRITE_TXN_MARKERS is sent between the brokers of a cluster; this broker runs alone",
                               ErrorCode.STALE_BROKER_EPOCH)
        claimed = _int(body, "broker_epoch")

        def checked(known: int | None) -> None:
            if known != claimed or broker == self.broker_id:
                self.reply_error(msg, ErrorCode.STALE_BROKER_EPOCH,
                                 f"broker {broker} with broker_epoch {claimed} is not a live broker of this cluster "
                                 f"(only another broker's transaction coordinator may write markers)")
                return
            self.markers_received_remote += 1
            self._write_here(msg, markers, offsets, bool(body.get("commit")), body.get("producer_id"))
        self._broker_epoch(broker, lambda known: checked(known) if known == claimed
                           else self._broker_epoch(broker, checked, refresh=True))

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
        now = _now_ms()
        out = [{"transactional_id": t.txn_id, "producer_id": t.producer_id, "transaction_state": t.state.value}
               for t in sorted(self.txns.txns.values(), key=lambda t: t.txn_id)
               if (not wanted or t.state.value in wanted) and (not pids or t.producer_id in pids)
               and (duration < 0 or (t.started_ms >= 0 and t.state not in COMPLETE and now - t.started_ms >= duration))]
        self.reply(msg, {"body": {"error_code": 0, "unknown_state_filters": unknown, "transaction_states": out}})

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
                self._check_owner(txn_id)
                t = self.txns.txns.get(txn_id)
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
        self.reply(msg, {"body": {"transaction_states": out}})

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
                per_host.setdefault(log_host(t['name'], p, self.log_hosts), []).append([t["name"], p])
        found: dict[tuple, list] = {}
        left = {"n": len(per_host)}

        def answer() -> None:
            by_topic: dict[str, list] = {}
            for name, p in asked:
                code, why, producers = found.get((name, p), (int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                                                             f"{name}-{p} is not hosted here", []))
                by_topic.setdefault(name, []).append({
                    "partition_index": p, "error_code": code, "error_message": why or None,
                    "active_producers": [{"producer_id": pid, "producer_epoch": epoch, "last_sequence": seq,
                                          "last_timestamp": ts, "coordinator_epoch": -1,
                                          "current_txn_start_offset": first}
                                         for pid, epoch, seq, ts, first in producers]})
            self.reply(msg, {"body": {"topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()]}})

        def answered(reply: Message, sent: list) -> None:
            if reply.is_error:
                for name, p in sent:
                    found[(name, p)] = (reply.error_code, reply.error_message, [])
            else:
                for name, p, code, why, producers in reply.get("parts") or ():
                    found[(name, p)] = (code, why, producers)
            left["n"] -= 1
            if not left["n"]:
                answer()

        if not per_host:
            answer()
        for host, sent in per_host.items():
            self.request(host, "describe_producers", {"parts": sent},
                         callback=lambda reply, sent=sent: answered(reply, sent), timeout=30.0)

    def _write_here(self, msg: Message, markers: list, offsets: dict, commit: bool, producer_id) -> None:
        per_host: dict[str, list] = {}
        for m in markers:
            per_host.setdefault(log_host(m[0], m[1], self.log_hosts), []).append(m)
        out = {"parts": [], "groups": []}
        left = {"n": len(per_host) + (1 if offsets else 0)}

        def one_done() -> None:
            left["n"] -= 1
            if left["n"] == 0:
                self.reply(msg, {"body": {"error_code": 0, **out}})

        def logs_answered(reply: Message, sent: list) -> None:
            if reply.is_error:
                out["parts"] += [[m[0], m[1], reply.error_code, reply.error_message] for m in sent]
            else:
                out["parts"] += [list(p) for p in reply.get("parts") or ()]
            one_done()

        def groups_answered(reply: Message) -> None:
            code = reply.error_code if reply.is_error else reply.get("error_code") or 0
            why = reply.error_message if reply.is_error else reply.get("message") or ""
            out["groups"] += [[g, code, why] for g in offsets]
            one_done()

        if not left["n"]:
            self.reply(msg, {"body": {"error_code": 0, **out}})
            return
        for host, sent in per_host.items():
            self.request(host, "write_markers", {"markers": sent, **MARKERS_ACKS_ALL},
                         callback=lambda reply, sent=sent: logs_answered(reply, sent), timeout=MARKER_TIMEOUT)
        if offsets:
            self.request(GROUP_COORDINATOR, "txn_offsets_end", {"producer_id": producer_id, "offsets": offsets,
                                                                "commit": commit},
                         callback=groups_answered, timeout=MARKER_TIMEOUT)

    def _release_parked(self, txn_id: str) -> None:
        """``txn_id``'s markers are no longer in flight: the requests parked meanwhile are
        handled now (refused CONCURRENT_TRANSACTIONS if the markers are still to be retried,
        NOT_COORDINATOR if the id went to another broker)."""
        for msg in self.parked.pop(txn_id, ()):
            self.on_txn_request(msg)

    def _markers_done(self, t: Transaction, written) -> None:
        if not self._current(t):
            return
        t = self.txns.markers_written(t.txn_id, written, _now_ms())
        if t.state in COMPLETE:
            for msg in self.waiting_end.pop(t.txn_id, ()):
                self.reply(msg, {"body": {"error_code": 0}})
            log.debug("transaction %r %s", t.txn_id, t.state.value)
            # The COMPLETE record, not waited for: the markers are what makes the outcome
            # durable; if this record is lost, a restart finds PREPARE and writes them again.
            # Deferred: the id's next record (its next transaction) replaces it.
            self.complete_due[t.txn_id] = (t, self.call_later(COMPLETE_DEFER, lambda: self._write_complete(t)))

    def _write_complete(self, t: Transaction) -> None:
        due = self.complete_due.get(t.txn_id)
        if due is None or due[0] is not t:
            return
        del self.complete_due[t.txn_id]
        if self._current(t) and t.state in COMPLETE:
            self._persist(t, lambda: None, lambda _exc: None)

    def _abort_timed_out(self) -> None:
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
