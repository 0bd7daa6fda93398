"""Bounded, streaming decompression of one batch's records: the only place the project inflates.

Pure (stdlib, cramjam). Every path that reads records inside a compressed batch comes here
(produce validation, the timestamp lookup, the cleaner, dump-log, the consumers). ``chunks``
yields the decompressed bytes ``CHUNK`` at a time; ``inflate`` joins them.
Invariant: a compression bomb costs a caller at most ``limit`` bytes, never what the batch
claims. Per codec (docs/FORMAT.md, "Compressed records"): gzip streams through
``zlib.decompressobj``, ``CHUNK`` at a time; snappy (raw and xerial chunks) and lz4 block (the
native batch) state their inflated size, checked before inflating; zstd and lz4 frame inflate
into a buffer of ``GUESS`` times their size, grown eightfold up to ``limit + 1`` bytes.
Errors: ``InflateLimitError`` (MESSAGE_TOO_LARGE) when the bound is hit, ``CorruptRecordError``
(CORRUPT_MESSAGE) when the bytes do not decompress; the caller adds which batch it was.
"""
from __future__ import annotations

import io
import mmap
import struct
import zlib
from typing import Iterator

import cramjam

from odradek.core.errors import CorruptRecordError, RecordTooLargeError

CHUNK = 64 << 10  # decompressed bytes produced per step by the streaming codecs
INFLATE_FACTOR = 64  # a produced batch may inflate to this many times the topic's max.message.bytes
DEFAULT_LIMIT = INFLATE_FACTOR * (1 << 20)  # 64 MiB: readers that do not know the topic's setting

GZIP, SNAPPY, LZ4_FRAME, ZSTD = "gzip", "snappy", "lz4", "zstd"
LZ4_BLOCK = "lz4-block"  # Odradek's native batch: one lz4 block with a little-endian u32 size prefix
GUESS = 8  # zstd and lz4 frames: the first buffer, in times the compressed size (records rarely inflate more)
MAPPED = 1 << 20  # a buffer larger than this is a lazily mapped one
LZ4_MAX_RATIO = 255  # lz4 cannot expand a block by more than this (plus a small constant)
_XERIAL = b"\x82SNAPPY\x00"
_U32 = struct.Struct(">I")
_LZ4_SIZE = struct.Struct("<I")


class InflateLimitError(RecordTooLargeError):
    """A batch's records inflate beyond the bound (MESSAGE_TOO_LARGE)."""


def limit_for(max_message_bytes: int) -> int:
    """The inflated size a batch of a topic with this ``max.message.bytes`` may reach."""
    return INFLATE_FACTOR * max(max_message_bytes, 1 << 20)


def chunks(codec: str, data, limit: int = DEFAULT_LIMIT) -> Iterator:
    """The decompressed bytes of ``data`` (one batch's records, compressed with ``codec``),
    as successive buffers; ``InflateLimitError`` once more than ``limit`` bytes came out."""
    total = 0
    try:
        for piece in _CODECS[codec](data, limit):
            total += len(piece)
            if total > limit:
                raise InflateLimitError(_too_big(codec, limit))
            yield piece
    except (CorruptRecordError, RecordTooLargeError):
        raise
    except Exception as exc:  # zlib.error, cramjam's DecompressionError
        raise CorruptRecordError(f"{codec} records do not decompress: {exc}") from None


def inflate(codec: str, data, limit: int = DEFAULT_LIMIT) -> bytes:
    """The whole decompressed payload (at most ``limit`` bytes). Gathered in a ``BytesIO``,
    whose ``getvalue`` hands its buffer over: the peak is the payload, not twice it."""
    out = io.BytesIO()
    for piece in chunks(codec, data, limit):
        out.write(piece)
    return out.getvalue()


def _too_big(codec: str, limit: int) -> str:
    return f"{codec} records inflate beyond {limit} bytes, the bound for one batch (docs/FORMAT.md)"


def _gzip(data, limit: int) -> Iterator[bytes]:
    """One or more gzip members (Java's GZIPInputStream reads concatenated members too)."""
    rest = bytes(data)
    while True:
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        pending = rest
        while not d.eof:
            out = d.decompress(pending, CHUNK)
            pending = d.unconsumed_tail
            if out:
                yield out
            elif not pending:
                raise CorruptRecordError("gzip records are truncated")
        rest = d.unused_data
        if not rest:
            return


def _snappy(data, limit: int) -> Iterator[bytes]:
    """Raw snappy (librdkafka) or the Java client's xerial framing (8-byte magic, two
    versions, then [u32 length, raw block] chunks)."""
    data = bytes(data)
    if not data.startswith(_XERIAL):
        yield _snappy_block(data, limit)
        return
    pos = 16
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptRecordError("snappy chunk length is truncated")
        (n,) = _U32.unpack_from(data, pos)
        yield _snappy_block(data[pos + 4:pos + 4 + n], limit)
        pos += 4 + n


def _snappy_block(block: bytes, limit: int) -> bytes:
    if cramjam.snappy.decompress_raw_len(block) > limit:
        raise InflateLimitError(_too_big(SNAPPY, limit))
    return bytes(cramjam.snappy.decompress_raw(block))


def _into_bounded(codec: str, decompress_into):
    """A codec's frames (one or more, concatenated) inflated into a buffer, handed out
    ``CHUNK`` at a time. The buffer starts at ``GUESS`` times the compressed size and grows
    eightfold while it fills, to ``limit + 1`` bytes at most: full then means beyond the bound.
    Large buffers are lazily mapped (pages are committed only as they are written)."""
    def inflate_into(data, limit: int) -> Iterator:
        data = bytes(data)
        size = min(limit + 1, max(CHUNK, GUESS * len(data)))
        while True:
            out = bytearray(size) if size <= MAPPED else mmap.mmap(-1, size)
            try:
                n = decompress_into(data, out)
                break
            except cramjam.DecompressionError as exc:
                _close(out)
                if "whole buffer" not in str(exc):
                    raise
                if size > limit:  # full at the bound
                    raise InflateLimitError(_too_big(codec, limit)) from None
                size = min(limit + 1, size * 8)
        view = memoryview(out)
        try:
            for at in range(0, n, CHUNK):
                yield view[at:min(at + CHUNK, n)].tobytes()
        finally:
            view.release()
            _close(out)
    return inflate_into


def _close(out) -> None:
    if isinstance(out, mmap.mmap):
        out.close()


_zstd = _into_bounded(ZSTD, cramjam.zstd.decompress_into)
_lz4_frame = _into_bounded(LZ4_FRAME, cramjam.lz4.decompress_into)


def _lz4_block(data, limit: int) -> Iterator[bytes]:
    if len(data) < _LZ4_SIZE.size:
        raise CorruptRecordError("lz4 block shorter than its size prefix")
    size = _LZ4_SIZE.unpack_from(data)[0]
    if size > LZ4_MAX_RATIO * len(data) + 64:
        raise CorruptRecordError(f"lz4 block claims {size} bytes from {len(data)}: impossible")
    if size > limit:
        raise InflateLimitError(_too_big(LZ4_BLOCK, limit))
    yield cramjam.lz4.decompress_block(data)


_CODECS = {GZIP: _gzip, SNAPPY: _snappy, LZ4_FRAME: _lz4_frame, ZSTD: _zstd, LZ4_BLOCK: _lz4_block}
