"""What the group coordinator's API handlers share: the checks of group ids and of
topic-partition lists (the generic field check is ``network.fields``), and the wall clock of
committed offsets and emptiness.

Pure (no I/O); runs in the ``group_coordinator`` process.
"""
from __future__ import annotations

import re
import time

from odradek.network.fields import BadRequest
from odradek.network.protocol import ErrorCode, OdradekError

GROUP_ID = re.compile(r"[\x21-\x7e]{1,255}")  # always fullmatch: "$" matches before a final newline


def group_id(body: dict, name: str = "group_id") -> str:
    gid = body.get(name)
    if not isinstance(gid, str) or not GROUP_ID.fullmatch(gid):
        raise OdradekError(f"group id must be 1 to 255 printable ASCII characters without spaces, got {gid!r}",
                           ErrorCode.INVALID_GROUP_ID)
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


def wall_ms() -> int:
    return int(time.time() * 1000)
