"""Producer state: the idempotent producer's sequence checks, alone and inside ``Log``
(append, follower copy, snapshots, recovery, truncation, retention, expiration)."""
from __future__ import annotations

import os

import pytest

from odradek.core.config import LogConfig
from odradek.log.producer_state import (INT32_MAX, MAX_CACHED_BATCHES, BatchMetadata, DuplicateSequenceError,
                                        InvalidProducerEpochError, OutOfOrderSequenceError,
                                        ProducerStateManager, UnknownProducerIdError, decode_snapshot,
                                        encode_snapshot, last_sequence, snapshot_name)
from odradek.core.records import encode_batch
from odradek.core.protocol import ErrorCode
from tests.log.support import log_records

PID = 4000


def pbatch(seq: int, n: int = 3, pid: int = PID, epoch: int = 0, tag: bytes = b"v") -> bytes:
    return encode_batch([(None, tag + b"%d" % (seq + i)) for i in range(n)], "lz4", timestamp_ms=1_700_000_000_000,
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq)


# ---------------------------------------------------------------- the manager alone

@pytest.fixture
def state(tmp_path):
    return ProducerStateManager(str(tmp_path))


def test_a_new_producer_starting_at_sequence_zero_is_accepted_and_recorded(state):
    assert state.check(PID, 0, 0, 2) is None
    state.update(PID, 0, 0, 2, 10, 12, 5)
    assert state.get(PID).batches == [BatchMetadata(0, 2, 10, 12)] and state.get(PID).last_timestamp == 5


def test_a_retried_batch_among_the_last_cached_is_a_duplicate_with_its_original_offsets(state):
    n = MAX_CACHED_BATCHES
    for i in range(n + 1):
        state.update(PID, 0, i * 10, i * 10 + 9, i * 100, i * 100 + 9, 0)
    assert state.check(PID, 0, n * 10, n * 10 + 9) == BatchMetadata(n * 10, n * 10 + 9, n * 100, n * 100 + 9)
    assert state.check(PID, 0, 10, 19) == BatchMetadata(10, 19, 100, 109)  # the oldest one kept
    with pytest.raises(OutOfOrderSequenceError):  # the one before is forgotten: not the next either
        state.check(PID, 0, 0, 9)


def test_the_producer_never_stamps_more_batches_of_a_partition_than_a_leader_remembers():
    """A retry in doubt must be recognised: the bundled producer's window of stamped batches
    per partition fits in what a leader keeps per producer."""
    from odradek.producer_sender import MAX_STAMPED
    assert MAX_STAMPED <= MAX_CACHED_BATCHES


def test_a_full_window_of_batches_stays_compact(state):
    """A leader keeps this for every producer of every partition: 32 batches in about a
    kilobyte (16 named tuples of four ints took ~2.5 KB)."""
    import sys
    for i in range(3 * MAX_CACHED_BATCHES):
        state.update(PID, 0, i * 10, i * 10 + 9, 10**12 + i * 100, 10**12 + i * 100 + 9, 0)
    e = state.get(PID)
    assert len(e.batches) == MAX_CACHED_BATCHES and e.last_seq == 3 * MAX_CACHED_BATCHES * 10 - 1
    assert sys.getsizeof(e.window) <= 64 + 40 * MAX_CACHED_BATCHES


def test_a_gap_in_the_sequence_is_out_of_order(state):
    state.update(PID, 0, 0, 4, 0, 4, 0)
    assert state.check(PID, 0, 5, 9) is None
    with pytest.raises(OutOfOrderSequenceError) as e:
        state.check(PID, 0, 6, 9)
    assert e.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and "follow 4" in e.value.message


def test_an_older_epoch_is_fenced_and_a_newer_one_must_start_at_zero(state):
    state.update(PID, 3, 0, 4, 0, 4, 0)
    with pytest.raises(InvalidProducerEpochError) as e:
        state.check(PID, 2, 5, 9)
    assert e.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    with pytest.raises(OutOfOrderSequenceError):
        state.check(PID, 4, 5, 9)
    assert state.check(PID, 4, 0, 0) is None
    state.update(PID, 4, 0, 0, 5, 5, 0)
    assert state.get(PID).epoch == 4 and state.get(PID).batches == [BatchMetadata(0, 0, 5, 5)]


def test_an_unknown_producer_with_a_sequence_other_than_zero_is_unknown_producer_id(state):
    with pytest.raises(UnknownProducerIdError) as e:
        state.check(PID, 0, 7, 9)
    assert e.value.code == ErrorCode.UNKNOWN_PRODUCER_ID


def test_sequences_wrap_after_int32_max(state):
    assert last_sequence(INT32_MAX - 1, 3) == 1
    state.update(PID, 0, INT32_MAX - 2, INT32_MAX, 0, 2, 0)
    assert state.check(PID, 0, 0, 4) is None


def test_idle_producers_expire(state):
    state.expiration_ms = 1000
    state.update(PID, 0, 0, 0, 0, 0, 10_000)
    state.update(PID + 1, 0, 0, 0, 1, 1, 10_900)
    assert state.expire(11_500) == 1 and state.get(PID) is None and state.get(PID + 1) is not None


def test_a_snapshot_round_trips_and_a_damaged_one_is_refused(state):
    state.update(PID, 2, 0, 4, 0, 4, 7)
    state.update(PID + 1, 0, 0, 0, 5, 5, 8)
    data = encode_snapshot(state.producers)
    back = decode_snapshot(data)
    assert {p: (e.epoch, e.batches, e.last_timestamp) for p, e in back.items()} == \
        {p: (e.epoch, e.batches, e.last_timestamp) for p, e in state.producers.items()}
    damaged = bytearray(data)
    damaged[-1] ^= 1
    with pytest.raises(ValueError):
        decode_snapshot(bytes(damaged))
    with pytest.raises(ValueError):
        decode_snapshot(b"\x00")


def test_load_takes_the_latest_snapshot_at_or_below_the_log_end_and_deletes_later_ones(state, tmp_path):
    state.update(PID, 0, 0, 0, 0, 0, 0)
    state.snapshot(1)
    state.update(PID, 0, 1, 1, 1, 1, 0)
    state.snapshot(2)
    (tmp_path / snapshot_name(9)).write_bytes(b"garbage")
    assert state.load(5) == 2 and state.get(PID).last_seq == 1
    assert state.snapshot_offsets() == [1, 2]  # 9 is past the log end: deleted
    assert state.load(1) == 1 and state.get(PID).last_seq == 0 and state.snapshot_offsets() == [1]


# ---------------------------------------------------------------- inside the log

def test_the_log_answers_a_retried_batch_with_its_original_offsets_and_writes_nothing(open_log):
    lg = open_log()
    first = lg.append(pbatch(0))
    second = lg.append(pbatch(3))
    again = lg.append(pbatch(0))
    assert again.duplicate and (again.base_offset, again.last_offset) == (first.base_offset, first.last_offset)
    assert lg.log_end_offset == second.last_offset + 1 == 6
    assert [r.value for r in log_records(lg)] == [b"v%d" % i for i in range(6)]


def test_the_log_refuses_a_gap_and_an_old_epoch_with_nothing_written(open_log):
    lg = open_log()
    lg.append(pbatch(0, epoch=1))
    with pytest.raises(OutOfOrderSequenceError):
        lg.append(pbatch(5, epoch=1))
    with pytest.raises(InvalidProducerEpochError):
        lg.append(pbatch(3, epoch=0))
    with pytest.raises(UnknownProducerIdError):
        lg.append(pbatch(3, pid=PID + 9))
    assert lg.log_end_offset == 3


def test_several_batches_in_one_append_are_checked_in_turn(open_log):
    lg = open_log()
    info = lg.append(pbatch(0) + pbatch(3))
    assert (info.base_offset, info.last_offset) == (0, 5) and lg.producers.get(PID).last_seq == 5
    with pytest.raises(OutOfOrderSequenceError):
        lg.append(pbatch(6) + pbatch(10))
    with pytest.raises(DuplicateSequenceError):
        lg.append(pbatch(3) + pbatch(6))
    assert lg.log_end_offset == 6


def test_a_follower_copies_the_producer_state_so_a_new_leader_recognises_a_retry(open_log, tmp_path, clock, files):
    from odradek.log.log import Log
    leader = open_log()
    leader.append(pbatch(0))
    leader.append(pbatch(3))
    follower = Log(str(tmp_path / "follower-0"), LogConfig(), now_ms=clock, files=files)
    try:
        follower.append_as_follower(leader.fetch(0, 1 << 20))
        dup = follower.append(pbatch(3))
        assert dup.duplicate and dup.base_offset == 3
    finally:
        follower.abandon()


def test_producer_state_survives_a_clean_close_through_its_snapshot(open_log, tmp_path):
    lg = open_log()
    lg.append(pbatch(0))
    lg.close()
    assert os.path.exists(tmp_path / "topic-0" / snapshot_name(3))
    again = open_log()
    assert again.append(pbatch(0)).duplicate and again.append(pbatch(3)).base_offset == 3


def test_producer_state_survives_a_crash_by_replaying_the_log_after_the_last_snapshot(open_log, tmp_path):
    lg = open_log()  # small segments: several rolls, so snapshots at the rolls and a tail after them
    for seq in range(0, 90, 3):
        lg.append(pbatch(seq, tag=b"x" * 40))
    snaps = sorted(n for n in os.listdir(tmp_path / "topic-0") if n.endswith(".snapshot"))
    assert snaps, "the rolls wrote snapshots"
    lg.abandon()  # a crash: no close, no snapshot at the end
    again = open_log()
    assert again.append(pbatch(87, tag=b"x" * 40)).duplicate
    assert again.append(pbatch(90)).base_offset == 90


def test_producer_state_is_rebuilt_without_any_snapshot(open_log, tmp_path):
    lg = open_log()
    for seq in range(0, 30, 3):
        lg.append(pbatch(seq, tag=b"x" * 40))
    lg.close()
    for n in os.listdir(tmp_path / "topic-0"):
        if n.endswith(".snapshot"):
            os.unlink(tmp_path / "topic-0" / n)
    again = open_log()
    assert again.producers.get(PID).last_seq == 29 and again.append(pbatch(27, tag=b"x" * 40)).duplicate


def test_truncation_takes_the_producer_state_back_with_the_log(open_log):
    lg = open_log()
    for seq in range(0, 60, 3):
        lg.append(pbatch(seq, tag=b"x" * 40))
    lg.truncate_to(30)
    assert lg.log_end_offset == 30 and lg.producers.get(PID).last_seq == 29
    assert lg.append(pbatch(30)).base_offset == 30  # the cut batches are not duplicates now
    lg.truncate_fully_and_start_at(100)
    assert lg.producers.get(PID) is None and not lg.producers.snapshot_offsets()


def test_retention_keeps_the_producer_state_and_the_newest_snapshot(open_log, clock, tmp_path):
    lg = open_log(LogConfig(segment_bytes=1024, retention_ms=1000, file_delete_delay_ms=0))
    for seq in range(0, 60, 3):
        lg.append(pbatch(seq, tag=b"x" * 40))
    clock.now += 10**13
    assert lg.apply_retention() > 0
    offsets = lg.producers.snapshot_offsets()
    assert offsets and all(o >= lg.segments[0].base_offset for o in offsets[:-1])
    assert lg.append(pbatch(57, tag=b"x" * 40)).duplicate


def test_expired_producers_must_start_again_at_sequence_zero(open_log, clock):
    lg = open_log()
    lg.producers.expiration_ms = 1000
    lg.append(pbatch(0))
    assert lg.expire_producers(1_700_000_000_000 + 5000) == 1
    with pytest.raises(UnknownProducerIdError):
        lg.append(pbatch(3))


def test_a_kafka_transactional_batch_without_a_producer_id_is_refused(open_log):
    from odradek.core import kafka_batch
    from odradek.log.producer_state import InvalidTxnStateError
    from odradek.core.records import Record
    recs = [Record(0, 1_700_000_000_000, None, b"v", [])]
    txn = kafka_batch.encode(recs, base_offset=0, first_timestamp=1_700_000_000_000, max_timestamp=1_700_000_000_000,
                             attributes=kafka_batch.TRANSACTIONAL_BIT, producer_id=-1, producer_epoch=-1,
                             base_sequence=-1)
    lg = open_log()
    with pytest.raises(InvalidTxnStateError) as e:
        lg.append(txn)
    assert e.value.code == ErrorCode.INVALID_TXN_STATE and lg.log_end_offset == 0
