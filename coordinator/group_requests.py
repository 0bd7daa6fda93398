"""What the group coordinator's API handlers share: the checks of group ids and of
topic-partition lists (the generic field check is ``core.fields``), a classic request's
error answer, and the wall clock of committed offsets and emptiness.

Pure (no I/O); runs in the ``group_coordinator`` process.
"""
from __future__ import annotations

import time

from odradek.core.fields import BadRequest
from odradek.core.protocol import ErrorCode, OdradekError

GROUP_ID_MAX_BYTES = 32767  # Kafka's STRING (an int16 length): the longest group id a Kafka client can send


def valid_group_id(gid) -> bool:
    """Kafka's rule: any non-empty string (spaces, any Unicode: a group id is only ever a
    msgpack string in ``__consumer_offsets`` records, a hashed partition and an escaped
    metric label here, never a file name), of at most ``GROUP_ID_MAX_BYTES`` in UTF-8.
    Kafka also takes an empty id for OffsetCommit/OffsetFetch/DescribeGroups/DeleteGroups
    (a legacy allowance); Odradek refuses it with every API."""
    if not isinstance(gid, str) or not gid:
        return False
    try:
        return len(gid.encode("utf-8")) <= GROUP_ID_MAX_BYTES
    except UnicodeEncodeError:  # a lone surrogate: not text any client can have sent
        return False


def group_id(body: dict, name: str = "group_id") -> str:
    gid = body.get(name)
    if not valid_group_id(gid):
        raise OdradekError(f"group id must be a non-empty string of at most {GROUP_ID_MAX_BYTES} UTF-8 bytes, "
                           f"got {gid if not isinstance(gid, str) else gid[:100]!r}", ErrorCode.INVALID_GROUP_ID)
    return gid


def tp_pairs(entries, what: str) -> list[tuple[str, int]]:
    """``[{"topic", "partitions": [int]}]`` checked -> ``[(topic, partition)]``."""
    if not isinstance(entries, list):
        raise BadRequest(f"'{what}' must be a list of {{topic, partitions}} maps")
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("topic"), str) or not isinstance(e.get("partitions"), list):
            raise BadRequest(f"each entry of '{what}' must be a map with 'topic' and a list of 'partitions'")
        for p in e["partitions"]:
            if not isinstance(p, int) or isinstance(p, bool):
                raise BadRequest(f"'{what}': partitions must be integers, got {p!r}")
            out.append((e["topic"], p))
    return out


def classic_error(exc: OdradekError, member_id: str = "") -> dict:
    """A classic JoinGroup/SyncGroup answer carrying ``exc``."""
    return {"error_code": int(exc.code), "error_message": exc.message, "generation_id": -1,
            "member_id": member_id, "leader": "", "members": [], "assignment": b""}


def wall_ms() -> int:
    return int(time.time() * 1000)
