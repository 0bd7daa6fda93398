"""Open files are a bounded cache: a log of thousands of segments, and a reader of it, hold a
bounded number of descriptors and reopen files on demand (issue 16, defect 2)."""
from __future__ import annotations

import os

import pytest

from odradek.core.config import LogConfig
from odradek.log.files import DescriptorCache, active_segments, descriptors
from odradek.log.log import Log
from odradek.log.reader import LogReader
from tests.log.support import batch

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
BUDGET = 16
SEGMENTS = 600


def _open_fds_under(path: str) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(path)
        except OSError:
            pass
    return n


@pytest.fixture
def small_budget(monkeypatch):
    cache = descriptors()
    cache.close_all()
    monkeypatch.setattr(cache, "capacity", BUDGET)
    yield cache
    cache.close_all()


def test_a_log_of_hundreds_of_segments_holds_a_bounded_number_of_descriptors(open_log, tmp_path, small_budget):
    config = LogConfig(segment_bytes=100)  # one batch per segment
    lg = open_log(config)
    for i in range(SEGMENTS):
        lg.append(batch(1, size=40, tag=i))
    assert len(lg.segments) == SEGMENTS
    lg.high_watermark = lg.log_end_offset
    for off in range(0, SEGMENTS, 7):
        assert lg.read(off, 1).first_offset == off and lg.fetch(off, 1)
    assert _open_fds_under(str(tmp_path)) <= BUDGET + 3  # + the active segment's .log and two index maps
    lg.close()
    again = open_log(config)  # opening: no descriptor per segment either
    assert again.recovery_report.clean and again.log_end_offset == SEGMENTS
    assert _open_fds_under(str(tmp_path)) <= BUDGET + 3
    again.high_watermark = again.log_end_offset
    assert [again.read(off, 1).first_offset for off in (0, 299, SEGMENTS - 1)] == [0, 299, SEGMENTS - 1]


def test_a_reader_of_hundreds_of_segments_holds_a_bounded_number_of_descriptors(open_log, tmp_path, small_budget):
    lg = open_log(LogConfig(segment_bytes=100))
    for i in range(SEGMENTS):
        lg.append(batch(1, size=40, tag=i))
    lg.high_watermark = lg.log_end_offset
    before = _open_fds_under(str(tmp_path))
    reader = LogReader(lg.dir, lg.bounds())
    try:
        for off in range(0, SEGMENTS, 5):
            assert reader.read(off, 1).first_offset == off
        assert _open_fds_under(str(tmp_path)) - before <= BUDGET
    finally:
        reader.close()


def test_a_descriptor_in_use_is_never_closed_under_its_user(tmp_path):
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"f{i}"))
        with open(paths[-1], "wb") as f:
            f.write(b"%d" % i)
    cache = DescriptorCache(capacity=1)
    with cache.use(paths[0]) as fd0:
        assert cache.pread(paths[1], 1, 0) == b"1" and cache.pread(paths[2], 1, 0) == b"2"
        assert os.pread(fd0, 1, 0) == b"0"  # still open though the cache is over its size
        cache.forget(paths[0])
        assert os.pread(fd0, 1, 0) == b"0"  # forgotten while in use: closed after, not now
    assert len(cache) <= 1 and cache.opened == 3
    cache.close_all()
    assert len(cache) == 0


ACTIVE = 8
PARTITIONS = 40


@pytest.fixture
def small_active_budget(monkeypatch):
    budget = active_segments()
    monkeypatch.setattr(budget, "capacity", ACTIVE)
    yield budget


def test_many_partitions_in_one_process_hold_a_bounded_number_of_active_segments(
        tmp_path, clock, small_budget, small_active_budget):
    """An active segment holds three descriptors (its .log and two index maps); one log actor
    with 10,000 partitions held 30,000 and ran out (EMFILE, then an AttributeError from a half
    opened segment). The ones written least recently are suspended and woken by their next
    write, with every record and index entry kept."""
    config = LogConfig(index_interval_bytes=1)  # an index entry per batch: the indexes matter
    logs = [Log(str(tmp_path / f"t-{p}"), config, now_ms=clock) for p in range(PARTITIONS)]
    try:
        for round_ in range(5):
            for p, lg in enumerate(logs):
                lg.append(batch(1, size=40, tag=round_ * PARTITIONS + p))
                assert _open_fds_under(str(tmp_path)) <= BUDGET + 3 * ACTIVE
        assert small_active_budget.suspended > 0 and len(small_active_budget) <= ACTIVE
        for p, lg in enumerate(logs):
            lg.high_watermark = lg.log_end_offset
            assert [lg.read(off, 1).first_offset for off in range(5)] == list(range(5))
            assert lg.offset_for_time(0).offset == 0
        for lg in logs:
            lg.close()
        for p in range(PARTITIONS):  # a clean close of a suspended segment reopens whole
            again = Log(str(tmp_path / f"t-{p}"), config, now_ms=clock)
            logs[p] = again
            assert again.recovery_report.clean and again.log_end_offset == 5
            again.append(batch(1, size=40, tag=999))
            again.high_watermark = again.log_end_offset
            assert [again.read(off, 1).first_offset for off in range(6)] == list(range(6))
    finally:
        for lg in logs:
            lg.abandon()
