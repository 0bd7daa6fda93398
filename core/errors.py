"""The storage library's exceptions: each an ``OdradekError`` carrying its protocol code. Pure.

Every error the log raises is one of these, so the log actor replies ``(code, message)`` with
no lookup table. Whose fault: ``CorruptRecordError`` and ``RecordTooLargeError`` blame the batch
handed in (or bytes found on disk); ``StorageError`` the disk (retriable once the fault clears);
``OffsetOutOfRangeError`` the requested offset. odradek/errors.py registers these as the
client's classes of their codes: one class a code.
"""
from __future__ import annotations

from odradek.core.protocol import ErrorCode, OdradekError


class CorruptRecordError(OdradekError):
    """A record batch failed a check: size, magic, CRC, offsets, counts or its encoding."""

    code = ErrorCode.CORRUPT_MESSAGE


class RecordTooLargeError(OdradekError):
    """A batch is larger than ``max.message.bytes``."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class RecordListTooLargeError(OdradekError):
    """A batch cannot fit in a segment (larger than ``segment.bytes``)."""

    code = ErrorCode.RECORD_LIST_TOO_LARGE


class InvalidRecordError(OdradekError):
    """A well-formed batch the log refuses (e.g. a follower's offsets going backwards)."""

    code = ErrorCode.INVALID_RECORD


class RecordErrors(InvalidRecordError):
    """Some records of a produced batch are refused (KIP-467): the batch fails with
    INVALID_RECORD and ``record_errors`` lists ``(index in the batch, message)`` for each."""

    def __init__(self, message: str, record_errors: list):
        super().__init__(message)
        self.record_errors = record_errors

    @classmethod
    def keyless(cls, where: str, indexes: list) -> "RecordErrors":
        why = "a compacted topic cannot accept a record without a key"
        return cls(f"{where}: {len(indexes)} record(s) refused, {why} (records {_first(indexes)})",
                   [(i, why) for i in indexes])


def _first(indexes: list, shown: int = 10) -> str:
    more = f", ... {len(indexes) - shown} more" if len(indexes) > shown else ""
    return ", ".join(map(str, indexes[:shown])) + more


class InvalidTimestampError(OdradekError):
    """A produced batch's timestamp is out of range (negative, other than -1 for none)."""

    code = ErrorCode.INVALID_TIMESTAMP


class OffsetOutOfRangeError(OdradekError):
    """The requested offset is below the log start offset or above the log end offset."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class StorageError(OdradekError):
    """A disk operation failed (ENOSPC, EIO, ...). The log is left consistent: retry later."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


class InvalidConfigError(OdradekError):
    """A log configuration value is missing its type, out of range or unknown."""

    code = ErrorCode.INVALID_CONFIG
