"""Messages between actors: an envelope, a small msgpack header, and raw payload frames. Pure.

A message on the wire is a ZeroMQ multipart message::

    frame 0   msgpack array [type, corr, reply_to, fields]
    frame 1.. payload frames (record batches, ...), raw bytes, never inside msgpack

``type`` names the message (``"produce"``, ``"_reply"``, ...); types starting with ``_`` belong
to the runtime. ``corr`` is a correlation id chosen by the requester (0 one-way); ``reply_to``
the actor the answer goes to (``None`` one-way); ``fields`` the body: a NamedTuple declared in
``actors.messages`` (an array of its fields on the wire) or ``None``. ``decode`` rebuilds a
body of a declared type as its class; an answer's (``_reply``) class is the one the requester
expects for what it asked (``REPLIES``), applied by ``typed_reply`` in the requester's runtime.
``_error`` carries ``ErrorReply`` (a code of ``core.protocol.ErrorCode``).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import msgpack

from odradek.actors.messages import BODIES

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
    fields: Any = None  # the body: a NamedTuple of actors.messages, or None
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
        return self.fields.code if self.type == ERROR else 0

    @property
    def error_message(self) -> str:
        return self.fields.message if self.type == ERROR else ""


class MalformedMessage(Exception):
    """A frame 0 that is not a valid header: a bug or a foreign sender, never a user error."""


def encode_header(type_: str, corr: int = 0, reply_to: str | None = None, fields: Any = None) -> bytes:
    return _packb([type_, corr, reply_to, fields])


def decode(frames: Sequence[Any]) -> Message:
    """Turn received multipart frames into a Message whose body is its declared class (a
    ``_reply``'s stays the array: the requester knows its class, ``typed_reply``). Raises
    MalformedMessage, also for a body whose type is declared but whose fields do not fit it."""
    if not frames:
        raise MalformedMessage("empty multipart message")
    head = frames[0]
    try:
        raw = head.bytes if hasattr(head, "bytes") else bytes(head)
        t, corr, reply_to, fields = _unpackb(raw, raw=False)
    except Exception as exc:  # msgpack raises several types; all mean the same here
        raise MalformedMessage(f"undecodable header: {exc}") from None
    if not isinstance(t, str) or not isinstance(corr, int) or not (reply_to is None or isinstance(reply_to, str)):
        raise MalformedMessage("header fields of the wrong type")
    if fields is not None:
        cls = BODIES.get(t)
        if cls is not None:
            fields = _typed(cls, fields, t)
        elif type(fields) is not list:  # a type nobody declares (its receiver answers INVALID_REQUEST)
            raise MalformedMessage("header fields of the wrong type")
    return Message(t, corr, reply_to, fields, frames[1:])


def _typed(cls: type, fields: Any, what: str) -> Any:
    if type(fields) is not list or len(fields) != len(cls._fields):
        raise MalformedMessage(f"'{what}' needs the {len(cls._fields)} fields of {cls.__name__}, "
                               f"got {type(fields).__name__} {fields!r:.80}")
    return tuple.__new__(cls, fields)


def typed_reply(msg: Message, cls: type | None) -> Message:
    """``msg``, an answer to a request whose answer class is ``cls`` (``REPLIES``), with its body
    as that class. Raises MalformedMessage if the fields do not fit it."""
    if cls is None or msg.type != REPLY or msg.fields is None:
        return msg
    return msg._replace(fields=_typed(cls, msg.fields, f"answer {cls.__name__}"))

