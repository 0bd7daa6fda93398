"""The transaction coordinator's state table and its log: which transactional ids are ours
(the leadership of ``__transaction_state``), their ``Transaction``s, and the writing of
their records.

Process: ``txn_coordinator`` (a plain object its actor owns, ``coordinator.txn_coordinator``).
Owns: the ``TransactionManager`` (``txns``: every loaded id), the latest metadata snapshot
(``snapshot``, adopted at ``clock()`` ms), the partitions of ``__transaction_state`` led and
loaded here (``owned``: partition -> leader epoch) or being loaded (``loading``), and the
deferred COMPLETE records (``complete_due``).
Collaborators, handed in: the actor's ``Outbox`` (requests and timers), the wall ``clock``
(ms), the broker's identity and settings (``TxnSite``), ``loaded(transactions)`` (the
actor writes again the markers of those found PREPARE_*) and ``dropped(txn_id, why)`` (an id
that went to another broker: the actor answers what waits for it NOT_COORDINATOR).
Sends (through the outbox): ``get_bounds`` and ``produce`` (acks=all, with ``then``: the
messages its log actor sends once the record is stored) to the partitions' log actors,
``get_metadata`` and ``create_topics`` to the controller.
Invariant: an id is in ``txns`` only while its partition is in ``owned``.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from odradek.actors.message import Message
from odradek.actors.names import CONTROLLER, log_host
from odradek.actors.messages import CreateTopics, GetBounds, GetMetadata, LogBounds, Produce, ProducePart
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.internal_replay import InternalReplay
from odradek.coordinator.offsets import offsets_leaders, partition_for
from odradek.coordinator.offsets_replay import bounds_of
from odradek.coordinator.transaction import COMPLETE, Transaction, TransactionManager
from odradek.core.records import encode_batch
from odradek.core.protocol import TXN_STATE_TOPIC, ErrorCode, OdradekError

log = logging.getLogger("odradek.txn")

WRITE_TIMEOUT = 30.0
LOAD_RETRY = 0.1  # seconds between get_bounds attempts while the log actor does not lead the partition yet
WRITE_RETRY = 0.1  # seconds before a record is written again to a partition being opened
WRITE_ATTEMPTS = 50
# seconds a finished transaction's COMPLETE record waits for its id's next record (the next
# transaction's first AddPartitionsToTxn), which replaces it: one write per transaction saved
# for a producer committing often. Safe to lose: a coordinator that loads PREPARE_COMMIT/ABORT
# writes the markers again and then COMPLETE, as after a crash between the two records.
COMPLETE_DEFER = 1.0
CREATE_SETTLE = 0.2  # seconds the log actor has to open a partition just created (a write before is retried)


@dataclasses.dataclass(frozen=True)
class TxnSite:
    """Where the transaction coordinator runs: what its parts need to know of the broker."""
    broker_id: int
    cluster_mode: bool
    data_dir: str
    log_hosts: int
    state_partitions: int = 8  # transaction.state.log.num.partitions (cluster mode)
    state_replication: int = 3  # transaction.state.log.replication.factor (cluster mode)

    def leads(self, snapshot: dict, topic: str, partition: int) -> bool:
        """This broker leads the partition (by ``snapshot``): its log actor is ours."""
        return not self.cluster_mode or topic_leaders(snapshot, topic).get(partition) == self.broker_id


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


class TxnStateLog:
    def __init__(self, site: TxnSite, outbox: Outbox, clock: Callable[[], int], txns: TransactionManager,
                 loaded: Callable[[list], None], dropped: Callable[[str, str], None]):
        self.site, self.outbox, self.clock, self.txns = site, outbox, clock, txns
        self.loaded, self.dropped = loaded, dropped
        self.snapshot: dict = {"topics": {}}
        self.snapshot_ms = 0  # clock() when it was adopted
        self.metadata_version = -1
        self.partitions = 0  # of __transaction_state; 0: not created yet (on the first transactional id)
        self.owned: dict[int, int] = {}  # partition -> leader epoch, loaded: its transactional ids are ours
        self.loading: dict[int, int] = {}  # partition -> leader epoch, being loaded
        self.creating = False
        self.complete_due: dict[str, tuple] = {}  # txn id -> (Transaction, Timer): its COMPLETE record, deferred

    # ---- which transactional ids are ours ----------------------------------------------------
    def refresh_metadata(self) -> None:
        self.outbox.request(CONTROLLER, GetMetadata(),
                            callback=lambda reply: None if reply.is_error else self.adopt(reply.fields.snapshot),
                            timeout=10.0)

    def adopt(self, snapshot: dict, load: Callable[[int], None] | None = None) -> None:
        """Take a newer metadata snapshot: partitions gained are loaded (by ``load(partition)``
        if given: the actor's blocking load at start), partitions lost dropped."""
        version = snapshot.get("version", -1)
        if not isinstance(version, int) or version < self.metadata_version:
            return
        self.metadata_version, self.snapshot, self.snapshot_ms = version, snapshot, self.clock()
        leaders = offsets_leaders(snapshot, self.site.broker_id, TXN_STATE_TOPIC)
        led = {p: epoch for p, (leader, epoch) in enumerate(leaders) if leader == self.site.broker_id}
        self.partitions = len(leaders)
        for p in list(self.owned) + list(self.loading):
            if p not in led:
                self.unload(p)
        for p, epoch in sorted(led.items()):
            if p in self.owned:
                self.owned[p] = epoch  # still led: a newer leader epoch alone (an ISR change) needs no reload
            elif p in self.loading:
                self.loading[p] = epoch
            else:
                self.loading[p] = epoch
                (load or self.load)(p)

    def partition_of(self, txn_id: str) -> int:
        return partition_for(txn_id, self.partitions) if self.partitions else 0

    def host_of(self, partition: int) -> str:
        return log_host(TXN_STATE_TOPIC, partition, self.site.log_hosts)

    def leads(self, topic: str, partition: int) -> bool:
        return self.site.leads(self.snapshot, topic, partition)

    def check_owner(self, txn_id: str) -> None:
        """Raise unless ``txn_id``'s transactions are coordinated (and loaded) here."""
        if not self.partitions:
            if not self.site.cluster_mode:
                return  # single broker: created with the first transaction record
            self.create_state_topic()
            raise OdradekError(f"{TXN_STATE_TOPIC} is being created; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        p = self.partition_of(txn_id)
        if p in self.owned:
            return
        if p in self.loading:
            raise OdradekError(f"{TXN_STATE_TOPIC}-{p} (transactional id {txn_id!r}) is being loaded; retry",
                               ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        leader = topic_leaders(self.snapshot, TXN_STATE_TOPIC).get(p, -1)
        raise OdradekError(f"transactional id {txn_id!r} is coordinated by the leader of {TXN_STATE_TOPIC}-{p} "
                           f"({'none now' if leader < 0 else f'broker {leader}'}), not broker "
                           f"{self.site.broker_id}: FindCoordinator (key_type 1) and retry",
                           ErrorCode.NOT_COORDINATOR)

    def load(self, partition: int) -> None:
        """Replay ``__transaction_state-<partition>`` (newly led, in ``loading``) once its log
        actor leads it: a ``get_bounds`` request retried every ``LOAD_RETRY`` until it does."""
        def answered(reply: Message) -> None:
            if self.loading.get(partition) is None:
                return  # unloaded meanwhile
            bounds = None if reply.is_error else bounds_of(reply.fields, partition, TXN_STATE_TOPIC)
            if bounds is None:
                self.outbox.later(LOAD_RETRY, lambda: partition in self.loading and self.load(partition))
            else:
                self.install(partition, bounds)
        self.outbox.request(self.host_of(partition), GetBounds(), callback=answered, timeout=30.0)

    def install(self, partition: int, bounds: LogBounds) -> None:
        loaded = []
        files = InternalReplay(self.site.data_dir, TXN_STATE_TOPIC, partition, bounds)
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
        self.loaded(list(latest.values()))

    def unload(self, partition: int) -> None:
        self.loading.pop(partition, None)
        if self.owned.pop(partition, None) is None:
            return
        gone = [i for i in self.txns.txns if self.partition_of(i) == partition]
        why = (f"broker {self.site.broker_id} no longer coordinates it ({TXN_STATE_TOPIC}-{partition} moved); "
               f"FindCoordinator and retry")
        for txn_id in gone:
            del self.txns.txns[txn_id]
            self.dropped(txn_id, why)
        log.info("%s-%d unloaded (another broker leads it): %d transactional ids dropped", TXN_STATE_TOPIC,
                 partition, len(gone))

    def current(self, t: Transaction) -> bool:
        """``t`` is still the loaded state of its id (not dropped or reloaded meanwhile)."""
        return self.txns.txns.get(t.txn_id) is t

    # ---- durable state: __transaction_state ----------------------------------------------------
    def persist(self, t: Transaction, then, fail, attempt: int = 0, chain: list | None = None) -> None:
        """Write ``t``'s record (acks=all), then ``then()``; ``fail(OdradekError)`` if it
        could not be stored (the client retries: COORDINATOR_NOT_AVAILABLE, or
        NOT_COORDINATOR once leadership moved). ``chain``: messages (``actors.messages.Chained``:
        requests whose answers are ``expect``-ed here, or the answer to one of our
        requesters, ``answer_chained``) the log actor sends once the record is
        stored, none if it is not (``fail`` then forgets them)."""
        if not self.partitions:
            if self.site.cluster_mode:
                self.create_state_topic()
                fail(OdradekError(f"{TXN_STATE_TOPIC} is being created; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE))
            else:
                self._create_single(lambda: self.persist(t, then, fail, attempt, chain), fail)
            return
        due = self.complete_due.pop(t.txn_id, None)
        if due is not None:
            due[1].cancel()  # this record replaces the deferred COMPLETE one
        key, value = t.to_record()
        partition = self.partition_of(t.txn_id)

        def answered(reply: Message) -> None:
            code, why = (reply.error_code, reply.error_message) if reply.is_error else (0, "")
            if not reply.is_error:
                try:
                    part = reply.fields.body["topics"][0]["partitions"][0]
                    code, why = part.get("error_code") or 0, part.get("error_message") or ""
                except (KeyError, IndexError, TypeError):
                    code, why = int(ErrorCode.UNKNOWN_SERVER_ERROR), "malformed answer from the log actor"
            if code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER) \
                    and attempt < WRITE_ATTEMPTS and partition in self.owned:  # a partition being opened
                self.outbox.later(WRITE_RETRY, lambda: self.persist(t, then, fail, attempt + 1, chain))
                return
            if code:
                log.warning("%s: writing %r failed: %s", TXN_STATE_TOPIC, t.txn_id, why)
                lost = code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH) \
                    or partition not in self.owned
                fail(OdradekError(f"the transaction state could not be stored ({why}); retry",
                                  ErrorCode.NOT_COORDINATOR if lost else ErrorCode.COORDINATOR_NOT_AVAILABLE))
            else:
                then()

        self.outbox.request(self.host_of(partition),
                            Produce(-1, [ProducePart(TXN_STATE_TOPIC, partition, 0)], int(WRITE_TIMEOUT * 1000),
                                    then=chain or []),
                            frames=[encode_batch([(key, value)])], callback=answered, timeout=WRITE_TIMEOUT)

    def defer_complete(self, t: Transaction) -> None:
        """The COMPLETE record of ``t``, not waited for: the markers are what makes the outcome
        durable; if this record is lost, a restart finds PREPARE and writes them again.
        Deferred ``COMPLETE_DEFER``: the id's next record (its next transaction) replaces it."""
        self.complete_due[t.txn_id] = (t, self.outbox.later(COMPLETE_DEFER, lambda: self._write_complete(t)))

    def _write_complete(self, t: Transaction) -> None:
        due = self.complete_due.get(t.txn_id)
        if due is None or due[0] is not t:
            return
        del self.complete_due[t.txn_id]
        if self.current(t) and t.state in COMPLETE:
            self.persist(t, lambda: None, lambda _exc: None)

    def _create_single(self, then, fail) -> None:
        """Single broker: one partition, created with the first transaction record."""
        def created(reply: Message) -> None:
            result = {} if reply.is_error else reply.fields.body["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            if code not in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                why = reply.error_message if reply.is_error else result.get("error_message")
                fail(OdradekError(f"cannot create {TXN_STATE_TOPIC} ({why}); retry",
                                  ErrorCode.COORDINATOR_NOT_AVAILABLE))
                return
            log.info("created %s", TXN_STATE_TOPIC)
            self.partitions = max(self.partitions, 1)
            self.owned.setdefault(0, 0)
            self.outbox.later(CREATE_SETTLE, then)

        self.outbox.request(CONTROLLER, CreateTopics({"topics": [{
            "name": TXN_STATE_TOPIC, "num_partitions": 1, "replication_factor": 1,
            "configs": {"cleanup.policy": "compact"}}]}), callback=created, timeout=60.0)

    def create_state_topic(self) -> None:
        """Cluster mode: create ``__transaction_state`` through the controller (once at a
        time; the metadata poll then brings its partitions and their leaders)."""
        if self.partitions or self.creating or not self.site.cluster_mode:
            return
        self.creating = True
        n, rf = self.site.state_partitions, self.site.state_replication

        def created(reply: Message) -> None:
            self.creating = False
            result = {} if reply.is_error else reply.fields.body["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            if code not in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                log.info("cannot create %s yet: %s", TXN_STATE_TOPIC,
                         reply.error_message if reply.is_error else result.get("error_message"))
                return
            log.info("created %s (%d partitions, replication factor %d)", TXN_STATE_TOPIC, n, rf)
            self.refresh_metadata()

        self.outbox.request(CONTROLLER, CreateTopics({"topics": [{
            "name": TXN_STATE_TOPIC, "num_partitions": n, "replication_factor": rf,
            "configs": {"cleanup.policy": "compact"}}]}), callback=created, timeout=60.0)
