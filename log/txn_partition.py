"""One partition's share of the transaction work, for the log actor that leads it.

Process: ``log-<i>`` (a plain object per hosted partition, owned by ``log.log_actor``'s
``PartitionLog`` as ``txn``; no messages of its own: the actor's handlers call it).
Owns: the coordinator's word that a producer's open transaction holds this partition
(``added``: producer id -> epoch, from ``txn_added``), the transactional batches sent before
that word came (``held``: ``HeldAppend``), and the coordinator's ``txn_check`` parts waiting
here for the producer's batches (``checks``: ``CheckedPart``).
Collaborators, handed in: the partition's ``Log`` (its producer state, high watermark,
``min.insync.replicas``, and ``append_marker``). What only the actor has is passed per call:
the ISR's size, the actor's timers (each ``HeldAppend``'s and ``DelayedTxnCheck``'s
``timer``, set and cancelled by the actor), the appends and the answers. Pure otherwise:
``tests/log/test_txn_partition.py`` drives it over a ``Log`` in a temporary directory.
docs/TRANSACTIONS.md, "The commit path", says what each part is for.
"""
from __future__ import annotations

from odradek.actors.message import Message
from odradek.actors.messages import PartOutcome, PartOutcomes, TxnAdded, TxnCheck, TxnMarker
from odradek.core.kafka_batch import LENGTH_AND_ATTRIBUTES, PRODUCER_FIELDS
from odradek.core.protocol import ErrorCode
from odradek.core.records import HEADER_SIZE, OFFSET_PRODUCER_ID, TRANSACTIONAL_BIT

MAX_TXN_CHECK_WAIT_MS = 10000  # the longest a txn_check waits for its producer's batches
TXN_HOLD = 2.0  # seconds a batch sent before its partition's AddPartitionsToTxn was stored waits for the word


class HeldAppend:
    """A transactional batch whose producer sent it before knowing the partition is in its
    transaction (``txn_unverified``): appended once the coordinator's ``txn_added`` comes,
    refused (retriable) after ``TXN_HOLD``. ``delayed`` is the produce waiting for it (the
    actor's ``DelayedProduce``), ``entry`` its row of the produce's answer."""
    __slots__ = ("pid", "epoch", "batch", "delayed", "entry", "timer")

    def __init__(self, pid: int, epoch: int, batch, delayed, entry: dict):
        self.pid, self.epoch, self.batch, self.delayed, self.entry = pid, epoch, batch, delayed, entry
        self.timer = None


class CheckedPart:
    """One partition of a ``txn_check``: what was asked (a ``TxnCheck``) and, once known, the
    answer (``code``, ``message``); ``check`` is the request it belongs to."""
    __slots__ = ("ask", "code", "message", "check")

    def __init__(self, ask: TxnCheck, check: DelayedTxnCheck):
        self.ask, self.check, self.code, self.message = ask, check, 0, ""

    def outcome(self) -> PartOutcome:
        return PartOutcome(self.ask.topic, self.ask.partition, self.code, self.message)


class DelayedTxnCheck:
    """A ``txn_check`` (the transaction coordinator's, before it commits a transaction the
    client ended without waiting for its produce answers) waiting for some of its partitions.
    ``rows``: in the order asked, a ``CheckedPart`` each (a ``PartOutcome`` for an entry it
    could not read), answered together (``body``); ``waiting_on``: the ``TxnPartition``s it
    still waits in; ``timer``: the actor's, for ``wait_ms``."""
    __slots__ = ("msg", "rows", "waiting_on", "timer")

    def __init__(self, msg: Message):
        self.msg, self.rows, self.waiting_on, self.timer = msg, [], [], None

    def body(self) -> PartOutcomes:
        return PartOutcomes([row.outcome() if type(row) is CheckedPart else row for row in self.rows])


class TxnPartition:
    __slots__ = ("topic", "partition", "log", "added", "held", "checks")

    def __init__(self, topic: str, partition: int, log_):
        self.topic, self.partition, self.log = topic, partition, log_
        self.added: dict[int, int] = {}  # producer id -> epoch: the coordinator's txn_added
        self.held: list[HeldAppend] = []  # in the order they came
        self.checks: list[CheckedPart] = []  # txn_check parts waiting here

    # ---- batches sent before the partition joined the transaction (txn_unverified) ------------
    def must_hold(self, batch) -> tuple[int, int] | None:
        """``(producer id, epoch)`` if ``batch`` (a produce's frame marked ``txn_unverified``)
        must wait for the coordinator's word: a transactional batch that would open its
        producer's transaction here before the coordinator said it stored the partition
        (KIP-890's hanging transaction), or that would pass batches of its producer held
        already. None: append it now (not transactional, the word came, or its transaction
        is open here already)."""
        if len(batch) < HEADER_SIZE:
            return None  # the usual append answers
        pid, epoch, _ = PRODUCER_FIELDS.unpack_from(batch, OFFSET_PRODUCER_ID)
        if pid < 0 or not LENGTH_AND_ATTRIBUTES.unpack_from(batch)[1] & TRANSACTIONAL_BIT \
                or self.added.get(pid) == epoch:
            return None
        e = self.log.producers.get(pid)
        if e is not None and e.txn_first_offset >= 0 and e.epoch == epoch and not any(h.pid == pid for h in self.held):
            return None  # its transaction is open here already: the coordinator stored the partition
        return pid, epoch

    def hold(self, held: HeldAppend) -> None:
        self.held.append(held)

    def word_came(self, added: TxnAdded) -> list[HeldAppend]:
        """The coordinator stored this partition in ``added.producer_id``'s transaction: the
        batches held for it, in the order they came, to append now."""
        pid, epoch = int(added.producer_id), int(added.producer_epoch)
        self.added[pid] = epoch
        return [h for h in self.held if h.pid == pid and h.epoch == epoch]

    def release(self, held: HeldAppend) -> bool:
        """Stop holding ``held`` (its timer cancelled); False if it was released already (the
        word and its timer crossed)."""
        if held not in self.held:
            return False
        self.held.remove(held)
        if held.timer is not None:
            held.timer.cancel()
        return True

    def held_for(self, delayed) -> list[HeldAppend]:
        return [h for h in self.held if h.delayed is delayed]

    def not_leading(self) -> list[HeldAppend]:
        """This broker no longer leads the partition: the coordinator's words are forgotten;
        returns the batches held, to refuse."""
        self.added.clear()
        return list(self.held)

    # ---- markers ------------------------------------------------------------------------------
    def write_marker(self, marker: TxnMarker, leader_epoch: int):
        """Append ``marker``'s control batch (the ``Log``'s checks: an older producer epoch, a
        fenced coordinator epoch); its producer's transaction is over here. The AppendInfo."""
        pid = int(marker.producer_id)
        info = self.log.append_marker(pid, int(marker.producer_epoch), bool(marker.commit),
                                      int(marker.coordinator_epoch), leader_epoch)
        self.added.pop(pid, None)  # that transaction is over here
        return info

    # ---- txn_check ------------------------------------------------------------------------------
    def verdict(self, ask: TxnCheck, in_sync: int) -> tuple[int, str] | None:
        """``(0, "")`` if the check holds, ``(code, message)`` if it never will, None to wait.
        ``in_sync``: the ISR's size now."""
        pid, epoch = ask.producer_id, ask.producer_epoch
        e = self.log.producers.get(pid)
        if e is not None and e.epoch > epoch:
            return int(ErrorCode.INVALID_PRODUCER_EPOCH), f"{self.topic}-{self.partition}: producer {pid} is at " \
                                                          f"epoch {e.epoch} here, not {epoch}"
        if e is None or e.epoch != epoch or e.last_seq != ask.last_seq:
            return None  # its batches are still on their way
        if e.txn_first_offset < 0:
            return int(ErrorCode.INVALID_TXN_STATE), f"{self.topic}-{self.partition}: producer {pid} has no open " \
                                                     f"transaction here (it was ended)"
        if self.log.high_watermark <= e.window[-1] or in_sync < self.log.config.min_insync_replicas:
            return None  # written, not yet replicated to the ISR
        return 0, ""

    def check(self, part: CheckedPart, in_sync: int) -> bool:
        """Answer ``part`` now if its verdict is known; else it waits here (True)."""
        verdict = self.verdict(part.ask, in_sync)
        if verdict is None:
            self.checks.append(part)
            part.check.waiting_on.append(self)
            return True
        part.code, part.message = verdict
        return False

    def settle(self, in_sync: int) -> list[DelayedTxnCheck]:
        """After an append or a follower's progress: answer the parts that hold now; returns
        the checks that wait for nothing more (to answer; their timers the actor's)."""
        left, done = [], []
        for part in self.checks:
            verdict = self.verdict(part.ask, in_sync)
            if verdict is None:
                left.append(part)
                continue
            part.code, part.message = verdict
            part.check.waiting_on.remove(self)
            if not part.check.waiting_on:
                done.append(part.check)
        self.checks = left
        return done

    def expire(self, check: DelayedTxnCheck) -> None:
        """``check``'s ``wait_ms`` passed: its parts waiting here fail CONCURRENT_TRANSACTIONS
        (the produce may still be on its way; the client ends the transaction again)."""
        for part in [part for part in self.checks if part.check is check]:
            ask = part.ask
            e = self.log.producers.get(ask.producer_id)
            part.code = int(ErrorCode.CONCURRENT_TRANSACTIONS)
            part.message = (f"{self.topic}-{self.partition}: producer {ask.producer_id} epoch {ask.producer_epoch} "
                            f"not written through sequence {ask.last_seq} and replicated in time (here: "
                            + ("nothing of it" if e is None else f"epoch {e.epoch}, last sequence {e.last_seq}")
                            + f", high watermark {self.log.high_watermark})")
        self.checks = [part for part in self.checks if part.check is not check]
        if self in check.waiting_on:
            check.waiting_on.remove(self)
