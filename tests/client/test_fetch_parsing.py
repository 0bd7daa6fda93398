"""Reading fetch answers: whole batches, torn or zeroed tails, batches before the fetch offset."""
from __future__ import annotations

import pytest

from odradek.core import records as fmt
from odradek import Record, errors
from odradek.consumer import decode_records, split_batches


def batch(base: int, values: list, ts: int = 1000) -> bytes:
    data = bytearray(fmt.encode_batch([(None, v) for v in values], timestamp_ms=ts))
    fmt.patch_base_offset(data, base)
    return bytes(data)


def records_of(buf: bytes, min_offset: int = 0) -> list:
    view = memoryview(buf)
    batches, _ = split_batches(view)
    return [r for pos, h in batches for r in decode_records(view, pos, h, "t", 3, min_offset)]


def test_whole_batches_decode_to_records_with_topic_partition_offset_and_timestamp():
    buf = batch(10, [b"a", b"b"]) + batch(12, [b"c"], ts=2000)
    assert records_of(buf) == [Record("t", 3, 10, 1000, None, b"a", ()), Record("t", 3, 11, 1000, None, b"b", ()),
                               Record("t", 3, 12, 2000, None, b"c", ())]


@pytest.mark.parametrize("cut", [1, fmt.HEADER_SIZE - 1, fmt.HEADER_SIZE + 3])
def test_a_torn_trailing_batch_is_ignored(cut):
    whole = batch(0, [b"a", b"b"])
    torn = batch(2, [b"c" * 100])[:cut]
    batches, why = split_batches(memoryview(whole + torn))
    assert len(batches) == 1 and why in ("partial header", "partial batch")
    assert [r.value for r in records_of(whole + torn)] == [b"a", b"b"]


def test_zero_padding_after_the_last_batch_is_ignored():
    buf = batch(0, [b"a"]) + bytes(4096)
    batches, why = split_batches(memoryview(buf))
    assert len(batches) == 1 and why == "zero padding"


def test_records_before_the_fetch_offset_are_skipped():
    buf = batch(100, [b"a", b"b", b"c", b"d"])
    assert [r.offset for r in records_of(buf, min_offset=102)] == [102, 103]


def test_offset_gaps_of_a_compacted_batch_are_kept():
    data = fmt.encode_records([fmt.Record(5, 1, None, b"x", []), fmt.Record(9, 1, b"k", b"y", [])])
    out = records_of(data, min_offset=6)
    assert [(r.offset, r.key, r.value) for r in out] == [(9, b"k", b"y")]


def test_log_append_time_batches_report_the_broker_time_for_every_record():
    data = bytearray(batch(0, [b"a", b"b"], ts=5))
    fmt.set_log_append_time(data, 777)
    assert [r.timestamp for r in records_of(bytes(data))] == [777, 777]


def test_a_flipped_byte_is_a_crc_error_naming_the_partition_and_offset():
    data = bytearray(batch(40, [b"hello"]))
    data[-1] ^= 0xFF
    with pytest.raises(errors.CorruptMessageError, match="t-3.*40"):
        records_of(bytes(data))


def test_headers_come_back_as_key_value_pairs():
    data = fmt.encode_batch([(b"k", b"v", [("trace", b"1")])])
    (record,) = records_of(data)
    assert [tuple(h) for h in record.headers] == [("trace", b"1")]


def test_records_of_one_batch_keep_their_own_timestamps_and_keys():
    """A batch whose records carry the batch's time shares one timestamp; one whose records
    carry their own (``send(timestamp_ms=...)``) gives each record its own."""
    from odradek.producer import encode_rows
    same = encode_rows([b"a", b"b"], 5000, 5000, "lz4", [b"k1", None])
    own = encode_rows([(0, 0, b"k", b"c", ()), (1, 7, None, b"d", ()), (2, -3, b"k", b"e", ())], 5000, 5007, None)
    got = [(r.offset, r.timestamp, r.key, r.value) for r in records_of(same + own)]
    assert got == [(0, 5000, b"k1", b"a"), (1, 5000, None, b"b"),
                   (0, 5000, b"k", b"c"), (1, 5007, None, b"d"), (2, 4997, b"k", b"e")]
    assert all(type(r) is Record for r in records_of(same + own))


@pytest.mark.parametrize("enabled", [True, False])
def test_decoding_leaves_the_garbage_collectors_setting_as_it_found_it(enabled):
    """decode_records pauses the cyclic GC while it builds a batch's records; it must restore
    it, also when the batch does not decode, and never turn on one the caller turned off."""
    import gc
    good = batch(0, [b"a", b"b"])
    bad = bytearray(good)
    bad[fmt.HEADER_SIZE + 2:] = bytes(len(bad) - fmt.HEADER_SIZE - 2)  # records zeroed: the CRC is wrong
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        assert [r.value for r in records_of(good)] == [b"a", b"b"] and gc.isenabled() is enabled
        with pytest.raises(errors.CorruptMessageError):
            records_of(bytes(bad))
        assert gc.isenabled() is enabled
        view = memoryview(bytes(bad))
        (pos, h), = split_batches(view)[0]
        with pytest.raises(errors.CorruptMessageError):  # past the CRC check: msgpack fails inside the pause
            decode_records(view, pos, h, "t", 3, 0, check_crc=False)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def _shapes() -> list:
    """Batches of every shape the C builder serves or declines (odradek/_recordbuild.c)."""
    from odradek.producer import encode_rows
    appended = bytearray(batch(3, [b"a", b"b"], ts=5))
    fmt.set_log_append_time(appended, 777)
    return [
        batch(10, [b"a", b"b", b"c"]),                                         # one time, keyless
        encode_rows([b"a", b"b"], 5000, 5000, "lz4", [b"k1", None]),           # keyed, lz4
        encode_rows([(0, 0, b"k", b"c", ()), (1, 7, None, b"d", ())], 5000, 5007, None),  # own times
        fmt.encode_records([fmt.Record(5, 1, None, b"x", []), fmt.Record(9, 1, b"k", b"y", [])]),  # gaps
        fmt.encode_batch([(b"k", b"v", [("trace", b"1")])]),                   # headers
        bytes(appended),                                                       # log-append time
    ]


@pytest.mark.parametrize("min_offset", [0, 1, 4, 11, 100])
def test_records_built_in_c_equal_those_built_in_python(monkeypatch, min_offset):
    """The consumer builds a native batch's Records in C when it can (odradek/_recordbuild.c);
    the Python path is the reference: same Records, same type, from every shape and position."""
    from odradek import consumer
    if consumer._build_records is None:
        pytest.skip("odradek._recordbuild is not built here (setup.py's optional extension)")
    for buf in _shapes():
        fast = records_of(buf, min_offset)
        monkeypatch.setattr(consumer, "_build_records", None)
        reference = records_of(buf, min_offset)
        monkeypatch.undo()
        assert fast == reference and all(type(r) is Record for r in fast)


@pytest.mark.parametrize("built_in_c", [True, False])
def test_a_batch_whose_rows_are_not_records_is_corrupt(monkeypatch, built_in_c):
    """Rows of the wrong shape (here 4 fields) are CORRUPT_MESSAGE naming the batch, on both paths."""
    from odradek import consumer
    from odradek.producer import encode_rows
    if built_in_c and consumer._build_records is None:
        pytest.skip("odradek._recordbuild is not built here")
    if not built_in_c:
        monkeypatch.setattr(consumer, "_build_records", None)
    data = encode_rows([(0, 0, b"k", b"c"), (1, 0, None, b"d")], 5000, 5000, None)
    with pytest.raises(errors.CorruptMessageError, match="t-3.*offset 0"):
        records_of(data)
