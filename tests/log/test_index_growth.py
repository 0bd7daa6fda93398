"""Active index files are allocated a page at a time and grow as entries come, not up front."""
from __future__ import annotations

import errno
import os

import pytest

from odradek.log import index as ix
from odradek.core.config import LogConfig
from odradek.core.errors import StorageError
from tests.log.support import batch, log_batches, log_records


def test_a_new_partition_costs_a_page_per_index_not_segment_index_bytes(open_log):
    lg = open_log(LogConfig())  # segment.index.bytes 10 MiB: 873,813 entries allowed
    seg = lg.active_segment
    assert seg.oidx.capacity == 10 * 1024 * 1024 // 12
    assert os.path.getsize(seg.index_path) == ix.ALLOCATION_CHUNK
    assert os.path.getsize(seg.timeindex_path) == ix.ALLOCATION_CHUNK // 12 * 12
    assert os.stat(seg.index_path).st_blocks * 512 <= 2 * ix.ALLOCATION_CHUNK


def test_the_index_doubles_as_it_fills_and_lookups_still_work(open_log):
    lg = open_log(LogConfig(index_interval_bytes=1))  # an entry per batch
    for i in range(3000):
        lg.append(batch(1, size=10, tag=i))
    seg = lg.active_segment
    assert seg.oidx.count == 2999 and seg.oidx.allocated >= 3001
    assert os.path.getsize(seg.index_path) == 32 * 1024  # 4 KiB doubled three times
    lg.high_watermark = lg.log_end_offset
    for off in (0, 1, 1500, 2999):
        assert lg.read(off, 1).first_offset == off
    lg.close()
    again = open_log(LogConfig(index_interval_bytes=1))
    assert again.recovery_report.clean and again.active_segment.oidx.count == 2999
    assert again.append(batch(1, size=10)).base_offset == 3000
    assert again.read(2000, 1).first_offset == 2000


def test_an_index_that_cannot_grow_fails_the_append_before_anything_is_written(open_log, files):
    lg = open_log(LogConfig(index_interval_bytes=1))
    while lg.active_segment.oidx.count + 2 <= lg.active_segment.oidx.allocated:
        lg.append(batch(1, size=10))
    before, end = log_batches(lg), lg.log_end_offset
    files.fail("allocate", errno.ENOSPC, match=".index")
    with pytest.raises(StorageError, match="growing the indexes"):
        lg.append(batch(1, size=10, tag=1))
    assert lg.log_end_offset == end and log_batches(lg) == before
    assert os.path.getsize(lg.active_segment.log_path) == lg.active_segment.size
    assert lg.append(batch(1, size=10, tag=2)).base_offset == end  # the fault cleared
    assert [r.offset for r in log_records(lg)] == list(range(end + 1))


def test_a_reopened_oversized_index_is_cut_to_what_it_holds(open_log, tmp_path):
    lg = open_log(LogConfig())
    lg.append(batch(2))
    path = lg.active_segment.index_path
    lg.abandon()  # a crash: the index stays untrimmed
    with open(path, "r+b") as f:  # what an older version preallocated
        f.truncate(10 * 1024 * 1024)
    again = open_log(LogConfig())
    assert os.path.getsize(path) == ix.ALLOCATION_CHUNK
    assert again.append(batch(1)).base_offset == 2


def _open_fds_under(path: str) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(path)
        except OSError:
            pass
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_an_open_partition_holds_three_descriptors_however_it_was_opened(open_log, tmp_path):
    lg = open_log(LogConfig())  # new: the active segment is activated twice while loading
    assert _open_fds_under(str(tmp_path)) == 3  # .log + one per index (the map's own)
    lg.append(batch(2))
    lg.close()
    assert _open_fds_under(str(tmp_path)) == 0
    again = open_log(LogConfig())
    again.append(batch(2))
    assert _open_fds_under(str(tmp_path)) == 3
    again.abandon()
    assert _open_fds_under(str(tmp_path)) == 0
