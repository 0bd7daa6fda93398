"""The leader-epoch cache (log/epochs.py) and its use by Log: Kafka's LeaderEpochFileCache
semantics, the checkpoint file, and truncation by leader epoch (KIP-101 / KIP-279)."""
from __future__ import annotations

import errno
import logging
import os

import pytest

from odradek.core.config import LogConfig
from odradek.log.epochs import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache
from odradek.core.errors import InvalidRecordError
from odradek.log.log import Log
from odradek.core.records import BatchHeader
from tests.log.support import Clock, batch, log_batches


def cache_with(tmp_path, *entries) -> LeaderEpochCache:
    os.makedirs(tmp_path, exist_ok=True)
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, start in entries:
        assert cache.assign(epoch, start)
    return cache


def stored(lg: Log) -> list[tuple[int, int, int]]:
    """(base offset, CRC, partitionLeaderEpoch) of every stored batch."""
    out = []
    for raw in log_batches(lg):
        h = BatchHeader.read(raw)
        out.append((h.base_offset, h.crc, h.partition_leader_epoch))
    return out


def checkpoint_text(lg_or_dir) -> str:
    directory = lg_or_dir.dir if isinstance(lg_or_dir, Log) else str(lg_or_dir)
    with open(os.path.join(directory, LEADER_EPOCH_CHECKPOINT)) as f:
        return f.read()


# ---------------------------------------------------------------------- the cache on its own

def test_end_offset_for_gives_the_largest_epoch_at_or_below_the_request_and_where_it_ended(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    assert cache.end_offset_for(1, 30) == (1, 10)
    assert cache.end_offset_for(3, 30) == (3, 20)
    assert cache.end_offset_for(2, 30) == (1, 10)  # between entries: the one below, its end
    assert cache.end_offset_for(4, 30) == (3, 20)


def test_end_offset_for_the_latest_epoch_or_above_it_is_the_log_end(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    assert cache.end_offset_for(5, 30) == (5, 30)
    assert cache.end_offset_for(6, 30) == (5, 30)
    assert cache.end_offset_for(2 ** 31 - 1, 31) == (5, 31)


def test_end_offset_for_an_epoch_below_the_first_entry_or_an_empty_cache_is_undefined(tmp_path):
    cache = cache_with(tmp_path / "a", (2, 5), (4, 10))
    assert cache.end_offset_for(1, 30) == (-1, -1)
    assert cache.end_offset_for(-1, 30) == (-1, -1)
    empty = LeaderEpochCache(str(tmp_path / "b"))
    assert empty.latest_epoch == -1 and empty.entries == []
    assert empty.end_offset_for(0, 30) == (-1, -1) and empty.end_offset_for(7, 0) == (-1, -1)


def test_assign_ignores_an_epoch_not_newer_than_the_latest(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10))
    assert not cache.assign(3, 12)
    assert not cache.assign(2, 15)
    assert not cache.assign(-1, 20)
    assert cache.entries == [(1, 0), (3, 10)] and cache.latest_epoch == 3


def test_assign_below_the_previous_start_replaces_the_stale_tail(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (4, 20))
    assert cache.assign(6, 10)  # epochs 3 and 4 start at or after 10: they had no surviving data
    assert cache.entries == [(1, 0), (6, 10)] and cache.latest_epoch == 6
    assert cache.assign(7, 10)  # an epoch that never got data is replaced by the next one
    assert cache.entries == [(1, 0), (7, 10)]
    with pytest.raises(ValueError):
        cache.assign(8, -1)


def test_only_replacing_entries_that_held_data_is_warned_of(tmp_path, caplog):
    """A leader epoch bumped again before any append (each step of a reassignment) replaces
    one entry at the same offset: expected, not a warning (it was one at every step)."""
    cache = cache_with(tmp_path, (1, 0), (3, 10))
    with caplog.at_level(logging.WARNING, logger="odradek.log"):
        assert cache.assign(4, 10)
    assert cache.entries == [(1, 0), (4, 10)] and not caplog.records
    cache.assign(5, 20)
    with caplog.at_level(logging.WARNING, logger="odradek.log"):
        assert cache.assign(6, 15)  # epoch 5 started at 20, past this one's start: its data is gone
    assert cache.entries == [(1, 0), (4, 10), (6, 15)] and "replaces entries" in caplog.text


def test_truncate_from_end_drops_entries_starting_at_or_after_the_new_end(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    cache.truncate_from_end(40)
    assert cache.entries == [(1, 0), (3, 10), (5, 20)]
    cache.truncate_from_end(20)
    assert cache.entries == [(1, 0), (3, 10)] and cache.latest_epoch == 3
    cache.truncate_from_end(11)
    assert cache.entries == [(1, 0), (3, 10)]
    cache.truncate_from_end(10)
    assert cache.entries == [(1, 0)]
    cache.truncate_from_end(0)
    assert cache.entries == [] and cache.latest_epoch == -1


def test_truncate_from_start_moves_the_covering_entry_up_and_drops_earlier_ones(tmp_path):
    cache = cache_with(tmp_path, (1, 5), (3, 10), (5, 20))
    cache.truncate_from_start(2)  # below the first entry: nothing to do
    assert cache.entries == [(1, 5), (3, 10), (5, 20)]
    cache.truncate_from_start(7)
    assert cache.entries == [(1, 7), (3, 10), (5, 20)]
    cache.truncate_from_start(10)
    assert cache.entries == [(3, 10), (5, 20)]
    cache.truncate_from_start(15)
    assert cache.entries == [(3, 15), (5, 20)]
    cache.truncate_from_start(25)
    assert cache.entries == [(5, 25)] and cache.latest_epoch == 5


def test_the_cache_is_written_as_kafkas_text_checkpoint_and_read_back(tmp_path):
    cache_with(tmp_path, (1, 0), (3, 10))
    assert checkpoint_text(tmp_path) == "0\n2\n1 0\n3 10\n"
    again = LeaderEpochCache(str(tmp_path))
    assert again.entries == [(1, 0), (3, 10)] and again.latest_epoch == 3
    again.clear()
    assert checkpoint_text(tmp_path) == "0\n0\n"
    assert LeaderEpochCache(str(tmp_path)).entries == []


@pytest.mark.parametrize("content", [
    b"\x00\xff garbage", b"", b"1\n1\n0 0\n", b"0\n2\n1 0\n", b"0\n1\n1 0\n2 5\n", b"0\nx\n",
    b"0\n2\n3 0\n2 5\n", b"0\n2\n1 9\n2 5\n", b"0\n1\n1\n", b"0\n1\n-3 0\n", b"0\n1\n1 0 7\n",
])
def test_a_corrupt_checkpoint_file_starts_an_empty_cache_with_a_warning(tmp_path, caplog, content):
    (tmp_path / LEADER_EPOCH_CHECKPOINT).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="odradek.log"):
        cache = LeaderEpochCache(str(tmp_path))
    assert cache.entries == [] and cache.latest_epoch == -1
    assert LEADER_EPOCH_CHECKPOINT in caplog.text and "empty" in caplog.text


def test_a_missing_checkpoint_file_is_an_empty_cache_without_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="odradek.log"):
        cache = LeaderEpochCache(str(tmp_path / "not-created-yet"))
    assert cache.entries == [] and not caplog.records


# ---------------------------------------------------------------------- the cache in Log

def test_a_leader_append_stamps_its_epoch_in_the_batch_and_records_where_the_epoch_began(open_log):
    lg = open_log()
    lg.append(batch(3), leader_epoch=2)  # fast path (bytes)
    lg.append(batch(2), leader_epoch=2)
    lg.append(bytearray(batch(2)), leader_epoch=5)  # general path (patched in place)
    lg.append(batch(1) + batch(2), leader_epoch=6)  # general path, two batches: one entry
    assert [(base, epoch) for base, _crc, epoch in stored(lg)] == [(0, 2), (3, 2), (5, 5), (7, 6), (8, 6)]
    assert lg.leader_epochs.entries == [(2, 0), (5, 5), (6, 7)] and lg.latest_epoch == 6
    assert lg.end_offset_for_epoch(2) == (2, 5) and lg.end_offset_for_epoch(6) == (6, 10)
    assert checkpoint_text(lg) == "0\n3\n2 0\n5 5\n6 7\n"


def test_an_append_without_an_epoch_records_none(open_log):
    lg = open_log()
    lg.append(batch(2))
    lg.append(bytearray(batch(2)))
    assert [epoch for _b, _c, epoch in stored(lg)] == [-1, -1]
    assert lg.latest_epoch == -1 and lg.end_offset_for_epoch(0) == (-1, -1)
    assert not os.path.exists(os.path.join(lg.dir, LEADER_EPOCH_CHECKPOINT))


def test_an_older_epoch_after_a_newer_one_is_stamped_but_not_recorded(open_log):
    lg = open_log()
    lg.append(batch(2), leader_epoch=4)
    lg.append(batch(2), leader_epoch=3)  # a deposed leader's late append (the log actor fences these)
    assert lg.leader_epochs.entries == [(4, 0)]


def test_the_epochs_survive_close_and_reopen(open_log):
    lg = open_log()
    for epoch in (1, 1, 3, 3, 4):
        lg.append(batch(2), leader_epoch=epoch)
    lg.close()
    again = open_log()
    assert again.leader_epochs.entries == [(1, 0), (3, 4), (4, 8)] and again.latest_epoch == 4
    assert again.end_offset_for_epoch(2) == (1, 4) and again.end_offset_for_epoch(4) == (4, 10)


def test_the_epochs_survive_a_crash_too(open_log):
    lg = open_log()
    lg.append(batch(2), leader_epoch=1)
    lg.append(batch(2), leader_epoch=2)
    lg.abandon()  # no flush, no marker: recovery keeps the written batches
    again = open_log()
    assert again.log_end_offset == 4 and again.leader_epochs.entries == [(1, 0), (2, 2)]


def test_a_follower_append_keeps_the_leaders_epochs_and_bytes(open_log, tmp_path, clock, small_config):
    leader = open_log()
    for epoch in (1, 1, 3, 3, 4):
        leader.append(batch(2, tag=epoch), leader_epoch=epoch)
    one_by_one = Log(str(tmp_path / "one-0"), small_config, now_ms=clock)
    at_once = Log(str(tmp_path / "all-0"), small_config, now_ms=clock)
    try:
        for raw in log_batches(leader):
            one_by_one.append_as_follower(raw)
        at_once.append_as_follower(b"".join(log_batches(leader)))
        for follower in (one_by_one, at_once):
            assert follower.leader_epochs.entries == leader.leader_epochs.entries == [(1, 0), (3, 4), (4, 8)]
            assert log_batches(follower) == log_batches(leader)
    finally:
        one_by_one.abandon()
        at_once.abandon()


def test_a_follower_append_below_the_log_end_is_refused_and_changes_nothing(open_log, tmp_path, clock, small_config):
    leader = open_log()
    leader.append(batch(2), leader_epoch=1)
    leader.append(batch(2), leader_epoch=2)
    follower = Log(str(tmp_path / "f-0"), small_config, now_ms=clock)
    try:
        first, second = log_batches(leader)
        follower.append_as_follower(first + second)
        with pytest.raises(InvalidRecordError):
            follower.append_as_follower(second)
        assert follower.log_end_offset == 4 and follower.leader_epochs.entries == [(1, 0), (2, 2)]
    finally:
        follower.abandon()


def test_truncate_to_trims_the_epochs_to_the_new_log_end(open_log):
    lg = open_log()
    for epoch in (1, 2, 3):
        lg.append(batch(3), leader_epoch=epoch)  # epoch e holds offsets 3(e-1) .. 3e-1
    lg.truncate_to(7)  # inside epoch 3's batch: the whole batch goes, the end is 6
    assert lg.log_end_offset == 6 and lg.leader_epochs.entries == [(1, 0), (2, 3)]
    lg.truncate_to(4)
    assert lg.log_end_offset == 3 and lg.leader_epochs.entries == [(1, 0)]
    lg.close()
    assert open_log().leader_epochs.entries == [(1, 0)]


def test_truncate_to_the_log_end_drops_an_epoch_that_got_no_data(open_log):
    lg = open_log()
    lg.append(batch(3), leader_epoch=1)
    lg.leader_epochs.assign(2, lg.log_end_offset)  # became leader at 2, wrote nothing, then lost it
    lg.truncate_to(lg.log_end_offset)
    assert lg.log_end_offset == 3 and lg.leader_epochs.entries == [(1, 0)]


def test_truncating_fully_clears_the_epochs(open_log):
    lg = open_log()
    lg.append(batch(3), leader_epoch=1)
    lg.append(batch(3), leader_epoch=2)
    lg.truncate_to(0)
    assert lg.log_end_offset == 0 and lg.leader_epochs.entries == []
    lg.append(batch(3), leader_epoch=3)
    assert lg.leader_epochs.entries == [(3, 0)]


def test_truncate_fully_and_start_at_empties_the_log_at_that_offset(open_log, small_config):
    lg = open_log()
    for epoch in (1, 2):
        lg.append(batch(3), leader_epoch=epoch)
    lg.truncate_fully_and_start_at(100)
    assert (lg.log_start_offset, lg.log_end_offset, lg.high_watermark, lg.recovery_point) == (100, 100, 100, 100)
    assert lg.leader_epochs.entries == [] and [s.base_offset for s in lg.segments] == [100]
    leader = Log(os.path.join(os.path.dirname(lg.dir), "leader-0"), small_config)
    try:
        leader.truncate_fully_and_start_at(100)
        leader.append(batch(2), leader_epoch=7)
        lg.append_as_follower(log_batches(leader)[0])
    finally:
        leader.abandon()
    assert lg.leader_epochs.entries == [(7, 100)]
    lg.close()
    again = open_log()
    assert (again.log_start_offset, again.log_end_offset) == (100, 102)
    assert again.leader_epochs.entries == [(7, 100)]


def test_moving_the_log_start_moves_the_first_epoch_start(open_log):
    lg = open_log(LogConfig(segment_bytes=2048, retention_bytes=12000, file_delete_delay_ms=0))
    for i in range(40):  # 4 offsets per segment; epochs 1..4 of 20 offsets each
        lg.append(batch(2, size=300, comp=None, tag=i), leader_epoch=1 + i // 10)
    lg.high_watermark = lg.log_end_offset
    lg.delete_records_before(5)
    assert lg.leader_epochs.entries == [(1, 5), (2, 20), (3, 40), (4, 60)]
    lg.apply_retention()  # deletes whole segments by size: the log start jumps to 44
    assert lg.log_start_offset == 44
    assert lg.leader_epochs.entries == [(3, 44), (4, 60)]
    lg.close()
    assert open_log().leader_epochs.entries == [(3, 44), (4, 60)]


def test_opening_a_log_trims_a_checkpoint_newer_than_the_surviving_data(open_log):
    lg = open_log()
    lg.append(batch(3), leader_epoch=1)
    lg.close()
    # as if epoch 2 was recorded and its data lost in a crash
    with open(os.path.join(lg.dir, LEADER_EPOCH_CHECKPOINT), "w") as f:
        f.write("0\n2\n1 0\n2 3\n")
    again = open_log()
    assert again.leader_epochs.entries == [(1, 0)]
    assert checkpoint_text(again) == "0\n1\n1 0\n"


def test_a_log_with_a_corrupt_epoch_checkpoint_opens_with_no_epochs(open_log, caplog):
    lg = open_log()
    lg.append(batch(3), leader_epoch=1)
    lg.close()
    with open(os.path.join(lg.dir, LEADER_EPOCH_CHECKPOINT), "wb") as f:
        f.write(b"\x00garbage\n")
    with caplog.at_level(logging.WARNING, logger="odradek.log"):
        again = open_log()
    assert again.log_end_offset == 3 and again.leader_epochs.entries == []
    assert "leader-epoch" in caplog.text
    again.append(batch(1), leader_epoch=2)
    assert again.leader_epochs.entries == [(2, 3)]


def test_a_failed_checkpoint_write_keeps_the_append_and_is_retried_at_the_next_checkpoint(open_log, files, caplog):
    lg = open_log()
    files.fail("rename", errno.ENOSPC, match=LEADER_EPOCH_CHECKPOINT)
    with caplog.at_level(logging.WARNING, logger="odradek.log"):
        info = lg.append(batch(3), leader_epoch=1)
    assert info.base_offset == 0 and lg.log_end_offset == 3 and "leader-epoch" in caplog.text
    assert lg.leader_epochs.entries == [(1, 0)] and lg.leader_epochs.dirty
    lg.checkpoint()
    assert not lg.leader_epochs.dirty and checkpoint_text(lg) == "0\n1\n1 0\n"


# ---------------------------------------------------------------------- KIP-101 at the Log level

def _replicate(source: Log, target: Log, from_offset: int) -> None:
    data = source.fetch(from_offset, 1 << 30)
    if data:
        target.append_as_follower(data)


def _truncate_by_epoch(follower: Log, leader: Log) -> int:
    """What the replica fetcher does: ask the leader where our latest epoch ended, truncate to
    min(that, our own end of the epoch the leader named)."""
    epoch, end = leader.end_offset_for_epoch(follower.latest_epoch)
    if epoch == -1:
        target = follower.high_watermark  # no common epoch: fall back (not reached here)
    else:
        target = min(end, follower.end_offset_for_epoch(epoch)[1])
    follower.truncate_to(target)
    return target


def test_kip_101_a_follower_truncates_by_epoch_and_ends_byte_identical_to_the_new_leader(tmp_path):
    clock = Clock()
    cfg = LogConfig(segment_bytes=2048, index_interval_bytes=256)
    a = Log(str(tmp_path / "a" / "t-0"), cfg, now_ms=clock)
    b = Log(str(tmp_path / "b" / "t-0"), cfg, now_ms=clock)
    try:
        # epoch 1: B leads; A copies the first batch only, then B fails
        b.append(batch(3, tag=1), leader_epoch=1)
        _replicate(b, a, 0)
        b.append(batch(3, tag=2), leader_epoch=1)  # never replicated: not committed
        a.high_watermark = b.high_watermark = 3
        # epoch 2: A leads and writes different data at the same offsets
        a.append(batch(2, tag=3), leader_epoch=2)
        a.append(batch(4, tag=4), leader_epoch=2)
        assert b.log_end_offset == 6 and a.log_end_offset == 9
        # B returns as a follower
        assert a.end_offset_for_epoch(b.latest_epoch) == (1, 3)
        assert _truncate_by_epoch(b, a) == 3 and b.log_end_offset == 3
        _replicate(a, b, b.log_end_offset)
        assert stored(b) == stored(a)
        assert [(o, e) for o, _c, e in stored(b)] == [(0, 1), (3, 2), (5, 2)]
        assert log_batches(b) == log_batches(a)
        assert b.leader_epochs.entries == a.leader_epochs.entries == [(1, 0), (2, 3)]
    finally:
        a.abandon()
        b.abandon()


def test_kip_279_a_follower_whose_latest_epoch_the_leader_never_saw_truncates_where_the_leaders_epoch_ended(tmp_path):
    clock = Clock()
    a = Log(str(tmp_path / "a" / "t-0"), now_ms=clock)
    b = Log(str(tmp_path / "b" / "t-0"), now_ms=clock)
    try:
        a.append(batch(3, tag=1), leader_epoch=1)
        _replicate(a, b, 0)
        b.append(batch(3, tag=2), leader_epoch=2)  # B led epoch 2 alone; nobody copied it
        a.append(batch(2, tag=3), leader_epoch=3)  # A leads epoch 3 from offset 3
        assert a.end_offset_for_epoch(2) == (1, 3)
        assert _truncate_by_epoch(b, a) == 3
        _replicate(a, b, b.log_end_offset)
        assert log_batches(b) == log_batches(a)
        assert b.leader_epochs.entries == a.leader_epochs.entries == [(1, 0), (3, 3)]
    finally:
        a.abandon()
        b.abandon()
