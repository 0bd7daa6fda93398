"""The request-field check every API handler shares: ``field(body, name, kind, default)``. Pure.

A body of the wrong shape is the client's fault: ``BadRequest`` is INVALID_REQUEST with a
message naming the field, what it must be and what it was. Used by the request handlers
(network/handler.py) and the coordinators' API handlers.
"""
from __future__ import annotations

from typing import Any

from odradek.core.protocol import ErrorCode, OdradekError


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


def check_shape(value: Any, shape: Any, where: str = "") -> None:
    """Raise BadRequest (naming the field, ``where``) unless ``value`` has ``shape``: a type (a bool is
    not an int); ``[shape]``, a list of such; ``{field: shape}``, a map whose named fields have
    their shapes (a missing field is a null; other fields are not checked); a tuple, any one of
    its shapes (``None`` for a null)."""
    if isinstance(shape, tuple):  # the first that fits at the outer level decides
        fitting = next((s for s in shape if _fits(value, s)), ...)
        if fitting is ...:
            raise BadRequest(f"'{where}' must be {_describe(shape)}, got {_kind(value)}")
        shape = fitting
    if not _fits(value, shape):
        raise BadRequest(f"'{where}' must be {_describe(shape)}, got {_kind(value)}")
    if isinstance(shape, list):
        for i, item in enumerate(value):
            check_shape(item, shape[0], f"{where}[{i}]")
    elif isinstance(shape, dict):
        for name, s in shape.items():
            check_shape(value.get(name), s, f"{where}.{name}" if where else name)


def _fits(value: Any, shape: Any) -> bool:
    """The outer level of ``shape`` (a tuple: any of it)."""
    if isinstance(shape, tuple):
        return any(_fits(value, s) for s in shape)
    if shape is None:
        return value is None
    if isinstance(shape, list):
        return isinstance(value, list)
    if isinstance(shape, dict):
        return isinstance(value, dict)
    return isinstance(value, shape) and not (isinstance(value, bool) and shape is int)


def _describe(shape: Any) -> str:
    if isinstance(shape, tuple):
        return " or ".join(_describe(s) for s in shape)
    if shape is None:
        return "null"
    if isinstance(shape, list):
        return f"a list (each: {_describe(shape[0])})"
    if isinstance(shape, dict):
        return "a map with " + ", ".join(f"'{name}'" for name in shape)
    return shape.__name__


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
