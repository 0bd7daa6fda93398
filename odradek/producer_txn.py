"""A transactional producer's state and its coordinator requests (docs/CLIENT.md, "Producer",
and docs/TRANSACTIONS.md): ``_Transactions`` runs on the caller's thread and the
*adder* thread it starts; the sender calls ``send_end`` to write a pipelined EndTxn.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import TYPE_CHECKING

from odradek.log.producer_state import last_sequence
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.cluster import NETWORK_ERRORS, Cluster, Connection
from odradek.errors import error_for
from odradek.group import TRANSACTION_KEY, Coordinator

if TYPE_CHECKING:
    from odradek.producer import Producer
    from odradek.producer_sender import _Sender

log = logging.getLogger("odradek.producer")



class TransactionAbortableError(OdradekError):
    """The transaction cannot commit (a record of it failed, or the coordinator refused an
    operation for a reason that only concerns this transaction): ``abort_transaction()``,
    then begin a new one. Its ``code`` is the error that caused it."""


# Kafka's fatal transactional errors: the producer must be closed (a newer instance took over).
TXN_FATAL = (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_PRODUCER_ID_MAPPING,
             ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ErrorCode.INVALID_TRANSACTION_TIMEOUT)


class _PipelinedEnd:
    """A commit whose EndTxn the sender writes behind the transaction's last batches (see the
    module doc). The caller waits for ``ready``: set by the sender once it wrote EndTxn on
    ``conn`` (the caller then owns that connection and reads the answer into ``answers``) or
    decided against it (``fallback`` says why: the usual commit follows)."""
    __slots__ = ("generation", "ready", "conn", "fallback", "answers")

    def __init__(self, generation: int):
        self.generation = generation
        self.ready = threading.Event()
        self.conn: Connection | None = None
        self.fallback = ""
        self.answers: list = []


class _Transactions:
    """A transactional producer's state (Kafka's TransactionManager, simplified): READY ->
    IN_TRANSACTION -> READY, or FATAL for good. The caller's thread talks to the
    coordinator (blocking requests); the adder thread (``_add_loop``) adds each partition
    to the transaction when its first batch opens, and the sender holds the partition's
    batches until then (``add_state``; ``may_go_unverified`` for the exception), and ends a
    commit itself right behind the last batches (``send_end``). Requests go to the
    transactional id's coordinator (FIND_COORDINATOR key_type 1: the leader of its
    ``__transaction_state`` partition), TxnOffsetCommit to the group's coordinator, as
    Kafka's producer does; both are found again when they move."""

    def __init__(self, producer: "Producer", txn_id: str, timeout_ms: int):
        self.p, self.txn_id, self.timeout_ms = producer, txn_id, timeout_ms
        timeout = producer.request_timeout_ms / 1000
        self.coordinator = Coordinator(producer._cluster, txn_id, timeout, key_type=TRANSACTION_KEY)
        self.group_coordinators: dict[str, Coordinator] = {}
        self.state = "UNINITIALIZED"
        self.fatal: OdradekError | None = None
        self.abortable: OdradekError | None = None
        # The current transaction's partitions (under _lock): added (the coordinator stored them),
        # being added (AddPartitionsToTxn in flight, ``_adder``), refused (their batches fail).
        self.partitions: set = set()
        self.adding: set = set()
        self.add_errors: dict = {}
        self._to_add: list = []  # asked for, not yet in a request
        # Transactions begun: an AddPartitionsToTxn answered after its transaction ended (an
        # abort that gave up waiting for it) adds nothing to the next one.
        self.generation = 0
        # The early path: the caller's thread writes a partition's AddPartitionsToTxn itself
        # when the adder is idle (the adder, woken while the caller holds the GIL, would send
        # it only when the caller blocks: after the transaction's sends), and the sender reads
        # its answer (``settle_early``) when it next looks for batches to send: at the flush,
        # one thread wakes where two did. ``_add_conn``, the adder's own connection to the
        # coordinator, is touched by one thread at a time: the caller only to write while
        # nothing is being added, the sender while ``_early`` is set, the adder otherwise.
        self._add_conn: Connection | None = None
        self._early: tuple | None = None  # (partitions, answers, deadline, generation): the caller's, for the sender
        self.offsets_sent = False  # send_offsets_to_transaction() in the current transaction
        self._end: _PipelinedEnd | None = None  # a commit the sender is to end (``send_end``)
        self._lock = threading.Lock()
        self._add_changed = threading.Condition(self._lock)
        self._closing = False
        self._adder = threading.Thread(target=self._add_loop, name=f"odradek-txn-{txn_id}", daemon=True)
        self._adder.start()

    # ---- errors -------------------------------------------------------------------------------
    def _raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def _classify(self, exc: OdradekError, what: str) -> OdradekError:
        if exc.code in TXN_FATAL:
            fatal = error_for(ErrorCode.PRODUCER_FENCED if exc.code == ErrorCode.INVALID_PRODUCER_EPOCH else exc.code,
                              f"transactional id {self.txn_id!r}: {what}: {exc.message}; this producer is fenced "
                              f"(another instance with the same transactional_id took over, or its transaction "
                              f"timed out): close it")
            self.fatal = fatal
            self.state = "FATAL"
            return fatal
        return exc

    def record_failed(self, err: BaseException) -> None:
        """A batch of the transaction failed (sender thread): the transaction must abort."""
        if isinstance(err, OdradekError) and err.code in TXN_FATAL:
            self._classify(err, "a produce was refused")
        elif self.abortable is None:
            self.abortable = TransactionAbortableError(f"a record of the transaction failed ({err}); "
                                                       f"abort_transaction() and retry",
                                                       getattr(err, "code", ErrorCode.UNKNOWN_SERVER_ERROR))

    def not_ready_error(self) -> OdradekError:
        return self.fatal or TransactionAbortableError("send() outside a transaction: call init_transactions() "
                                                       "and begin_transaction() first", ErrorCode.INVALID_TXN_STATE)

    def check_sendable(self) -> None:
        self._raise_if_fatal()
        if self.state != "IN_TRANSACTION":
            raise ValueError(f"send() needs an open transaction (state {self.state}): call "
                             f"{'init_transactions()' if self.state == 'UNINITIALIZED' else 'begin_transaction()'} first")

    # ---- requests to the coordinator ---------------------------------------------------------
    def _request(self, api: int, body: dict, what: str, timeout: float | None, item_codes=None,
                 group_id: str | None = None) -> dict:
        """Blocking, to the transaction's coordinator (or ``group_id``'s), retrying retriable
        answers (CONCURRENT_TRANSACTIONS while markers are written, a coordinator loading,
        restarting or moved) until ``timeout``."""
        deadline = time.monotonic() + (self.p.request_timeout_ms / 1000 if timeout is None else timeout)
        backoff = self.p.retry_backoff
        coordinator = self.coordinator
        if group_id is not None:
            coordinator = self.group_coordinators.get(group_id)
            if coordinator is None:
                coordinator = self.group_coordinators[group_id] = Coordinator(self.p._cluster, group_id,
                                                                              self.coordinator.timeout)

        def codes_of(answer: dict) -> list:
            return [answer.get("error_code", 0)] + list(item_codes(answer) if item_codes else ())

        while True:
            try:
                left = max(deadline - time.monotonic(), 0.1)
                answer = coordinator.request(api, body, timeout=left, item_codes=codes_of) or {}
                codes = codes_of(answer)
                code = next((c for c in codes if c), 0)
                if not code:
                    return answer
                exc = error_for(code, answer.get("error_message") or ErrorCode.of(code).meaning)
            except OdradekError as e:
                exc = e
            if not (exc.retriable or exc.code in NETWORK_ERRORS) or time.monotonic() + backoff >= deadline:
                raise self._classify(exc, what)
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _ids(self) -> dict:
        s = self.p._sender
        return {"transactional_id": self.txn_id, "producer_id": s.idem.producer_id, "producer_epoch": s.idem.epoch}

    def init(self, timeout: float | None) -> None:
        self._raise_if_fatal()
        if self.state != "UNINITIALIZED":
            raise ValueError(f"init_transactions() was called already (state {self.state})")
        body = self._request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": self.txn_id,
                                                       "transaction_timeout_ms": self.timeout_ms,
                                                       "producer_id": -1, "producer_epoch": -1},
                             "InitProducerId", timeout)
        s = self.p._sender
        s.idem.producer_id, s.idem.epoch = body["producer_id"], body["producer_epoch"]  # before any batch: no race
        s.idem.next_seq.clear()
        self.state = "READY"

    def begin(self) -> None:
        self._raise_if_fatal()
        if self.state != "READY":
            raise ValueError(f"begin_transaction() in state {self.state}"
                             + (": call init_transactions() first" if self.state == "UNINITIALIZED" else
                                ": commit or abort the open transaction first"))
        with self._lock:
            self.partitions = set()
            self.add_errors = {}
            self.generation += 1
        self.abortable = None
        self.offsets_sent = False
        self.state = "IN_TRANSACTION"

    # ---- AddPartitionsToTxn, while the partition's first batch fills --------------------------
    def partition_opened(self, topic: str, partition: int) -> None:
        """A batch opened (a caller's thread, the accumulator's lock held): the partition is
        added to the transaction now, while the batch fills, instead of by the sender before
        it sends the batch (one round trip off each transaction). With nothing else being
        added, this thread writes the request itself (the sender takes its answer); else the
        adder thread sends it. The sender sends none of the partition's batches before the
        coordinator stored it."""
        tp = (topic, partition)
        if tp in self.partitions:
            return
        with self._lock:
            if self._asked(tp):
                return
            conn = self._add_conn
            if not self.adding and self._early is None and conn is not None and conn.connected:
                answers: list = []
                try:
                    conn.send(ApiKey.ADD_PARTITIONS_TO_TXN, self._add_body([tp]),
                              callback=lambda frame, err: answers.append((frame, err)))
                except OdradekError:
                    pass  # the adder sends it its usual way
                else:
                    self.adding.add(tp)  # not in _to_add: the adder is not woken for nothing
                    self._early = ([tp], answers, time.monotonic() + self.p.request_timeout_ms / 1000,
                                   self.generation)
                    return
            self._want(tp)

    def _asked(self, tp: tuple) -> bool:
        """Lock held: ``tp`` is added, being added or refused."""
        return tp in self.partitions or tp in self.adding or tp in self.add_errors

    def _want(self, tp: tuple) -> None:
        """Lock held: ask for ``tp`` unless it is added, being added or refused."""
        if self._asked(tp):
            return
        self.adding.add(tp)
        self._to_add.append(tp)
        self._add_changed.notify_all()

    def add_state(self, tp: tuple):
        """Sender thread, for a batch about to be sent: True if its partition is in the
        transaction, None while it is being added (the batch waits; the sender is woken when
        the answer comes), or the error that refused it (the batch fails)."""
        if tp in self.partitions:
            return True
        with self._lock:
            if tp in self.partitions:
                return True
            if tp in self.add_errors:
                return self.add_errors[tp]
            self._want(tp)  # a batch opened before a refusal was forgotten (begin) or none asked yet
            return None

    def _add_body(self, tps: list) -> dict:
        topics: dict[str, list] = {}
        for topic, partition in tps:
            topics.setdefault(topic, []).append(partition)
        return {**self._ids(), "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

    @staticmethod
    def _add_codes(answer: dict) -> list:
        return [r["partition_error_code"] for t in answer.get("results") or () for r in t["results"]]

    def may_go_unverified(self, tp: tuple, cluster: Cluster) -> bool:
        """Sender thread: may a batch of ``tp`` go before the answer to the AddPartitionsToTxn
        the caller wrote for it? Yes if that request is out and the partition's leader is the
        coordinator's broker: the batch goes marked ``txn_unverified``, and the leader appends
        it only once the coordinator told it the partition is stored in the transaction (one
        round trip off a transaction's commit; docs/TRANSACTIONS.md)."""
        early = self._early
        return early is not None and tp in early[0] and self._led_by_coordinator(tp, cluster)

    def _led_by_coordinator(self, tp: tuple, cluster: Cluster) -> bool:
        """Is ``tp``'s leader the broker the coordinator connection goes to (connected)?"""
        conn = self._add_conn
        return conn is not None and conn.connected and cluster.address(cluster.leader(*tp)) == (conn.host, conn.port)

    def early_conn(self) -> Connection | None:
        """Sender thread: the connection whose answer it waits for besides its own (the
        early AddPartitionsToTxn's), or None (also while a pipelined commit's caller reads it)."""
        end = self._end
        return self._add_conn if self._early is not None and (end is None or end.conn is None) else None

    def settle_early(self, reader: bool = False) -> None:
        """Sender thread (or ``reader``: a pipelined commit's caller, who owns the connection
        then): take the answer to the AddPartitionsToTxn the caller wrote, if it
        came (read without blocking) or will never come (the connection lost, or no answer
        within request_timeout_ms). Added, the partitions' batches may go; refused, they are
        asked again the usual way, by the adder (``_request`` retries, follows a coordinator
        that moved, and records a refusal that stands)."""
        early = self._early
        if early is None:
            return
        end = self._end
        if end is not None and end.conn is not None and not reader:
            return  # a pipelined commit's caller reads the connection now, and settles this answer
        tps, answers, deadline, generation = early
        conn = self._add_conn
        if not answers and conn.connected:
            conn.read()
        if not answers:
            if conn.connected and time.monotonic() < deadline:
                return
            conn.close("AddPartitionsToTxn unanswered")  # fails it: its callback records why
        frame, err = answers[0]
        added = err is None and not any(self._add_codes(frame.header["body"]))
        with self._lock:
            self._early = None
            if generation != self.generation:
                self.adding.difference_update(tps)  # its transaction ended: the sender asks anew if need be
            elif added:
                self.partitions.update(tps)
                self.adding.difference_update(tps)
            else:
                self._to_add[:0] = tps  # still in ``adding``: asked once
            self._add_changed.notify_all()  # the adder (partitions asked meanwhile), _adds_settled

    def _connect_adder(self) -> None:
        """Adder thread, after an AddPartitionsToTxn succeeded: its own connection to the
        coordinator (again, if the coordinator moved or the connection dropped)."""
        address = self.coordinator.address
        conn = self._add_conn
        if address is None or (conn is not None and conn.connected and (conn.host, conn.port) == address):
            return
        if conn is not None:
            conn.close("the transaction coordinator moved")
        conn = Connection(address[0], address[1], self.p._cluster.client_id, self.p.request_timeout_ms,
                          security=self.p._cluster.security)
        try:
            conn.connect()
        except OdradekError:
            conn = None
        with self._lock:
            self._add_conn = conn

    def _add_loop(self) -> None:
        """The adder thread: AddPartitionsToTxn for the partitions asked for (all those asked
        meanwhile in one request, once the caller's early one is answered: one at a time),
        then wakes the sender."""
        while True:
            with self._lock:
                while (not self._to_add or self._early is not None) and not self._closing:
                    self._add_changed.wait()
                if self._closing:
                    return
                new, self._to_add = sorted(set(self._to_add)), []
                generation = self.generation
            error = None
            try:
                self._request(ApiKey.ADD_PARTITIONS_TO_TXN, self._add_body(new), "AddPartitionsToTxn", None,
                              self._add_codes)
                self._connect_adder()
            except OdradekError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - a bug must fail the batches, not hang them
                log.exception("AddPartitionsToTxn failed")
                error = error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"AddPartitionsToTxn failed: {exc!r}")
            with self._lock:
                if generation != self.generation:
                    pass  # its transaction ended meanwhile: the sender asks anew if need be
                elif error is None:
                    self.partitions.update(new)
                else:
                    self.add_errors.update((tp, error) for tp in new)
                self.adding.difference_update(new)
                self._add_changed.notify_all()
            self.p._acc.wake()  # the sender sends (or fails) the batches that waited

    def _adds_settled(self, timeout: float | None) -> None:
        """Wait until no AddPartitionsToTxn is in flight (its batches are resolved by then,
        unless one failed on its own): EndTxn must not overtake one."""
        deadline = time.monotonic() + (self.p.request_timeout_ms / 1000 if timeout is None else timeout)
        with self._lock:
            while self.adding:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"AddPartitionsToTxn of {sorted(self.adding)} unanswered after {timeout}s")
                self._add_changed.wait(left)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._add_changed.notify_all()
        self._adder.join(1.0)  # idle, it returns at once; one stuck in a retry must not hold close()
        if self._add_conn is not None:
            self._add_conn.close()

    def send_offsets(self, offsets, group_metadata, timeout: float | None) -> None:
        self._raise_if_fatal()
        if self.state != "IN_TRANSACTION":
            raise ValueError(f"send_offsets_to_transaction() needs an open transaction (state {self.state})")
        group_id = getattr(group_metadata, "group_id", group_metadata)
        if not isinstance(group_id, str) or not group_id:
            raise ValueError("group_metadata must be consumer.group_metadata() (or a group id)")
        if isinstance(offsets, dict):
            pairs = [(tp.topic, tp.partition, off if isinstance(off, int) else off.offset) for tp, off in offsets.items()]
        else:
            pairs = [(tp.topic, tp.partition, tp.offset) for tp in offsets]
        self._request(ApiKey.ADD_OFFSETS_TO_TXN, {**self._ids(), "group_id": group_id}, "AddOffsetsToTxn", timeout)
        self.offsets_sent = True
        topics: dict[str, list] = {}
        for topic, partition, offset in pairs:
            topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset})
        self._request(ApiKey.TXN_OFFSET_COMMIT, {**self._ids(), "group_id": group_id,
                                                 "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]},
                      "TxnOffsetCommit", timeout,
                      lambda a: [p["error_code"] for t in a.get("topics") or () for p in t["partitions"]],
                      group_id=group_id)

    def end(self, commit: bool, timeout: float | None) -> None:
        self._raise_if_fatal()
        what = "commit_transaction()" if commit else "abort_transaction()"
        if self.state != "IN_TRANSACTION":
            raise ValueError(f"{what} without an open transaction (state {self.state})")
        if commit and self.abortable is None and self._commit_pipelined(timeout):
            self.state = "READY"
            return
        try:
            self.p.flush(timeout)
        except TimeoutError:
            if commit:
                raise
        try:
            self._adds_settled(timeout)
        except TimeoutError:
            if commit:
                raise
        self._raise_if_fatal()  # a batch refused as fenced
        if commit and self.abortable is not None:
            raise self.abortable
        with self._lock:
            touched = bool(self.partitions) or self.offsets_sent
        if touched:  # a transaction that wrote nothing has nothing to end at the coordinator
            self._request(ApiKey.END_TXN, {**self._ids(), "committed": commit}, "EndTxn", timeout)
        self.state = "READY"

    # ---- the pipelined commit ----------------------------------------------------------------
    def _commit_pipelined(self, timeout: float | None) -> bool:
        """Commit with EndTxn written by the sender right behind the last batches (see the
        module doc). True once committed; False if the usual commit must follow (nothing
        sent that needs checking, no connection to the coordinator, a partition led
        elsewhere, or the coordinator could not confirm the records: it then left the
        transaction open). Raises a fatal error as the usual path does."""
        with self._lock:
            conn = self._add_conn
            if not (self.partitions or self.adding) or conn is None or not conn.connected or self._end is not None:
                return False
        deadline = time.monotonic() + (self.p.request_timeout_ms / 1000 if timeout is None else timeout)
        pending = self.p._acc.flush_futures()
        with self._lock:
            end = self._end = _PipelinedEnd(self.generation)
        self.p._acc.wake()
        try:
            if not end.ready.wait(max(0.0, deadline - time.monotonic())) or end.conn is None:
                log.debug("transactional id %r: committing in Kafka's order: %s", self.txn_id,
                          end.fallback or "EndTxn not written in time")
                return False
            conn = end.conn
            while not end.answers and conn.connected and time.monotonic() < deadline:
                conn.poll(min(deadline - time.monotonic(), 1.0))
            self.settle_early(reader=True)  # its answer came first, on the same connection
        finally:
            with self._lock:
                self._end = None
        if not end.answers:
            return False  # connection lost, or no answer: the usual EndTxn finds out (a retried commit is answered)
        frame, err = end.answers[0]
        if err is not None:
            if err.code in TXN_FATAL:
                raise self._classify(err, "EndTxn")
            log.debug("transactional id %r: commit with the batches in flight refused (%s); committing again "
                      "after their acknowledgements", self.txn_id, err)
            return False
        # The coordinator committed: every batch is written and replicated. Their answers are
        # on their way; flush() semantics: return once every record is resolved.
        done, not_done = concurrent.futures.wait(pending, max(0.0, deadline - time.monotonic()))
        failed = [f for f in done if f.exception() is not None]
        if failed:
            log.warning("transactional id %r committed (the coordinator found every batch written), yet %d batch(es) "
                        "reported a failure: %s", self.txn_id, len(failed), failed[0].exception())
        if not_done:
            raise TimeoutError(f"commit_transaction: committed, but {len(not_done)} batches still unacknowledged "
                               f"after {timeout}s")
        return True

    def send_end(self, sender: "_Sender") -> None:
        """Sender thread, after sending, while a pipelined commit waits: once every batch of
        the transaction was sent at least once (and its partitions were added), write EndTxn
        on the coordinator connection with each partition's last sequence still unacknowledged,
        and hand the connection to the caller; or decide for the usual commit."""
        end = self._end
        if end is None or end.ready.is_set():
            return
        if end.generation != self.generation:
            end.fallback = "the transaction ended"
            end.ready.set()
            return
        early = self._early
        if self.adding.difference(early[0] if early is not None else ()):
            return  # the adder's AddPartitionsToTxn (another connection) must be answered before EndTxn
        # The caller's own AddPartitionsToTxn may be in flight: it went on the connection EndTxn
        # takes, so the coordinator handles it first.
        if any(b.stamp is None for b in sender.retry) or not sender.acc.drained():
            return  # batches not sent yet (limits, backoff, closed just now): asked again on the next turn
        idem, cluster = sender.idem, sender.cluster
        current = (idem.producer_id, idem.epoch)
        expect = []
        for (topic, partition), window in idem.window.items():
            if not window or all(b.future.done() for b in window):
                continue
            last = window[-1]
            pid, epoch, seq = last.stamp
            if (pid, epoch) != current:
                end.fallback = f"{topic}-{partition} is switching producer epoch"
                break
            if not self._led_by_coordinator((topic, partition), cluster):
                end.fallback = f"{topic}-{partition} is not led by the coordinator's broker (or no connection to it)"
                break
            expect.append([topic, partition, last_sequence(seq, last.count - 1)])
        if not end.fallback and not expect:
            end.fallback = "every batch is acknowledged already"
        if not end.fallback:
            conn = self._add_conn
            try:
                conn.send(ApiKey.END_TXN, {**self._ids(), "committed": True, "expect": expect},
                          callback=lambda frame, err: end.answers.append((frame, err)))
                end.conn = conn
            except OdradekError as exc:
                end.fallback = f"EndTxn not sent: {exc}"
        end.ready.set()
