"""LogReader's tail positions: a caught-up reader's read costs no index search, and returns
exactly what the indexed path returns (also after rolls and truncation)."""
import time

from odradek.core.config import LogConfig
from odradek.log.log import Log
from odradek.log.reader import LogReader
from odradek.core.records import BatchHeader, encode_batch


def fill(tmp_path, batches, segment_bytes=1 << 30):
    lg = Log(str(tmp_path), LogConfig(segment_bytes=segment_bytes))
    reader = None
    ends = []
    for i in range(batches):
        lg.append(encode_batch([(None, b"v%05d" % i + b"x" * 90)]))
        lg.high_watermark = lg.log_end_offset
        if reader is None:
            reader = LogReader(str(tmp_path), lg.bounds())
        else:
            reader.update(lg.bounds())
        ends.append(lg.log_end_offset)
    return lg, reader, ends


def same(a, b):
    return [(s.path, s.position, s.length, s.first_offset, s.next_offset) for s in a.slices] == \
        [(s.path, s.position, s.length, s.first_offset, s.next_offset) for s in b.slices]


def test_tail_reads_equal_indexed_reads_for_every_offset_and_size(tmp_path):
    lg, reader, ends = fill(tmp_path, 300)
    for offset in range(0, 300, 7):
        for max_bytes in (1, 150, 1000, 1 << 20):
            assert same(reader.read(offset, max_bytes), lg.read(offset, max_bytes)), (offset, max_bytes)
    assert reader.read(300, 1000).slices == ()


def test_tail_reads_respect_an_upper_bound_below_the_end(tmp_path):
    lg, reader, _ = fill(tmp_path, 50)
    for bound in (10, 25, 49):
        assert same(reader.read(5, 1 << 20, upper_bound=bound), lg.read(5, 1 << 20, upper_bound=bound))


def test_after_a_truncation_no_stale_tail_position_is_used(tmp_path):
    lg, reader, _ = fill(tmp_path, 40)
    lg.truncate_to(20)
    for i in range(5):  # new, longer batches at the same offsets
        lg.append(encode_batch([(None, b"new%d" % i + b"y" * 300)]))
    lg.high_watermark = lg.log_end_offset
    reader.update(lg.bounds())
    for offset in range(20, 25):
        assert same(reader.read(offset, 1 << 20), lg.read(offset, 1 << 20))


def test_after_a_roll_reads_follow_the_new_active_segment(tmp_path):
    lg, reader, _ = fill(tmp_path, 300, segment_bytes=4096)
    assert len(lg.segments) > 3
    for offset in range(0, 300, 5):
        assert same(reader.read(offset, 1 << 20), lg.read(offset, 1 << 20))


def test_a_caught_up_read_is_much_cheaper_than_an_indexed_one(tmp_path):
    lg, reader, ends = fill(tmp_path, 3000)
    cold = LogReader(str(tmp_path), lg.bounds())  # knows no tail positions
    offset = ends[-3]

    def cost(r):
        t0 = time.perf_counter()
        for _ in range(200):
            r.read(offset, 1 << 20)
        return time.perf_counter() - t0

    assert same(reader.read(offset, 1 << 20), cold.read(offset, 1 << 20))
    assert cost(reader) * 3 < cost(cold)  # a ratio in one process, not a time limit


def test_a_slice_knows_the_offset_after_its_last_batch_on_both_paths(tmp_path):
    """What the fetch actor counts records out by: the offset after the slice's last batch,
    checked against the batches' own headers, within a segment and at a segment's end."""
    lg = Log(str(tmp_path), LogConfig(segment_bytes=4096))
    reader = LogReader(str(tmp_path), lg.bounds())
    for i in range(120):
        lg.append(encode_batch([(None, b"r%d-%d" % (i, j) + b"z" * 40) for j in range(3)]))
        lg.high_watermark = lg.log_end_offset
        reader.update(lg.bounds())
    assert len(lg.segments) > 3
    checked = 0
    for offset in range(0, 360, 7):
        for max_bytes in (1, 400, 1500, 1 << 20):
            for result in (reader.read(offset, max_bytes), lg.read(offset, max_bytes)):
                (piece,) = result.slices
                data, pos = result.read_bytes(), 0
                while pos < len(data):
                    header = BatchHeader.read(data, pos)
                    pos += header.size
                assert piece.next_offset == header.last_offset + 1, (offset, max_bytes)
                checked += 1
    assert checked == 2 * 4 * len(range(0, 360, 7))
