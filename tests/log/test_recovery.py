"""Crash recovery, in the spirit of Kafka's LogLoaderTest: damage the files, reopen, check that
every record before the damage is byte-identical and appends continue at the right offset."""
from __future__ import annotations

import os
import random
import shutil

import pytest

from odradek.core.config import LogConfig
from odradek.log.log import Log
from odradek.core.records import BatchHeader
from tests.log.support import Crash, FaultyFiles, batch, log_batches

CFG = LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_index_bytes=240,
                file_delete_delay_ms=0)


def build(path, n=40, flush_every=None, cfg=CFG):
    """A log with ``n`` batches (2 records each); returns its batches as bytes."""
    lg = Log(str(path), cfg)
    for i in range(n):
        lg.append(batch(2, tag=i))
        if flush_every and i % flush_every == flush_every - 1:
            lg.flush()
    lg.checkpoint()
    out = log_batches(lg)
    lg.abandon()  # a crash: no flush, no marker
    return out


def reopen(path, cfg=CFG, files=None):
    return Log(str(path), cfg, files=files)


def active_log_file(path):
    return os.path.join(path, sorted(n for n in os.listdir(path) if n.endswith(".log"))[-1])


def test_an_unclean_start_with_intact_files_keeps_everything(tmp_path):
    d = tmp_path / "t-0"
    before = build(d)
    lg = reopen(d)
    assert not lg.recovery_report.clean and not lg.recovery_report.lost_data
    assert log_batches(lg) == before
    assert lg.append(batch(1)).base_offset == 80
    lg.abandon()


def test_cutting_the_active_segment_at_every_byte_of_its_last_batch(tmp_path):
    template = tmp_path / "template"
    before = build(template, n=30)
    last = before[-1]
    log_path = active_log_file(template)
    full = os.path.getsize(log_path)
    for cut in range(full - len(last), full):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(template, d)
        os.truncate(active_log_file(d), cut)
        lg = reopen(d)
        assert log_batches(lg) == before[:-1], cut
        end = BatchHeader.read(before[-2]).next_offset
        assert lg.log_end_offset == end
        assert lg.recovery_report.dropped_bytes == cut - (full - len(last))
        assert lg.append(batch(1)).base_offset == end
        assert lg.log_end_offset == end + 1
        lg.abandon()
        shutil.rmtree(d)


@pytest.mark.parametrize("clean", [False, True])
def test_random_garbage_after_the_log_and_the_index_is_dropped(tmp_path, clean):
    d = tmp_path / "t-0"
    lg = Log(str(d), CFG)
    for i in range(30):
        lg.append(batch(2, tag=i))
    before = log_batches(lg)
    lg.close() if clean else lg.abandon()
    rnd = random.Random(7)
    for suffix in (".log", ".index"):
        path = active_log_file(d)[:-4] + suffix
        with open(path, "ab") as f:
            f.write(bytes(rnd.randrange(256) for _ in range(333)))
    lg = reopen(d)
    assert log_batches(lg) == before
    assert lg.recovery_report.dropped_bytes == 333
    assert lg.append(batch(1)).base_offset == 60
    assert lg.read(59, 1).first_offset == 58
    lg.abandon()


def test_a_flipped_byte_in_an_unflushed_batch_truncates_from_that_batch(tmp_path):
    d = tmp_path / "t-0"
    before = build(d, n=30, flush_every=10)
    path = active_log_file(d)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # a byte in the payload of the second-to-last batch
        f.seek(size - len(before[-1]) - 5)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    lg = reopen(d)
    assert log_batches(lg) == before[:-2]
    r = lg.recovery_report
    assert "CRC" in " ".join(r.reasons) and r.dropped_bytes == len(before[-1]) + len(before[-2])
    assert r.dropped_from_offset == BatchHeader.read(before[-2]).base_offset
    lg.abandon()


def test_corruption_in_an_earlier_unflushed_segment_deletes_the_later_segments(tmp_path):
    d = tmp_path / "t-0"
    before = build(d, n=40)
    logs = sorted(n for n in os.listdir(d) if n.endswith(".log"))
    assert len(logs) >= 3
    victim = d / logs[1]
    with open(victim, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 4)
    lg = reopen(d)
    survivors = log_batches(lg)
    assert survivors == before[:len(survivors)] and len(survivors) < len(before)
    assert [s.base_offset for s in lg.segments] == [int(logs[0][:20]), int(logs[1][:20])]
    assert lg.recovery_report.segments_deleted
    end = lg.log_end_offset
    assert lg.append(batch(1)).base_offset == end
    lg.abandon()


def test_recovery_starts_at_the_recovery_point(tmp_path):
    d = tmp_path / "t-0"
    build(d, n=40, flush_every=40)  # everything flushed and checkpointed
    lg = reopen(d)
    assert lg.recovery_report.segments_scanned == 1  # only the segment holding the recovery point
    lg.abandon()


@pytest.mark.parametrize("damage", ["delete", "garbage", "zero", "truncate-entry"])
@pytest.mark.parametrize("clean", [False, True])
def test_missing_or_corrupt_index_files_are_rebuilt(tmp_path, damage, clean):
    d = tmp_path / "t-0"
    lg = Log(str(d), CFG)
    for i in range(40):
        lg.append(batch(2, ts=1000 + i, tag=i))
    lg.flush()
    lg.checkpoint()
    before = log_batches(lg)
    lg.close() if clean else lg.abandon()
    for name in sorted(os.listdir(d)):
        if name.endswith((".index", ".timeindex")):
            p = d / name
            if damage == "delete":
                p.unlink()
            elif damage == "garbage":
                p.write_bytes(os.urandom(max(p.stat().st_size, 24)))
            elif damage == "zero":
                p.write_bytes(b"\x00" * p.stat().st_size)
            else:
                with open(p, "r+b") as f:
                    f.truncate(max(p.stat().st_size - 3, 0))
    lg = reopen(d)
    assert log_batches(lg) == before
    for off in range(0, 80, 7):  # every lookup lands on the right batch
        h = BatchHeader.read(lg.fetch(off, 1))
        assert h.base_offset <= off <= h.last_offset
    assert lg.offset_for_time(1000 + 25).offset == 50
    assert lg.append(batch(1)).base_offset == 80
    lg.abandon()


def test_leftover_temporary_files_are_removed(tmp_path):
    d = tmp_path / "t-0"
    before = build(d, n=10)
    for name in ("00000000000000000000.log.cleaned", "00000000000000000000.index.swap",
                 "partition.checkpoint.tmp", "00000000000000000007.log.deleted",
                 "00000000000000099999.index"):
        (d / name).write_bytes(b"junk")
    lg = reopen(d)
    assert log_batches(lg) == before
    names = os.listdir(d)
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".tmp", ".deleted"))]
    assert "00000000000000099999.index" not in names
    # an index .swap without its log rolls back: the swap and the index it shadowed both go
    assert sorted(lg.recovery_report.files_removed) == sorted(
        ["00000000000000000000.log.cleaned", "00000000000000000000.index.swap",
         "00000000000000000000.index", "partition.checkpoint.tmp",
         "00000000000000000007.log.deleted", "00000000000000099999.index"])
    assert 0 in lg.recovery_report.indexes_rebuilt
    lg.abandon()


def test_a_crash_at_any_step_of_segment_deletion_leaves_a_consistent_log(tmp_path):
    template = tmp_path / "template"
    lg = Log(str(template), CFG)
    for i in range(40):
        lg.append(batch(2, tag=i))
    lg.flush()
    before = log_batches(lg)
    lg.abandon()
    step = 0
    while True:
        d = tmp_path / f"s{step}"
        shutil.copytree(template, d)
        files = FaultyFiles()
        lg = Log(str(d), CFG, files=files)
        lg.high_watermark = lg.log_end_offset
        files.crash_at(step)
        try:
            lg.delete_records_before(50)
            crashed = False
        except Crash:
            crashed = True
        lg.abandon()
        again = reopen(d)
        after = log_batches(again)
        assert after == before[len(before) - len(after):]  # a suffix: whole segments gone, or none
        assert again.log_end_offset == 80 and again.log_start_offset <= 50
        if not crashed:
            assert again.log_start_offset == 50
        assert again.append(batch(1)).base_offset == 80
        again.abandon()
        shutil.rmtree(d)
        if not crashed:
            break
        step += 1
    assert step > 5


def test_recovery_never_raises_on_random_damage(tmp_path):
    rnd = random.Random(11)
    template = tmp_path / "template"
    before = build(template, n=40)
    for trial in range(25):
        d = tmp_path / f"r{trial}"
        shutil.copytree(template, d)
        for _ in range(3):
            name = rnd.choice(sorted(os.listdir(d)))
            p = d / name
            data = bytearray(p.read_bytes())
            if data:
                i = rnd.randrange(len(data))
                data[i:i + 8] = os.urandom(8)
                p.write_bytes(bytes(data))
        lg = reopen(d)
        got = log_batches(lg)
        assert got == before[:len(got)] or lg.recovery_report.reasons
        end = lg.log_end_offset
        assert lg.append(batch(1)).base_offset == end
        lg.abandon()
        shutil.rmtree(d)
