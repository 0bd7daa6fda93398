"""The group coordinator's KIP-848 API: CONSUMER_GROUP_HEARTBEAT (``heartbeat``), topics by
name or by Kafka topic id.

Process: ``group_coordinator`` (a plain object its actor owns, ``coordinator.group_coordinator``).
Owns the count of heartbeats served. Collaborators, handed in: the ``GroupTable``, the
``Purgatory`` (a quiet heartbeat is held there), the ``GroupWriter`` (answered once the
group's record is stored), the ``TopicView`` (topics by id, partition counts) and the
``Clock``. The group state machine is ``coordinator.group``; here: parsing, converting a
classic group that has no members, holding, answering.
"""
from __future__ import annotations

from odradek.actors.message import Message
from odradek.actors.messages import Response
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.group import ConsumerGroup, GroupError, HeartbeatRequest, tps_of
from odradek.coordinator.group_purgatory import Purgatory
from odradek.coordinator.group_requests import group_id, tp_pairs
from odradek.coordinator.group_table import Clock, GroupTable, TopicView
from odradek.coordinator.group_writes import GroupWriter
from odradek.core.fields import BadRequest, field
from odradek.core.protocol import ErrorCode, OdradekError

MAX_WAIT_MS = 30_000  # a heartbeat is held at most this long


class ConsumerApi:
    def __init__(self, table: GroupTable, purgatory: Purgatory, writer: GroupWriter, meta: TopicView,
                 outbox: Outbox, clock: Clock):
        self.table, self.purgatory, self.writer, self.meta = table, purgatory, writer, meta
        self.outbox, self.clock = outbox, clock
        self.heartbeats = 0

    def heartbeat(self, msg: Message, body: dict) -> None:
        self.heartbeats += 1
        table, meta = self.table, self.meta
        gid = group_id(body)
        owned_entries = field(body, "topic_partitions", list, None)
        if owned_entries is not None and body.get("topic_ids"):  # Kafka's KIP-848: topics by id
            owned_entries = meta.named(owned_entries)
        names = field(body, "subscribed_topic_names", list, None)
        if names is not None and not all(isinstance(n, str) for n in names):
            raise BadRequest("'subscribed_topic_names' must be a list of strings")
        req = HeartbeatRequest(
            member_id=field(body, "member_id", str, ""), member_epoch=field(body, "member_epoch", int),
            instance_id=field(body, "instance_id", str, None),
            rebalance_timeout_ms=field(body, "rebalance_timeout_ms", int, None),
            session_timeout_ms=field(body, "session_timeout_ms", int, None),
            subscribed_topic_names=names, subscribed_topic_regex=field(body, "subscribed_topic_regex", str, None),
            server_assignor=field(body, "server_assignor", str, None),
            owned=None if owned_entries is None else tp_pairs(owned_entries, "topic_partitions"),
            client_id=str(msg.fields.client or ""), client_host=str(msg.fields.peer or "").rpartition(":")[0])
        wait_ms = min(max(field(body, "wait_ms", int, 0), 0), MAX_WAIT_MS)
        classic = table.classic.get(gid)
        if classic is not None:
            if classic.members or classic.pending:
                raise OdradekError(f"group '{gid}' is a classic group with {len(classic.members)} members: a "
                                   f"consumer-protocol (KIP-848) member cannot join it; use another group id, or "
                                   f"the classic protocol", ErrorCode.GROUP_ID_NOT_FOUND)
            del table.classic[gid]  # an empty classic group becomes a consumer group, as Kafka converts it
        g = table.groups.get(gid)
        if g is None:
            if req.member_epoch != 0:
                raise OdradekError(f"member {req.member_id!r} is not in group '{gid}' (the group does not exist)",
                                   ErrorCode.UNKNOWN_MEMBER_ID)
            g = table.groups[gid] = ConsumerGroup(gid, table.group_config)
        self.purgatory.release(gid, req.member_id)
        now = self.clock.now()
        try:
            resp = g.heartbeat(req, now, meta.topics)
        except GroupError:
            if not g.members and g.group_epoch == 0 and gid not in table.offsets:
                del table.groups[gid]  # a refused first join leaves no trace
            raise
        finally:
            self.purgatory.changed(g)  # a refused request changed nothing; a removal by it did
        owned = set(req.owned or ())
        # Nothing new for the member (even one waiting for partitions to be released): hold it.
        quiet = (resp["member_epoch"] == req.member_epoch and tps_of(resp["assignment"]) == owned
                 and req.owned is not None)
        if wait_ms > 0 and quiet and req.member_epoch > 0:
            self.purgatory.hold((gid, resp["member_id"]), msg, wait_ms, req.member_epoch, owned)
            return
        self.writer.after_write(g, lambda: self.outbox.reply(msg, Response({"error_code": 0,
                                                                                     **meta.with_ids(resp)})), msg)
