"""The transaction coordinator's state machine: one ``Transaction`` per transactional id.

Pure (no I/O, no clock: every operation takes ``now`` in ms), run by the transaction
coordinator actor (``coordinator/txn_coordinator.py``), tested alone
(tests/coordinator/test_transaction.py). Kafka's ``TransactionMetadata`` and
``TransactionCoordinator`` rules (KIP-98, KIP-360, KIP-588):

    EMPTY --add_partitions--> ONGOING --end_txn(commit)--> PREPARE_COMMIT --markers--> COMPLETE_COMMIT
                                      --end_txn(abort) --> PREPARE_ABORT  --markers--> COMPLETE_ABORT
    ONGOING --timeout or a new init_producer_id--> PREPARE_ABORT (epoch bumped: the old producer is fenced)
    COMPLETE_* --add_partitions--> ONGOING (the next transaction)

An operation returns what the caller must answer, and may leave effects for it to carry
out (``Transaction.pending_markers``: the partitions that need a commit or abort marker
before the transaction completes, ``markers_written``). Errors are ``OdradekError`` with
Kafka's codes: PRODUCER_FENCED (an older epoch; fatal to that producer),
INVALID_PRODUCER_ID_MAPPING (the id is not this transactional id's),
CONCURRENT_TRANSACTIONS (retriable: markers are still being written), INVALID_TXN_STATE
(e.g. commit of an aborted transaction), INVALID_TRANSACTION_TIMEOUT.

``to_record``/``from_record`` give the durable form (key: the transactional id; value: a
msgpack map), what the coordinator writes before it answers.
"""
from __future__ import annotations

import enum
from typing import Callable

import msgpack

from odradek.core.protocol import ErrorCode, OdradekError

MAX_EPOCH = 32767  # producer epochs are int16; at the top a new producer id is handed out
DEFAULT_MAX_TIMEOUT_MS = 900000  # Kafka's transaction.max.timeout.ms


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


PREPARING = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
COMPLETE = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


class Transaction:
    """One transactional id: its producer id and epoch, and its current transaction."""

    __slots__ = ("txn_id", "producer_id", "epoch", "timeout_ms", "state", "partitions", "groups",
                 "started_ms", "updated_ms", "pending_markers", "offsets")

    def __init__(self, txn_id: str, producer_id: int, epoch: int, timeout_ms: int, now: int):
        self.txn_id = txn_id
        self.producer_id, self.epoch, self.timeout_ms = producer_id, epoch, timeout_ms
        self.state = TxnState.EMPTY
        self.partitions: set[tuple[str, int]] = set()
        self.groups: set[str] = set()  # consumer groups whose offsets the transaction commits
        # TxnOffsetCommit: group -> [[topic, partition, offset, leader_epoch, metadata]], stored on commit
        self.offsets: dict[str, list] = {}
        self.started_ms = -1
        self.updated_ms = now
        self.pending_markers: set[tuple[str, int]] = set()

    @property
    def committing(self) -> bool:
        return self.state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)

    def to_record(self) -> tuple[bytes, bytes]:
        value = {"pid": self.producer_id, "epoch": self.epoch, "timeout_ms": self.timeout_ms,
                 "state": self.state.value, "partitions": sorted(self.partitions), "groups": sorted(self.groups),
                 "started_ms": self.started_ms, "updated_ms": self.updated_ms, "offsets": self.offsets}
        return self.txn_id.encode(), msgpack.packb(value)

    @classmethod
    def from_record(cls, key: bytes, value: bytes) -> "Transaction":
        """``ValueError`` if the record is not a transaction's."""
        try:
            v = msgpack.unpackb(value)
            t = cls(key.decode(), int(v["pid"]), int(v["epoch"]), int(v["timeout_ms"]), int(v["updated_ms"]))
            t.state = TxnState(v["state"])
            t.partitions = {(str(a), int(b)) for a, b in v["partitions"]}
            t.groups = set(map(str, v["groups"]))
            t.started_ms = int(v["started_ms"])
            t.offsets = {str(g): [list(o) for o in offs] for g, offs in (v.get("offsets") or {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError, msgpack.UnpackException) as exc:
            raise ValueError(f"not a transaction record ({type(exc).__name__}: {exc})") from None
        if t.state in PREPARING:  # the markers may not all be written: write them again
            t.pending_markers = set(t.partitions)
        return t

    def __repr__(self) -> str:
        return (f"Transaction({self.txn_id!r}, pid={self.producer_id}, epoch={self.epoch}, {self.state.name}, "
                f"{sorted(self.partitions)})")


def _fail(code: ErrorCode, message: str) -> OdradekError:
    return OdradekError(message, code)


class TransactionManager:
    """Every transactional id this coordinator owns. Pure: ``allocate_pid()`` is injected."""

    def __init__(self, allocate_pid: Callable[[], int], max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS):
        self.allocate_pid = allocate_pid
        self.max_timeout_ms = max_timeout_ms
        self.txns: dict[str, Transaction] = {}

    # ------------------------------------------------------------------ InitProducerId
    def init_producer_id(self, txn_id: str, timeout_ms: int, now: int, expected_pid: int = -1,
                         expected_epoch: int = -1) -> Transaction:
        """A producer with ``txn_id`` starts (or restarts): the same producer id with the
        epoch bumped, which fences every older instance. An ongoing transaction is aborted
        first (CONCURRENT_TRANSACTIONS until its markers are written: the client retries).
        ``expected_*`` (KIP-360, InitProducerId v3+): the id and epoch the producer had; a
        mismatch means another instance took over (PRODUCER_FENCED)."""
        if not isinstance(timeout_ms, int) or not 0 < timeout_ms <= self.max_timeout_ms:
            raise _fail(ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                        f"transaction.timeout.ms {timeout_ms!r} must be in 1..{self.max_timeout_ms} "
                        f"(transaction.max.timeout.ms)")
        t = self.txns.get(txn_id)
        if t is None:
            t = self.txns[txn_id] = Transaction(txn_id, self.allocate_pid(), 0, timeout_ms, now)
            return t
        if t.state in PREPARING:
            raise _fail(ErrorCode.CONCURRENT_TRANSACTIONS,
                        f"transactional id {txn_id!r}: the previous transaction is still completing; retry")
        if expected_pid >= 0 and (expected_pid, expected_epoch) != (t.producer_id, t.epoch):
            raise _fail(ErrorCode.PRODUCER_FENCED,
                        f"transactional id {txn_id!r}: producer {expected_pid} epoch {expected_epoch} is not the "
                        f"current one (another instance took over)")
        if t.state == TxnState.ONGOING:
            self._bump(t)
            self._prepare(t, commit=False, now=now)
            raise _fail(ErrorCode.CONCURRENT_TRANSACTIONS,
                        f"transactional id {txn_id!r}: its open transaction is being aborted; retry")
        self._bump(t)
        t.timeout_ms, t.updated_ms = timeout_ms, now
        t.state = TxnState.EMPTY
        t.partitions, t.groups, t.offsets = set(), set(), {}
        return t

    def _bump(self, t: Transaction) -> None:
        if t.epoch >= MAX_EPOCH - 1:
            t.producer_id, t.epoch = self.allocate_pid(), 0
        else:
            t.epoch += 1

    # ------------------------------------------------------------------ the transaction
    def _current(self, txn_id: str, pid: int, epoch: int) -> Transaction:
        t = self.txns.get(txn_id)
        if t is None or t.producer_id != pid:
            raise _fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                        f"producer {pid} is not the producer of transactional id {txn_id!r} (InitProducerId first)")
        if epoch != t.epoch:
            raise _fail(ErrorCode.PRODUCER_FENCED,
                        f"transactional id {txn_id!r}: epoch {epoch} is not the current {t.epoch} (a newer "
                        f"instance of the producer took over, or the transaction timed out)")
        return t

    def add_partitions(self, txn_id: str, pid: int, epoch: int, partitions, now: int) -> Transaction:
        """AddPartitionsToTxn (and AddOffsetsToTxn with ``("__consumer_offsets", p)``)."""
        t = self._current(txn_id, pid, epoch)
        if t.state in PREPARING:
            raise _fail(ErrorCode.CONCURRENT_TRANSACTIONS,
                        f"transactional id {txn_id!r}: the previous transaction is still completing; retry")
        if t.state != TxnState.ONGOING:
            t.state, t.started_ms = TxnState.ONGOING, now
            t.partitions, t.groups, t.offsets = set(), set(), {}
        t.partitions.update((str(tp), int(p)) for tp, p in partitions)
        t.updated_ms = now
        return t

    def add_group(self, txn_id: str, pid: int, epoch: int, group: str, offsets_partition: tuple, now: int):
        t = self.add_partitions(txn_id, pid, epoch, [offsets_partition], now)
        t.groups.add(group)
        return t

    def commit_offsets(self, txn_id: str, pid: int, epoch: int, group: str, offsets: list, now: int) -> Transaction:
        """TxnOffsetCommit: ``offsets`` ([[topic, partition, offset, leader_epoch, metadata]])
        of ``group``, added to the transaction by AddOffsetsToTxn first; they become the
        group's committed offsets if the transaction commits."""
        t = self._current(txn_id, pid, epoch)
        if t.state != TxnState.ONGOING or group not in t.groups:
            raise _fail(ErrorCode.INVALID_TXN_STATE,
                        f"transactional id {txn_id!r}: group {group!r} is not in the open transaction "
                        f"(AddOffsetsToTxn first)")
        held = {(o[0], o[1]): o for o in t.offsets.get(group, [])}
        held.update({(o[0], o[1]): list(o) for o in offsets})
        t.offsets[group] = sorted(held.values())
        t.updated_ms = now
        return t

    def end_txn(self, txn_id: str, pid: int, epoch: int, commit: bool, now: int) -> Transaction:
        """EndTxn: the transaction goes to PREPARE_COMMIT/ABORT and its partitions need
        markers; a retry of an end that completed is answered again (success)."""
        t = self._current(txn_id, pid, epoch)
        wanted = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if t.state == wanted:
            return t  # a retried EndTxn whose answer was lost
        if t.state == preparing:
            raise _fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"transactional id {txn_id!r}: still completing; retry")
        if t.state != TxnState.ONGOING:
            if not commit and t.state in COMPLETE:
                return t  # aborting nothing: nothing to do
            raise _fail(ErrorCode.INVALID_TXN_STATE,
                        f"transactional id {txn_id!r}: cannot {'commit' if commit else 'abort'} in state "
                        f"{t.state.value}")
        self._prepare(t, commit, now)
        return t

    def _prepare(self, t: Transaction, commit: bool, now: int) -> None:
        t.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        t.pending_markers = set(t.partitions)
        t.updated_ms = now

    def markers_written(self, txn_id: str, partitions, now: int) -> Transaction:
        """Markers landed on ``partitions``; once all have, the transaction is complete."""
        t = self.txns[txn_id]
        t.pending_markers.difference_update((str(tp), int(p)) for tp, p in partitions)
        if t.state in PREPARING and not t.pending_markers:
            t.state = TxnState.COMPLETE_COMMIT if t.state == TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
            t.updated_ms = now
        return t

    def expire(self, now: int) -> list[Transaction]:
        """Transactions open longer than their timeout: aborted with the epoch bumped (the
        producer is fenced, as Kafka does). Returns them (their markers are pending)."""
        out = []
        for t in self.txns.values():
            if t.state == TxnState.ONGOING and now - t.started_ms > t.timeout_ms:
                self._bump(t)
                self._prepare(t, commit=False, now=now)
                out.append(t)
        return out

    def load(self, t: Transaction) -> None:
        self.txns[t.txn_id] = t
