"""The producer's encoding (docs/CLIENT.md, "Producer": partitioning): Kafka's
default partitioner (``murmur2``, ``partition_for_key``) and a batch's bytes (``encode_rows``:
the rows packed as msgpack, compressed, under the ``core.records`` header and its CRC, or
Kafka's magic-2 batch for the Kafka codecs). Plain values are packed in C when the optional
extension ``odradek._recordbuild`` is built; ``pack_rows`` and the header code here are its
Python twin and fallback (same bytes). Runs on whichever thread closes a batch.
"""
from __future__ import annotations

import struct
import zlib
from operator import add
from typing import Optional

import cramjam
import msgpack

from odradek.core import kafka_batch
from odradek.core import records as fmt


_packb = msgpack.Packer(use_bin_type=True).pack
_HEADER_PACK = fmt.HEADER.pack_into
_CRC_PACK = struct.Struct(">I").pack_into
_crc32 = zlib.crc32
try:  # plain batches in C (odradek/_recordbuild.c, built by setup.py); optional: else the Python below
    from odradek import _recordbuild as _native
    if not hasattr(_native, "batch"):  # a build from before the producer's functions
        _native = None
except ImportError:
    _native = None


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 of the key bytes (Utils.murmur2), as an unsigned 32-bit value."""
    m, n = 0x5BD1E995, len(key)
    h = (0x9747B28C ^ n) & 0xFFFFFFFF
    end = n & ~3
    for (k,) in struct.iter_unpack("<I", key[:end]):
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        h = ((h * m) & 0xFFFFFFFF) ^ ((k * m) & 0xFFFFFFFF)
    extra = n & 3
    if extra == 3:
        h ^= key[end + 2] << 16
    if extra >= 2:
        h ^= key[end + 1] << 8
    if extra >= 1:
        h = ((h ^ key[end]) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition of a keyed record: Kafka's default partitioner, so a Kafka producer and
    this one put a key on the same partition."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


# Codecs the native batch format does not have (it compresses with lz4 blocks): a batch
# compressed with one of them is written as Kafka's magic-2 batch (``core.kafka_batch``, what a
# Kafka producer sends; the broker stores and serves both kinds, docs/FORMAT.md).
KAFKA_CODECS = ("gzip", "snappy", "zstd")
CODECS = (None, "lz4", *KAFKA_CODECS)


def encode_rows(rows: list, base_ts: int, max_ts: int, compression: Optional[str], keys: list | None = None,
                plain: bool = False) -> bytes:
    """One record batch (``core.records`` layout, base offset 0) from ``rows``: each item is
    either a value (bytes: a record with no headers and the batch's timestamp; its key is
    ``keys[i]``, or None when ``keys`` is None) or a full row ``(offset_delta,
    timestamp_delta, key, value, headers)``; offset deltas are the positions 0..n-1.
    ``plain``: the caller knows every row is a value and every key bytes (``pack_rows``).
    ``KAFKA_CODECS``: a magic-2 batch instead.

    Plain values are packed in C when ``odradek._recordbuild`` is built (``_native``): an
    uncompressed batch whole, in one allocation (``batch``); an lz4 one's rows (``pack``), then
    compressed here. Every batch goes under its header in C (``seal``). Without the extension,
    or for rows that are not plain, the Python below makes the same bytes (its twin)."""
    if compression in KAFKA_CODECS:
        return kafka_batch.encode([fmt.Record(i, base_ts, None if keys is None else keys[i], r, [])
                                   if isinstance(r, (bytes, bytearray, memoryview))
                                   else fmt.Record(r[0], base_ts + r[1], r[2], r[3], r[4] or [])
                                   for i, r in enumerate(rows)],
                                  base_offset=0, first_timestamp=base_ts, max_timestamp=max_ts, compression=compression)
    native = _native
    if native is None:
        payload = pack_rows(rows, keys, plain)
    elif plain or _is_plain(rows, keys):
        if compression is None:
            return native.batch(rows, keys, base_ts, max_ts, fmt.MAGIC)
        payload = native.pack(rows, keys)
    else:
        payload = _pack_rows_of(rows, keys)
    attributes = 0
    if compression == "lz4":
        payload = cramjam.lz4.compress_block(payload)  # lz4 block, little-endian u32 size first
        attributes = fmt.COMPRESSION_LZ4
    if native is not None:
        return native.seal(payload, attributes, len(rows), base_ts, max_ts, fmt.MAGIC)
    out = bytearray(fmt.HEADER_SIZE + len(payload))
    n = len(rows)
    _HEADER_PACK(out, 0, 0, len(out) - fmt.LOG_OVERHEAD, -1, fmt.MAGIC, 0, attributes, n - 1,
                 base_ts, max_ts, -1, -1, -1, n)
    out[fmt.HEADER_SIZE:] = payload
    _CRC_PACK(out, fmt.OFFSET_CRC, _crc32(memoryview(out)[fmt.CRC_START:]))
    return bytes(out)


def pack_rows(rows: list, keys: list | None = None, plain: bool = False) -> bytes:
    """The msgpack array of rows, byte for byte what ``msgpack.packb`` makes of the full rows
    (``keys``, when given, holds the key of each plain value; see ``encode_rows``). The Python
    twin of ``odradek._recordbuild.pack``, and ``encode_rows``' path without it.

    A batch of plain values (the common case) is assembled with slice assignments and one
    ``join`` from cached byte strings: no Python code and no object per record. That is why
    ``send`` can queue a bare value (and its key, in ``keys``) instead of a row tuple. When
    every value has the same length (the usual benchmark and a common workload), each
    value's framing is one cached string: "end of the previous row + this row's position,
    timestamp, key and bin header"; keyed values the same, with the key between.
    ``plain`` (every row bytes, every key bytes: the accumulator knows it without looking)
    skips the scans that check it (~20 ns a record each)."""
    if not plain and not _is_plain(rows, keys):
        return _pack_rows_of(rows, keys)
    if keys is not None:
        return _pack_keyed(rows, keys)
    n = len(rows)
    parts = [None] * (2 * n)
    parts[1::2] = rows
    lengths = set(map(len, rows))
    if len(lengths) == 1:
        parts[0::2] = _framing_for(lengths.pop(), n)[:n]
    else:
        heads = [None] * (2 * n)
        heads[0::2] = _row_prefixes(n)
        heads[1::2] = map(_BIN_HEADER.__getitem__, map(len, rows))
        parts[0::2] = map(b"".join, zip(heads[0::2], heads[1::2]))
        parts[2::2] = map(b"\x90".__add__, parts[2::2])
    return _array_header(n) + b"".join(parts) + b"\x90"


def _is_plain(rows: list, keys: list | None) -> bool:
    """Every row a value (bytes) and, with keys, no key None (``pack_rows``' fast path)."""
    return set(map(type, rows)) == _ONLY_BYTES and (keys is None or None not in keys)


def _pack_rows_of(rows: list, keys: list | None) -> bytes:
    """``pack_rows`` of rows that are not all plain values: full rows, plain values between
    them, or values of which some have no key; msgpack packs the rows as they are."""
    if keys is not None:
        return _packb([(i, 0, k, r, ()) if r.__class__ is bytes else r for i, (r, k) in enumerate(zip(rows, keys))])
    if set(map(type, rows)) == _ONLY_TUPLES:  # full rows only
        return _packb(rows)
    return _packb([(i, 0, None, r, ()) if r.__class__ is bytes else r for i, r in enumerate(rows)])


def _pack_keyed(rows: list, keys: list) -> bytes:
    """``pack_rows`` of plain values with a key each (bytes). Values of one length (the usual
    case): three strings a record, (end of the previous row + position and timestamp), the
    key's cached *blob* (its bin header, the key, the value's bin header: ``_KEY_BLOBS``) and
    the value. Else four: (... + the key's bin header), key, value's bin header, value."""
    n = len(rows)
    lengths = set(map(len, rows))
    if len(lengths) == 1:
        parts = [None] * (3 * n)
        parts[0::3] = _framing_for(None, n, keyed=True)[:n]
        parts[1::3] = map(_key_blobs(lengths.pop()).__getitem__, keys)
        parts[2::3] = rows
        return _array_header(n) + b"".join(parts) + b"\x90"
    parts = [None] * (4 * n)
    parts[1::4] = keys
    parts[3::4] = rows
    parts[0::4] = map(add, _framing_for(None, n, keyed=True)[:n], map(_BIN_HEADER.__getitem__, map(len, keys)))
    parts[2::4] = map(_BIN_HEADER.__getitem__, map(len, rows))
    return _array_header(n) + b"".join(parts) + b"\x90"


class _KeyBlobs(dict):
    """key -> its bin header + key + the bin header of a value of this dict's length: a keyed
    record's middle in one string. Keys up to ``KEY_BLOB_MAX`` bytes are kept (at most
    ``KEY_BLOBS`` of them, then it starts over); longer ones are made each time."""

    def __init__(self, value_length: int):
        super().__init__()
        self.value_header = _BIN_HEADER[value_length]

    def __missing__(self, key: bytes) -> bytes:
        blob = _BIN_HEADER[len(key)] + key + self.value_header
        if len(key) <= KEY_BLOB_MAX:
            if len(self) >= KEY_BLOBS:
                self.clear()
            self[key] = blob
        return blob


def _key_blobs(value_length: int) -> _KeyBlobs:
    blobs = _KEY_BLOBS.get(value_length)
    if blobs is None:
        if len(_KEY_BLOBS) >= 16:
            _KEY_BLOBS.clear()
        blobs = _KEY_BLOBS[value_length] = _KeyBlobs(value_length)
    return blobs


def _row_prefixes(n: int) -> list:
    """Position i -> fixarray(5), i, timestamp delta 0, key nil (grown on demand)."""
    if len(_ROW_PREFIX) < n:
        _ROW_PREFIX.extend(b"\x95" + _packb(i) + b"\x00\xc0" for i in range(len(_ROW_PREFIX), n))
    return _ROW_PREFIX[:n]


def _framing_for(length: int | None, n: int, keyed: bool = False) -> list:
    """Position i -> (end of row i-1) + row i's prefix + the bin header of a ``length``-byte
    value (none for None). ``keyed``: the prefix stops before the key (its header follows)
    instead of ending with a nil key."""
    framing = _FRAMING.get((keyed, length))
    if framing is None or len(framing) < n:
        if len(_FRAMING) >= 64:
            _FRAMING.clear()
        head = b"" if length is None else _BIN_HEADER[length]
        framing = [(p[:-1] if keyed else p) + head for p in _row_prefixes(max(n, 256))]
        framing[1:] = [b"\x90" + f for f in framing[1:]]
        _FRAMING[(keyed, length)] = framing
    return framing


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2, "big") if n < 65536 else b"\xdd" + n.to_bytes(4, "big")


class _BinHeaders(dict):
    """length -> msgpack bin header (cached; values of one size share one entry)."""

    def __missing__(self, n: int) -> bytes:
        h = b"\xc4" + bytes((n,)) if n < 256 else b"\xc5" + n.to_bytes(2, "big") if n < 65536 \
            else b"\xc6" + n.to_bytes(4, "big")
        self[n] = h
        return h


_ONLY_BYTES = {bytes}
_ONLY_TUPLES = {tuple}
_ROW_PREFIX: list = []
_FRAMING: dict = {}  # (keyed, key or value length) -> framing strings by position (at most 64 kept)
_BIN_HEADER = _BinHeaders()
KEY_BLOBS = 65536  # keys a value length's _KeyBlobs keeps (then it starts over)
KEY_BLOB_MAX = 256  # bytes: longer keys are not kept
_KEY_BLOBS: dict = {}  # value length -> _KeyBlobs (at most 16 lengths kept)
