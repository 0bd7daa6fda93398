"""The producer's batch encoder against the shared record-batch format (log/records.py)."""
from __future__ import annotations

from log import records as fmt
from odradek.producer import encode_rows


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
