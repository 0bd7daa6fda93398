"""Kafka bodies as plain dicts, through kio (types generated from Kafka's JSON schemas). Pure.

``decode_request(api, version, view)`` -> dict with Kafka's field names (snake_case, as kio
names them); ``encode_response(api, version, dict)`` -> bytes. Times are integers in ms both
ways, error codes plain ints, topic ids ``uuid.UUID``; a field the dict leaves out takes its
schema default (or the zero of its type), so translations write only what they know.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import typing
import uuid

import sys

# kio registers a Hypothesis strategy for each of its types whenever it can import
# hypothesis (the test extra installs it): 0.4 s of CPU per process on a quiet machine, and
# several seconds under load, during which the processor taking its first Kafka connection
# serves nobody. The broker never generates test data, so kio is shown no hypothesis while
# it loads (unless a process, such as a test run, imported hypothesis already).
_HIDE_HYPOTHESIS = "hypothesis" not in sys.modules
if _HIDE_HYPOTHESIS:
    sys.modules["hypothesis"] = None  # type: ignore[assignment]  # makes `import hypothesis` fail
try:
    from kio.index import load_request_schema, load_response_schema
    from kio.schema.errors import ErrorCode as KioErrorCode
    from kio.serial import entity_reader, entity_writer
finally:
    if _HIDE_HYPOTHESIS:
        del sys.modules["hypothesis"]

from odradek.core.kafka.framing import FrameError, skip_tagged

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@functools.cache
def request_class(api: int, version: int):
    return load_request_schema(api, version)


@functools.cache
def response_class(api: int, version: int):
    return load_response_schema(api, version)


def known(api: int, version: int) -> bool:
    try:
        request_class(api, version)
        return True
    except Exception:  # kio's UnknownAPIKey / UnknownEntity
        return False


def request_header_flexible(api: int, version: int) -> bool:
    return known(api, version) and request_class(api, version).__flexible__


def response_header_flexible(api: int, version: int) -> bool:
    """ApiVersions answers with header v0 always, so a client that does not know the
    broker's versions yet can read it (KIP-511)."""
    return api != 18 and response_class(api, version).__flexible__


@functools.cache
def _reader(cls):
    return entity_reader(cls)


@functools.cache
def _writer(cls):
    return entity_writer(cls)


def decode_request(api: int, version: int, rest: memoryview) -> dict:
    """The body of a request whose header ended at ``rest`` (client id included)."""
    cls = request_class(api, version)
    at = skip_tagged(rest, 0) if cls.__flexible__ else 0
    try:
        entity, used = _reader(cls)(rest, at)
    except Exception as exc:  # kio raises several types for malformed bytes
        raise FrameError(f"{cls.__name__} v{version} does not decode: {type(exc).__name__}: {exc}") from None
    # Bytes after the body are ignored, as Kafka's own broker does (librdkafka 2.x sends three
    # after some Metadata v12 requests).
    return to_dict(entity)


def encode_response(api: int, version: int, body: dict) -> bytes:
    cls = response_class(api, version)
    buf = io.BytesIO()
    _writer(cls)(buf, from_dict(cls, body))
    return buf.getvalue()


def encode_request(api: int, version: int, body: dict) -> bytes:
    """A request body (for codec tests and tools)."""
    cls = request_class(api, version)
    buf = io.BytesIO()
    _writer(cls)(buf, from_dict(cls, body))
    return buf.getvalue()


def decode_response(api: int, version: int, data: bytes) -> dict:
    """A response body (for codec tests and tools)."""
    entity, _ = _reader(response_class(api, version))(memoryview(data), 0)
    return to_dict(entity)


# ---- entity <-> dict ---------------------------------------------------------------------

@functools.cache
def _field_names(cls) -> tuple | None:
    """A kio entity class's field names (None: not an entity); cached, as ``to_dict`` runs on
    every request (``dataclasses.fields`` per object was a tenth of the processor's time on
    a produce run)."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


def to_dict(value):
    names = _field_names(type(value))
    if names is not None:
        return {name: to_dict(getattr(value, name)) for name in names}
    if isinstance(value, tuple):
        return [to_dict(v) for v in value]
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    if isinstance(value, KioErrorCode):
        return int(value.value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return value


@functools.cache
def _fields(cls) -> list:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def from_dict(cls, d: dict):
    kwargs = {}
    legacy = not getattr(cls, "__flexible__", True)
    for f, hint in _fields(cls):
        if f.name in d:
            value = d[f.name]
            if legacy and type(value) is str and len(value) > _SAFE_CHARS:
                value = _legacy_string(value)
            kwargs[f.name] = _convert(hint, f.metadata.get("kafka_type"), value)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(hint, f.metadata.get("kafka_type"))
    return cls(**kwargs)


LEGACY_STRING_MAX = 32767  # bytes of a non-flexible version's string (an i16 length)
_SAFE_CHARS = LEGACY_STRING_MAX // 4  # no string of this many characters can be longer in UTF-8


def _legacy_string(value: str) -> str:
    """A string a non-flexible version can carry: an answer that echoes a client's 32 KiB name
    inside a message would not fit an i16 length, and its encoding would fail; the message is
    cut (and says so) instead."""
    raw = value.encode("utf-8")
    if len(raw) <= LEGACY_STRING_MAX:
        return value
    return raw[:LEGACY_STRING_MAX - 16].decode("utf-8", "ignore") + "... (truncated)"


def _strip_optional(hint):
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)) \
            and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return hint, False


def _convert(hint, kafka_type, value):
    inner, optional = _strip_optional(hint)
    if value is None:
        return None
    if typing.get_origin(inner) is tuple:
        item = typing.get_args(inner)[0]
        return tuple(_convert(item, kafka_type, v) for v in value)
    if dataclasses.is_dataclass(inner):
        return from_dict(inner, value)
    if kafka_type == "timedelta_i32" or kafka_type == "timedelta_i64":
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64":
        return _EPOCH + datetime.timedelta(milliseconds=value)
    if kafka_type == "error_code":
        try:
            return KioErrorCode(int(value))
        except ValueError:
            return KioErrorCode(-1)
    if kafka_type == "uuid" and isinstance(value, str):
        return uuid.UUID(value)
    return value


def _zero(hint, kafka_type):
    inner, optional = _strip_optional(hint)
    if optional:
        return None
    if typing.get_origin(inner) is tuple:
        return ()
    if dataclasses.is_dataclass(inner):
        return from_dict(inner, {})
    return _convert(hint, kafka_type, {"string": "", "bool": False, "bytes": b"", "records": b"",
                                       "uuid": uuid.UUID(int=0), "float64": 0.0}.get(kafka_type, 0))
