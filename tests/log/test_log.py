"""Log: append, read, roll, retention, truncation, flush, checkpoints, bad input and faults."""
from __future__ import annotations

import errno
import os

import pytest

from odradek.core.config import LogConfig
from odradek.core.errors import (CorruptRecordError, InvalidRecordError, OffsetOutOfRangeError,
                        RecordTooLargeError, StorageError)
from odradek.core.records import BatchHeader, decode_batch, iter_batches
from tests.log.support import batch, log_batches, log_records


def test_appends_get_consecutive_offsets_and_report_where_they_went(open_log, clock):
    lg = open_log()
    a = lg.append(batch(3))
    b = lg.append(batch(2))
    assert (a.base_offset, a.last_offset, b.base_offset, b.last_offset) == (0, 2, 3, 4)
    assert (a.position, a.segment_base, b.position) == (0, 0, a.size)
    assert a.append_time_ms == clock.now and lg.log_end_offset == 5
    assert [r.offset for r in log_records(lg)] == [0, 1, 2, 3, 4]


def test_an_appended_batch_is_stored_byte_for_byte_apart_from_its_base_offset(open_log):
    lg = open_log()
    lg.append(batch(1))
    original = batch(4, tag=7)
    info = lg.append(original, leader_epoch=3)
    stored = log_batches(lg)[1]
    h = BatchHeader.read(stored)
    assert (h.base_offset, h.partition_leader_epoch) == (info.base_offset, 3)
    assert stored[12:16] != original[12:16] and stored[16:] == original[16:]


def test_a_corrupt_batch_is_refused_and_nothing_is_written(open_log):
    lg = open_log()
    lg.append(batch(2))
    bad = bytearray(batch(2))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError) as e:
        lg.append(bytes(bad))
    assert e.value.code.name == "CORRUPT_MESSAGE"
    assert lg.log_end_offset == 2 and lg.active_segment.size == os.path.getsize(lg.active_segment.log_path)


def test_an_oversized_batch_is_refused_with_message_too_large(open_log, small_config):
    lg = open_log(LogConfig(max_message_bytes=500))
    with pytest.raises(RecordTooLargeError) as e:
        lg.append(batch(1, size=600, comp=None))
    assert e.value.code.name == "MESSAGE_TOO_LARGE" and lg.log_end_offset == 0


def test_reads_return_whole_batches_up_to_max_bytes_and_always_at_least_one(open_log):
    lg = open_log()
    sizes = [lg.append(batch(2, tag=i)).size for i in range(5)]
    one = lg.read(0, 1)
    assert one.size == sizes[0] and one.first_offset == 0
    two = lg.read(0, sizes[0] + sizes[1] + sizes[2] - 1)
    assert two.size == sizes[0] + sizes[1]
    assert lg.read(0, 10_000).size == sum(sizes)


def test_an_offset_inside_a_batch_returns_that_batch(open_log):
    lg = open_log()
    lg.append(batch(5))
    lg.append(batch(5))
    r = lg.read(7, 1)
    assert r.first_offset == 5
    assert [x.offset for x in decode_batch(r.read_bytes())] == [5, 6, 7, 8, 9]


def test_reads_stop_below_the_upper_bound_and_at_the_end(open_log):
    lg = open_log()
    for i in range(4):
        lg.append(batch(2, tag=i))
    r = lg.read(0, 10_000, upper_bound=4)
    assert [h.base_offset for _, h in iter_batches(r.read_bytes())] == [0, 2]
    assert lg.read(8, 100).slices == ()
    assert lg.read(4, 100, upper_bound=4).slices == ()


def test_offsets_outside_the_log_are_out_of_range(open_log):
    lg = open_log()
    lg.append(batch(2))
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(3, 100)
    lg.high_watermark = 2
    lg.delete_records_before(1)
    with pytest.raises(OffsetOutOfRangeError) as e:
        lg.read(0, 100)
    assert e.value.code.name == "OFFSET_OUT_OF_RANGE"


def test_segments_roll_on_size_and_reads_cross_them(open_log):
    lg = open_log()
    for i in range(60):
        lg.append(batch(2, tag=i))
    assert len(lg.segments) > 3
    assert all(s.size <= 2048 for s in lg.segments)
    assert [r.offset for r in log_records(lg)] == list(range(120))
    names = sorted(os.listdir(lg.dir))
    assert "00000000000000000000.log" in names and "00000000000000000000.timeindex" in names


def test_segments_roll_on_age(open_log, clock):
    lg = open_log(LogConfig(segment_ms=1000))
    lg.append(batch(1))
    clock.advance(999)
    lg.append(batch(1))
    clock.advance(1)
    info = lg.append(batch(1))
    assert info.segment_base == 2 and len(lg.segments) == 2


def test_segments_roll_when_the_index_is_full(open_log):
    lg = open_log(LogConfig(index_interval_bytes=0, segment_index_bytes=60))  # 5 entries
    for _ in range(12):
        lg.append(batch(1))
    assert len(lg.segments) >= 3
    assert [r.offset for r in log_records(lg)] == list(range(12))


def test_closed_segments_have_trimmed_indexes(open_log):
    lg = open_log()
    for i in range(40):
        lg.append(batch(2, tag=i))
    first = lg.segments[0]
    assert os.path.getsize(first.index_path) % 8 == 0
    assert os.path.getsize(first.index_path) < 240
    assert os.path.getsize(lg.active_segment.index_path) == 240 // 12 * 8


def test_lookups_use_the_index_not_a_scan_from_the_segment_start(open_log, files):
    lg = open_log(LogConfig(index_interval_bytes=128, segment_bytes=1 << 20))
    for i in range(400):
        lg.append(batch(1, tag=i))
    seg = lg.active_segment
    reads = []
    real = seg.pread
    seg.pread = lambda n, pos: reads.append(pos) or real(n, pos)
    assert lg.read(390, 1).first_offset == 390
    assert len(reads) <= 6  # index entry's batch, the target, the span check; not 390 headers
    assert not seg.index_suspect


def test_offset_for_time_finds_the_first_record_at_or_after_the_timestamp(open_log):
    lg = open_log()
    for i in range(50):
        lg.append(batch(2, ts=1000 + 10 * i, tag=i))
    assert tuple(lg.offset_for_time(1000)) == (1000, 0)
    assert tuple(lg.offset_for_time(1205)) == (1210, 42)
    assert lg.offset_for_time(5000) is None
    assert lg.offset_for_time(-2).offset == 0 and lg.offset_for_time(-1).offset == 100


def test_offset_for_time_with_out_of_order_timestamps(open_log):
    lg = open_log()
    stamps = [50, 10, 70, 20, 90, 30, 100, 60]
    for i, ts in enumerate(stamps * 4):
        lg.append(batch(1, ts=ts, tag=i))
    for target in (5, 15, 55, 65, 95, 100):
        expect = next(i for i, ts in enumerate(stamps * 4) if ts >= target)
        assert lg.offset_for_time(target).offset == expect


def test_high_watermark_is_clamped_between_start_and_end(open_log):
    lg = open_log()
    lg.append(batch(3))
    lg.high_watermark = 10
    assert lg.high_watermark == 3
    lg.high_watermark = -5
    assert lg.high_watermark == 0


def test_truncate_to_removes_whole_batches_and_appends_continue_there(open_log):
    lg = open_log()
    for i in range(40):
        lg.append(batch(2, tag=i))
    kept = log_batches(lg)[:15]
    lg.truncate_to(30)
    assert lg.log_end_offset == 30 and log_batches(lg) == kept
    assert lg.append(batch(1)).base_offset == 30
    lg.truncate_to(31)  # straddling nothing: no-op at the end
    lg.truncate_to(29)  # inside batch [28, 29]: the whole batch goes
    assert lg.log_end_offset == 28


def test_truncate_below_the_start_empties_the_log_and_restarts_there(open_log):
    lg = open_log()
    for i in range(20):
        lg.append(batch(2, tag=i))
    lg.truncate_to(0)
    assert (lg.log_start_offset, lg.log_end_offset, len(lg.segments)) == (0, 0, 1)
    assert lg.append(batch(1)).base_offset == 0


def test_delete_records_before_advances_the_start_and_drops_whole_segments(open_log, clock):
    lg = open_log()
    for i in range(60):
        lg.append(batch(2, tag=i))
    lg.high_watermark = lg.log_end_offset
    before = len(lg.segments)
    second = lg.segments[1].base_offset
    assert lg.delete_records_before(second + 1) == second + 1
    assert len(lg.segments) == before - 1
    assert any(n.endswith(".deleted") for n in os.listdir(lg.dir))
    clock.advance(1000)
    lg.delete_expired_files()
    assert not any(n.endswith(".deleted") for n in os.listdir(lg.dir))
    with pytest.raises(OffsetOutOfRangeError):
        lg.delete_records_before(lg.log_end_offset + 1)


def test_retention_by_time_deletes_old_closed_segments_only(open_log, clock):
    lg = open_log(LogConfig(segment_bytes=2048, retention_ms=10_000, file_delete_delay_ms=0))
    for i in range(30):
        lg.append(batch(2, ts=clock.now - 20_000, tag=i))
    for i in range(30):
        lg.append(batch(2, ts=clock.now, tag=i))
    old_end = lg.log_end_offset
    deleted = lg.apply_retention()
    assert deleted > 0
    assert all(s.max_timestamp >= clock.now - 10_000 for s in lg.segments[:-1])
    assert lg.log_start_offset == lg.segments[0].base_offset and lg.log_end_offset == old_end
    assert not any(n.endswith(".deleted") for n in os.listdir(lg.dir))


def test_retention_by_size_keeps_at_most_the_limit(open_log):
    lg = open_log(LogConfig(segment_bytes=2048, retention_bytes=5000))
    for i in range(100):
        lg.append(batch(2, tag=i))
    lg.apply_retention()
    assert lg.size - lg.segments[0].size < 5000 <= lg.size + 2048
    assert [r.offset for r in log_records(lg)][-1] == 199


def test_the_active_segment_is_never_deleted_by_retention(open_log, clock):
    lg = open_log(LogConfig(retention_ms=0, retention_bytes=0))
    lg.append(batch(2, ts=1))
    lg.apply_retention()
    assert lg.log_end_offset == 2 and len(lg.segments) == 1


def test_flush_messages_1_fsyncs_every_append_and_moves_the_recovery_point(open_log, files):
    lg = open_log(LogConfig(flush_messages=1))
    before = files.calls.get("fsync", 0)
    lg.append(batch(2))
    lg.append(batch(2))
    assert files.calls["fsync"] - before == 2 and lg.recovery_point == 4


def test_flush_ms_flushes_when_time_passes(open_log, files, clock):
    lg = open_log(LogConfig(flush_ms=100))
    lg.append(batch(2))
    assert lg.recovery_point == 0
    clock.advance(100)
    assert lg.maybe_flush() and lg.recovery_point == 2


def test_checkpoint_is_written_by_rename_and_read_back(open_log, files):
    lg = open_log()
    lg.append(batch(5))
    lg.high_watermark = 4
    lg.flush()
    lg.checkpoint()
    text = open(os.path.join(lg.dir, "partition.checkpoint")).read()
    assert "recovery_point 5" in text and "high_watermark 4" in text
    assert files.calls["rename"] >= 1 and not os.path.exists(os.path.join(lg.dir, "partition.checkpoint.tmp"))
    lg.close()
    again = Log_reopen(open_log)
    assert (again.high_watermark, again.recovery_point, again.log_end_offset) == (4, 5, 5)


def Log_reopen(open_log):
    return open_log()


def test_follower_appends_keep_leader_offsets_and_refuse_going_backwards(open_log):
    open_log()  # the leader's log, beside the follower's
    b1 = bytearray(batch(3))
    from odradek.core.records import patch_base_offset
    patch_base_offset(b1, 10, 7)
    follower = open_log()
    info = follower.append_as_follower(bytes(b1))
    assert (info.base_offset, info.last_offset, follower.log_end_offset) == (10, 12, 13)
    assert BatchHeader.read(log_batches(follower)[0]).partition_leader_epoch == 7
    with pytest.raises(InvalidRecordError):
        follower.append_as_follower(bytes(b1))


def test_log_append_time_topics_stamp_batches_with_the_broker_clock(open_log, clock):
    lg = open_log(LogConfig(message_timestamp_type="LogAppendTime"))
    lg.append(batch(2, ts=5))
    assert {r.timestamp for r in log_records(lg)} == {clock.now}


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_leaves_nothing_and_the_log_works_once_the_fault_clears(open_log, files, err):
    lg = open_log()
    lg.append(batch(2))
    before = log_batches(lg)
    files.half_write_then_fail = True
    if err == errno.EIO:
        files.half_write_then_fail = False
        files.fail("pwrite", err)
    with pytest.raises(StorageError) as e:
        lg.append(batch(2, tag=1))
    assert e.value.code.name == "KAFKA_STORAGE_ERROR" and e.value.retriable
    assert lg.log_end_offset == 2 and log_batches(lg) == before
    assert os.path.getsize(lg.active_segment.log_path) == lg.active_segment.size
    assert lg.append(batch(2, tag=2)).base_offset == 2


def test_when_even_the_cleanup_truncate_fails_the_next_append_repairs_first(open_log, files):
    lg = open_log()
    lg.append(batch(2))
    files.half_write_then_fail = True
    files.fail("ftruncate")
    with pytest.raises(StorageError):
        lg.append(batch(2, tag=1))
    assert os.path.getsize(lg.active_segment.log_path) > lg.active_segment.size
    files.fail("ftruncate")
    with pytest.raises(StorageError):
        lg.append(batch(2, tag=2))
    assert lg.append(batch(2, tag=3)).base_offset == 2
    assert [r.value[:10] for r in log_records(lg)][2:] == [b"00000003-0", b"00000003-1"]


def test_a_failed_roll_raises_storage_error_and_keeps_the_log_usable(open_log, files):
    lg = open_log()
    failed = False
    while not failed:
        files.fail("open_create", errno.ENOSPC, match=".log")
        try:
            lg.append(batch(4))
        except StorageError:
            failed = True
        files.clear()
    assert len(lg.segments) == 1
    end = lg.log_end_offset
    assert lg.append(batch(4)).base_offset == end
    assert [r.offset for r in log_records(lg)] == list(range(end + 4))


def test_reads_from_a_reopened_log_are_byte_identical(open_log):
    lg = open_log()
    for i in range(50):
        lg.append(batch(3, tag=i))
    before = log_batches(lg)
    lg.close()
    again = open_log()
    assert again.recovery_report.clean and log_batches(again) == before
    assert not os.path.exists(os.path.join(again.dir, ".clean_shutdown"))


def test_crc_checked_appends_skip_only_the_crc(open_log):
    lg = open_log()
    bad = bytearray(batch(2))
    bad[-1] ^= 1
    assert lg.append(bytes(bad), crc_checked=True).base_offset == 0  # the caller vouched for it
    worse = bytearray(batch(2))
    worse[16] = 3  # magic is still checked (an unknown one: 2 is Kafka's, stored too)
    with pytest.raises(CorruptRecordError, match="magic"):
        lg.append(bytes(worse), crc_checked=True)


def test_a_read_only_buffer_is_appended_without_being_modified(open_log):
    lg = open_log()
    lg.append(batch(2))
    frame = batch(3, tag=5)
    view = memoryview(frame)  # read-only, like a ZeroMQ frame
    info = lg.append(view, leader_epoch=4)
    stored = log_batches(lg)[1]
    assert BatchHeader.read(frame).base_offset == 0  # the caller's bytes are untouched
    h = BatchHeader.read(stored)
    assert (h.base_offset, h.partition_leader_epoch) == (info.base_offset, 4) == (2, 4)
    assert stored[16:] == frame[16:]
    assert [r.offset for r in decode_batch(stored)] == [2, 3, 4]


def test_a_writable_buffer_is_patched_in_place(open_log):
    lg = open_log()
    lg.append(batch(2))
    buf = bytearray(batch(1))
    lg.append(buf, leader_epoch=2)
    assert BatchHeader.read(buf).base_offset == 2 and bytes(buf) == log_batches(lg)[1]


def test_several_batches_in_one_append_get_consecutive_offsets(open_log):
    lg = open_log()
    info = lg.append(memoryview(batch(2) + batch(3, tag=1)))
    assert (info.base_offset, info.last_offset) == (0, 4)
    assert [BatchHeader.read(b).base_offset for b in log_batches(lg)] == [0, 2]
