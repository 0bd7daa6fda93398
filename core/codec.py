"""The native wire framing over TCP: bytes in, frames out, and back. Pure, sans-io.

Used by the processor (broker side) and ``network.client`` (client side); owns only its buffers.
A frame (docs/PROTOCOL.md)::

    u32 size          big-endian; the number of bytes after this field
    u32 header_len    big-endian
    header            msgpack map, header_len bytes
    payload           the concatenation of the frames listed in header["frames"]

Request header ``{"api", "v", "corr", "client", "body", "frames": [len, ...]}``; response
header ``{"corr", "body", "frames"}``. Payloads (record batches) never go inside msgpack: the
decoder hands them out as ``memoryview`` slices of the received bytes.
Errors say whose fault: ``FrameError`` is the peer's (garbage, a size over the limit, a bad
header) and carries the correlation id when it could be read; ``BadRequest`` (a kind of it) is
a well-framed request with an unacceptable header (nested deeper than ``MAX_DEPTH``, a
non-string key): answered, and the stream stays usable.
Invariants: memory grows with bytes received, never with bytes announced; ``head_size()`` and
``buffered`` let the reader charge its byte budget with what has actually arrived.
"""
from __future__ import annotations

import struct
from typing import Any, NamedTuple, Sequence

import msgpack

from odradek.core.protocol import ErrorCode

_U32 = struct.Struct(">I")
_U32x2 = struct.Struct(">II")
PREFIX = 8  # size + header_len
MAX_HEADER = 1 << 20  # a header larger than this is refused even if the frame is allowed
MAX_OVERSIZED_HEADER = 1 << 16  # header bytes buffered to answer an oversized frame
BIG_FRAME = 1 << 16  # frames at least this large that span chunks get their own buffer
DEFAULT_MAX_FRAME = 104857600
MAX_DEPTH = 32  # containers nested in a header (a body itself is at depth 2); deeper is refused

_packb = msgpack.Packer(use_bin_type=True).pack


class FrameError(Exception):
    """The peer sent something that is not a valid frame. ``corr`` is the correlation id
    when the header was readable (else None); ``code`` the error code to answer with."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST, corr: int | None = None,
                 api: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.corr = corr
        self.api = api


class BadRequest(FrameError):
    """A request read whole whose header is unacceptable; framing is intact, so the stream
    stays usable after it is answered."""


class Frame(NamedTuple):
    """One decoded frame: the header map and its payload frames (memoryviews)."""

    header: dict
    frames: list

    @property
    def corr(self) -> int:
        return self.header["corr"]

    @property
    def body(self) -> dict:
        return self.header["body"]


# ---- encoding ------------------------------------------------------------------------------
def encode(header: dict, frames: Sequence[Any] = ()) -> list:
    """A frame as a list of buffers to write in order (scatter-gather; payloads uncopied).
    ``header["frames"]`` is filled in from ``frames``."""
    lens = [len(f) if not isinstance(f, memoryview) else f.nbytes for f in frames]
    header["frames"] = lens
    head = _packb(header)
    prefix = _U32x2.pack(4 + len(head) + sum(lens), len(head))
    if not frames:
        return [prefix + head]
    return [prefix + head, *frames]


def encode_request(api: int, version: int, corr: int, client: str, body: dict,
                   frames: Sequence[Any] = ()) -> list:
    return encode({"api": int(api), "v": version, "corr": corr, "client": client, "body": body}, frames)


def encode_response(corr: int, body: dict, frames: Sequence[Any] = (), extra_lens: Sequence[int] = ()) -> list:
    """A response; ``extra_lens`` are lengths of payload pieces the caller writes itself
    after the returned buffers (file regions sent with ``os.sendfile``)."""
    lens = [len(f) if not isinstance(f, memoryview) else f.nbytes for f in frames]
    lens.extend(extra_lens)
    head = _packb({"corr": corr, "body": body, "frames": lens})
    prefix = _U32x2.pack(4 + len(head) + sum(lens), len(head))
    return [prefix + head, *frames]


def encode_error(corr: int, code: int, message: str) -> list:
    return encode_response(corr, {"error_code": int(code), "error_message": message})


# ---- decoding ------------------------------------------------------------------------------
REQUEST_FIELDS = {"api": int, "v": int, "corr": int, "client": str, "body": dict, "frames": list}
RESPONSE_FIELDS = {"corr": int, "body": dict, "frames": list}


class Decoder:
    """Incremental decoder. ``feed(chunk)`` appends received bytes; ``next()`` returns the
    next complete ``Frame`` or ``None`` when more bytes are needed, and raises
    ``FrameError`` at garbage. Pull-based, so a reader under back-pressure can leave
    frames in the buffer.

    A frame whose size is over ``max_size`` is never buffered: once its header has arrived
    (or cannot be read) ``next()`` raises ``FrameError(MESSAGE_TOO_LARGE, corr=...)``.
    After a ``FrameError`` the stream is unusable (framing is lost): close it.
    """

    def __init__(self, max_size: int = DEFAULT_MAX_FRAME, fields: dict = REQUEST_FIELDS):
        self.max_size = max_size
        self.fields = fields
        self._buf: bytes | memoryview = b""  # unconsumed received bytes
        self._pos = 0
        self._big: bytearray | None = None  # a frame being assembled from several chunks
        self._big_size = 0  # its size; _big grows towards it as bytes arrive
        self._failed: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buf) - self._pos + (len(self._big) if self._big is not None else 0)

    def head_size(self) -> int | None:
        """Bytes (size prefix included) of the frame at the head of the stream once it has
        arrived whole, or None while its size prefix has not arrived."""
        if self._big is not None:
            return self._big_size
        if len(self._buf) - self._pos < 4:
            return None
        return 4 + _U32.unpack_from(self._buf, self._pos)[0]

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self._big is not None:
            self._fill_big(data)
            return
        rest = len(self._buf) - self._pos
        if rest == 0:
            self._buf, self._pos = data, 0
        else:
            self._buf, self._pos = bytes(self._buf[self._pos:]) + data, 0

    def _fill_big(self, data) -> None:
        n = min(len(data), self._big_size - len(self._big))
        self._big += memoryview(data)[:n]
        if n < len(data):
            self._buf, self._pos = memoryview(data)[n:], 0

    def next(self) -> Frame | None:
        if self._failed is not None:
            raise self._failed
        try:
            return self._next()
        except BadRequest:
            raise  # the frame was consumed whole: the stream goes on
        except FrameError as exc:
            self._failed = exc
            raise

    def _next(self) -> Frame | None:
        if self._big is not None:
            if len(self._big) < self._big_size:
                return None
            data, self._big, self._big_size = self._big, None, 0
            return self._parse(memoryview(data), 0, len(data))
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if avail < PREFIX:
            return None
        size, hlen = _U32x2.unpack_from(buf, pos)
        if size < 4 or hlen > size - 4:
            raise FrameError(f"bad frame prefix: size {size}, header length {hlen}")
        if hlen == 0 or hlen > MAX_HEADER:
            raise FrameError(f"bad frame header length {hlen} (1 to {MAX_HEADER} bytes)")
        if size > self.max_size:
            return self._refuse_oversized(size, hlen, buf, pos, avail)
        end = pos + 4 + size
        if end > len(buf):
            if size >= BIG_FRAME:  # assemble it in its own buffer: no quadratic joins
                self._big, self._big_size = bytearray(), 4 + size
                self._buf, self._pos = b"", 0
                self._fill_big(memoryview(buf)[pos:])
            return None
        self._pos = end
        return self._parse(buf if isinstance(buf, memoryview) else memoryview(buf), pos, end)

    def _refuse_oversized(self, size: int, hlen: int, buf, pos: int, avail: int) -> None:
        """Never buffer an oversized frame: wait for its header only, then refuse it with
        the correlation id (or at once if even the header is too large to wait for)."""
        too_large = (f"request of {size + 4} bytes is larger than socket.request.max.bytes "
                     f"({self.max_size})")
        if hlen > MAX_OVERSIZED_HEADER:
            raise FrameError(too_large, ErrorCode.MESSAGE_TOO_LARGE)
        if avail < PREFIX + hlen:
            return None
        try:
            header = self._unpack(memoryview(buf)[pos + PREFIX:pos + PREFIX + hlen])
        except FrameError:
            raise FrameError(too_large, ErrorCode.MESSAGE_TOO_LARGE) from None
        corr, api = header.get("corr"), header.get("api")
        raise FrameError(too_large, ErrorCode.MESSAGE_TOO_LARGE, _int_or_none(corr), _int_or_none(api))

    def _unpack(self, raw) -> dict:
        try:
            header = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:
            raise FrameError(f"undecodable frame header: {type(exc).__name__}: {exc}") from None
        if not isinstance(header, dict):
            raise FrameError(f"frame header must be a map, got {type(header).__name__}")
        return header

    def _parse(self, view: memoryview, start: int, end: int) -> Frame:
        hlen = _U32.unpack_from(view, start + 4)[0]
        hstart = start + PREFIX
        header = self._unpack(view[hstart:hstart + hlen])
        self._check_fields(header)
        if "api" in self.fields:  # requests; responses are the broker's own
            _check_shape(header)
        lens = header["frames"]
        frames = []
        at = hstart + hlen
        for n in lens:
            if not isinstance(n, int) or n < 0:
                raise FrameError(f"frame lengths must be non-negative integers, got {n!r}",
                                 corr=header["corr"], api=header.get("api"))
            frames.append(view[at:at + n])
            at += n
        if at != end:
            raise FrameError(f"frame lengths {lens} add up to {at - hstart - hlen} bytes, "
                             f"but the frame carries {end - hstart - hlen}", corr=header["corr"],
                             api=header.get("api"))
        return Frame(header, frames)

    def _check_fields(self, header: dict) -> None:
        for name, kind in self.fields.items():
            value = header.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                got = "missing" if name not in header else f"{type(value).__name__} {value!r:.40}"
                raise FrameError(f"frame header field '{name}' must be {kind.__name__}, got {got}",
                                 corr=_int_or_none(header.get("corr")), api=_int_or_none(header.get("api")))


def _check_shape(header: dict) -> None:
    """Refuse (``BadRequest``) a header nested deeper than ``MAX_DEPTH`` or holding a map key
    that is not a string: neither can cross to a handler (the actors' messages refuse both).
    Iterative, so a deep header cannot exhaust the stack here either."""
    stack = [(header, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadRequest(f"request header nested deeper than {MAX_DEPTH} levels", corr=header["corr"],
                             api=header["api"])
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise BadRequest(f"map keys must be strings, got {type(key).__name__} {key!r:.40}",
                                     corr=header["corr"], api=header["api"])
                if isinstance(item, (dict, list)):
                    stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value if isinstance(item, (dict, list)))


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decode_all(data: bytes, max_size: int = DEFAULT_MAX_FRAME, fields: dict = REQUEST_FIELDS) -> list[Frame]:
    """Every complete frame in ``data`` (a convenience for tests and tools)."""
    dec = Decoder(max_size, fields)
    dec.feed(data)
    out = []
    while (frame := dec.next()) is not None:
        out.append(frame)
    return out
