"""The group coordinator's tables: the groups and committed offsets it holds in memory
(``GroupTable``), and the topics of the latest metadata snapshot as the group APIs read them
(``TopicView``).

Process: ``group_coordinator`` (plain objects its actor owns, ``coordinator.group_coordinator``);
no messages, no clock of their own (``now`` and ``wall`` are passed in).
``GroupTable`` owns the KIP-848 groups (``groups``: ``coordinator.group.ConsumerGroup``), the
classic ones (``classic``: ``coordinator.classic_group.ClassicGroup``), the committed offsets
(``offsets``) and when each group became empty (``empty_since``, wall ms: the retention of
its offsets counts from then). Invariant: a group id is one group of one kind (never in both
``groups`` and ``classic``): a classic JoinGroup to a KIP-848 group with members is
INCONSISTENT_GROUP_PROTOCOL, a ConsumerGroupHeartbeat to a classic group with members
GROUP_ID_NOT_FOUND, and an empty group of one kind becomes the other.
``TopicView`` owns the snapshot, its version, and the topics' partition counts and Kafka topic
ids (KIP-848 requests name topics by id).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from odradek.coordinator.classic_group import ClassicConfig, ClassicGroup
from odradek.coordinator.group import EMPTY, ConsumerGroup, GroupConfig
from odradek.coordinator.offsets import Committed, OffsetsView
from odradek.core.fields import BadRequest
from odradek.core.kafka.groups import kafka_topic_id


class Clock(NamedTuple):
    """The group coordinator's two clocks, injected: ``now()`` monotonic ms (sessions,
    deadlines), ``wall()`` wall-clock ms (what is stored: commit times, emptiness)."""
    now: Callable[[], float]
    wall: Callable[[], int]


class GroupTable:
    def __init__(self, group_config: GroupConfig, classic_config: ClassicConfig):
        self.group_config, self.classic_config = group_config, classic_config
        self.groups: dict[str, ConsumerGroup] = {}
        self.classic: dict[str, ClassicGroup] = {}
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self.empty_since: dict[str, int] = {}

    def install(self, view: OffsetsView, now: float, wall: int, skip: Callable[[int, str], None]) -> None:
        """A replayed partition's groups and offsets join the table; a group record that
        cannot be rebuilt is ``skip``-ped (offset, why): the group starts empty, its offsets
        are kept."""
        self.offsets.update(view.offsets)
        for gid, rec in view.groups.items():
            empty_since = rec.get("empty_since_ms")
            try:
                if type(empty_since) not in (int, type(None)):
                    raise ValueError(f"empty_since_ms {empty_since!r} is not a time")
                if "classic" in rec["group"]:
                    group = ClassicGroup.from_record(gid, rec["group"]["classic"], now, self.classic_config)
                else:
                    group = ConsumerGroup.from_record(gid, rec["group"], now, self.group_config)
            except Exception as exc:  # a record this coordinator cannot rebuild (issue 27): not fatal
                skip(view.group_at.get(gid, -1), f"group '{gid}' cannot be rebuilt from its record "
                                                 f"({type(exc).__name__}: {exc}); it starts empty, its "
                                                 f"committed offsets are kept")
                continue
            (self.classic if isinstance(group, ClassicGroup) else self.groups)[gid] = group
            if empty_since is not None:
                self.empty_since[gid] = empty_since
        for gid in view.offsets:
            self.empty_since.setdefault(gid, wall)

    def drop(self, mine: Callable[[str], bool]) -> list[str]:
        """Forget every group (and its offsets) for which ``mine(gid)``; returns their ids."""
        gids = [gid for gid in set(self.groups) | set(self.classic) | set(self.offsets) | set(self.empty_since)
                if mine(gid)]
        for gid in gids:
            self.forget(gid)
        return gids

    def forget(self, gid: str) -> None:
        self.groups.pop(gid, None)
        self.classic.pop(gid, None)
        self.offsets.pop(gid, None)
        self.empty_since.pop(gid, None)

    def known(self) -> list[str]:
        return sorted(set(self.groups) | set(self.classic) | set(self.offsets))

    def has_members(self, gid: str) -> bool:
        g = self.groups.get(gid)
        cg = self.classic.get(gid)
        return bool((g is not None and g.members) or (cg is not None and cg.members))

    def state_of(self, gid: str) -> str:
        g = self.groups.get(gid)
        return g.state if g is not None else EMPTY

    def note_members(self, gid: str, has_members: bool, wall: int) -> None:
        """A group with members is not empty; one without has been since ``wall`` (or earlier)."""
        if has_members:
            self.empty_since.pop(gid, None)
        else:
            self.empty_since.setdefault(gid, wall)

    def members(self) -> int:
        return sum(len(g.members) for g in (*self.groups.values(), *self.classic.values()))


class TopicView:
    def __init__(self, broker_id: int):
        self.broker_id = broker_id
        self.version = -1
        self.snapshot: dict = {}
        self.topics: dict[str, int] = {}
        self.topic_ids: dict[str, str] = {}  # name -> the hex of its Kafka topic id
        self.topic_names: dict[str, str] = {}

    def adopt(self, snapshot: dict) -> bool | None:
        """Take a snapshot unless it is older than ours (None); True if topics changed."""
        version = snapshot.get("version", -1)
        if not isinstance(version, int) or version < self.version:
            return None
        self.version = version
        self.snapshot = snapshot
        if isinstance(snapshot.get("broker_id"), int):
            self.broker_id = snapshot["broker_id"]
        before = self.topics
        self.topics = {n: t["partitions"] for n, t in (snapshot.get("topics") or {}).items()}
        self.topic_ids = {n: kafka_topic_id(t.get("id")) for n, t in (snapshot.get("topics") or {}).items()}
        self.topic_names = {i: n for n, i in self.topic_ids.items()}
        return self.topics != before

    def named(self, entries: list) -> list:
        """``[{"topic_id", "partitions"}]`` -> ``[{"topic", "partitions"}]``; ids of topics
        that no longer exist are dropped (the member owns nothing there)."""
        out = []
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("topic_id"), str):
                raise BadRequest("each entry of 'topic_partitions' must be a map with 'topic_id' and 'partitions'")
            name = self.topic_names.get(e["topic_id"])
            if name is not None:
                out.append({"topic": name, "partitions": e.get("partitions")})
        return out

    def with_ids(self, resp: dict) -> dict:
        """The answer's assignment with each topic's id beside its name."""
        if resp.get("assignment") is None:
            return resp
        return {**resp, "assignment": self.ids(resp["assignment"])}

    def ids(self, entries) -> list:
        return [{**e, "topic_id": self.topic_ids.get(e["topic"])} for e in entries or ()]
