"""LogReader: read-only access from another process, trusting only the bounds it is told."""
from __future__ import annotations

import multiprocessing

import pytest

from odradek.core.config import LogConfig
from odradek.core.errors import OffsetOutOfRangeError
from odradek.log.log import Log
from odradek.log.reader import LogReader
from odradek.core.records import iter_batches
from tests.log.support import Clock, batch, log_batches

CFG = LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_index_bytes=240,
                file_delete_delay_ms=60_000)


def reader_batches(reader, start):
    out, offset = [], start
    while offset < reader.bounds.log_end_offset:
        r = reader.read(offset, 1 << 20)
        if not r.slices:
            break
        data = r.read_bytes()
        for pos, h in iter_batches(data):
            out.append(data[pos:pos + h.size])
            offset = h.next_offset
    return out


def test_a_reader_sees_what_the_writer_wrote_and_agrees_on_every_lookup(tmp_path):
    lg = Log(str(tmp_path / "t-0"), CFG)
    for i in range(40):
        lg.append(batch(2, ts=1000 + i, tag=i))
    reader = LogReader(lg.dir, lg.bounds())
    assert reader_batches(reader, 0) == log_batches(lg)
    for off in range(0, 80, 3):
        assert reader.read(off, 500) == lg.read(off, 500)
    assert reader.offset_for_time(1020) == lg.offset_for_time(1020)
    reader.close()
    lg.abandon()


def test_bytes_past_the_bounds_it_was_given_are_invisible(tmp_path):
    lg = Log(str(tmp_path / "t-0"), CFG)
    lg.append(batch(2))
    reader = LogReader(lg.dir, lg.bounds())
    lg.append(batch(2, tag=1))  # written, but the reader was not told
    assert reader.read(0, 1 << 20).size == lg.read(0, 1).size
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(3, 100)
    reader.update(lg.bounds())
    assert reader.read(2, 100).first_offset == 2
    reader.close()
    lg.abandon()


def test_the_reader_follows_rolls_retention_and_truncation(tmp_path):
    clock = Clock()
    lg = Log(str(tmp_path / "t-0"), CFG, now_ms=clock)
    reader = LogReader(lg.dir, lg.bounds())
    for i in range(60):
        lg.append(batch(2, tag=i))
        reader.update(lg.bounds())
    assert reader_batches(reader, 0) == log_batches(lg)
    lg.high_watermark = lg.log_end_offset
    lg.delete_records_before(50)
    reader.update(lg.bounds())
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(10, 100)
    assert reader_batches(reader, 50) == log_batches(lg)
    lg.truncate_to(80)
    reader.update(lg.bounds())
    assert reader.bounds.log_end_offset == 80 and reader_batches(reader, 50) == log_batches(lg)
    reader.close()
    lg.abandon()


def _serve(directory, bounds, offsets, queue):
    reader = LogReader(directory, bounds)
    queue.put([reader.read(o, 300).read_bytes() for o in offsets])
    reader.close()


def test_a_reader_in_another_process_serves_the_same_bytes(tmp_path):
    lg = Log(str(tmp_path / "t-0"), CFG)
    for i in range(30):
        lg.append(batch(2, tag=i))
    offsets = [0, 7, 33, 59]
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_serve, args=(lg.dir, lg.bounds(), offsets, q))
    p.start()
    got = q.get(timeout=60)
    p.join(30)
    assert got == [lg.fetch(o, 300) for o in offsets]
    lg.abandon()
