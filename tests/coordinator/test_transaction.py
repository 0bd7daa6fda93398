"""The transaction coordinator's state machine alone (coordinator/transaction.py)."""
from __future__ import annotations

import itertools

import pytest

from odradek.coordinator.transaction import MAX_EPOCH, Transaction, TransactionManager, TxnState
from odradek.core.protocol import ErrorCode, OdradekError

T = 60000


@pytest.fixture
def tm():
    ids = itertools.count(100)
    return TransactionManager(lambda: next(ids), max_timeout_ms=120000)


def code_of(fn, *args, **kw) -> ErrorCode:
    with pytest.raises(OdradekError) as e:
        fn(*args, **kw)
    return e.value.code


def test_a_new_transactional_id_gets_a_producer_id_at_epoch_zero_and_a_restart_bumps_the_epoch(tm):
    t = tm.init_producer_id("app", T, now=0)
    assert (t.producer_id, t.epoch, t.state) == (100, 0, TxnState.EMPTY)
    again = tm.init_producer_id("app", T, now=1)
    assert (again.producer_id, again.epoch) == (100, 1)
    assert tm.init_producer_id("other", T, now=1).producer_id == 101


def test_a_zombie_with_the_old_epoch_is_fenced(tm):
    tm.init_producer_id("app", T, now=0)
    tm.init_producer_id("app", T, now=1)  # a new instance: epoch 1
    assert code_of(tm.add_partitions, "app", 100, 0, [("t", 0)], 2) == ErrorCode.PRODUCER_FENCED
    assert code_of(tm.end_txn, "app", 100, 0, True, 2) == ErrorCode.PRODUCER_FENCED
    assert code_of(tm.add_partitions, "app", 999, 1, [("t", 0)], 2) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert code_of(tm.init_producer_id, "app", T, 3, expected_pid=100, expected_epoch=0) == ErrorCode.PRODUCER_FENCED


def test_commit_goes_through_prepare_to_complete_once_every_marker_is_written(tm):
    tm.init_producer_id("app", T, now=0)
    t = tm.add_partitions("app", 100, 0, [("a", 0), ("b", 1)], now=5)
    assert t.state == TxnState.ONGOING and t.started_ms == 5
    t = tm.end_txn("app", 100, 0, True, now=6)
    assert t.state == TxnState.PREPARE_COMMIT and t.pending_markers == {("a", 0), ("b", 1)}
    assert code_of(tm.add_partitions, "app", 100, 0, [("a", 0)], 7) == ErrorCode.CONCURRENT_TRANSACTIONS
    assert code_of(tm.end_txn, "app", 100, 0, True, 7) == ErrorCode.CONCURRENT_TRANSACTIONS
    tm.markers_written("app", [("a", 0)], 8)
    assert t.state == TxnState.PREPARE_COMMIT
    tm.markers_written("app", [("b", 1)], 9)
    assert t.state == TxnState.COMPLETE_COMMIT
    assert tm.end_txn("app", 100, 0, True, 10) is t  # a retried EndTxn: answered again


def test_committing_an_aborted_transaction_is_an_invalid_state(tm):
    tm.init_producer_id("app", T, now=0)
    tm.add_partitions("app", 100, 0, [("a", 0)], now=1)
    tm.end_txn("app", 100, 0, False, now=2)
    tm.markers_written("app", [("a", 0)], 3)
    assert code_of(tm.end_txn, "app", 100, 0, True, 4) == ErrorCode.INVALID_TXN_STATE


def test_the_next_transaction_starts_afresh_after_a_complete_one(tm):
    tm.init_producer_id("app", T, now=0)
    tm.add_partitions("app", 100, 0, [("a", 0)], now=1)
    tm.end_txn("app", 100, 0, True, now=2)
    tm.markers_written("app", [("a", 0)], 3)
    t = tm.add_partitions("app", 100, 0, [("b", 0)], now=4)
    assert t.state == TxnState.ONGOING and t.partitions == {("b", 0)} and t.started_ms == 4


def test_a_restart_during_an_open_transaction_aborts_it_and_fences_the_old_instance(tm):
    tm.init_producer_id("app", T, now=0)
    tm.add_partitions("app", 100, 0, [("a", 0)], now=1)
    assert code_of(tm.init_producer_id, "app", T, 2) == ErrorCode.CONCURRENT_TRANSACTIONS
    t = tm.txns["app"]
    assert t.state == TxnState.PREPARE_ABORT and t.epoch == 1 and t.pending_markers == {("a", 0)}
    assert code_of(tm.add_partitions, "app", 100, 0, [("a", 0)], 3) == ErrorCode.PRODUCER_FENCED
    tm.markers_written("app", [("a", 0)], 4)
    t = tm.init_producer_id("app", T, 5)
    assert (t.epoch, t.state) == (2, TxnState.EMPTY)


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(tm):
    tm.init_producer_id("app", 1000, now=0)
    tm.add_partitions("app", 100, 0, [("a", 0)], now=10)
    assert tm.expire(now=1000) == []
    expired = tm.expire(now=1011)
    assert [t.txn_id for t in expired] == ["app"] and expired[0].state == TxnState.PREPARE_ABORT
    assert expired[0].epoch == 1
    assert code_of(tm.end_txn, "app", 100, 0, True, 1012) == ErrorCode.PRODUCER_FENCED


def test_a_timeout_out_of_range_is_refused(tm):
    assert code_of(tm.init_producer_id, "app", 0, 0) == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert code_of(tm.init_producer_id, "app", 120001, 0) == ErrorCode.INVALID_TRANSACTION_TIMEOUT


def test_the_epoch_running_out_gives_a_new_producer_id(tm):
    t = tm.init_producer_id("app", T, now=0)
    t.epoch = MAX_EPOCH - 1
    t = tm.init_producer_id("app", T, now=1)
    assert (t.producer_id, t.epoch) == (101, 0)


def test_a_transaction_round_trips_through_its_record_and_a_preparing_one_owes_its_markers(tm):
    tm.init_producer_id("app", T, now=0)
    tm.add_partitions("app", 100, 0, [("a", 0), ("b", 2)], now=1)
    t = tm.end_txn("app", 100, 0, True, now=2)
    back = Transaction.from_record(*t.to_record())
    assert (back.txn_id, back.producer_id, back.epoch, back.state, back.partitions) == \
        ("app", 100, 0, TxnState.PREPARE_COMMIT, {("a", 0), ("b", 2)})
    assert back.pending_markers == {("a", 0), ("b", 2)}
    with pytest.raises(ValueError):
        Transaction.from_record(b"app", b"\x01garbage")


def test_txn_offsets_need_add_offsets_first_and_travel_in_the_durable_record(tm):
    t = tm.init_producer_id("app", 60000, now=0)
    pid, epoch = t.producer_id, t.epoch
    tm.add_partitions("app", pid, epoch, [("out", 0)], now=1)
    with pytest.raises(OdradekError) as e:
        tm.commit_offsets("app", pid, epoch, "g1", [["in", 0, 5, -1, ""]], now=2)
    assert e.value.code == ErrorCode.INVALID_TXN_STATE and "AddOffsetsToTxn" in e.value.message
    tm.add_group("app", pid, epoch, "g1", ("__consumer_offsets", 0), now=3)
    tm.commit_offsets("app", pid, epoch, "g1", [["in", 0, 5, -1, ""]], now=4)
    tm.commit_offsets("app", pid, epoch, "g1", [["in", 0, 7, -1, "m"], ["in", 1, 2, -1, ""]], now=5)
    again = Transaction.from_record(*t.to_record())
    assert again.offsets == {"g1": [["in", 0, 7, -1, "m"], ["in", 1, 2, -1, ""]]}
    tm.end_txn("app", pid, epoch, commit=False, now=6)
    tm.markers_written("app", list(t.pending_markers), now=7)
    tm.add_partitions("app", pid, epoch, [("out", 0)], now=8)  # the next transaction starts clean
    assert t.offsets == {} and t.groups == set()
