"""The group coordinator's KIP-848 API: CONSUMER_GROUP_HEARTBEAT (``heartbeat``), topics by
name or by Kafka topic id.

Runs in the ``group_coordinator`` process, as part of ``GroupCoordinator`` (a mixin). The group
state machine is ``coordinator.group``; here: parsing, converting a classic group that has no
members, holding a quiet heartbeat (``group_purgatory``), and answering once the group's record
is stored (``group_writes``).
"""
from __future__ import annotations

from odradek.actors.message import Message
from odradek.coordinator.group import ConsumerGroup, GroupError, HeartbeatRequest, tps_of
from odradek.coordinator.group_purgatory import Held
from odradek.coordinator.group_requests import group_id, tp_pairs
from odradek.network.fields import BadRequest, field
from odradek.network.protocol import ErrorCode, OdradekError

MAX_WAIT_MS = 30_000  # a heartbeat is held at most this long


class ConsumerApi:
    """The group coordinator's KIP-848 API (a mixin of ``GroupCoordinator``)."""

    # ---- heartbeats -------------------------------------------------------------------------
    def heartbeat(self, msg: Message, body: dict) -> None:
        self.heartbeats += 1
        gid = group_id(body)
        owned_entries = field(body, "topic_partitions", list, None)
        if owned_entries is not None and body.get("topic_ids"):  # Kafka's KIP-848: topics by id
            owned_entries = self._named(owned_entries)
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
            client_id=str(msg.get("client") or ""), client_host=str(msg.get("peer") or "").rpartition(":")[0])
        wait_ms = min(max(field(body, "wait_ms", int, 0), 0), MAX_WAIT_MS)
        classic = self.classic.get(gid)
        if classic is not None:
            if classic.members or classic.pending:
                raise OdradekError(f"group '{gid}' is a classic group with {len(classic.members)} members: a "
                                   f"consumer-protocol (KIP-848) member cannot join it; use another group id, or "
                                   f"the classic protocol", ErrorCode.GROUP_ID_NOT_FOUND)
            del self.classic[gid]  # an empty classic group becomes a consumer group, as Kafka converts it
        g = self.groups.get(gid)
        if g is None:
            if req.member_epoch != 0:
                raise OdradekError(f"member {req.member_id!r} is not in group '{gid}' (the group does not exist)",
                                   ErrorCode.UNKNOWN_MEMBER_ID)
            g = self.groups[gid] = ConsumerGroup(gid, self.group_config)
        self._release_held(gid, req.member_id)
        now = self._now()
        try:
            resp = g.heartbeat(req, now, self.topics)
        except GroupError:
            if not g.members and g.group_epoch == 0 and gid not in self.offsets:
                del self.groups[gid]  # a refused first join leaves no trace
            raise
        finally:
            self._changed(g)  # a refused request changed nothing; a removal by it did
        owned = set(req.owned or ())
        # Nothing new for the member (even one waiting for partitions to be released): hold it.
        quiet = (resp["member_epoch"] == req.member_epoch and tps_of(resp["assignment"]) == owned
                 and req.owned is not None)
        if wait_ms > 0 and quiet and req.member_epoch > 0:
            key = (gid, resp["member_id"])
            timer = self.call_later(wait_ms / 1000, lambda: self._answer_held(key))
            self.held[key] = Held(msg, timer, req.member_epoch, owned)
            return
        self._after_write(g, lambda: self.reply(msg, {"body": {"error_code": 0, **self._with_ids(resp)}}), msg)

    def _named(self, entries: list) -> list:
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

    def _with_ids(self, resp: dict) -> dict:
        """The answer's assignment with each topic's id beside its name."""
        if resp.get("assignment") is None:
            return resp
        return {**resp, "assignment": self._ids(resp["assignment"])}

    def _ids(self, entries) -> list:
        return [{**e, "topic_id": self.topic_ids.get(e["topic"])} for e in entries or ()]
