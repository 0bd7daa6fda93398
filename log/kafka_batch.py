"""Kafka's record batch (magic 2): checks for the broker, decoding and encoding for clients.

Layer 1 (pure, no I/O), beside ``log.records`` which dispatches here by the magic byte.
A magic-2 batch has the same 61-byte header as Odradek's native batch (``records.HEADER``);
what differs is the magic (2), the checksum (CRC-32C over the same covered bytes), the
attribute bits (compression 0 none, 1 gzip, 2 snappy, 3 lz4 frame, 4 zstd; bit 4
transactional) and the records, which are varint-framed instead of one msgpack list.

- The **broker** calls ``check_header`` and ``crc_of`` (via ``records``): header fields and
  CRC-32C, no per-record work; base offset and leader epoch are patched like a native batch.
- **Readers** call ``decode`` (the bundled consumer, the compactor, ``dump-log``) and the
  processor calls ``from_native`` to hand a Kafka consumer a batch written natively.
Byte-level description: docs/FORMAT.md.
"""
from __future__ import annotations

import struct
from typing import Sequence

import cramjam
import crc32c as _crc32c

from odradek.log.errors import CorruptRecordError

MAGIC = 2
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61, the same layout as the native header
LOG_OVERHEAD = 12
CRC_START = 21
OFFSET_CRC = 17
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

COMPRESSION_MASK = 0x07
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40
KNOWN_ATTRIBUTE_BITS = COMPRESSION_MASK | TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT | DELETE_HORIZON_BIT
MAX_DECOMPRESSED = 1 << 30
_XERIAL = b"\x82SNAPPY\x00"
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

def _payload(buf, h) -> bytes:
    data = bytes(memoryview(buf)[HEADER_SIZE:h.batch_length + LOG_OVERHEAD])
    codec = h.attributes & COMPRESSION_MASK
    try:
        if codec == 0:
            return data
        if codec == 1:
            return bytes(cramjam.gzip.decompress(data))
        if codec == 2:
            return _snappy(data)
        if codec == 3:
            return bytes(cramjam.lz4.decompress(data))
        return bytes(cramjam.zstd.decompress(data))
    except CorruptRecordError:
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError and friends
        raise CorruptRecordError(f"{CODECS[codec]} payload does not decompress: {exc}") from None


def _snappy(data: bytes) -> bytes:
    """Raw snappy (librdkafka) or the Java client's xerial framing (8-byte magic, two
    versions, then [u32 length, block] chunks)."""
    if not data.startswith(_XERIAL):
        return bytes(cramjam.snappy.decompress_raw(data))
    out, pos = bytearray(), 16
    while pos < len(data):
        (n,) = _U32.unpack_from(data, pos)
        out += cramjam.snappy.decompress_raw(data[pos + 4:pos + 4 + n])
        pos += 4 + n
        if len(out) > MAX_DECOMPRESSED:
            raise CorruptRecordError("snappy payload decompresses beyond 1 GiB")
    return bytes(out)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, next position)."""
    shift = result = 0
    while True:
        if pos >= len(data):
            raise CorruptRecordError("record runs past the end of the batch")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")


def _bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = _varint(data, pos)
    if n < 0:
        return None, pos
    if pos + n > len(data):
        raise CorruptRecordError("record field runs past the end of the batch")
    return data[pos:pos + n], pos + n


def decode(buf, h, record_type) -> list:
    """Decode the records of the magic-2 batch ``buf`` (header ``h``) into ``record_type``
    values ``(offset, timestamp, key, value, headers)``. Headers keys are str, values bytes."""
    data = _payload(buf, h)
    out = []
    pos = 0
    append_time = h.attributes & TIMESTAMP_TYPE_BIT
    for _ in range(h.record_count):
        length, pos = _varint(data, pos)
        end = pos + length
        if length < 0 or end > len(data):
            raise CorruptRecordError("record length runs past the end of the batch")
        pos += 1  # attributes (unused)
        ts_delta, pos = _varint(data, pos)
        off_delta, pos = _varint(data, pos)
        key, pos = _bytes(data, pos)
        value, pos = _bytes(data, pos)
        count, pos = _varint(data, pos)
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
           producer_epoch: int = -1, base_sequence: int = -1, compression: str = "none") -> bytes:
    """One magic-2 batch from records with absolute ``offset``/``timestamp`` (e.g. decoded
    native ``Record``s, keeping their offsets)."""
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
    last_delta = records[-1].offset - base_offset if records else 0
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
