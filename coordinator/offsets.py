"""The records of ``__consumer_offsets`` and the in-memory view built from them.

Pure (no I/O): the group coordinator actor encodes records with these functions, appends
them through the log actors, and rebuilds ``OffsetsView`` from the topic at start. The
topic is compacted, so only the latest record per key is kept; a record whose value is
None (a tombstone) deletes its key.

Records (msgpack keys and values; the batch format is ``core.records``):

  key ``["o", group, topic, partition]``  value ``{"offset", "leader_epoch", "metadata",
                                                   "commit_ms"}``   a committed offset
  key ``["g", group]``                    value ``{"group": ConsumerGroup.to_record(),
                                                   "empty_since_ms"}``   group membership

A group's records all go to partition ``partition_for(group, n)``, so they are appended,
and replayed, in the order they were written. The coordinator of a group is the leader of
that partition (``offsets_leaders``/``led_partitions`` read it from a metadata snapshot).
"""
from __future__ import annotations

import dataclasses
import zlib

import msgpack

from odradek.core.protocol import OFFSETS_TOPIC

OFFSET_KEY, GROUP_KEY = "o", "g"


@dataclasses.dataclass(frozen=True)
class Committed:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_ms: int = 0


def partition_for(group_id: str, partitions: int) -> int:
    """Stable across processes and runs (not Python's salted ``hash``)."""
    return zlib.crc32(group_id.encode()) % partitions


def offsets_leaders(snapshot: dict, broker_id: int, topic: str = OFFSETS_TOPIC) -> list[tuple[int, int]]:
    """``[(leader, leader_epoch)]`` per partition of ``__consumer_offsets`` (or of another
    internal ``topic``: ``__transaction_state``) in a metadata
    snapshot (docs/REPLICATION.md); ``[]`` when the topic does not exist. A snapshot without
    partition ``state`` (single-broker mode, or an older controller) makes ``broker_id`` the
    leader of every partition, at epoch 0. A partition without a usable state entry has no
    leader (-1, -1)."""
    meta = (snapshot.get("topics") or {}).get(topic)
    if not isinstance(meta, dict):
        return []
    n = meta.get("partitions") or 0
    state = meta.get("state")
    if state is None:
        return [(broker_id, 0)] * n
    out = []
    for p in range(n):
        s = state[p] if p < len(state) and isinstance(state[p], dict) else {}
        leader, epoch = s.get("leader"), s.get("leader_epoch")
        out.append((leader if isinstance(leader, int) else -1, epoch if isinstance(epoch, int) else -1))
    return out


def led_partitions(snapshot: dict, broker_id: int) -> dict[int, int]:
    """``{partition: leader_epoch}`` of the ``__consumer_offsets`` partitions ``broker_id``
    leads: the groups it coordinates are those hashing to them."""
    return {p: epoch for p, (leader, epoch) in enumerate(offsets_leaders(snapshot, broker_id)) if leader == broker_id}


def offset_record(group: str, topic: str, partition: int, c: Committed | None) -> tuple[bytes, bytes | None]:
    key = msgpack.packb([OFFSET_KEY, group, topic, partition])
    if c is None:
        return key, None
    return key, msgpack.packb({"offset": c.offset, "leader_epoch": c.leader_epoch, "metadata": c.metadata,
                               "commit_ms": c.commit_ms})


def group_record(group: str, state: dict | None, empty_since_ms: int | None = None) -> tuple[bytes, bytes | None]:
    key = msgpack.packb([GROUP_KEY, group])
    if state is None:
        return key, None
    return key, msgpack.packb({"group": state, "empty_since_ms": empty_since_ms})


def expired(committed: dict, empty_since_ms: int, retention_ms: int, now_ms: int) -> list:
    """``offsets.retention.minutes`` for a group without members: the partitions whose offset
    was committed, and whose group has been empty, for at least ``retention_ms``."""
    return [tp for tp, c in committed.items() if max(c.commit_ms, empty_since_ms) + retention_ms <= now_ms]


class OffsetsView:
    """Committed offsets and group snapshots by group: what replaying the topic gives."""

    def __init__(self):
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self.groups: dict[str, dict] = {}  # group -> {"group": ..., "empty_since_ms": ...}
        self.group_at: dict[str, int] = {}  # group -> the offset of its record in ``groups``

    def apply(self, key: bytes | None, value: bytes | None, offset: int = -1) -> str | None:
        """One record, in log order. An unreadable record is not applied: the reason is
        returned, for the replay to log (None: applied)."""
        try:
            k = msgpack.unpackb(key, raw=False, use_list=True) if key else None
            v = None if value is None else msgpack.unpackb(value, raw=False, use_list=True, strict_map_key=False)
        except Exception as exc:  # msgpack raises several types for malformed input
            return f"not msgpack ({type(exc).__name__})"
        if not isinstance(k, list) or not k or k[0] not in (OFFSET_KEY, GROUP_KEY):
            return f"key {k!r:.80} is neither a committed offset's nor a group's"
        if k[0] == OFFSET_KEY:
            return self._apply_offset(k, v)
        if len(k) != 2 or not isinstance(k[1], str):
            return f"group key {k!r:.80} is not ['g', group]"
        if v is None:
            self.groups.pop(k[1], None)
            self.group_at.pop(k[1], None)
        elif not isinstance(v, dict) or not isinstance(v.get("group"), dict):
            return f"group '{k[1]}': value {v!r:.80} is not a group record"
        else:
            self.groups[k[1]] = v
            self.group_at[k[1]] = offset
        return None

    def _apply_offset(self, k: list, v) -> str | None:
        if len(k) != 4 or not isinstance(k[1], str) or not isinstance(k[2], str) or type(k[3]) is not int:
            return f"offset key {k!r:.80} is not ['o', group, topic, partition]"
        group, topic, partition = k[1], k[2], k[3]
        if v is None:
            committed = self.offsets.get(group)
            if committed is not None:
                committed.pop((topic, partition), None)
                if not committed:
                    del self.offsets[group]
            return None
        offset = v.get("offset") if isinstance(v, dict) else None
        if type(offset) is not int:
            return f"group '{group}' {topic}-{partition}: value {v!r:.80} is not a committed offset"
        epoch, metadata, when = v.get("leader_epoch"), v.get("metadata"), v.get("commit_ms")
        c = Committed(offset, epoch if type(epoch) is int else -1, metadata if isinstance(metadata, str) else "",
                      when if type(when) is int else 0)
        self.offsets.setdefault(group, {})[(topic, partition)] = c
        return None
