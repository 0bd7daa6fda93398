"""Transactions in the log: transactional batches open a producer's transaction, a marker
(control batch) closes it, the last stable offset follows the earliest open transaction,
and aborted transactions land in ``aborted.txnindex`` (surviving a restart, a crash and a
truncation)."""
from __future__ import annotations

import pytest

from odradek.core import kafka_batch
from odradek.core.records import Record
from odradek.log.txn_index import AbortedTxn, TxnIndex
from odradek.core.protocol import ErrorCode, OdradekError

PID_A, PID_B = 7000, 8000


def txn_batch(pid: int, seq: int, n: int = 2, epoch: int = 0) -> bytes:
    recs = [Record(i, 1_700_000_000_000, None, b"v%d" % (seq + i), []) for i in range(n)]
    return kafka_batch.encode(recs, base_offset=0, first_timestamp=1_700_000_000_000,
                              max_timestamp=1_700_000_000_000, attributes=kafka_batch.TRANSACTIONAL_BIT,
                              producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def settle(lg):
    lg.high_watermark = lg.log_end_offset
    return lg


def test_an_open_transaction_holds_the_last_stable_offset_at_its_first_offset(open_log):
    lg = open_log()
    lg.append(txn_batch(PID_A, 0))          # 0..1, open
    lg.append(txn_batch(PID_B, 0))          # 2..3, open
    settle(lg)
    assert lg.last_stable_offset == 0
    lg.append_marker(PID_A, 0, commit=True)  # 4
    settle(lg)
    assert lg.last_stable_offset == 2
    lg.append_marker(PID_B, 0, commit=True)  # 5
    settle(lg)
    assert lg.last_stable_offset == lg.log_end_offset == 6
    assert lg.txn_index.entries == []


def test_an_abort_marker_records_the_aborted_range_in_the_index(open_log):
    lg = open_log()
    lg.append(txn_batch(PID_A, 0))          # 0..1
    lg.append(txn_batch(PID_B, 0))          # 2..3
    lg.append(txn_batch(PID_A, 2))          # 4..5
    lg.append_marker(PID_A, 0, commit=False)  # 6: PID_B still open from 2
    assert lg.txn_index.entries == [AbortedTxn(PID_A, 0, 6, 2)]
    assert lg.txn_index.aborted(0, 100) == [AbortedTxn(PID_A, 0, 6, 2)]
    assert lg.txn_index.aborted(7, 100) == []


def test_the_index_and_the_open_transactions_survive_a_clean_restart_and_a_crash(open_log, tmp_path):
    lg = open_log()
    lg.append(txn_batch(PID_A, 0))
    lg.append_marker(PID_A, 0, commit=False)  # 2
    lg.append(txn_batch(PID_B, 0))            # 3..4, left open
    lg.close()
    again = settle(open_log())
    assert again.txn_index.entries == [AbortedTxn(PID_A, 0, 2, 2)]
    assert again.last_stable_offset == 3
    again.abandon()  # a crash: no snapshot at the end, the log tail is replayed
    (tmp_path / "topic-0" / "aborted.txnindex").unlink()
    third = settle(open_log())
    assert third.last_stable_offset == 3


def test_a_truncation_drops_markers_and_reopens_their_transactions(open_log):
    lg = open_log()
    lg.append(txn_batch(PID_A, 0))            # 0..1
    lg.append_marker(PID_A, 0, commit=False)  # 2
    lg.truncate_to(2)
    settle(lg)
    assert lg.txn_index.entries == [] and lg.last_stable_offset == 0


def test_a_torn_last_index_entry_is_dropped_on_load(tmp_path):
    idx = TxnIndex(str(tmp_path))
    idx.add(AbortedTxn(1, 0, 5, 0))
    with open(idx.path, "ab") as f:
        f.write(b"\x00\x00\x01")
    assert TxnIndex(str(tmp_path)).entries == [AbortedTxn(1, 0, 5, 0)]


def test_a_marker_from_a_replaced_coordinator_is_fenced_and_the_fence_survives_a_restart_and_a_replay(
        open_log, tmp_path):
    """Kafka's coordinator epoch (the leader epoch of the transaction log partition whose
    leader wrote the marker): a deposed coordinator still retrying a marker its successor
    already wrote must not write it again, whatever a restart rebuilt from."""
    lg = open_log()
    lg.append(txn_batch(PID_A, 0))
    lg.append_marker(PID_A, 0, commit=True, coordinator_epoch=3)   # 2
    lg.append(txn_batch(PID_A, 2))                                  # 3..4, open
    end = lg.log_end_offset
    with pytest.raises(OdradekError) as fenced:
        lg.append_marker(PID_A, 0, commit=False, coordinator_epoch=2)
    assert fenced.value.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert "epoch 2" in fenced.value.message and "3" in fenced.value.message
    assert lg.log_end_offset == end and settle(lg).last_stable_offset == 3
    lg.close()
    again = open_log()  # from the snapshot written at close
    with pytest.raises(OdradekError):
        again.append_marker(PID_A, 0, commit=False, coordinator_epoch=2)
    again.abandon()
    for snap in (tmp_path / "topic-0").glob("*.snapshot"):
        snap.unlink()
    third = open_log()  # no snapshot: rebuilt from the markers' own values
    with pytest.raises(OdradekError):
        third.append_marker(PID_A, 0, commit=False, coordinator_epoch=2)
    third.append_marker(PID_A, 0, commit=True, coordinator_epoch=3)  # the same coordinator still may
    assert settle(third).last_stable_offset == third.log_end_offset
