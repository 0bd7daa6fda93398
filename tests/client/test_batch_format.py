"""The producer's batch encoder against the shared record-batch format (core/records.py)."""
from __future__ import annotations

import msgpack
import pytest

from odradek.core import records as fmt
from odradek.producer import encode_rows, pack_rows


def test_encoded_rows_decode_with_the_storage_decoder_and_pass_validation():
    rows = [(0, 0, None, b"a", ()), (1, 5, b"k", b"b", (("h", b"v"),)), (2, -3, None, None, ())]
    data = encode_rows(rows, 1000, 1005, "lz4")
    header = fmt.validate_batch(data)
    assert header.record_count == 3 and header.last_offset_delta == 2
    assert header.compression == fmt.COMPRESSION_LZ4 and header.max_timestamp == 1005
    records = fmt.decode_batch(data)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in records] == \
        [(0, 1000, None, b"a"), (1, 1005, b"k", b"b"), (2, 997, None, None)]
    assert [list(h) for h in records[1].headers] == [["h", b"v"]]


def test_uncompressed_batches_carry_no_compression_bit():
    data = encode_rows([(0, 0, None, b"x" * 50, ())], 1, 1, None)
    assert fmt.validate_batch(data).compression == fmt.COMPRESSION_NONE
    assert fmt.decode_batch(data)[0].value == b"x" * 50


@pytest.mark.parametrize("size", [0, 1, 31, 32, 255, 256, 65535, 65536])
@pytest.mark.parametrize("count", [1, 15, 16, 128, 256, 300])
def test_plain_values_pack_byte_for_byte_like_msgpack_of_full_rows(size, count):
    if size * count > 5_000_000:
        count = 2
    values = [bytes([i % 251]) * size for i in range(count)]
    assert pack_rows(values) == msgpack.packb([(i, 0, None, v, ()) for i, v in enumerate(values)])


def test_batches_mixing_plain_values_and_full_rows_keep_each_record():
    rows = [b"plain", (1, 7, b"key", b"keyed", (("h", b"1"),)), b"again"]
    data = encode_rows(rows, 100, 107, "lz4")
    got = [(r.offset, r.timestamp, r.key, r.value) for r in fmt.decode_batch(data)]
    assert got == [(0, 100, None, b"plain"), (1, 107, b"key", b"keyed"), (2, 100, None, b"again")]


def test_plain_values_of_mixed_lengths_pack_like_msgpack_too():
    values = [b"a" * (i * 37 % 300) for i in range(500)]
    assert pack_rows(values) == msgpack.packb([(i, 0, None, v, ()) for i, v in enumerate(values)])


@pytest.mark.parametrize("key_sizes", [(10,), (0, 3, 300), (255, 256)])
@pytest.mark.parametrize("value_sizes", [(100,), (0, 7, 70000)])
@pytest.mark.parametrize("count", [1, 16, 300])
def test_keyed_values_pack_byte_for_byte_like_msgpack_of_full_rows(key_sizes, value_sizes, count):
    keys = [bytes([i % 13]) * key_sizes[i % len(key_sizes)] for i in range(count)]
    values = [bytes([i % 251]) * value_sizes[i % len(value_sizes)] for i in range(count)]
    expected = msgpack.packb([(i, 0, k, v, ()) for i, (k, v) in enumerate(zip(keys, values))])
    assert pack_rows(values, keys) == expected
    assert pack_rows(values, keys, plain=True) == expected  # the accumulator's word, no scans
    assert pack_rows(values, keys, plain=True) == expected  # again: the keys' cached blobs


def test_keyed_batches_mixing_keyless_values_and_full_rows_keep_each_record():
    rows = [b"plain", b"keyed", (2, 7, b"row", b"full", (("h", b"1"),)), b"again"]
    keys = [None, b"k", None, b"k2"]
    assert pack_rows(rows, keys) == msgpack.packb([(0, 0, None, b"plain", ()), (1, 0, b"k", b"keyed", ()),
                                                   (2, 7, b"row", b"full", [["h", b"1"]]), (3, 0, b"k2", b"again", ())])
    data = encode_rows(rows, 100, 107, "lz4", keys)
    got = [(r.offset, r.timestamp, r.key, r.value) for r in fmt.decode_batch(data)]
    assert got == [(0, 100, None, b"plain"), (1, 100, b"k", b"keyed"), (2, 107, b"row", b"full"), (3, 100, b"k2", b"again")]
