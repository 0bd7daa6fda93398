"""A client's batch is validated as Kafka's LogValidator does (log.records.validate_produced,
log.kafka_batch.check_records), and compressed records inflate through one bounded helper
(log.inflate): pure tests, bytes in, the error code out."""
from __future__ import annotations

import struct
import subprocess
import sys
import zlib

import cramjam
import pytest

from odradek.log import inflate, kafka_batch
from odradek.log.errors import (CorruptRecordError, InvalidRecordError, RecordErrors, RecordTooLargeError)
from odradek.log.records import (HEADER, HEADER_SIZE, OFFSET_CRC, BatchHeader, Record, decode_batch, encode_batch,
                                 validate_produced)
from odradek.network.protocol import ErrorCode

CODEC = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def varint(value: int) -> bytes:
    out = bytearray()
    kafka_batch._put_varint(out, value)
    return bytes(out)


def record(key: bytes | None, value: bytes, offset_delta: int = 0, headers: int = 0) -> bytes:
    body = b"\x00" + varint(0) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(len(value)) + value + varint(headers)
    return varint(len(body)) + body


def batch(body: bytes, count: int, codec: str = "none", *, compress: bool = True, producer_id: int = -1,
          base_sequence: int = -1) -> bytearray:
    """A magic-2 batch around records ``body`` (compressed with ``codec`` unless told not to), CRC right."""
    if compress and codec != "none":
        body = {"gzip": lambda b: bytes(cramjam.gzip.compress(b)),
                "snappy": lambda b: bytes(cramjam.snappy.compress_raw(b)),
                "lz4": lambda b: bytes(cramjam.lz4.compress(b)), "zstd": lambda b: bytes(cramjam.zstd.compress(b))}[codec](body)
    out = bytearray(HEADER_SIZE + len(body))
    HEADER.pack_into(out, 0, 0, len(out) - 12, -1, kafka_batch.MAGIC, 0, CODEC[codec], count - 1, 1000, 1000,
                     producer_id, 0 if producer_id >= 0 else -1, base_sequence, count)
    out[HEADER_SIZE:] = body
    struct.pack_into(">I", out, OFFSET_CRC, kafka_batch.crc_of(out, 0, len(out)))
    return out


def code_of(buf, **kw) -> ErrorCode | None:
    try:
        validate_produced(buf, **kw)
    except (CorruptRecordError, InvalidRecordError, RecordTooLargeError) as exc:
        return exc.code
    return None


@pytest.mark.parametrize("codec", list(CODEC))
def test_a_sound_batch_of_every_codec_passes_and_decodes(codec):
    body = b"".join(record(b"k%d" % i, b"v" * i, i) for i in range(50))
    b = batch(body, 50, codec)
    assert code_of(b, compacted=True) is None
    assert [r.key for r in decode_batch(b)] == [b"k%d" % i for i in range(50)]


def test_a_batch_claiming_two_billion_records_while_holding_one_is_invalid():
    b = batch(record(None, b"x"), 2**31 - 1)
    with pytest.raises(InvalidRecordError, match="premature EOF"):
        validate_produced(b)


def test_a_record_count_below_the_records_held_is_invalid():
    b = batch(record(None, b"x") + record(None, b"y", 1), 1)
    with pytest.raises(InvalidRecordError, match="records still remaining"):
        validate_produced(b)


FRAMING = [  # what the broker's offsets depend on: checked on every topic
    b"\xff\xff\xff\xff\x7f" + b"\x00" * 8,                  # a record length beyond 32 bits
    b"\xff\xff\xff\xff\xff\x01" + b"\x00" * 8,              # a record length varint longer than 5 bytes
    varint(-5) + b"\x00" * 8,                               # a negative record length
    varint(30) + b"\x00" * 8,                               # a record running past the batch
]
FIELDS = [  # inside a record: parsed where the broker reads records (compacted topics), else by readers
    varint(3) + b"\x00" + b"\xff" * 11,                     # a timestamp varlong longer than 10 bytes
    varint(20) + b"\x00" + varint(0) + varint(0) + varint(-7) + b"\x00" * 16,  # a key length below -1 ... runs on
    varint(5) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(0) + varint(-3),  # a negative header count
    varint(8) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(0) + varint(0) + b"\x00\x00\x00",  # length lies
]


@pytest.mark.parametrize("compacted", [False, True])
@pytest.mark.parametrize("bad", FRAMING)
def test_malformed_framing_is_invalid_record_on_every_topic(bad, compacted):
    assert code_of(batch(bad, 1), compacted=compacted) == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("bad", FIELDS)
def test_malformed_record_fields_are_invalid_record_where_records_are_parsed(bad):
    assert code_of(batch(bad, 1), compacted=True) == ErrorCode.INVALID_RECORD
    with pytest.raises(CorruptRecordError):  # and every reader's decoder refuses them
        decode_batch(batch(bad, 1))


def test_offset_deltas_out_of_order_are_invalid():
    b = batch(record(b"k", b"x", 0) + record(b"k", b"y", 7), 2)
    with pytest.raises(InvalidRecordError, match="offset delta 7"):
        validate_produced(b, compacted=True)


def test_compression_bits_on_raw_bytes_are_a_corrupt_message():
    body = record(None, b"plain")
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        assert code_of(batch(body, 1, codec, compress=False)) == ErrorCode.CORRUPT_MESSAGE, codec


def test_a_producer_id_without_a_sequence_is_invalid():
    assert code_of(batch(record(None, b"x"), 1, producer_id=5, base_sequence=-1)) == ErrorCode.INVALID_RECORD


def test_keyless_records_on_a_compacted_topic_are_listed_by_index():
    body = b"".join(record(None if i % 3 == 0 else b"k", b"v", i) for i in range(7))
    for codec in ("none", "zstd"):
        with pytest.raises(RecordErrors) as caught:
            validate_produced(batch(body, 7, codec), compacted=True)
        assert caught.value.code == ErrorCode.INVALID_RECORD
        assert [i for i, _ in caught.value.record_errors] == [0, 3, 6]
        assert "without a key" in caught.value.record_errors[0][1]
    assert code_of(batch(body, 7)) is None  # the same batch on a delete topic


def test_keyless_native_records_on_a_compacted_topic_are_listed_by_index():
    native = encode_batch([(b"k", b"1"), (None, b"2"), (b"k", b"3"), (None, b"4")])
    with pytest.raises(RecordErrors) as caught:
        validate_produced(native, compacted=True)
    assert [i for i, _ in caught.value.record_errors] == [1, 3]
    validate_produced(native)


BOMB_MIB = 192  # the one record's value, in MiB: three times the default bound; every codec packs it below 1 MiB


def bomb(codec: str) -> bytearray:
    """A batch of one keyless record of BOMB_MIB MiB of zeros, compressed by a streaming
    compressor (so the test never holds the record itself): about a MiB or less."""
    zeros = b"\x00" * (1 << 20)
    body_len = 4 + len(varint(BOMB_MIB << 20)) + (BOMB_MIB << 20) + 1  # attributes, 3 varints, value, headers
    prefix = varint(body_len) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(BOMB_MIB << 20)
    if codec == "snappy":
        return batch(prefix + zeros * BOMB_MIB + varint(0), 1, codec)
    if codec in ("zstd", "lz4"):  # cramjam's Compressor takes input and hands the frame back at the end
        c = {"zstd": cramjam.zstd, "lz4": cramjam.lz4}[codec].Compressor()
        for piece in (prefix, *[zeros] * BOMB_MIB, varint(0)):
            c.compress(piece)
        return batch(bytes(c.finish()), 1, codec, compress=False)
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = []
    for piece in (prefix, *[zeros] * BOMB_MIB, varint(0)):
        out.append(c.compress(piece))
    out.append(c.flush())
    return batch(b"".join(out), 1, codec, compress=False)


def test_the_bomb_is_what_it_claims_to_be():
    """Without a bound the zstd bomb does inflate to BOMB_MIB MiB (the bombs below are real)."""
    b = bomb("zstd")
    assert len(b) < 1 << 20
    assert len(cramjam.zstd.decompress(bytes(b[HEADER_SIZE:]))) > BOMB_MIB << 20


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_compression_bomb_is_refused_at_the_bound_with_bounded_memory(codec, tmp_path):
    """Validation (produce) and decoding (every reader) stop at the bound, in a process whose
    peak memory stays well below what the batch claims."""
    path = tmp_path / "bomb"
    path.write_bytes(bomb(codec))
    script = f"""
import resource, sys
from odradek.log import inflate
from odradek.log.records import decode_batch, validate_produced
data = open({str(path)!r}, "rb").read()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for fn in (lambda: validate_produced(data), lambda: decode_batch(data)):
    try:
        fn()
        sys.exit("no error")
    except inflate.InflateLimitError as exc:
        assert "beyond %d bytes" % inflate.DEFAULT_LIMIT in exc.message, exc.message
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) >> 10)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    grown_mib = int(done.stdout.split()[-1])
    assert grown_mib < 64 + 32, f"{codec}: peak memory grew by {grown_mib} MiB"


def test_the_walk_reads_big_records_a_window_at_a_time():
    """Records larger than a window (and crossing window edges) check out under streaming."""
    body = b"".join(record(b"k", bytes([i]) * (3 * inflate.CHUNK + i), i) for i in range(5))
    for codec in ("gzip", "lz4", "zstd", "snappy"):
        b = batch(body, 5, codec)
        assert [o for o, _, _ in kafka_batch.walk(b, BatchHeader.read(b))] == list(range(5))


def test_decoded_records_match_what_was_encoded_with_headers():
    recs = [Record(i, 1000 + i, b"k", b"v" * i, [["h", b"x"]]) for i in range(3)]
    b = kafka_batch.encode(recs, base_offset=0, first_timestamp=1000, max_timestamp=1002, compression="gzip")
    validate_produced(b, compacted=True)
    assert [r.value for r in decode_batch(b)] == [b"", b"v", b"vv"]


def test_the_cleaner_stops_at_a_bomb_naming_its_offset_with_bounded_memory(tmp_path):
    """A compacted partition holding a bomb written before validation: the pass fails, naming
    the batch and the bound (the log actor logs it with the partition), in a process whose
    peak stays far below what the bomb claims."""
    path = tmp_path / "bomb"
    path.write_bytes(bomb("gzip"))
    script = f"""
import resource
from odradek.log import cleaner, inflate
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.records import encode_batch
lg = Log({str(tmp_path / "t-0")!r}, LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.0))
lg.append(bytearray(encode_batch([(b"k", b"old")])))
lg.append(bytearray(open({str(path)!r}, "rb").read()))
lg.append(bytearray(encode_batch([(b"k", b"new")])))
lg.roll()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    cleaner.clean(lg, force=True)
    print("cleaned")
except inflate.InflateLimitError as exc:
    print(exc.message)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) >> 10)
lg.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    message, grown_mib = done.stdout.splitlines()
    assert "batch at offset 1" in message and f"beyond {inflate.DEFAULT_LIMIT} bytes" in message, message
    assert int(grown_mib) < 64 + 96, f"the cleaner's peak grew by {grown_mib} MiB"


def test_the_walk_agrees_with_the_decoder_on_random_batches_and_never_raises_anything_else():
    import random
    rng = random.Random(27)
    for trial in range(60):
        n = rng.randrange(1, 40)
        recs = [Record(i, 1000 + rng.randrange(-5000, 5000), rng.choice([None, rng.randbytes(rng.randrange(0, 300))]),
                       rng.randbytes(rng.choice([0, 5, 70, 9000, 200_000])),
                       [[f"h{j}", rng.choice([None, rng.randbytes(rng.randrange(0, 100))])]
                        for j in range(rng.choice([0, 0, 1, 3]))]) for i in range(n)]
        codec = rng.choice(list(CODEC))
        b = bytearray(kafka_batch.encode(recs, base_offset=0, first_timestamp=1000, max_timestamp=6000,
                                         compression=codec))
        h = BatchHeader.read(b)
        assert [(o, 1000 + t, k) for o, t, k in kafka_batch.walk(b, h)] == \
            [(r.offset, r.timestamp, r.key is not None) for r in recs], codec
        validate_produced(b)
        for _ in range(5):  # a flipped byte behind a good CRC: a Kafka error code, nothing else
            bad = bytearray(b)
            at = rng.randrange(HEADER_SIZE, len(bad))
            bad[at] ^= 1 << rng.randrange(8)
            struct.pack_into(">I", bad, OFFSET_CRC, kafka_batch.crc_of(bad, 0, len(bad)))
            code_of(bad)
