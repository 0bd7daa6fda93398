"""The request-field check every API handler shares: ``field(body, name, kind, default)``.

Pure (no I/O), layer 1. A body of the wrong shape is the client's fault: ``BadRequest`` is
INVALID_REQUEST with a message naming the field, what it must be and what it was. Used by the
request handlers (``network/handler.py``) and the group coordinator's API handlers.
"""
from __future__ import annotations

from typing import Any

from odradek.network.protocol import ErrorCode, OdradekError


class BadRequest(OdradekError):
    code = ErrorCode.INVALID_REQUEST


def field(body: dict, name: str, kind: type | tuple, default: Any = ...) -> Any:
    """``body[name]`` checked against ``kind``; a missing optional field gives ``default``
    (a bool is not an int, though Python says it is)."""
    if name not in body or body[name] is None:
        if default is ...:
            raise BadRequest(f"missing field '{name}'")
        return default
    value = body[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int,))):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRequest(f"field '{name}' must be {names}, got {type(value).__name__}")
    return value
