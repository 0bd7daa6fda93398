"""The group coordinator's administrative APIs: FIND_COORDINATOR (groups, and transactional ids
for this broker's transaction coordinator), LIST_GROUPS, DESCRIBE_GROUPS and
CONSUMER_GROUP_DESCRIBE, DELETE_GROUPS, LEAVE_GROUP (a forced removal, or a classic member's
leave).

Process: ``group_coordinator`` (a plain object its actor owns, ``coordinator.group_coordinator``).
Owns this broker's own address once learned. Collaborators, handed in: the ``GroupTable``,
the ``TopicView`` (the brokers' addresses, this broker's id), the ``Leadership`` (who
coordinates a group), the ``GroupWriter`` (tombstones), the ``Purgatory`` (a removed member's
held heartbeat), the ``ClassicApi`` (a classic member's leave, a classic group described),
``create_topic()`` (the actor's creation of ``__consumer_offsets``), the actor's ``Outbox``,
the config (listeners, cluster mode) and the supervisor's name.
Sends ``status`` to the supervisor (this broker's own address, while the snapshot has no port
for it), ``create_state_topic`` to the transaction coordinator.
"""
from __future__ import annotations

from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import CreateStateTopic, Response, Status
from odradek.actors.names import TXN_COORDINATOR
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.group import EMPTY, GroupError
from odradek.coordinator.group_api_classic import ClassicApi
from odradek.coordinator.group_leadership import Leadership
from odradek.coordinator.group_purgatory import Purgatory
from odradek.coordinator.group_requests import group_id, valid_group_id
from odradek.coordinator.group_table import GroupTable, TopicView
from odradek.coordinator.group_writes import GroupWriter, group_write_error
from odradek.coordinator.offsets import group_record, offset_record, offsets_leaders, partition_for
from odradek.core.fields import BadRequest, field
from odradek.core.kafka.groups import decode_subscription
from odradek.core.protocol import OFFSETS_TOPIC, TXN_STATE_TOPIC, ApiKey, ErrorCode, OdradekError


class AdminApi:
    def __init__(self, table: GroupTable, meta: TopicView, leadership: Leadership, writer: GroupWriter,
                 purgatory: Purgatory, classic: ClassicApi, create_topic: Callable[[], None], outbox: Outbox,
                 config, supervisor: str | None):
        self.table, self.meta, self.leadership, self.writer = table, meta, leadership, writer
        self.purgatory, self.classic, self.create_topic, self.outbox = purgatory, classic, create_topic, outbox
        self.config, self.supervisor = config, supervisor
        self.cluster_mode = bool(config.get("zookeeper.connect"))
        self.address: tuple[str, int] | None = None

    # ---- administration --------------------------------------------------------------------------
    def find_coordinator(self, msg: Message, body: dict) -> None:
        """The leader of the group's ``__consumer_offsets`` partition, with its address from
        the snapshot's ``brokers``. This broker's own address comes from the snapshot, or,
        while the snapshot has no port for it (single-broker mode), from the listener.
        ``keys`` (FindCoordinator v4+) asks for several groups at once: answered
        ``{"coordinators": [{key, node_id, host, port, error_code, error_message}]}``."""
        key_type = body.get("key_type", 0)
        if key_type == 1:
            self._find_txn_coordinator(msg, body)
            return
        if key_type != 0:
            raise OdradekError(f"key_type {key_type!r}: 0 (group) or 1 (transaction)", ErrorCode.INVALID_REQUEST)
        keys = body.get("keys")
        if keys is None:
            key = body.get("key")
            node_id, _ = self._coordinator_of(key, None)  # raises before waiting for an address

            def answer(own) -> None:
                try:
                    node_id, (host, port) = self._coordinator_of(key, own)
                except OdradekError as exc:
                    self.outbox.reply_error(msg, exc.code, exc.message)
                    return
                self.outbox.reply(msg, Response({"error_code": 0, "node_id": node_id, "host": host, "port": port,
                                                 "key": key}))
            self._own_address(answer)
            return
        if not isinstance(keys, list):
            raise BadRequest("'keys' must be a list of group ids")

        def answer_all(own) -> None:
            out = []
            for key in keys:
                try:
                    node_id, (host, port) = self._coordinator_of(key, own)
                    out.append({"key": key, "node_id": node_id, "host": host, "port": port, "error_code": 0})
                except OdradekError as exc:
                    out.append({"key": key, "node_id": -1, "host": "", "port": -1, "error_code": int(exc.code),
                                "error_message": exc.message})
            self.outbox.reply(msg, Response({"coordinators": out}))
        self._own_address(answer_all)

    def _find_txn_coordinator(self, msg: Message, body: dict) -> None:
        """FindCoordinator key_type 1 (transactional ids): this broker on a single broker; in
        a cluster the leader of the id's ``__transaction_state`` partition (the transaction
        coordinator's rule, coordinator/txn_coordinator.py), which is asked to create the
        topic when it does not exist yet (COORDINATOR_NOT_AVAILABLE meanwhile)."""
        keys = body.get("keys")
        if keys is not None and not isinstance(keys, list):
            raise BadRequest("'keys' must be a list of transactional ids")
        if keys is None:
            self._txn_coordinator_of(body.get("key"), None)  # raises before waiting for an address

        def answer(own) -> None:
            out = []
            for key in (keys if keys is not None else [body.get("key")]):
                try:
                    node_id, (host, port) = self._txn_coordinator_of(key, own)
                    out.append({"key": key, "node_id": node_id, "host": host, "port": port, "error_code": 0})
                except OdradekError as exc:
                    if keys is None:
                        self.outbox.reply_error(msg, exc.code, exc.message)
                        return
                    out.append({"key": key, "node_id": -1, "host": "", "port": -1, "error_code": int(exc.code),
                                "error_message": exc.message})
            self.outbox.reply(msg, Response({"coordinators": out} if keys is not None
                                            else {**out[0], "key": body.get("key")}))
        self._own_address(answer)

    def _txn_coordinator_of(self, key, own) -> tuple[int, tuple | None]:
        if not isinstance(key, str) or not key:
            raise BadRequest("a transactional id must be a non-empty string")
        if not self.cluster_mode:
            return self.meta.broker_id, own
        leaders = offsets_leaders(self.meta.snapshot, self.meta.broker_id, TXN_STATE_TOPIC)
        if not leaders:
            self.outbox.send(TXN_COORDINATOR, CreateStateTopic())
            raise OdradekError(f"{TXN_STATE_TOPIC} is being created; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        p = partition_for(key, len(leaders))
        leader = leaders[p][0]
        if leader == self.meta.broker_id:
            return self.meta.broker_id, own
        entry = (self.meta.snapshot.get("brokers") or {}).get(str(leader)) if leader >= 0 else None
        if not entry or not entry[1]:
            why = "has no leader" if leader < 0 else f"is led by broker {leader}, whose address is unknown here"
            raise OdradekError(f"the coordinator of transactional id {key!r} is not available: "
                               f"{TXN_STATE_TOPIC}-{p} {why}; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return leader, (entry[0], entry[1])

    def _coordinator_of(self, key, own) -> tuple[int, tuple | None]:
        """``(node_id, (host, port))`` of group ``key``'s coordinator (``own``: this broker's
        address, None while not known yet); raises why there is none."""
        if not self.leadership.partitions:
            if self.cluster_mode:  # clients reach a coordinator only through FindCoordinator: create it now
                self.create_topic()
                raise OdradekError(f"{OFFSETS_TOPIC} is being created; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return self.meta.broker_id, own  # created on the first write
        gid = group_id({"key": key}, "key")
        p, leader = self.leadership.leader_of(gid)
        if leader == self.meta.broker_id:
            return self.meta.broker_id, own
        entry = (self.meta.snapshot.get("brokers") or {}).get(str(leader)) if leader >= 0 else None
        if not entry or not entry[1]:
            why = "has no leader" if leader < 0 else f"is led by broker {leader}, whose address is unknown here"
            raise OdradekError(f"the coordinator of group '{gid}' is not available: {OFFSETS_TOPIC}-{p} {why}; retry",
                               ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return leader, (entry[0], entry[1])

    def _own_address(self, then) -> None:
        entry = (self.meta.snapshot.get("brokers") or {}).get(str(self.meta.broker_id))
        if entry and entry[1]:
            then((entry[0], entry[1]))
        else:
            self._with_address(then)

    def _with_address(self, then) -> None:
        if self.address is not None:
            then(self.address)
            return
        from odradek.core.protocol import parse_listener
        cfg = self.config
        host, port = parse_listener(cfg.get("advertised.listeners") or cfg["listeners"])
        if port != 0 or not self.supervisor:
            self.address = (host, port)
            then(self.address)
            return

        def learned(status: Message) -> None:
            addr = status.fields.supervisor.get("address") if not status.is_error else None
            if addr:
                h, _, p = str(addr).rpartition(":")
                self.address = (host if cfg.get("advertised.listeners") else h, int(p))
                then(self.address)
            else:
                then((host, port))
        self.outbox.request(self.supervisor, Status(), callback=learned, timeout=5.0)

    def list_groups(self, msg: Message, body: dict) -> None:
        states = {str(s).lower() for s in field(body, "states_filter", list, [])}
        types = {str(t).lower() for t in field(body, "types_filter", list, [])}
        out = []
        for gid in self.table.known():
            cg = self.table.classic.get(gid)
            if cg is not None:
                out.append({"group_id": gid, "protocol_type": cg.protocol_type or "", "group_type": "classic",
                            "group_state": cg.state})
            else:
                out.append({"group_id": gid, "protocol_type": "consumer", "group_type": "consumer",
                            "group_state": self.table.state_of(gid)})
        if states:
            out = [g for g in out if g["group_state"].lower() in states]
        if types:
            out = [g for g in out if g["group_type"] in types]
        self.outbox.reply(msg, Response({"error_code": 0, "groups": out}))

    def describe_groups(self, msg: Message, body: dict) -> None:
        ids = body.get("group_ids", body.get("groups"))
        if not isinstance(ids, list):
            raise BadRequest("missing field 'group_ids' (a list of group ids)")
        out = []
        for gid in ids:
            error = self.leadership.coordinator_error(gid) if valid_group_id(gid) else None
            if error is not None:
                out.append({"group_id": gid, "error_code": int(error.code), "error_message": error.message})
                continue
            if not isinstance(gid, str) or (gid not in self.table.groups and gid not in self.table.offsets
                                            and gid not in self.table.classic):
                out.append({"group_id": gid, "error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                            "error_message": f"group {gid!r} does not exist"})
                continue
            if gid in self.table.classic:
                if msg.fields.api == ApiKey.CONSUMER_GROUP_DESCRIBE:
                    out.append({"group_id": gid, "error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                                "error_message": f"group '{gid}' is a classic group, not a consumer group"})
                else:
                    out.append({"error_code": 0, **self.classic.describe(self.table.classic[gid])})
                continue
            g = self.table.groups.get(gid)
            d = g.describe() if g is not None else {"group_id": gid, "group_state": EMPTY, "group_epoch": 0,
                                                     "assignment_epoch": 0, "assignor_name": "", "members": []}
            d["members"] = [{**m, "assignment": self.meta.ids(m["assignment"]),
                             "target_assignment": self.meta.ids(m["target_assignment"])} for m in d["members"]]
            out.append({"error_code": 0, **d})
        self.outbox.reply(msg, Response({"groups": out}))

    def delete_groups(self, msg: Message, body: dict) -> None:
        names = body.get("groups_names", body.get("group_ids"))
        if not isinstance(names, list):
            raise BadRequest("missing field 'groups_names' (a list of group ids)")
        results, pending = [], {"n": 1}

        def finish() -> None:
            pending["n"] -= 1
            if pending["n"] == 0:
                self.outbox.reply(msg, Response({"results": results}))

        for gid in names:
            error = self.leadership.coordinator_error(gid) if valid_group_id(gid) else None
            if error is not None:
                results.append({"group_id": gid, "error_code": int(error.code), "error_message": error.message})
                continue
            g = (self.table.groups.get(gid) or self.table.classic.get(gid)) if isinstance(gid, str) else None
            if not isinstance(gid, str) or (g is None and gid not in self.table.offsets):
                results.append({"group_id": gid, "error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                                "error_message": f"group {gid!r} does not exist"})
                continue
            if g is not None and g.members:
                results.append({"group_id": gid, "error_code": int(ErrorCode.NON_EMPTY_GROUP),
                                "error_message": f"group '{gid}' has {len(g.members)} members; stop them first"})
                continue
            recs = [offset_record(gid, t, p, None) for t, p in self.table.offsets.pop(gid, {})]
            recs.append(group_record(gid, None))
            if g is not None:
                g.deleted = True
            self.table.groups.pop(gid, None)
            self.table.classic.pop(gid, None)
            self.table.empty_since.pop(gid, None)
            entry = {"group_id": gid, "error_code": 0}
            results.append(entry)
            pending["n"] += 1

            def stored(code, error, entry=entry) -> None:
                if code:
                    entry.update(error_code=int(group_write_error(code)),
                                 error_message=f"deleted here, but the tombstones were not stored: {error}")
                finish()
            self.writer.append(gid, recs, stored)
        finish()

    def delete_offsets(self, msg: Message, body: dict) -> None:
        """OFFSET_DELETE (Kafka's OffsetDelete, KIP-496): tombstones for a group's committed
        offsets of the partitions named. A partition of a topic the group's members subscribe
        to is refused (GROUP_SUBSCRIBED_TO_TOPIC); a group with members of another protocol
        than the consumer's is NON_EMPTY_GROUP; a partition without an offset is answered 0."""
        gid = group_id(body)
        g = self.table.groups.get(gid) or self.table.classic.get(gid)
        committed = self.table.offsets.get(gid)
        if g is None and committed is None:
            raise OdradekError(f"group '{gid}' does not exist", ErrorCode.GROUP_ID_NOT_FOUND)
        subscribed = self._subscribed_topics(g)
        if subscribed is None:
            raise OdradekError(f"group '{gid}' has members of protocol type '{g.protocol_type}': stop them first",
                               ErrorCode.NON_EMPTY_GROUP)
        out, gone = [], []
        for t in field(body, "topics", list):
            name = t.get("name") if isinstance(t, dict) else None
            parts = []
            for p in (t.get("partitions") or []) if isinstance(t, dict) else []:
                index = p.get("partition_index") if isinstance(p, dict) else None
                if not isinstance(name, str) or not isinstance(index, int):
                    raise BadRequest("each topic needs a 'name' and partitions with a 'partition_index'")
                code = int(ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC) if name in subscribed else 0
                if not code and committed and (name, index) in committed:
                    gone.append((name, index))
                parts.append({"partition_index": index, "error_code": code})
            out.append({"name": name, "partitions": parts})
        answer = {"error_code": 0, "topics": out}
        if not gone:
            self.outbox.reply(msg, Response(answer))
            return
        for tp in gone:
            del committed[tp]

        def stored(code, error) -> None:
            if code:
                self.outbox.reply_error(msg, group_write_error(code), f"offsets deleted here, but the tombstones were "
                                                               f"not stored: {error}")
            else:
                self.outbox.reply(msg, Response(answer))
        self.writer.append(gid, [offset_record(gid, t, p, None) for t, p in gone], stored)

    def _subscribed_topics(self, g) -> set | None:
        """The topics a group's members subscribe to (none for an empty or unknown group); None
        for a classic group with members of a protocol that is not the consumer's."""
        if g is None or not g.members:
            return set()
        if getattr(g, "kind", "") == "classic":
            if g.protocol_type != "consumer":
                return None
            topics = set()
            for m in g.members.values():
                for name, data in m.protocols:  # the chosen protocol's subscription (each while none is)
                    if g.protocol_name in (None, name):
                        topics |= set(decode_subscription(data))
            return topics
        topics = set()
        for m in g.members.values():
            topics |= set(m.subscribed_topic_names)
            if m.subscribed_topic_regex:
                topics |= {t for t in self.meta.topics if m.subscribes(t)}
        return topics

    def leave_group(self, msg: Message, body: dict) -> None:
        """Remove members by id (a tool's forced removal; KIP-848 members leave by heartbeat,
        classic members by this request, by member id or ``group_instance_id``)."""
        gid = group_id(body)
        if gid in self.table.classic:
            self.classic.leave(msg, body, self.table.classic[gid])
            return
        g = self.table.groups.get(gid)
        if g is None:
            raise OdradekError(f"group '{gid}' does not exist", ErrorCode.GROUP_ID_NOT_FOUND)
        out = []
        for m in field(body, "members", list):
            member_id = m.get("member_id") if isinstance(m, dict) else None
            try:
                g.remove_member(member_id, self.meta.topics)
                self.purgatory.answer((gid, member_id))
                out.append({"member_id": member_id, "error_code": 0})
            except GroupError as exc:
                out.append({"member_id": member_id, "error_code": int(exc.code), "error_message": exc.message})
        self.purgatory.changed(g)
        self.writer.after_write(g, lambda: self.outbox.reply(msg, Response({"error_code": 0, "members": out})), msg)
