"""Exceptions with the broker's error code: one ``OdradekError`` subclass per ``ErrorCode``.

Pure; no state beyond the class table built at import. ``error_for(code, message)`` returns an
instance of the subclass for a code, so callers can catch the precise failure::

    try:
        admin.create_topic("orders")
    except errors.TopicAlreadyExistsError:
        ...

Every class is named after its code in CamelCase with an ``Error`` suffix
(UNKNOWN_TOPIC_OR_PARTITION -> ``UnknownTopicOrPartitionError``; the storage library's classes,
core/errors.py, are those of their codes under their own names too), and every one is an
``OdradekError`` whose ``.code`` is that ``ErrorCode`` (so ``except OdradekError`` and
``exc.code.retriable`` still work). Misuse of the client API raises ``TypeError`` /
``ValueError`` instead: those are the caller's bugs, not the broker's answers.
"""
from __future__ import annotations

from odradek.core import errors as _log
from odradek.core.protocol import ErrorCode, OdradekError

__all__ = ["OdradekError", "ErrorCode", "error_for"]

# One family: the storage library's classes (core/errors.py, the pure layer the client reads
# records with) are the classes of their codes here, under both names (``CorruptRecordError``
# is ``CorruptMessageError``), so ``except errors.OffsetOutOfRangeError`` catches the log's too.
_BY_CODE: dict[ErrorCode, type] = {cls.code: cls for cls in (
    _log.CorruptRecordError, _log.RecordTooLargeError, _log.RecordListTooLargeError, _log.InvalidRecordError,
    _log.InvalidTimestampError, _log.OffsetOutOfRangeError, _log.StorageError, _log.InvalidConfigError)}


def _class_name(code: ErrorCode) -> str:
    name = "".join(part.capitalize() for part in code.name.split("_"))
    return name if name.endswith("Error") else name + "Error"


for _code in ErrorCode:
    if _code is ErrorCode.NONE:
        continue
    _cls = _BY_CODE.get(_code) or type(_class_name(_code), (OdradekError,), {
        "code": _code, "__doc__": _code.meaning, "__module__": __name__})
    _BY_CODE[_code] = _cls
    for _name in {_class_name(_code), _cls.__name__}:
        globals()[_name] = _cls
        __all__.append(_name)

# Names Python users look for first (the generated ones, spelled out for readers and linters).
UnknownTopicOrPartitionError = _BY_CODE[ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
NotLeaderOrFollowerError = _BY_CODE[ErrorCode.NOT_LEADER_OR_FOLLOWER]
OffsetOutOfRangeError = _BY_CODE[ErrorCode.OFFSET_OUT_OF_RANGE]
TopicAlreadyExistsError = _BY_CODE[ErrorCode.TOPIC_ALREADY_EXISTS]
InvalidTopicExceptionError = _BY_CODE[ErrorCode.INVALID_TOPIC_EXCEPTION]
InvalidTopicError = InvalidTopicExceptionError
MessageTooLargeError = _BY_CODE[ErrorCode.MESSAGE_TOO_LARGE]
CorruptMessageError = _BY_CODE[ErrorCode.CORRUPT_MESSAGE]
RequestTimedOutError = _BY_CODE[ErrorCode.REQUEST_TIMED_OUT]
NetworkExceptionError = _BY_CODE[ErrorCode.NETWORK_EXCEPTION]
InvalidRequiredAcksError = _BY_CODE[ErrorCode.INVALID_REQUIRED_ACKS]
InvalidConfigError = _BY_CODE[ErrorCode.INVALID_CONFIG]
InvalidPartitionsError = _BY_CODE[ErrorCode.INVALID_PARTITIONS]
InvalidReplicationFactorError = _BY_CODE[ErrorCode.INVALID_REPLICATION_FACTOR]
__all__.append("InvalidTopicError")


def error_for(code: int, message: str | None = None) -> OdradekError:
    """The exception for a broker error code (an unknown number becomes UNKNOWN_SERVER_ERROR)."""
    member = ErrorCode.of(code)
    cls = _BY_CODE.get(member, OdradekError)
    return cls(message or member.meaning, member)


def check(code: int | None, message: str | None = None, context: str = "") -> None:
    """Raise ``error_for(code)`` unless ``code`` is 0/None; ``context`` prefixes the message."""
    if code:
        member = ErrorCode.of(code)
        text = message or member.meaning
        raise error_for(code, f"{context}: {text}" if context else text)
