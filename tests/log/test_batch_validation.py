"""A client's batch is validated as Kafka's LogValidator does (core.records.validate_produced,
core.kafka_batch.check_records), and compressed records inflate through one bounded helper
(core.inflate): pure tests, bytes in, the error code out."""
from __future__ import annotations

import struct
import subprocess
import sys
import zlib

import cramjam
import pytest

from odradek.core import inflate, kafka_batch
from odradek.core import records as records_module
from odradek.core.errors import (CorruptRecordError, InvalidRecordError, RecordErrors, RecordTooLargeError)
from odradek.core.records import (HEADER, HEADER_SIZE, OFFSET_CRC, BatchHeader, Record, decode_batch, encode_batch,
                                 validate_produced)
from odradek.core.protocol import ErrorCode

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
FIELDS = [  # inside a record: parsed on every topic too (Kafka's DefaultRecord reader), and by readers
    varint(3) + b"\x00" + b"\xff" * 11,                     # a timestamp varlong longer than 10 bytes
    varint(20) + b"\x00" + varint(0) + varint(0) + varint(-7) + b"\x00" * 16,  # a key length below -1 ... runs on
    varint(5) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(0) + varint(-3),  # a negative header count
    varint(8) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(0) + varint(0) + b"\x00\x00\x00",  # length lies
]


@pytest.mark.parametrize("compacted", [False, True])
@pytest.mark.parametrize("bad", FRAMING)
def test_malformed_framing_is_invalid_record_on_every_topic(bad, compacted):
    assert code_of(batch(bad, 1), compacted=compacted) == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("compacted", [False, True])
@pytest.mark.parametrize("bad", FIELDS)
def test_malformed_record_fields_are_invalid_record_on_every_topic(bad, compacted):
    assert code_of(batch(bad, 1), compacted=compacted) == ErrorCode.INVALID_RECORD
    with pytest.raises(CorruptRecordError):  # and every reader's decoder refuses them
        decode_batch(batch(bad, 1))


@pytest.mark.parametrize("compacted", [False, True])
def test_offset_deltas_out_of_order_are_invalid(compacted):
    b = batch(record(b"k", b"x", 0) + record(b"k", b"y", 7), 2)
    with pytest.raises(InvalidRecordError, match="offset delta 7"):
        validate_produced(b, compacted=compacted)


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
from odradek.core import inflate
from odradek.core.records import decode_batch, validate_produced
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
from odradek.core import inflate
from odradek.log import cleaner
from odradek.core.config import LogConfig
from odradek.log.log import Log
from odradek.core.records import encode_batch
lg = Log({str(tmp_path / "t-0")!r}, LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.0))
lg.append(bytearray(encode_batch([(b"k", b"old")])))
lg.append(bytearray(open({str(path)!r}, "rb").read()))
lg.append(bytearray(encode_batch([(b"k", b"new")])))
lg.roll()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lg.high_watermark = lg.log_end_offset
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


def random_records(rng, n: int, value_sizes: tuple, key_max: int, header_max: int) -> list:
    """``n`` records at offsets 0..n-1: random timestamps, null or random keys, values of one of
    ``value_sizes`` bytes, zero to three headers with null or random values."""
    return [Record(i, 1000 + rng.randrange(-5000, 5000), rng.choice([None, rng.randbytes(rng.randrange(0, key_max))]),
                   rng.randbytes(rng.choice(value_sizes)),
                   [[f"h{j}", rng.choice([None, rng.randbytes(rng.randrange(0, header_max))])]
                    for j in range(rng.choice([0, 0, 1, 3]))]) for i in range(n)]


def test_the_walk_agrees_with_the_decoder_on_random_batches_and_never_raises_anything_else():
    import random
    rng = random.Random(27)
    for trial in range(60):
        recs = random_records(rng, rng.randrange(1, 40), (0, 5, 70, 9000, 200_000), 300, 100)
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


# ----------------------------------------------------------------------------- the C checker and its reference

def test_the_c_record_checker_is_built():
    """bin/odradek and bin/test install it (setup.py); without it the produce path falls back
    to the Python walk, about a hundred times slower, and says so in the broker's log."""
    assert kafka_batch._recordscan is not None, "odradek.core._recordscan is not built: pip install -e . with gcc"


def outcome(b, compacted: bool, native: bool) -> tuple:
    """What ``check_records`` makes of batch ``b``: by the C Scanner (``native``) or the Python
    walk, its reference: ("ok",), ("keyless", indexes) or (exception class,)."""
    saved = kafka_batch._recordscan
    kafka_batch._recordscan = saved if native else None
    try:
        kafka_batch.check_records(b, BatchHeader.read(b), compacted=compacted)
    except RecordErrors as exc:
        return "keyless", [i for i, _ in exc.record_errors]
    except (CorruptRecordError, InvalidRecordError, RecordTooLargeError) as exc:
        return type(exc).__name__, exc.code
    finally:
        kafka_batch._recordscan = saved
    return ("ok",)


def body(*fields: bytes, length: int | None = None) -> bytes:
    """One record from its raw fields after the length (attributes first), its length right or ``length``."""
    raw = b"".join(fields)
    return varint(len(raw) if length is None else length) + raw


GOOD = record(b"k0", b"v" * 100, 0)
TAIL = record(None, b"w" * 100, 2)  # the third record, after the malformed second
HDR = varint(1) + varint(1) + b"h" + varint(1) + b"x"  # one header "h": b"x"
SECOND = {  # the second record of three, malformed each way Kafka's DefaultRecord reader refuses
    "an offsetDelta varint longer than 5 bytes": body(b"\x00", varint(0), b"\x81\x80\x80\x80\x80\x00",
                                                     varint(1) + b"k", varint(1) + b"v", varint(0)),
    "a timestampDelta varlong longer than 10 bytes": body(b"\x00", b"\x80" * 10 + b"\x00", varint(1),
                                                         varint(-1), varint(0), varint(0)),
    "a timestampDelta varlong beyond 64 bits": body(b"\x00", b"\xff" * 9 + b"\x03", varint(1), varint(-1),
                                                   varint(0), varint(0)),
    "a key length varint beyond 32 bits": body(b"\x00", varint(0), varint(1), b"\xff\xff\xff\xff\x1f",
                                               varint(0), varint(0)),
    "a value length varint truncated at the record's end": body(b"\x00", varint(0), varint(1), varint(-1),
                                                                b"\x80"),
    "a negative record length": varint(-3) + b"\x00" + varint(0) + varint(1) + varint(-1) + varint(0) + varint(0),
    "a record longer than its length": body(b"\x00", varint(0), varint(1), varint(1) + b"k", varint(1) + b"v",
                                            varint(0), length=7),
    "a record length taking the next record's first byte": body(b"\x00", varint(0), varint(1), varint(1) + b"k",
                                                                varint(1) + b"v", varint(0), length=9),
    "a record that ends early (its length holds two more bytes)": body(b"\x00", varint(0), varint(1), varint(-1),
                                                                      varint(1) + b"v", varint(0), b"\x00\x00"),
    "a negative header count": body(b"\x00", varint(0), varint(1), varint(-1), varint(0), varint(-1)),
    "a header count beyond the record's length": body(b"\x00", varint(0), varint(1), varint(-1), varint(0),
                                                      varint(1000)),
    "a header with a negative key length": body(b"\x00", varint(0), varint(1), varint(-1), varint(0), varint(1),
                                                varint(-1), varint(1) + b"x"),
    "a header value running past the record": body(b"\x00", varint(0), varint(1), varint(-1), varint(0),
                                                   varint(1), varint(1) + b"h", varint(90) + b"x"),
    "an offset delta out of order": record(b"k", b"v", 5),
    "a value running past the batch": body(b"\x00", varint(0), varint(1), varint(-1), varint(10 ** 6) + b"v",
                                          varint(0)),
}
WHOLE = {  # the batch as a whole
    "bytes after the last record": (GOOD + record(b"k", b"v", 1) + TAIL + b"\x00", 3),
    "fewer records than recordCount": (GOOD + record(b"k", b"v", 1), 3),
    "more records than recordCount": (GOOD + record(b"k", b"v", 1) + TAIL, 2),
    "a varint truncated at the batch's end": (GOOD + b"\x80", 2),
    "no records at all": (b"", 1),
}
CODECS_ALL = list(CODEC)


@pytest.mark.parametrize("codec", CODECS_ALL)
@pytest.mark.parametrize("case", list(SECOND) + list(WHOLE))
def test_the_c_checker_and_the_python_walk_refuse_each_malformed_batch_alike(case, codec):
    records, count = WHOLE[case] if case in WHOLE else (GOOD + SECOND[case] + TAIL, 3)
    b = batch(records, count, codec)
    # (no records at all under gzip is an empty gzip member: it does not decompress, CORRUPT_MESSAGE)
    expect = ("CorruptRecordError", ErrorCode.CORRUPT_MESSAGE) if case == "no records at all" and codec == "gzip" \
        else ("InvalidRecordError", ErrorCode.INVALID_RECORD)
    for compacted in (False, True):
        assert outcome(b, compacted, native=True) == outcome(b, compacted, native=False) == expect, \
            (case, codec, compacted)


@pytest.mark.parametrize("codec", CODECS_ALL)
def test_the_c_checker_passes_sound_batches_with_headers_nulls_and_records_across_windows(codec):
    good = GOOD + body(b"\x00", varint(-7), varint(1), varint(-1), varint(-1), HDR) \
        + record(b"k", bytes(3 * inflate.CHUNK + 5), 2) \
        + body(b"\x00", varint(0), varint(3), varint(-5), varint(-9), varint(2), varint(0), varint(-1),
               varint(2) + b"hh", varint(0))  # lengths below -1 are nulls, as Kafka reads them
    b = batch(good, 4, codec)
    assert outcome(b, False, True) == outcome(b, False, False) == ("ok",)
    assert outcome(b, True, True) == outcome(b, True, False) == ("keyless", [1, 3])


def test_the_c_checker_agrees_with_the_python_walk_on_random_and_mutated_batches():
    """Sound random batches (every codec, headers, nulls, records across inflate windows), then
    each with bytes of its records flipped, inserted, dropped or cut before compression and the
    CRC made right: the two checkers give the same verdict, every time."""
    import random
    rng = random.Random(2027)
    verdicts = set()
    for trial in range(80):
        n = rng.randrange(1, 30)
        recs = random_records(rng, n, (0, 5, 100, 300, 70_000), 40, 20)
        raw = kafka_batch.encode(recs, base_offset=0, first_timestamp=1000, max_timestamp=6000)[HEADER_SIZE:]
        codec = rng.choice(CODECS_ALL)
        for mutation in range(8):
            records = bytearray(raw)
            if mutation:
                at = rng.randrange(len(records))
                kind = rng.randrange(4)
                if kind == 0:
                    records[at] ^= 1 << rng.randrange(8)
                elif kind == 1:
                    records[at:at] = rng.randbytes(rng.randrange(1, 4))
                elif kind == 2:
                    del records[at:at + rng.randrange(1, 4)]
                else:
                    del records[at:]
            b = batch(bytes(records), n, codec)
            for compacted in (False, True):
                native = outcome(b, compacted, native=True)
                assert native == outcome(b, compacted, native=False), (trial, mutation, codec, compacted)
                verdicts.add(native[0])
                if not mutation:
                    assert native[0] in ("ok", "keyless")
    assert {"ok", "keyless", "InvalidRecordError"} <= verdicts


def test_each_view_of_the_header_reads_the_fields_header_reads():
    """The batch header's layout is spelled once (core/kafka_batch.py); the few-field views the
    hot paths use agree with HEADER and the named offsets on a header of distinct values."""
    values = (1001, 2002, 3003, 2, 4004, 0x15, 6006, 7007, 8008, 9009, 1010, 1111, 1212)
    raw = kafka_batch.HEADER.pack(*values)
    base, length, epoch, magic, crc, attributes, _last, _first, max_ts, pid, pepoch, seq, count = values
    assert kafka_batch.PATCHED_HEAD.unpack_from(raw) == (base, length, epoch)
    assert kafka_batch.PATCHED_HEAD.size == kafka_batch.PATCHED_PREFIX
    assert kafka_batch.APPEND_VIEW.unpack_from(raw) == (base, length, magic, crc, attributes, _last, max_ts, pid,
                                                        pepoch, seq, count)
    assert kafka_batch.LENGTH_AND_MAGIC.unpack_from(raw) == (length, magic)
    assert kafka_batch.LENGTH_AND_ATTRIBUTES.unpack_from(raw) == (length, attributes)
    assert kafka_batch.PRODUCER_FIELDS.unpack_from(raw, kafka_batch.OFFSET_PRODUCER_ID) == (pid, pepoch, seq)
    at = {kafka_batch.OFFSET_BASE: (">q", base), kafka_batch.OFFSET_LENGTH: (">i", length),
          kafka_batch.OFFSET_LEADER_EPOCH: (">i", epoch), kafka_batch.OFFSET_MAGIC: (">b", magic),
          kafka_batch.OFFSET_CRC: (">I", crc), kafka_batch.OFFSET_ATTRIBUTES: (">h", attributes),
          kafka_batch.OFFSET_MAX_TIMESTAMP: (">q", max_ts), kafka_batch.OFFSET_PRODUCER_ID: (">q", pid),
          kafka_batch.OFFSET_PRODUCER_EPOCH: (">h", pepoch)}
    assert {o: struct.unpack_from(f, raw, o)[0] for o, (f, _) in at.items()} == {o: v for o, (_, v) in at.items()}
    assert kafka_batch.HEADER is records_module.HEADER
