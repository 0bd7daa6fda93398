"""Kafka's record batch (magic 2): checks for the broker, decoding and encoding for clients. Pure.

Beside ``core.records``, which dispatches here by the magic byte. Same 61-byte header as the
native batch (``HEADER``, spelled here); it differs in the magic (2), the checksum (CRC-32C over
the same bytes), the attribute bits (compression 0 none, 1 gzip, 2 snappy, 3 lz4 frame, 4 zstd;
bit 4 transactional) and the records, varint-framed.
The broker calls ``check_header``, ``crc_of`` and ``check_records`` (every record's fields as
Kafka's DefaultRecord reader checks them; in C, core/_recordscan.c, with ``walk`` the Python
reference). Readers call ``decode``; the processor calls ``from_native`` to hand a Kafka
consumer a natively written batch. Bytes: docs/FORMAT.md.
"""
from __future__ import annotations

import logging
import struct
from typing import Sequence

import cramjam
import crc32c as _crc32c

from odradek.core import inflate
from odradek.core.errors import CorruptRecordError, InvalidRecordError, RecordErrors

try:  # Kafka's DefaultRecord checks in C (core/_recordscan.c, built by setup.py); check_records
    from odradek.core import _recordscan  # falls back to the Python walk without it
except ImportError:
    _recordscan = None
if getattr(_recordscan, "VERSION", None) != 1:  # a build of another version of the C source: not used
    _recordscan = None
_warned = False

MAGIC = 2

# The batch header: the one place its layout is spelled, for both formats (Kafka's magic 2 and
# Odradek's native batch share it; ``records`` and every reader of header fields import it):
# baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32 |
# attributes i16 | lastOffsetDelta i32 | firstTimestamp i64 | maxTimestamp i64 |
# producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes batchLength does not count
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49
OFFSET_BASE = 0
OFFSET_LENGTH = 8
OFFSET_LEADER_EPOCH = 12
OFFSET_MAGIC = 16
OFFSET_CRC = 17
OFFSET_ATTRIBUTES = 21  # the CRC covers [21, end)
OFFSET_MAX_TIMESTAMP = 35
OFFSET_PRODUCER_ID = 43
OFFSET_PRODUCER_EPOCH = 51
CRC_START = OFFSET_ATTRIBUTES
# Views of the same header for hot paths that read or write a few fields in one call
# (tests/log/test_batch_validation.py checks each against HEADER):
PATCHED_PREFIX = OFFSET_MAGIC  # baseOffset, batchLength, partitionLeaderEpoch: what an append rewrites
PATCHED_HEAD = struct.Struct(">qii")  # those 16 bytes
# HEADER without the leader epoch and first timestamp (the log's one-batch append guard):
# baseOffset, batchLength, magic, crc, attributes, lastOffsetDelta, maxTimestamp, producerId,
# producerEpoch, baseSequence, recordCount
APPEND_VIEW = struct.Struct(">qi4xbIhi8xqqhii")
LENGTH_AND_MAGIC = struct.Struct(">8xi4xb")  # batchLength and magic, from a batch's start
LENGTH_AND_ATTRIBUTES = struct.Struct(">8xi9xh")  # batchLength and attributes, from a batch's start
PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence, at OFFSET_PRODUCER_ID

COMPRESSION_MASK = 0x07
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40
KNOWN_ATTRIBUTE_BITS = COMPRESSION_MASK | TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT | DELETE_HORIZON_BIT
_U32 = struct.Struct(">I")


def crc_of(buf, pos: int, size: int) -> int:
    """CRC-32C of the covered bytes of the magic-2 batch at ``pos`` occupying ``size`` bytes."""
    with memoryview(buf) as mv:
        return _crc32c.crc32c(mv[pos + CRC_START:pos + size])


def check_header(h, where: str) -> None:
    """Field checks that need no CRC; raises ``CorruptRecordError`` naming the failing one.

    A producer's batch numbers its records 0..n-1, so ``lastOffsetDelta`` must be
    ``recordCount - 1`` (Kafka's own rule for appends); a compacted batch read back may
    have gaps, which ``last_offset_delta >= record_count - 1`` allows."""
    if h.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(f"{where}: batchLength {h.batch_length} is shorter than the header "
                                 f"({MIN_BATCH_LENGTH})")
    if h.record_count < 0 or (h.record_count == 0 and not h.attributes & CONTROL_BIT):
        raise CorruptRecordError(f"{where}: recordCount {h.record_count} < 1")
    if h.last_offset_delta < h.record_count - 1:
        raise CorruptRecordError(
            f"{where}: lastOffsetDelta {h.last_offset_delta} < recordCount - 1 ({h.record_count - 1})")
    if h.base_offset < 0:
        raise CorruptRecordError(f"{where}: negative baseOffset {h.base_offset}")
    if h.attributes & ~KNOWN_ATTRIBUTE_BITS & 0xFFFF or h.attributes & COMPRESSION_MASK not in CODECS:
        raise CorruptRecordError(f"{where}: unknown attributes 0x{h.attributes & 0xFFFF:04x} "
                                 f"(compression {h.attributes & COMPRESSION_MASK})")


# ----------------------------------------------------------------------------- decoding

def _payload(buf, h, limit: int) -> bytes:
    data = memoryview(buf)[HEADER_SIZE:h.batch_length + LOG_OVERHEAD]
    codec = h.attributes & COMPRESSION_MASK
    return bytes(data) if codec == 0 else inflate.inflate(CODECS[codec], data, limit)


def _varint(data, pos: int, size: int = 10, error=CorruptRecordError) -> tuple[int, int]:
    """The zigzag varint at ``pos``, at most ``size`` bytes (Kafka's varint 5, varlong 10):
    (value, next position). Too long, past the end or beyond its width raises ``error``."""
    shift = result = 0
    for pos in range(pos, pos + size):
        if pos >= len(data):
            raise error("record runs past the end of the batch")
        b = data[pos]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            if result >> (64 if size == 10 else 32):
                raise error(f"varint overflows {64 if size == 10 else 32} bits")
            return (result >> 1) ^ -(result & 1), pos + 1
        shift += 7
    raise error(f"varint longer than {size} bytes")


def _bytes(data, pos: int) -> tuple[bytes | None, int]:
    n, pos = _varint(data, pos, 5)
    if n < 0:
        return None, pos
    if pos + n > len(data):
        raise CorruptRecordError("record field runs past the end of the batch")
    return data[pos:pos + n], pos + n


def decode(buf, h, record_type, limit: int = inflate.DEFAULT_LIMIT) -> list:
    """Decode the records of the magic-2 batch ``buf`` (header ``h``) into ``record_type``
    values ``(offset, timestamp, key, value, headers)``. Headers keys are str, values bytes.
    Compressed records inflate to at most ``limit`` bytes (``inflate.InflateLimitError``)."""
    data = _payload(buf, h, limit)
    out = []
    pos = 0
    append_time = h.attributes & TIMESTAMP_TYPE_BIT
    for _ in range(h.record_count):
        length, pos = _varint(data, pos, 5)
        end = pos + length
        if length < 0 or end > len(data):
            raise CorruptRecordError("record length runs past the end of the batch")
        pos += 1  # attributes (unused)
        ts_delta, pos = _varint(data, pos)
        off_delta, pos = _varint(data, pos, 5)
        key, pos = _bytes(data, pos)
        value, pos = _bytes(data, pos)
        count, pos = _varint(data, pos, 5)
        headers = []
        for _ in range(max(count, 0)):
            hk, pos = _bytes(data, pos)
            hv, pos = _bytes(data, pos)
            headers.append([(hk or b"").decode("utf-8", "replace"), hv])
        if pos != end:
            raise CorruptRecordError(f"record declares {length} bytes but its fields take {length + pos - end}")
        ts = h.max_timestamp if append_time else h.first_timestamp + ts_delta
        out.append(record_type(h.base_offset + off_delta, ts, key, value, headers))
    if pos != len(data):
        raise CorruptRecordError(f"{len(data) - pos} bytes after the batch's {h.record_count} records")
    return out


# ----------------------------------------------------------------------------- validation

_PREFIX = 26  # the most bytes before a record's key: length 5, attributes 1, timestamp 10, offset 5, key length 5
_FIELD = 5  # a 32-bit varint: a value or header length, a header count


def walk(buf, h, limit: int = inflate.DEFAULT_LIMIT, where: str = "batch"):
    """Yield ``(offset delta, timestamp delta, has key)`` for each record of the magic-2
    batch ``buf`` (header ``h``) as soon as its key length is read (a caller that stops there
    inflates nothing more), checking the records' structure as Kafka's DefaultRecord
    reader does, without keeping a key, value or header: varints no longer and no wider than
    their type, record and key lengths not negative, each record exactly the length it
    declares, exactly ``recordCount`` records and no byte after them. Compressed records are
    read a window at a time from ``inflate.chunks`` (at most ``limit`` bytes in all), so
    memory stays at a chunk whatever the batch claims. Raises ``InvalidRecordError``
    (INVALID_RECORD; Kafka's InvalidRecordException), or from decompression
    ``CorruptRecordError`` / ``inflate.InflateLimitError``. The produce path's check is the C
    ``Scanner`` (``check_records``); this is its reference, and the readers' walk."""
    data, more, edge = _records_of(buf, h, limit)
    base = pos = 0
    size = len(data)  # of the window
    n = h.record_count
    index = 0
    try:
        while index < n:
            if pos > edge:
                data, base, pos, size, edge = _window(more, data, base, pos, _PREFIX)
            # Each varint inline for one and two bytes (lengths under 64 and 8,192), else _varint.
            b = data[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | data[pos + 1] << 7
                length, pos = (b >> 1) ^ -(b & 1), pos + 2
            else:
                length, pos = _varint(data, pos, 5, InvalidRecordError)
            if length < 0:
                raise InvalidRecordError(f"record {index} has a negative length {length}")
            start = base + pos
            b = data[pos + 1]  # after the attributes byte (unused in magic 2)
            if b < 0x80:
                ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
            else:
                ts_delta, pos = _varint(data, pos + 1, 10, InvalidRecordError)
            b = data[pos]
            if b < 0x80:
                off_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                off_delta, pos = _varint(data, pos, 5, InvalidRecordError)
            b = data[pos]
            if b < 0x80:
                key_len, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                key_len, pos = _varint(data, pos, 5, InvalidRecordError)
            # yielded before the key and value are read past: a lookup that stops here inflates no further
            yield off_delta, ts_delta, key_len >= 0
            pos += max(key_len, 0)  # past the key (-1: null)
            if pos > size:
                data, base, pos, size, edge = _skip(more, data, base, pos)
            if pos > edge:
                data, base, pos, size, edge = _window(more, data, base, pos, _FIELD)
            value_len, pos = _varint(data, pos, 5, InvalidRecordError)
            pos += max(value_len, 0)  # past the value
            if pos > size:
                data, base, pos, size, edge = _skip(more, data, base, pos)
            if pos > edge:
                data, base, pos, size, edge = _window(more, data, base, pos, _FIELD)
            if data[pos]:  # a header count other than 0
                count, pos = _varint(data, pos, 5, InvalidRecordError)
                if count < 0 or count > length:
                    raise InvalidRecordError(f"record {index} has an invalid header count {count}")
                data, base, pos, size, edge = _headers(more, data, base, pos, count, index, edge)
            else:
                pos += 1
            if base + pos - start != length:
                raise InvalidRecordError(f"record {index} declares {length} bytes but its fields take "
                                         f"{base + pos - start}")
            index += 1
    except IndexError:
        raise _premature(where, n, index) from None
    _none_remaining(data, pos, more, where, n)


def _records_of(buf, h, limit: int):
    """``(data, more, edge)`` to start a walk: the records themselves (uncompressed; ``more``
    None, ``edge`` never reached) or an empty window over ``inflate.chunks`` (``edge`` -1:
    refill at once)."""
    payload = memoryview(buf)[HEADER_SIZE:h.batch_length + LOG_OVERHEAD]
    codec = h.attributes & COMPRESSION_MASK
    if codec == 0:
        return payload, None, 1 << 62
    return b"", inflate.chunks(CODECS[codec], payload, limit), -1


def _premature(where: str, n: int, index: int) -> InvalidRecordError:
    return InvalidRecordError(f"{where}: recordCount says {n} records; the records end in record {index} "
                              f"(Kafka: incorrect declared batch size, premature EOF)")


def _none_remaining(data, pos: int, more, where: str, n: int) -> None:
    if pos < len(data) or (more is not None and any(more)):
        raise InvalidRecordError(f"{where}: bytes remain after the batch's {n} records (Kafka: incorrect "
                                 f"declared batch size, records still remaining)")


def _headers(more, data, base: int, pos: int, count: int, index: int, edge: int):
    size = len(data)
    for _ in range(count):
        for key in (True, False):
            if pos > edge:
                data, base, pos, size, edge = _window(more, data, base, pos, _FIELD)
            length, pos = _varint(data, pos, 5, InvalidRecordError)
            if key and length < 0:
                raise InvalidRecordError(f"record {index} has a header key of negative size {length}")
            if length > 0:
                pos += length
                if pos > size:
                    data, base, pos, size, edge = _skip(more, data, base, pos)
    return data, base, pos, size, edge


def _window(more, data, base: int, pos: int, need: int):
    """A window of the inflated records holding at least ``need`` bytes from ``pos`` (fewer
    at the end): ``(data, base, pos, size, edge)``, ``base`` being where ``data`` starts in
    the records, ``edge`` the position past which the next record's prefix may not fit."""
    parts = [data[pos:]]
    have = len(parts[0])
    for piece in more:
        parts.append(piece)
        have += len(piece)
        if have >= need:
            break
    data = b"".join(parts)
    return data, base + pos, 0, len(data), len(data) - _PREFIX


def _skip(more, data, base: int, pos: int):
    """Past the end of the window (``pos > len(data)``): drop the inflated bytes up to ``pos``;
    ``_window``'s 5-tuple."""
    if more is None:
        raise IndexError(pos)  # the record runs past the batch
    gone = pos - len(data)
    base += len(data)
    for piece in more:
        if len(piece) > gone:
            return piece, base, gone, len(piece), len(piece) - _PREFIX
        gone -= len(piece)
        base += len(piece)
    if gone:
        raise IndexError(pos)
    return b"", base, 0, 0, -_PREFIX


def check_records(buf, h, *, compacted: bool = False, limit: int = inflate.DEFAULT_LIMIT,
                  where: str = "batch") -> None:
    """LogValidator's record checks on a client's magic-2 batch, on every topic: each record
    parsed as Kafka's DefaultRecord reader does (``walk``'s checks: varints, lengths, header
    counts and keys, each record exactly its length, exactly ``recordCount`` records, nothing
    after them) and offset deltas 0 .. recordCount-1 in order; compressed records inflate a
    window at a time within ``limit`` bytes. On a ``compacted`` topic records without a key
    are listed by index (KIP-467) in the ``RecordErrors`` raised (INVALID_RECORD): the batch
    fails and the client learns which records did it. Done by the C ``Scanner``
    (core/_recordscan.c: 0.2-0.4 ms per 6,400-record batch, a quarter of the Python framing
    check it replaced) or, where it was not built, by ``walk`` (about a hundred times as
    much: the broker says so in its log at the first batch). Figures: docs/FORMAT.md."""
    keyless = [] if compacted else None
    if _recordscan is None:
        _check_by_walk(buf, h, keyless, limit, where)
    else:
        _check_by_scanner(buf, h, keyless, limit, where)
    if keyless:
        raise RecordErrors.keyless(where, keyless)


def _check_by_scanner(buf, h, keyless: list | None, limit: int, where: str) -> None:
    scanner = _recordscan.Scanner(h.record_count, keyless)
    payload = memoryview(buf)[HEADER_SIZE:h.batch_length + LOG_OVERHEAD]
    codec = h.attributes & COMPRESSION_MASK
    try:
        if codec == 0:
            scanner.feed(payload)
        else:
            for piece in inflate.chunks(CODECS[codec], payload, limit):
                scanner.feed(piece)
        scanner.close()
    except ValueError as exc:  # the Scanner's only error: a record that is not well formed
        raise InvalidRecordError(f"{where}: {exc}") from None


def _check_by_walk(buf, h, keyless: list | None, limit: int, where: str) -> None:
    """``check_records`` in Python: the reference the C ``Scanner`` is tested against."""
    global _warned
    if not _warned:
        _warned = True
        logging.getLogger("odradek.log").warning(
            "the C record checker (odradek.core._recordscan) is not built: produced batches are checked "
            "in Python, about 100 times slower; reinstall with a C compiler and Python's headers "
            "(bin/odradek does it when setup.py or core/_recordscan.c change)")
    expect = 0
    for off_delta, _ts, has_key in walk(buf, h, limit, where):
        if off_delta != expect:
            raise InvalidRecordError(f"{where}: record {expect} has offset delta {off_delta} (a producer numbers "
                                     f"its records 0 to recordCount - 1)")
        if not has_key and keyless is not None:
            keyless.append(expect)
        expect += 1


# ----------------------------------------------------------------------------- encoding

def _put_varint(out: bytearray, value: int) -> None:
    v = (value << 1) ^ (value >> 63)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _put_bytes(out: bytearray, value) -> None:
    if value is None:
        out.append(1)  # zigzag(-1)
        return
    _put_varint(out, len(value))
    out += value


def encode(records: Sequence, *, base_offset: int, first_timestamp: int, max_timestamp: int,
           partition_leader_epoch: int = -1, attributes: int = 0, producer_id: int = -1,
           producer_epoch: int = -1, base_sequence: int = -1, compression: str = "none",
           last_offset_delta: int | None = None) -> bytes:
    """One magic-2 batch from records with absolute ``offset``/``timestamp`` (e.g. decoded
    native ``Record``s, keeping their offsets). ``last_offset_delta`` defaults to the last
    record's; the cleaner keeps a compacted batch's own (Kafka keeps a v2 batch's base offset
    and last offset delta, so the producer's sequence span survives compaction)."""
    body = bytearray()
    for r in records:
        rec = bytearray(b"\x00")
        _put_varint(rec, r.timestamp - first_timestamp)
        _put_varint(rec, r.offset - base_offset)
        _put_bytes(rec, r.key)
        _put_bytes(rec, r.value)
        _put_varint(rec, len(r.headers or ()))
        for hk, hv in r.headers or ():
            _put_bytes(rec, hk.encode() if isinstance(hk, str) else hk)
            _put_bytes(rec, hv)
        _put_varint(body, len(rec))
        body += rec
    codec = {v: k for k, v in CODECS.items()}[compression]
    if codec == 1:
        body = bytes(cramjam.gzip.compress(bytes(body)))
    elif codec == 2:
        body = bytes(cramjam.snappy.compress_raw(bytes(body)))
    elif codec == 3:
        body = bytes(cramjam.lz4.compress(bytes(body)))
    elif codec == 4:
        body = bytes(cramjam.zstd.compress(bytes(body)))
    out = bytearray(HEADER_SIZE + len(body))
    last_delta = last_offset_delta if last_offset_delta is not None else (
        records[-1].offset - base_offset if records else 0)
    HEADER.pack_into(out, 0, base_offset, len(out) - LOG_OVERHEAD, partition_leader_epoch, MAGIC, 0,
                     (attributes & ~COMPRESSION_MASK) | codec, last_delta, first_timestamp, max_timestamp,
                     producer_id, producer_epoch, base_sequence, len(records))
    out[HEADER_SIZE:] = body
    _U32.pack_into(out, OFFSET_CRC, crc_of(out, 0, len(out)))
    return bytes(out)


def from_native(buf, h, records: list) -> bytes:
    """The magic-2 form of a native batch (header ``h``, decoded ``records``): same offsets,
    timestamps, producer fields and transactional/control/timestamp-type bits; records uncompressed."""
    attributes = h.attributes & (TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT)
    return encode(records, base_offset=h.base_offset, first_timestamp=h.first_timestamp,
                  max_timestamp=h.max_timestamp, partition_leader_epoch=h.partition_leader_epoch,
                  attributes=attributes, producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                  base_sequence=h.base_sequence)
