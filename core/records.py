"""The record-batch format: one layout shared by producer, broker log and consumer. Pure.

The broker works on headers only: ``BatchHeader`` (a view of the 61-byte header),
``validate_batch`` / ``validate_batches`` (size, magic, CRC, offset span, count),
``patch_base_offset`` (in place; the CRC does not cover base offset and leader epoch) and
``iter_batches``. Clients and the compactor encode and decode records: ``encode_batch``,
``encode_records`` (keeping each record's offset), ``decode_batch``. Bytes: docs/FORMAT.md.
Invariants: no state, so any function is safe from any thread or process; decoding or
validating arbitrary bytes raises ``CorruptRecordError`` and nothing else (``validate_batch``
also ``RecordTooLargeError`` given a ``max_size``).
"""
from __future__ import annotations

import struct
import time
import zlib
from typing import Iterator, NamedTuple, Sequence

import cramjam
import msgpack

from odradek.core import inflate, kafka_batch
from odradek.core.errors import (CorruptRecordError, InvalidRecordError, InvalidTimestampError, RecordErrors,
                                RecordTooLargeError)

# The 61-byte header both formats share: its layout is spelled once, in kafka_batch
from odradek.core.kafka_batch import (APPEND_VIEW, CRC_START, HEADER, HEADER_SIZE, LENGTH_AND_MAGIC,  # noqa: F401
                                     LOG_OVERHEAD, MIN_BATCH_LENGTH, OFFSET_ATTRIBUTES, OFFSET_BASE, OFFSET_CRC,
                                     OFFSET_LEADER_EPOCH, OFFSET_LENGTH, OFFSET_MAGIC, OFFSET_MAX_TIMESTAMP,
                                     OFFSET_PRODUCER_EPOCH, OFFSET_PRODUCER_ID, PATCHED_HEAD, PATCHED_PREFIX,
                                     PRODUCER_FIELDS)

MAGIC = 0x4F  # 'O': Odradek's format 1; distinct from Kafka's magic 2 on purpose

# The attribute bits are Kafka's, at the same places (docs/FORMAT.md): TIMESTAMP_TYPE_BIT (0
# CreateTime, 1 LogAppendTime), TRANSACTIONAL_BIT (a transactional producer's batch,
# docs/TRANSACTIONS.md), CONTROL_BIT; only the compression codes differ
from odradek.core.kafka_batch import COMPRESSION_MASK, CONTROL_BIT, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT  # noqa: E402,F401

COMPRESSION_NONE = 0
COMPRESSION_LZ4 = 1
KNOWN_ATTRIBUTE_BITS = COMPRESSION_MASK | TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT

NO_TIMESTAMP = -1

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")


class Record(NamedTuple):
    """One decoded record (client side). ``headers`` is a list of ``[str, bytes]``."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list


class BatchHeader(NamedTuple):
    """The fixed 61-byte header, read in one ``struct.unpack_from`` without touching records."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @classmethod
    def read(cls, buf, pos: int = 0) -> "BatchHeader":
        """The header at ``pos``; ``CorruptRecordError`` if fewer than 61 bytes are there."""
        try:
            return cls._make(HEADER.unpack_from(buf, pos))
        except struct.error:
            raise CorruptRecordError(
                f"truncated batch header at position {pos}: need {HEADER_SIZE} bytes") from None

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies (header and records)."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


_make_header = BatchHeader._make

# ----------------------------------------------------------------------------- broker side

def check_header(h: BatchHeader, pos: int | None = None) -> None:
    """Field checks that need no CRC: magic, length, counts, offset span, attributes.

    One combined test on the fast path; the precise message is built only on failure.
    """
    if (h.magic == MAGIC and h.batch_length >= MIN_BATCH_LENGTH and h.record_count >= 1
            and h.last_offset_delta >= h.record_count - 1 and h.base_offset >= 0
            and not h.attributes & ~KNOWN_ATTRIBUTE_BITS and h.attributes & COMPRESSION_MASK <= COMPRESSION_LZ4):
        return
    _diagnose(h, "batch" if pos is None else f"batch at byte {pos}")


def _diagnose(h: BatchHeader, where: str) -> None:
    if h.magic == kafka_batch.MAGIC:  # Kafka's batch: its own rules (core/kafka_batch.py)
        kafka_batch.check_header(h, where)
        return
    if h.magic != MAGIC:
        raise CorruptRecordError(f"{where}: magic {h.magic} is not {MAGIC}")
    if h.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"{where}: batchLength {h.batch_length} is shorter than the header ({MIN_BATCH_LENGTH})")
    if h.record_count < 1:
        raise CorruptRecordError(f"{where}: recordCount {h.record_count} < 1")
    if h.last_offset_delta < h.record_count - 1:
        raise CorruptRecordError(
            f"{where}: lastOffsetDelta {h.last_offset_delta} < recordCount - 1 ({h.record_count - 1})")
    if h.base_offset < 0:
        raise CorruptRecordError(f"{where}: negative baseOffset {h.base_offset}")
    raise CorruptRecordError(f"{where}: unknown attributes 0x{h.attributes & 0xFFFF:04x}")


def crc_of(buf, pos: int, size: int) -> int:
    """CRC-32 of the covered bytes of the batch at ``pos`` occupying ``size`` bytes."""
    if buf[pos + OFFSET_MAGIC] == kafka_batch.MAGIC:
        return kafka_batch.crc_of(buf, pos, size)
    with memoryview(buf) as mv:
        return zlib.crc32(mv[pos + CRC_START:pos + size])


def _crc_kind(h: BatchHeader) -> str:
    return "CRC-32C (Kafka's magic 2)" if h.magic == kafka_batch.MAGIC else "CRC"


def validate_batch(buf, max_size: int | None = None) -> BatchHeader:
    """Check that ``buf`` holds exactly one sound batch; return its header.

    Raises ``CorruptRecordError`` (with the failing check in the message) or, when
    ``max_size`` is given and exceeded, ``RecordTooLargeError``.
    """
    n = len(buf)
    h = BatchHeader.read(buf)
    if h.size != n:
        raise CorruptRecordError(f"batchLength {h.batch_length} says {h.size} bytes; buffer holds {n}")
    if max_size is not None and n > max_size:
        raise RecordTooLargeError(f"batch of {n} bytes exceeds max.message.bytes {max_size}")
    check_header(h)
    crc = crc_of(buf, 0, n)
    if crc != h.crc:
        raise CorruptRecordError(f"{_crc_kind(h)} mismatch: header says {h.crc:#010x}, bytes give {crc:#010x}")
    return h


def validate_batches(buf, max_size: int | None = None, verify_crc: bool = True) -> list[BatchHeader]:
    """Validate a buffer of one or more concatenated batches, every byte accounted for.

    The broker's append path: header fields and CRC per batch, records never decoded.
    ``verify_crc=False`` skips only the CRC, for callers that checked it already.
    """
    n = len(buf)
    headers = []
    pos = 0
    with memoryview(buf) as mv:
        while pos < n:
            if n - pos < HEADER_SIZE:
                raise CorruptRecordError(f"{n - pos} trailing bytes at {pos} are not a whole batch")
            h = _make_header(HEADER.unpack_from(buf, pos))
            check_header(h, pos)
            end = pos + h.batch_length + LOG_OVERHEAD
            if end > n:
                raise CorruptRecordError(f"batch at byte {pos}: batchLength {h.batch_length} runs past the end ({n})")
            if max_size is not None and end - pos > max_size:
                raise RecordTooLargeError(
                    f"batch at byte {pos}: {end - pos} bytes exceeds max.message.bytes {max_size}")
            if verify_crc and crc_of(mv, pos, end - pos) != h.crc:
                raise CorruptRecordError(f"batch at byte {pos}: {_crc_kind(h)} mismatch")
            headers.append(h)
            pos = end
    if not headers:
        raise CorruptRecordError("empty record set")
    return headers


def validate_produced(buf, max_size: int | None = None, *, compacted: bool = False,
                      limit: int = inflate.DEFAULT_LIMIT) -> list[BatchHeader]:
    """``validate_batches`` plus what only a client's batch must satisfy (Kafka's LogValidator
    on produce): no control bit, offsets 0 .. recordCount-1 (``lastOffsetDelta = recordCount - 1``),
    timestamps that are -1 (none) or not negative, and records that agree with the header,
    read through the bounded inflater (``limit`` bytes at most, ``inflate``):

    - a Kafka (magic 2) batch alone in its partition's records, a sequence number if it has a
      producer id, and every record parsed as Kafka's DefaultRecord reader does, offset
      deltas and (on a compacted topic) keys included (``kafka_batch.check_records``);
    - a native batch's payload is what the compression bit says (an lz4 block, or raw msgpack)
      and an array of exactly ``recordCount`` entries, the first at offset delta 0 (the
      consumer checks the last one's against ``lastOffsetDelta``); on a compacted topic
      each entry is decoded for its key.

    On a ``compacted`` topic a record without a key is refused (``RecordErrors`` lists them).
    Replicated and compacted batches (gaps, control batches) take ``validate_batches`` only.
    Raises ``InvalidRecordError`` (INVALID_RECORD), ``InvalidTimestampError``
    (INVALID_TIMESTAMP), ``CorruptRecordError`` (CORRUPT_MESSAGE) or ``RecordTooLargeError``
    (MESSAGE_TOO_LARGE: beyond ``max_size``, or inflating beyond ``limit``).
    """
    headers = validate_batches(buf, max_size)
    pos = 0
    for h in headers:
        where = f"batch at byte {pos}"
        if h.attributes & CONTROL_BIT:
            raise InvalidRecordError(f"{where}: the control bit is set; clients may not write control batches")
        if h.last_offset_delta != h.record_count - 1:
            raise InvalidRecordError(f"{where}: lastOffsetDelta {h.last_offset_delta} does not match recordCount "
                                     f"{h.record_count} (a producer's records have offsets 0 to recordCount - 1)")
        if h.first_timestamp < NO_TIMESTAMP or h.max_timestamp < NO_TIMESTAMP:
            raise InvalidTimestampError(f"{where}: timestamp {min(h.first_timestamp, h.max_timestamp)} is "
                                        f"negative (only -1, no timestamp, may be)")
        batch = memoryview(buf)[pos:pos + h.size]
        if h.magic == MAGIC:
            _check_native_records(batch, h, where, compacted, limit)
        else:
            if len(headers) > 1:
                raise InvalidRecordError(f"{len(headers)} batches in one partition's records: a Kafka (magic 2) "
                                         f"batch comes alone")
            if h.producer_id >= 0 and h.base_sequence < 0:
                raise InvalidRecordError(f"{where}: producer id {h.producer_id} with sequence number "
                                         f"{h.base_sequence}")
            kafka_batch.check_records(batch, h, compacted=compacted, limit=limit, where=where)
        pos += h.size
    return headers


def _check_native_records(batch, h: BatchHeader, where: str, compacted: bool, limit: int) -> None:
    """The records' framing agrees with the header, read without decoding a record: the
    payload (decompressed if the lz4 bit is set) is a msgpack array of ``recordCount``
    entries whose first is a 5-element entry at offset delta 0. Constant work past the lz4
    block; the keys, values and headers inside are not looked at, but on a compacted topic,
    where every entry is decoded for its key."""
    data = _payload(batch, h, limit)
    count, at = _array_header(data)
    if count != h.record_count:
        held = "no list of" if count is None else count
        raise CorruptRecordError(f"{where}: recordCount says {h.record_count} records; the payload holds {held} "
                                 f"records")
    if data[at:at + 2] != b"\x95\x00":
        raise CorruptRecordError(f"{where}: the first record is not a 5-field entry at offset delta 0")
    if compacted:
        try:
            keyless = [i for i, entry in enumerate(_entries(data, h)) if entry[2] is None]
        except (TypeError, IndexError, KeyError):
            raise CorruptRecordError(f"{where}: a record entry is not a list of 5 fields") from None
        if keyless:
            raise RecordErrors.keyless(where, keyless)


def _array_header(data) -> tuple[int | None, int]:
    """``(length, header size)`` of the msgpack array at the start of ``data``, or (None, 0)."""
    first = data[0] if len(data) else 0
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if first == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None, 0


def patch_base_offset(buf, base_offset: int, leader_epoch: int | None = None, pos: int = 0) -> None:
    """Rewrite baseOffset (and partitionLeaderEpoch) of the batch at ``pos`` in place.

    Neither field is covered by the CRC, so the batch stays valid.
    """
    _I64.pack_into(buf, pos + OFFSET_BASE, base_offset)
    if leader_epoch is not None:
        _I32.pack_into(buf, pos + OFFSET_LEADER_EPOCH, leader_epoch)


def set_log_append_time(buf, timestamp_ms: int, pos: int = 0) -> None:
    """Mark the batch at ``pos`` LogAppendTime with maxTimestamp ``timestamp_ms``; redo its CRC.

    Both fields are covered by the CRC, so this costs one C-speed crc32 over the batch (still no
    record decoding). Used when a topic has ``message.timestamp.type=LogAppendTime``.
    """
    attributes = _I16.unpack_from(buf, pos + OFFSET_ATTRIBUTES)[0]
    _I16.pack_into(buf, pos + OFFSET_ATTRIBUTES, attributes | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(buf, pos + OFFSET_MAX_TIMESTAMP, timestamp_ms)
    size = _I32.unpack_from(buf, pos + OFFSET_LENGTH)[0] + LOG_OVERHEAD
    _U32.pack_into(buf, pos + OFFSET_CRC, crc_of(buf, pos, size))


def iter_batches(buf, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each whole batch in ``buf[pos:end]``.

    Stops cleanly at a partial trailing batch (a fetch response may end with one). Raises
    ``CorruptRecordError`` if a header is impossible (bad magic or length). Does not check CRCs.
    """
    end = len(buf) if end is None else end
    while end - pos >= HEADER_SIZE:
        h = BatchHeader.read(buf, pos)
        check_header(h, pos)
        if pos + h.size > end:
            return
        yield pos, h
        pos += h.size


# ----------------------------------------------------------------------------- client side

def _now_ms() -> int:
    return int(time.time() * 1000)


def _build(entries: list, base_offset: int, last_offset_delta: int, first_ts: int, max_ts: int,
           compression: str | None, *, producer_id: int, producer_epoch: int, base_sequence: int,
           partition_leader_epoch: int, control: bool, log_append_time: bool,
           transactional: bool = False) -> bytes:
    payload = msgpack.packb(entries, use_bin_type=True)
    attributes = 0
    if compression == "lz4":
        payload = cramjam.lz4.compress_block(payload)  # lz4 block, little-endian u32 size first
        attributes |= COMPRESSION_LZ4
    elif compression not in (None, "none"):
        raise ValueError(f"unsupported compression {compression!r} (use 'lz4' or None)")
    if control:
        attributes |= CONTROL_BIT
    if log_append_time:
        attributes |= TIMESTAMP_TYPE_BIT
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    out = bytearray(HEADER_SIZE + len(payload))
    HEADER.pack_into(out, 0, base_offset, len(out) - LOG_OVERHEAD, partition_leader_epoch, MAGIC, 0,
                     attributes, last_offset_delta, first_ts, max_ts, producer_id, producer_epoch,
                     base_sequence, len(entries))
    out[HEADER_SIZE:] = payload
    _U32.pack_into(out, OFFSET_CRC, zlib.crc32(memoryview(out)[CRC_START:]))
    return bytes(out)


def encode_batch(records: Sequence, compression: str | None = "lz4", base_offset: int = 0, *,
                 timestamp_ms: int | None = None, producer_id: int = -1, producer_epoch: int = -1,
                 base_sequence: int = -1, partition_leader_epoch: int = -1,
                 control: bool = False) -> bytes:
    """Encode records into one batch (offsets ``base_offset``, ``base_offset + 1``, ...).

    Each item is ``(key, value)``, ``(key, value, headers)`` or
    ``(key, value, headers, timestamp_ms)``; key and value are bytes or None, headers a list
    of ``(str, bytes)``. Records without their own timestamp get ``timestamp_ms`` (default:
    now). The whole record list is packed by one ``msgpack.packb`` call.
    """
    n = len(records)
    if n == 0:
        raise ValueError("a batch holds at least one record")
    ts = _now_ms() if timestamp_ms is None else timestamp_ms
    try:  # fast path: plain (key, value) pairs
        entries = [[i, 0, k, v, ()] for i, (k, v) in enumerate(records)]
        first_ts = max_ts = ts
    except ValueError:
        entries, first_ts, max_ts = _general_entries(records, ts)
    return _build(entries, base_offset, n - 1, first_ts, max_ts, compression,
                  producer_id=producer_id, producer_epoch=producer_epoch,
                  base_sequence=base_sequence, partition_leader_epoch=partition_leader_epoch,
                  control=control, log_append_time=False)


def _general_entries(records: Sequence, default_ts: int) -> tuple[list, int, int]:
    stamps = [r[3] if len(r) > 3 and r[3] is not None else default_ts for r in records]
    first_ts = stamps[0]
    entries = [[i, stamps[i] - first_ts, r[0], r[1], r[2] if len(r) > 2 and r[2] else ()]
               for i, r in enumerate(records)]
    return entries, first_ts, max(stamps)


def encode_records(records: Sequence[Record], compression: str | None = "lz4", *,
                   producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                   partition_leader_epoch: int = -1, control: bool = False,
                   log_append_time: bool = False, transactional: bool = False) -> bytes:
    """Encode ``Record`` values keeping their offsets (gaps allowed; increasing order).

    The batch's base offset is the first record's offset; used by the compactor to rewrite a
    batch with only its surviving records.
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    base = records[0].offset
    first_ts = records[0].timestamp
    entries = [[r.offset - base, r.timestamp - first_ts, r.key, r.value, r.headers or ()]
               for r in records]
    max_ts = max(r.timestamp for r in records)
    return _build(entries, base, records[-1].offset - base, first_ts, max_ts, compression,
                  producer_id=producer_id, producer_epoch=producer_epoch,
                  base_sequence=base_sequence, partition_leader_epoch=partition_leader_epoch,
                  control=control, log_append_time=log_append_time, transactional=transactional)


def _payload(buf, h: BatchHeader, limit: int = inflate.DEFAULT_LIMIT):
    data = memoryview(buf)[HEADER_SIZE:h.size]
    return data if h.compression == COMPRESSION_NONE else inflate.inflate(inflate.LZ4_BLOCK, data, limit)


def _entries(data, h: BatchHeader) -> list:
    """The msgpack entries ``[offset delta, timestamp delta, key, value, headers]`` of a native payload."""
    try:
        entries = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for malformed input
        raise CorruptRecordError(f"records do not decode: {type(e).__name__}") from None
    if type(entries) is not list or len(entries) != h.record_count:
        raise CorruptRecordError(f"records are not a list of {h.record_count}")
    return entries


def record_times(buf, h: BatchHeader, limit: int = inflate.DEFAULT_LIMIT) -> Iterator[tuple[int, int]]:
    """``(offset, timestamp)`` of each record of the batch ``buf`` (header ``h``), in order,
    without building a key, value or header (the timestamp lookup). A Kafka batch is walked a
    window at a time (``kafka_batch.walk``: memory stays at a window whatever the batch
    holds); a native one is read by msgpack's streaming unpacker over its payload (inflated
    to at most ``limit`` bytes). Raises ``CorruptRecordError``, ``InvalidRecordError`` or
    ``inflate.InflateLimitError``."""
    base, first_ts = h.base_offset, h.first_timestamp
    append_time = h.max_timestamp if h.log_append_time else None
    if h.magic == kafka_batch.MAGIC:
        for offset_delta, ts_delta, _ in kafka_batch.walk(buf, h, limit):
            yield base + offset_delta, first_ts + ts_delta if append_time is None else append_time
        return
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(limit, h.size))
    unpacker.feed(_payload(buf, h, limit))
    try:
        for _ in range(unpacker.read_array_header()):
            if unpacker.read_array_header() != 5:
                raise ValueError("a record entry is not 5 fields")
            offset_delta, ts_delta = unpacker.unpack(), unpacker.unpack()
            unpacker.skip(), unpacker.skip(), unpacker.skip()  # key, value, headers
            yield base + offset_delta, first_ts + ts_delta if append_time is None else append_time
    except (ValueError, TypeError, msgpack.OutOfData, msgpack.UnpackException) as e:
        raise CorruptRecordError(f"records do not decode: {type(e).__name__}") from None


def decode_batch(buf, verify_crc: bool = True, limit: int = inflate.DEFAULT_LIMIT) -> list[Record]:
    """Decode the one batch in ``buf`` into records (client and compactor side). Compressed
    records inflate to at most ``limit`` bytes (``inflate.InflateLimitError`` beyond)."""
    h = validate_batch(buf) if verify_crc else BatchHeader.read(buf)
    if not verify_crc:
        check_header(h)
        if h.size > len(buf):
            raise CorruptRecordError("batch runs past the end of the buffer")
    if h.magic == kafka_batch.MAGIC:
        return kafka_batch.decode(buf, h, Record, limit)
    entries = _entries(_payload(buf, h, limit), h)
    base, first_ts = h.base_offset, h.first_timestamp
    try:
        if h.log_append_time:
            ts = h.max_timestamp
            out = [Record(base + od, ts, k, v, hd) for od, _td, k, v, hd in entries]
        else:
            out = [Record(base + od, first_ts + td, k, v, hd) for od, td, k, v, hd in entries]
    except (TypeError, ValueError) as e:
        raise CorruptRecordError(f"malformed record entry: {e}") from None
    if out[0].offset < base or out[-1].offset != base + h.last_offset_delta:
        raise CorruptRecordError("record offsets disagree with the header's offset span")
    return out
