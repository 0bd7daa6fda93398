"""The transaction coordinator's pipelined requests: each transactional id's requests handled
in the order they came, and an EndTxn sent before its produce answers (the bundled producer's
``expect``) checked with the partitions' log actors before it commits.

Process: ``txn_coordinator`` (a plain object its actor owns, ``coordinator.txn_coordinator``).
Owns: the requests parked per id (``parked``) and the EndTxn requests whose records are being
checked (``checking``: txn id -> ``Check``).
Collaborators, handed in: the ``TxnStateLog`` (the transactions, which partitions are led
here), the ids whose markers are in flight (``in_flight``, the marker writer's set), the
actor's ``Outbox``, ``handle(msg)`` (the actor's dispatch, for a request released) and
``end(msg, txn_id, pid, epoch, committed)`` (the actor's EndTxn, once the records are there).
Sends: ``txn_check`` to the log actors of the partitions an EndTxn names.
Invariants: an id's requests are handled in arrival order: while its markers are in flight
they are parked, and once one is parked so is every later one (docs/DECISIONS.md).
"""
from __future__ import annotations

from typing import Callable

from odradek.actors.message import Message
from odradek.actors.names import log_host
from odradek.actors.messages import PartOutcome, TxnCheck, TxnChecks
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.transaction import TxnState
from odradek.coordinator.txn_state_log import TxnStateLog
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

# AddPartitionsToTxn / AddOffsetsToTxn for an id whose markers are in flight wait for them
PARKED_APIS = (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN)
# ... and, while an EndTxn's records are being checked, every request that could change the transaction
CHECK_PARKED_APIS = PARKED_APIS + (ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.INIT_PRODUCER_ID)
# milliseconds a log actor waits for the batches an EndTxn with ``expect`` names (they were
# sent just before it, on another connection) before the coordinator answers "not yet"
TXN_CHECK_WAIT_MS = 2000


class Check:
    """An EndTxn whose records the log actors are checking: the request, the answers still
    due, the first problem one reported."""
    __slots__ = ("msg", "due", "problem")

    def __init__(self, msg: Message, due: int):
        self.msg, self.due, self.problem = msg, due, None


class PipelinedRequests:
    def __init__(self, state: TxnStateLog, in_flight: set, outbox: Outbox, handle: Callable[[Message], None],
                 end: Callable[..., None]):
        self.state, self.in_flight, self.outbox, self.handle, self.end = state, in_flight, outbox, handle, end
        self.parked: dict[str, list[Message]] = {}
        self.checking: dict[str, Check] = {}

    def park(self, api, body: dict, msg: Message) -> bool:
        """Park ``msg`` if an earlier request of its id is still being served: True if parked."""
        if api in CHECK_PARKED_APIS and (self.in_flight or self.checking or self.parked):
            txn_id = body.get("transactional_id")
            if isinstance(txn_id, str) and (txn_id in self.checking or txn_id in self.parked or (
                    txn_id in self.in_flight and api in PARKED_APIS)):
                self.parked.setdefault(txn_id, []).append(msg)
                return True
        return False

    def release(self, txn_id: str) -> None:
        """``txn_id``'s markers are no longer in flight (or its check ended): the requests
        parked meanwhile are handled now (refused CONCURRENT_TRANSACTIONS if the markers are
        still to be retried, NOT_COORDINATOR if the id went to another broker)."""
        for msg in self.parked.pop(txn_id, ()):
            self.handle(msg)

    def drop(self, txn_id: str, why: str) -> None:
        """``txn_id`` went to another broker: an EndTxn being checked gets NOT_COORDINATOR."""
        check = self.checking.pop(txn_id, None)
        if check is not None:
            self.outbox.reply_error(check.msg, ErrorCode.NOT_COORDINATOR, f"transactional id {txn_id!r}: {why}")

    def checks_for(self, txn_id: str, pid: int, epoch: int, expect) -> dict:
        """``expect``: ``[[topic, partition, last_seq]]``, the partitions whose produce answers
        the client had not received when it sent EndTxn, each with the last sequence it sent
        there. Returns ``{log host: [TxnCheck]}`` to check
        before committing, {} if the transaction is not open (the usual EndTxn path answers:
        a retry, a fenced producer). Every partition must be in the transaction and led by
        this broker (else CONCURRENT_TRANSACTIONS: the client waits for its answers and ends
        the transaction again without ``expect``)."""
        t = self.state.txns.txns.get(txn_id)
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
            if not self.state.leads(topic, partition):
                raise OdradekError(f"{topic}-{partition} is led by another broker: its records cannot be checked "
                                   f"here; end the transaction again once they are acknowledged",
                                   ErrorCode.CONCURRENT_TRANSACTIONS)
            by_host.setdefault(log_host(topic, partition, self.state.site.log_hosts), []).append(
                TxnCheck(topic, partition, pid, epoch, last_seq))
        return by_host

    def check_then_end(self, msg: Message, txn_id: str, pid: int, epoch: int, by_host: dict) -> None:
        """Ask each partition's log actor whether the client's batches are written there (and
        replicated), then commit as any EndTxn; the id's other requests wait meanwhile. A
        partition that does not confirm in time fails the EndTxn (CONCURRENT_TRANSACTIONS),
        the transaction staying open."""
        check = self.checking[txn_id] = Check(msg, len(by_host))

        def answered(reply: Message) -> None:
            if reply.is_error:
                check.problem = check.problem or reply.error_message
            else:
                for part in map(PartOutcome._make, reply.fields.parts):
                    if part.code:
                        check.problem = check.problem or part.message or \
                            f"{part.topic}-{part.partition}: {ErrorCode.of(part.code).name}"
            check.due -= 1
            if check.due or self.checking.get(txn_id) is not check:
                return
            del self.checking[txn_id]
            try:
                if check.problem:
                    raise OdradekError(f"transactional id {txn_id!r} not committed, its records are not all "
                                       f"stored yet: {check.problem}; end it again once they are acknowledged",
                                       ErrorCode.CONCURRENT_TRANSACTIONS)
                self.end(msg, txn_id, pid, epoch, True)
            except OdradekError as exc:
                self.outbox.reply_error(msg, exc.code, exc.message)
            self.release(txn_id)

        for host, parts in by_host.items():
            self.outbox.request(host, TxnChecks(parts, TXN_CHECK_WAIT_MS), callback=answered,
                                timeout=TXN_CHECK_WAIT_MS / 1000 + 5)
