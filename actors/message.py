"""Messages between actors: an envelope, a small msgpack header, and raw payload frames. Pure.

A message on the wire is a ZeroMQ multipart message::

    frame 0   msgpack array [type, corr, reply_to, fields]
    frame 1.. payload frames (record batches, ...), raw bytes, never inside msgpack

``type`` names the message (``"produce"``, ``"_reply"``, ...); types starting with ``_`` belong
to the runtime. ``corr`` is a correlation id chosen by the requester (0 one-way); ``reply_to``
the actor the answer goes to (``None`` one-way); ``fields`` a msgpack-able dict or ``None``.
Replies reuse the request's ``corr``: ``_reply`` carries the answer's fields, ``_error``
``{"code", "message"}`` with a code of ``core.protocol.ErrorCode``.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import msgpack

REPLY = "_reply"
ERROR = "_error"

_packb = msgpack.Packer(use_bin_type=True).pack
_unpackb = msgpack.unpackb


class Message(NamedTuple):
    """A received (or about to be sent) message. ``frames`` are bytes-like payloads:
    ``zmq.Frame`` objects on receipt (zero-copy; ``memoryview(frame)`` reads them)."""

    type: str
    corr: int = 0
    reply_to: str | None = None
    fields: dict | None = None
    frames: Sequence[Any] = ()

    @property
    def is_reply(self) -> bool:
        return self.type == REPLY or self.type == ERROR

    @property
    def is_error(self) -> bool:
        return self.type == ERROR

    @property
    def error_code(self) -> int:
        """The error code of an ``_error`` reply, 0 otherwise."""
        return self.fields["code"] if self.type == ERROR else 0

    @property
    def error_message(self) -> str:
        return self.fields.get("message", "") if self.type == ERROR else ""

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default) if self.fields else default


class MalformedMessage(Exception):
    """A frame 0 that is not a valid header: a bug or a foreign sender, never a user error."""


def encode_header(type_: str, corr: int = 0, reply_to: str | None = None,
                  fields: dict | None = None) -> bytes:
    return _packb([type_, corr, reply_to, fields])


def decode(frames: Sequence[Any]) -> Message:
    """Turn received multipart frames into a Message. Raises MalformedMessage."""
    if not frames:
        raise MalformedMessage("empty multipart message")
    head = frames[0]
    try:
        raw = head.bytes if hasattr(head, "bytes") else bytes(head)
        t, corr, reply_to, fields = _unpackb(raw, raw=False)
    except Exception as exc:  # msgpack raises several types; all mean the same here
        raise MalformedMessage(f"undecodable header: {exc}") from None
    if not isinstance(t, str) or not isinstance(corr, int) or not (reply_to is None or isinstance(reply_to, str)) \
            or not (fields is None or isinstance(fields, dict)):
        raise MalformedMessage("header fields of the wrong type")
    return Message(t, corr, reply_to, fields, frames[1:])


def error_fields(code: int, message: str) -> dict:
    return {"code": int(code), "message": message}
