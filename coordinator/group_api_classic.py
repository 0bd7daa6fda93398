"""The group coordinator's classic protocol: JOIN_GROUP, SYNC_GROUP, HEARTBEAT, and a classic
member's LEAVE_GROUP.

Process: ``group_coordinator`` (a plain object its actor owns, ``coordinator.group_coordinator``).
Owns the count of heartbeats served. Collaborators, handed in: the ``GroupTable``, the
``Purgatory`` (a JoinGroup or SyncGroup that waits is held there, and answered from the
group's outbox), the ``GroupWriter`` (the group's record, written before SyncGroup answers go
out), the actor's ``Outbox`` and the ``Clock``. The state machine is
``coordinator.classic_group``; here: parsing, holding, answering.
"""
from __future__ import annotations

import logging

from odradek.actors.message import Message
from odradek.actors.messages import Response
from odradek.coordinator.classic_group import ClassicGroup, JoinRequest
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.group import GroupError
from odradek.coordinator.group_purgatory import Purgatory
from odradek.coordinator.group_requests import classic_error, group_id
from odradek.coordinator.group_table import Clock, GroupTable
from odradek.coordinator.group_writes import GroupWriter, group_write_error
from odradek.coordinator.offsets import group_record
from odradek.core.fields import BadRequest, field
from odradek.core.kafka.groups import decode_assignment, decode_subscription
from odradek.core.protocol import ErrorCode

log = logging.getLogger("odradek.groups")


class ClassicApi:
    def __init__(self, table: GroupTable, purgatory: Purgatory, writer: GroupWriter, outbox: Outbox, clock: Clock):
        self.table, self.purgatory, self.writer, self.outbox, self.clock = table, purgatory, writer, outbox, clock
        self.heartbeats = 0

    def _for_join(self, gid: str) -> ClassicGroup:
        g = self.table.classic.get(gid)
        if g is not None:
            return g
        other = self.table.groups.get(gid)
        if other is not None:
            if other.members:
                raise GroupError(f"group '{gid}' is a consumer group (KIP-848) with {len(other.members)} members: "
                                 f"a classic JoinGroup cannot join it; use group.protocol=consumer, or another "
                                 f"group id", ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            del self.table.groups[gid]  # an empty consumer group becomes a classic one, as Kafka converts it
        g = self.table.classic[gid] = ClassicGroup(gid, self.table.classic_config)
        return g

    def drop_if_unused(self, gid: str) -> None:
        """A refused first join leaves no trace."""
        g = self.table.classic.get(gid)
        if g is not None and not g.members and not g.pending and g.generation_id == 0 and gid not in self.table.offsets:
            del self.table.classic[gid]

    def join_group(self, msg: Message, body: dict) -> None:
        gid = group_id(body)
        member_id = field(body, "member_id", str, "")
        entries = field(body, "protocols", list)
        protocols = []
        for p in entries:
            if not isinstance(p, dict) or not isinstance(p.get("name"), str) or \
                    not isinstance(p.get("metadata"), (bytes, type(None))):
                raise BadRequest("each protocol must be a map with a string 'name' and bytes 'metadata'")
            protocols.append((p["name"], bytes(p.get("metadata") or b"")))
        req = JoinRequest(member_id=member_id, instance_id=field(body, "group_instance_id", str, None),
                          session_timeout_ms=field(body, "session_timeout_ms", int),
                          rebalance_timeout_ms=field(body, "rebalance_timeout_ms", int, -1),
                          protocol_type=field(body, "protocol_type", str), protocols=protocols,
                          client_id=str(msg.fields.client or ""),
                          client_host=str(msg.fields.peer or "").rpartition(":")[0],
                          require_known_member_id=bool(body.get("require_known_member_id", True)))
        try:
            g = self._for_join(gid)
            new_id, answer = g.join(req, self.clock.now())
        except GroupError as exc:
            self.drop_if_unused(gid)
            self.outbox.reply(msg, Response(classic_error(exc, member_id)))
            return
        if answer is not None:
            self.outbox.reply(msg, Response(answer))
        else:
            self.purgatory.hold_classic((gid, "join", new_id), msg)
        self.changed(g)

    def sync_group(self, msg: Message, body: dict) -> None:
        gid = group_id(body)
        member_id = field(body, "member_id", str)
        assignments = {}
        for a in field(body, "assignments", list, []):
            if not isinstance(a, dict) or not isinstance(a.get("member_id"), str) or \
                    not isinstance(a.get("assignment"), (bytes, type(None))):
                raise BadRequest("each assignment must be a map with a string 'member_id' and bytes 'assignment'")
            data = bytes(a.get("assignment") or b"")
            if len(data) > self.table.classic_config.max_metadata_bytes:
                raise BadRequest(f"the assignment of member {a['member_id']} is {len(data)} bytes; at most "
                                 f"{self.table.classic_config.max_metadata_bytes} (group.classic.max.metadata.bytes)")
            assignments[a["member_id"]] = data
        g = self.table.classic.get(gid)
        try:
            if g is None:
                raise GroupError(f"member {member_id!r} is not in group '{gid}' (no classic group of that id): "
                                 f"join first", ErrorCode.UNKNOWN_MEMBER_ID)
            answer = g.sync(member_id, field(body, "generation_id", int), field(body, "group_instance_id", str, None),
                            assignments, self.clock.now(), field(body, "protocol_type", str, None),
                            field(body, "protocol_name", str, None))
        except GroupError as exc:
            self.outbox.reply(msg, Response(classic_error(exc, member_id)))
            return
        if answer is not None:
            self.outbox.reply(msg, Response(answer))
        else:
            self.purgatory.hold_classic((gid, "sync", member_id), msg)
        self.changed(g)

    def classic_heartbeat(self, msg: Message, body: dict) -> None:
        self.heartbeats += 1
        gid = group_id(body)
        member_id = field(body, "member_id", str)
        g = self.table.classic.get(gid)
        try:
            if g is None:
                raise GroupError(f"member {member_id!r} is not in group '{gid}' (no classic group of that id): "
                                 f"join first", ErrorCode.UNKNOWN_MEMBER_ID)
            g.heartbeat(member_id, field(body, "generation_id", int), field(body, "group_instance_id", str, None),
                        self.clock.now())
            self.outbox.reply(msg, Response({"error_code": 0}))
        except GroupError as exc:
            self.outbox.reply(msg, Response({"error_code": int(exc.code), "error_message": exc.message}))
        if g is not None:
            self.changed(g)

    def leave(self, msg: Message, body: dict, g: ClassicGroup) -> None:
        out = []
        for m in field(body, "members", list):
            if not isinstance(m, dict):
                raise BadRequest("each member must be a map with 'member_id' and/or 'group_instance_id'")
            member_id, instance_id = m.get("member_id") or "", m.get("group_instance_id")
            if not isinstance(member_id, str) or not isinstance(instance_id, (str, type(None))):
                raise BadRequest("'member_id' and 'group_instance_id' must be strings")
            try:
                left = g.leave(member_id, instance_id, self.clock.now())
                log.info("group %s: member %s left", g.group_id, left)
                out.append({"member_id": left, "group_instance_id": instance_id, "error_code": 0})
            except GroupError as exc:
                out.append({"member_id": member_id, "group_instance_id": instance_id, "error_code": int(exc.code),
                            "error_message": exc.message})
        self.outbox.reply(msg, Response({"error_code": 0, "members": out}))
        self.changed(g)

    def changed(self, g: ClassicGroup) -> None:
        """After any operation on ``g``: answer what its outbox holds (JoinGroup answers at
        once; SyncGroup answers once the group's record is stored, as Kafka's storeGroup),
        note emptiness, write the record if the durable state moved."""
        syncs = []
        for kind, member_id, body in g.take_outbox():
            key = (g.group_id, kind, member_id)
            if kind == "sync" and not body.get("error_code"):
                syncs.append((key, body))
                continue
            held = self.purgatory.take_classic(key)
            if held is not None:
                self.outbox.reply(held, Response(body))
        if g.members or g.generation_id:
            self.table.note_members(g.group_id, bool(g.members), self.clock.wall())

        def answer(code: int = 0, error: str = "") -> None:
            for key, body in syncs:
                held = self.purgatory.take_classic(key)
                if held is None:
                    continue
                if code:
                    body = classic_error(GroupError(f"group '{g.group_id}': its new generation was not stored "
                                                          f"({error}); rejoin", group_write_error(code)), key[2])
                self.outbox.reply(held, Response(body))

        if not g.changed:
            answer()
            return
        g.changed = False
        state = None if g.deleted else {"classic": g.to_record()}
        key, value = group_record(g.group_id, state, self.table.empty_since.get(g.group_id))

        def done(code: int, error: str) -> None:
            if code:
                log.warning("group %s: its record was not written: %s", g.group_id, error)
                if self.table.classic.get(g.group_id) is g:
                    g.changed = True
            answer(code, error)
        self.writer.append(g.group_id, [(key, value)], done)

    @staticmethod
    def describe(g: ClassicGroup) -> dict:
        """A classic group in DESCRIBE_GROUPS' shape: Kafka's classic fields (``protocol_type``,
        ``protocol_data``, member metadata and assignment bytes) and, for consumers, the same
        fields a KIP-848 group has (assignment and subscription decoded), so tools show both."""
        d = g.describe()
        consumer = g.protocol_type == "consumer"
        members = [{**m, "instance_id": m["group_instance_id"], "member_epoch": g.generation_id,
                    "state": "stable" if g.state == "Stable" else "reconciling",
                    "subscribed_topic_names": decode_subscription(m["member_metadata"]) if consumer else [],
                    "subscribed_topic_regex": None,
                    "assignment": decode_assignment(m["member_assignment"]) if consumer else [],
                    "pending_revocation": [], "target_assignment": [], "left": False} for m in d["members"]]
        return {**d, "group_type": "classic", "group_epoch": g.generation_id, "assignment_epoch": g.generation_id,
                "assignor_name": g.protocol_name or "", "members": members}
