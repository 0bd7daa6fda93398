"""The record-batch format: codec round trips, header fields, validation, fuzzing."""
from __future__ import annotations

import struct
import zlib

import cramjam
import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from odradek.core.errors import CorruptRecordError, InvalidRecordError, InvalidTimestampError, RecordTooLargeError
from odradek.core.records import (HEADER, HEADER_SIZE, MAGIC, BatchHeader, Record, decode_batch,
                         encode_batch, encode_records, iter_batches, patch_base_offset,
                         set_log_append_time, validate_batch, validate_batches, validate_produced)

keys = st.one_of(st.none(), st.binary(max_size=20))
headers = st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=2)
records = st.lists(st.tuples(keys, keys, headers, st.integers(0, 2**40)), min_size=1, max_size=30)


def test_header_is_61_bytes_in_kafka_v2_order():
    assert HEADER_SIZE == 61
    b = encode_batch([(b"k", b"v")], None, base_offset=7, timestamp_ms=123, producer_id=9,
                     producer_epoch=2, base_sequence=5, partition_leader_epoch=4)
    assert struct.unpack_from(">q", b, 0)[0] == 7
    assert struct.unpack_from(">i", b, 8)[0] == len(b) - 12
    assert struct.unpack_from(">i", b, 12)[0] == 4
    assert b[16] == MAGIC
    assert struct.unpack_from(">I", b, 17)[0] == zlib.crc32(b[21:])
    h = BatchHeader.read(b)
    assert (h.first_timestamp, h.max_timestamp, h.producer_id, h.producer_epoch, h.base_sequence,
            h.record_count, h.last_offset_delta) == (123, 123, 9, 2, 5, 1, 0)


@given(records, st.sampled_from(["lz4", None]), st.integers(0, 2**40))
@settings(max_examples=150, deadline=None)
def test_encode_then_decode_gives_back_every_record(recs, comp, base):
    b = encode_batch(recs, comp, base_offset=base)
    out = decode_batch(b)
    assert [r.offset for r in out] == list(range(base, base + len(recs)))
    assert [(r.key, r.value, r.timestamp) for r in out] == [(k, v, ts) for k, v, _, ts in recs]
    assert [[tuple(x) for x in r.headers] for r in out] == [[tuple(x) for x in h] for _, _, h, _ in recs]
    h = validate_batch(b)
    assert h.max_timestamp == max(ts for *_, ts in recs)
    assert h.compression == (1 if comp else 0)


def test_plain_pairs_take_the_batch_timestamp():
    out = decode_batch(encode_batch([(b"a", b"1"), (None, b"2")], timestamp_ms=55))
    assert out == [Record(0, 55, b"a", b"1", []), Record(1, 55, None, b"2", [])]


def test_encode_records_keeps_offsets_with_gaps():
    recs = [Record(10, 5, b"a", b"1", []), Record(13, 7, b"b", None, []), Record(20, 6, b"c", b"3", [])]
    b = encode_records(recs)
    h = validate_batch(b)
    assert (h.base_offset, h.last_offset, h.record_count, h.max_timestamp) == (10, 20, 3, 7)
    assert decode_batch(b) == recs


def test_patching_the_base_offset_and_epoch_keeps_the_crc_valid():
    b = bytearray(encode_batch([(b"k", b"v")] * 4))
    patch_base_offset(b, 1234, leader_epoch=9)
    h = validate_batch(b)
    assert (h.base_offset, h.partition_leader_epoch, h.last_offset) == (1234, 9, 1237)
    assert [r.offset for r in decode_batch(b)] == [1234, 1235, 1236, 1237]


def test_log_append_time_sets_every_record_timestamp_and_a_new_crc():
    b = bytearray(encode_batch([(b"k", b"v")] * 2, timestamp_ms=5))
    set_log_append_time(b, 999)
    h = validate_batch(b)
    assert h.log_append_time and h.max_timestamp == 999
    assert [r.timestamp for r in decode_batch(b)] == [999, 999]


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b.__setitem__(16, 2), "magic"),
    (lambda b: b.__setitem__(len(b) - 1, b[len(b) - 1] ^ 1), "CRC"),
    (lambda b: struct.pack_into(">i", b, 8, len(b)), "batchLength"),
])
def test_validation_names_the_failed_check(mutate, message):
    b = bytearray(encode_batch([(b"k", b"v")] * 3))
    mutate(b)
    with pytest.raises(CorruptRecordError, match=message):
        validate_batch(b)


def _with_fields(**fields):
    """A CRC-valid batch whose header fields are overridden."""
    b = bytearray(encode_batch([(b"k", b"v")] * 3, None))
    h = BatchHeader.read(b)._replace(**fields)
    HEADER.pack_into(b, 0, *h)
    struct.pack_into(">I", b, 17, zlib.crc32(b[21:]))
    return b


@pytest.mark.parametrize("fields, message", [
    ({"record_count": 0}, "recordCount"),
    ({"last_offset_delta": 1}, "lastOffsetDelta"),
    ({"attributes": 0x40}, "attributes"),
    ({"attributes": 5}, "attributes"),
])
def test_validation_refuses_impossible_counts_and_attributes(fields, message):
    with pytest.raises(CorruptRecordError, match=message):
        validate_batch(_with_fields(**fields))


def test_a_batch_over_the_size_limit_is_too_large_not_corrupt():
    b = encode_batch([(b"k", b"v" * 1000)], None)
    with pytest.raises(RecordTooLargeError):
        validate_batch(b, max_size=len(b) - 1)
    validate_batch(b, max_size=len(b))


def test_validate_batches_accepts_concatenated_batches_and_refuses_a_trailing_fragment():
    a, b = encode_batch([(b"a", b"1")]), encode_batch([(b"b", b"2")] * 2)
    assert [h.record_count for h in validate_batches(a + b)] == [1, 2]
    with pytest.raises(CorruptRecordError):
        validate_batches(a + b[:-1])
    with pytest.raises(CorruptRecordError):
        validate_batches(b"")


def test_iter_batches_stops_cleanly_at_a_partial_trailing_batch():
    a, b = encode_batch([(b"a", b"1")]), encode_batch([(b"b", b"2")] * 2)
    data = a + b + b[:30]
    assert [(p, h.record_count) for p, h in iter_batches(data)] == [(0, 1), (len(a), 2)]
    assert [p for p, _ in iter_batches(a + b[:-1])] == [0]


def test_an_lz4_block_claiming_an_impossible_size_is_corrupt_not_a_huge_allocation():
    payload = struct.pack("<I", 2**31 - 1) + b"\x00" * 8
    b = _raw_batch(payload, attributes=1)
    with pytest.raises(CorruptRecordError, match="lz4"):
        decode_batch(b)


def _raw_batch(payload: bytes, attributes: int = 0, count: int = 1) -> bytes:
    """A header with a valid CRC around arbitrary record bytes."""
    b = bytearray(HEADER_SIZE + len(payload))
    HEADER.pack_into(b, 0, 0, len(b) - 12, 0, MAGIC, 0, attributes, count - 1, 0, 0, -1, -1, -1, count)
    b[HEADER_SIZE:] = payload
    struct.pack_into(">I", b, 17, zlib.crc32(b[21:]))
    return bytes(b)


@given(st.binary(max_size=300))
@settings(max_examples=400, deadline=None)
def test_random_bytes_only_ever_raise_corrupt_record_error(data):
    for fn in (validate_batch, decode_batch, validate_batches, lambda d: list(iter_batches(d))):
        try:
            fn(data)
        except CorruptRecordError:
            pass


@given(st.binary(max_size=200), st.sampled_from([0, 1]), st.integers(1, 5))
@settings(max_examples=400, deadline=None)
def test_random_payloads_behind_a_valid_crc_only_ever_raise_corrupt_record_error(payload, attrs, count):
    try:
        decode_batch(_raw_batch(payload, attrs, count))
    except CorruptRecordError:
        pass


@given(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.binary(max_size=4), st.text(max_size=3),
                          st.lists(st.integers(-2**63, 2**63 - 1), max_size=6)), max_size=5), st.sampled_from([0, 1]))
@settings(max_examples=300, deadline=None)
def test_well_formed_msgpack_of_the_wrong_shape_is_corrupt(entries, attrs):
    payload = msgpack.packb(entries)
    if attrs:
        payload = bytes(cramjam.lz4.compress_block(payload))
    try:
        decode_batch(_raw_batch(payload, attrs, max(len(entries), 1)))
    except CorruptRecordError:
        pass


def _forged(entries: list, compressed: bool = False, count: int | None = None, last_delta: int | None = None,
            attributes: int = 0, first_ts: int = 0, max_ts: int = 0) -> bytes:
    """A batch with a valid CRC whose header says what the arguments say, whatever it holds."""
    payload = msgpack.packb(entries, use_bin_type=True)
    if compressed:
        payload = bytes(cramjam.lz4.compress_block(payload))
    count = len(entries) if count is None else count
    b = bytearray(HEADER_SIZE + len(payload))
    HEADER.pack_into(b, 0, 0, len(b) - 12, 0, MAGIC, 0, attributes, count - 1 if last_delta is None else last_delta,
                     first_ts, max_ts, -1, -1, -1, count)
    b[HEADER_SIZE:] = payload
    struct.pack_into(">I", b, 17, zlib.crc32(b[21:]))
    return bytes(b)


THREE = [[i, 0, None, b"v%d" % i, []] for i in range(3)]


@pytest.mark.parametrize("batch, error, words", [
    (_forged(THREE, count=100), CorruptRecordError, "recordCount says 100 records; the payload holds 3"),
    (_forged(THREE, attributes=1), CorruptRecordError, "lz4"),
    (_forged(THREE, attributes=0x20), InvalidRecordError, "control"),
    (_forged(THREE, first_ts=-2**63, max_ts=-2**63), InvalidTimestampError, "negative"),
    (_forged(THREE, last_delta=2**31 - 1), InvalidRecordError, "lastOffsetDelta 2147483647"),
    (_forged([[1, 0, None, b"a", []], [2, 0, None, b"b", []]]), CorruptRecordError, "offset delta 0"),
    (_forged([[0, 0, None], [1, 0, None]]), CorruptRecordError, "5-field"),
    (_forged({"not": "a list"}, count=1), CorruptRecordError, "payload holds"),
])
def test_a_produced_batch_whose_header_disagrees_with_its_records_is_refused(batch, error, words):
    validate_batches(batch)  # sound as stored bytes: only a producer's batch must be more
    with pytest.raises(error) as err:
        validate_produced(batch)
    assert words in err.value.message


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_a_producers_batches_pass_the_produce_checks(compression):
    batches = encode_batch([(b"k", b"v")] * 5, compression) + encode_batch([(None, b"x", [("h", b"1")], 7)],
                                                                          compression)
    assert [h.record_count for h in validate_produced(batches)] == [5, 1]
