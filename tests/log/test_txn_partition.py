"""A partition's share of the transaction work (``log.txn_partition.TxnPartition``), alone:
over a ``Log`` in a temporary directory, no actor, no broker. The batches a producer sends
before the coordinator's ``txn_added`` word are held, the markers end a transaction, and a
``txn_check`` waits until the producer's batches are written and replicated. The log actor
around it is exercised end to end by tests/client/test_txn_pipelined_commit.py,
tests/client/test_txn_commit_path.py and tests/kafka/test_transactions.py."""
from __future__ import annotations

import dataclasses

import msgpack
import pytest

from odradek.actors.message import Message
from odradek.actors.messages import PartOutcome, PartOutcomes, TxnAdded, TxnCheck, TxnChecks, TxnMarker, WriteMarkers
from odradek.core import kafka_batch
from odradek.core.protocol import ErrorCode, OdradekError
from odradek.core.records import Record
from odradek.log.txn_partition import CheckedPart, DelayedTxnCheck, HeldAppend, TxnPartition

PID, OTHER = 7000, 8000


def batch(pid: int = PID, seq: int = 0, epoch: int = 0, transactional: bool = True, n: int = 2) -> bytes:
    recs = [Record(i, 1_700_000_000_000, None, b"v%d" % (seq + i), []) for i in range(n)]
    return kafka_batch.encode(recs, base_offset=0, first_timestamp=1_700_000_000_000,
                              max_timestamp=1_700_000_000_000,
                              attributes=kafka_batch.TRANSACTIONAL_BIT if transactional else 0,
                              producer_id=pid, producer_epoch=epoch, base_sequence=seq)


class Timer:
    def __init__(self):
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def held(part: TxnPartition, pid: int = PID, epoch: int = 0, delayed=None) -> HeldAppend:
    h = HeldAppend(pid, epoch, batch(pid, epoch=epoch), delayed, {"error_code": 0})
    h.timer = Timer()
    part.hold(h)
    return h


def ask(pid: int = PID, epoch: int = 0, last_seq: int = 1, topic: str = "t", partition: int = 0):
    check = DelayedTxnCheck(Message(TxnChecks.TYPE, 3, "txn_coordinator", TxnChecks([], 2000)))
    part = CheckedPart(TxnCheck(topic, partition, pid, epoch, last_seq), check)
    check.rows.append(part)
    return check, part


@pytest.fixture
def txn(open_log):
    return TxnPartition("t", 0, open_log())


def replicated(part: TxnPartition) -> None:
    part.log.high_watermark = part.log.log_end_offset


# ---- batches sent before the word ---------------------------------------------------------------
def test_a_transactional_batch_that_would_open_the_transaction_waits_for_the_coordinators_word(txn):
    assert txn.must_hold(batch()) == (PID, 0)
    assert txn.must_hold(batch(transactional=False)) is None  # not transactional: appended at once
    assert txn.must_hold(b"\0" * 10) is None  # too short to be a batch: the append refuses it
    held(txn)
    assert txn.word_came(TxnAdded("t", 0, PID, 1)) == []  # another epoch's word frees nothing
    assert txn.must_hold(batch(epoch=0)) == (PID, 0)
    assert txn.must_hold(batch(epoch=1)) is None  # that epoch's word came


def test_the_word_frees_the_producers_held_batches_in_the_order_they_came_and_no_others(txn):
    first, other, second = held(txn), held(txn, OTHER), held(txn)
    assert txn.word_came(TxnAdded("t", 0, PID, 0)) == [first, second]
    assert txn.must_hold(batch(seq=4)) is None
    assert txn.release(first) and first.timer.cancelled and txn.held == [other, second]
    assert not txn.release(first)  # the word and the hold's timer crossed: released once


def test_a_batch_of_a_transaction_open_here_waits_only_behind_batches_of_its_producer_held_already(txn):
    txn.log.append(batch())  # the transaction is open here: the coordinator stored the partition
    assert txn.must_hold(batch(seq=2)) is None
    held(txn)
    assert txn.must_hold(batch(seq=2)) == (PID, 0)  # may not overtake the held one


def test_leadership_gone_forgets_the_words_and_hands_back_every_held_batch(txn):
    txn.word_came(TxnAdded("t", 0, OTHER, 0))
    h = held(txn)
    assert txn.not_leading() == [h] and txn.added == {}
    assert txn.must_hold(batch(OTHER)) == (OTHER, 0)


def test_held_for_lists_the_batches_one_produce_waits_on(txn):
    one, two = object(), object()
    a, _, c = held(txn, delayed=one), held(txn, OTHER, delayed=two), held(txn, delayed=one)
    assert txn.held_for(one) == [a, c]


# ---- markers -------------------------------------------------------------------------------------
def test_a_marker_ends_the_transaction_here_and_forgets_the_coordinators_word(txn):
    txn.word_came(TxnAdded("t", 0, PID, 0))
    txn.log.append(batch())
    replicated(txn)
    assert txn.log.last_stable_offset == 0
    info = txn.write_marker(TxnMarker("t", 0, PID, 0, True, 0), leader_epoch=0)
    assert info.base_offset == 2 and txn.added == {}
    replicated(txn)
    assert txn.log.last_stable_offset == txn.log.log_end_offset == 3
    with pytest.raises(OdradekError) as old:
        txn.write_marker(TxnMarker("t", 0, PID, 0, False, 0)._replace(producer_epoch=-5), leader_epoch=0)
    assert old.value.code == ErrorCode.INVALID_PRODUCER_EPOCH


# ---- txn_check ------------------------------------------------------------------------------------
def test_a_check_waits_until_the_batches_are_written_and_replicated_to_enough_replicas(open_log, small_config):
    txn = TxnPartition("t", 0, open_log(dataclasses.replace(small_config, min_insync_replicas=2)))
    check, part = ask(last_seq=3)
    assert txn.check(part, in_sync=1) and check.waiting_on == [txn]
    txn.log.append(batch(seq=0))
    assert txn.settle(in_sync=1) == []  # sequence 1 of 3 written
    txn.log.append(batch(seq=2))
    assert txn.settle(in_sync=1) == []  # written, not yet under the high watermark
    replicated(txn)
    assert txn.settle(in_sync=1) == []  # the ISR is below min.insync.replicas
    assert txn.settle(in_sync=2) == [check] and txn.checks == [] and check.waiting_on == []
    assert check.body() == PartOutcomes([PartOutcome("t", 0, 0, "")])


def test_a_check_that_can_never_hold_is_answered_at_once(txn):
    txn.log.append(batch(epoch=3))
    replicated(txn)
    check, fenced = ask(epoch=2)
    assert not txn.check(fenced, in_sync=1)
    assert fenced.code == ErrorCode.INVALID_PRODUCER_EPOCH and "at epoch 3 here, not 2" in fenced.message
    txn.write_marker(TxnMarker("t", 0, PID, 3, True, 0), leader_epoch=0)
    replicated(txn)
    _, ended = ask(epoch=3)
    assert not txn.check(ended, in_sync=1)
    assert ended.code == ErrorCode.INVALID_TXN_STATE and check.waiting_on == [] and txn.checks == []


def test_an_expired_check_says_how_far_the_producer_got_and_leaves_the_other_checks_waiting(txn):
    txn.log.append(batch(seq=0))
    mine, part = ask(last_seq=5)
    other, other_part = ask(pid=OTHER, last_seq=0)
    txn.check(part, in_sync=1)
    txn.check(other_part, in_sync=1)
    txn.expire(mine)
    assert part.code == ErrorCode.CONCURRENT_TRANSACTIONS and mine.waiting_on == []
    assert "not written through sequence 5" in part.message and "epoch 0, last sequence 1" in part.message
    assert txn.checks == [other_part] and other_part.code == 0


def test_a_checks_answer_keeps_the_order_asked_with_malformed_entries_in_place():
    check, part = ask()
    bad = PartOutcome(None, None, int(ErrorCode.INVALID_REQUEST), "malformed")
    check.rows.insert(0, bad)
    part.code, part.message = int(ErrorCode.NOT_LEADER_OR_FOLLOWER), "not its leader"
    body = PartOutcomes._make(msgpack.unpackb(msgpack.packb(check.body())))  # as the coordinator receives it
    assert body.parts == [[None, None, ErrorCode.INVALID_REQUEST, "malformed"],
                          ["t", 0, ErrorCode.NOT_LEADER_OR_FOLLOWER, "not its leader"]]
    assert PartOutcome._make(body.parts[1]).code == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_the_typed_parts_travel_as_the_positional_lists_they_replaced():
    marker = TxnMarker("t", 3, PID, 2, True, 7)
    wire = WriteMarkers._make(msgpack.unpackb(msgpack.packb(WriteMarkers([marker])))).markers[0]
    assert wire == ["t", 3, PID, 2, True, 7] and TxnMarker._make(wire).commit is True
    with pytest.raises(TypeError):
        TxnMarker._make(wire[:5])  # a receiver refuses a short entry (the log actor: INVALID_REQUEST)
