"""Kafka framing: size-prefixed requests in, size-prefixed responses out. Pure, no I/O.

A request: i32 size, i16 api_key, i16 api_version, i32 correlation_id, nullable string
client_id (header v1), tagged fields for a flexible version (header v2), the body. A response:
i32 size, i32 correlation_id (header v0), tagged fields if flexible (header v1), the body.
``sniff`` tells a Kafka connection from a native one by its first 9 bytes (docs/PROTOCOL.md):
a native frame's byte 8 opens a msgpack map (>= 0x80); a Kafka request's byte 8 is the top
byte of a non-negative correlation id (< 0x80) and bytes 4-5 hold a Kafka API key.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from odradek.core import codec
from odradek.core.protocol import ErrorCode

_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hhih")
SNIFF_BYTES = 9
MIN_REQUEST = _HEAD.size  # api key, version, correlation id, client id length
MAX_KAFKA_API_KEY = 200
RAW_SASL = -1  # the api key of a raw SASL token (SaslHandshake v0's exchange): no header
MAX_RAW_TOKEN = 65536


class FrameError(codec.FrameError):
    """A stream that cannot be split into Kafka requests, or a request that does not
    decode: the processor logs it and closes the connection (no correlation id to answer,
    as Kafka does)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST):
        super().__init__(message, code)


class Request(NamedTuple):
    """One Kafka request: the header's fields and a view of the bytes after the client id
    (tagged header fields, if any, then the body)."""

    api: int
    version: int
    corr: int
    client: str
    rest: memoryview


def sniff(first: bytes) -> str | None:
    """``"kafka"``, ``"native"``, or None if fewer than ``SNIFF_BYTES`` bytes are known."""
    if len(first) < SNIFF_BYTES:
        return None
    if first[8] >= 0x80:
        return "native"
    api = struct.unpack_from(">h", first, 4)[0]
    return "kafka" if 0 <= api <= MAX_KAFKA_API_KEY else "native"


class Decoder:
    """Fed bytes, yields whole requests. The buffer grows with bytes received, never with a
    size announced: a request over ``max_size`` is refused as soon as its size is read."""

    def __init__(self, max_size: int):
        self.max_size = max_size
        self._buf = bytearray()
        self._pos = 0
        # After a SaslHandshake v0 the client sends raw SASL tokens, size-prefixed without a
        # request header, until authenticated: ``next`` returns each as a RAW_SASL Request.
        self.raw = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as requests."""
        return len(self._buf) - self._pos

    def head_size(self) -> int | None:
        """Bytes (size prefix included) the request at the head of the stream announces, or
        None while its size prefix has not arrived (the processor refuses it by this before
        SASL authentication, and may let one connection read its rest past its byte budget;
        nothing is set aside for it)."""
        if len(self._buf) - self._pos < 4:
            return None
        return max(_I32.unpack_from(self._buf, self._pos)[0], 0) + 4

    def feed(self, data: bytes) -> None:
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def next(self) -> Request | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (size,) = _I32.unpack_from(buf, pos)
        if self.raw:
            if not 0 <= size <= MAX_RAW_TOKEN:
                raise FrameError(f"a SASL token of {size} bytes (after SaslHandshake v0): 0 to {MAX_RAW_TOKEN}",
                                 ErrorCode.SASL_AUTHENTICATION_FAILED)
            if pos + 4 + size > len(buf):
                return None
            self._pos = pos + 4 + size
            return Request(RAW_SASL, 0, -1, "", memoryview(bytes(buf[pos + 4:pos + 4 + size])))
        if size < MIN_REQUEST:
            raise FrameError(f"Kafka request size {size} is smaller than a request header ({MIN_REQUEST})")
        if size > self.max_size:
            raise FrameError(f"Kafka request of {size + 4} bytes is larger than socket.request.max.bytes "
                             f"({self.max_size})", ErrorCode.MESSAGE_TOO_LARGE)
        end = pos + 4 + size
        if end > len(buf):
            return None
        with memoryview(buf) as view:  # one copy (a bytearray slice, then bytes(), made two)
            frame = memoryview(view[pos + 4:end].tobytes())
        self._pos = end
        return parse_header(frame)


def parse_header(frame: memoryview) -> Request:
    api, version, corr, n = _HEAD.unpack_from(frame, 0)
    at = _HEAD.size
    client = ""
    if n > 0:
        if at + n > len(frame):
            raise FrameError(f"client id of {n} bytes runs past the request ({len(frame)} bytes)")
        client = bytes(frame[at:at + n]).decode("utf-8", "replace")
        at += n
    elif n < -1:
        raise FrameError(f"client id length {n} is negative")
    return Request(api, version, corr, client, frame[at:])


def skip_tagged(view: memoryview, at: int) -> int:
    """Skip a tagged-field section at ``at``; the position after it."""
    count, at = read_uvarint(view, at)
    for _ in range(count):
        _tag, at = read_uvarint(view, at)
        size, at = read_uvarint(view, at)
        at += size
        if at > len(view):
            raise FrameError("tagged field runs past the request")
    return at


def read_uvarint(view, at: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if at >= len(view):
            raise FrameError("varint runs past the request")
        b = view[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7
        if shift > 35:
            raise FrameError("varint longer than 5 bytes")


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def response(corr: int, flexible_header: bool, body: list) -> list:
    """The buffers of one response: size, correlation id, tagged fields if flexible, body."""
    head = _I32.pack(corr) + (b"\x00" if flexible_header else b"")
    size = len(head) + sum(len(b) if not hasattr(b, "left") else b.left for b in body)
    return [_I32.pack(size) + head, *body]
