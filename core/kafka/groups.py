"""The Kafka group APIs, translated to the group coordinator's internal requests. Pure.

Registered into ``apis`` on import. Each entry carries a Kafka request (kio's field names) to
the internal body of the same key (docs/PROTOCOL.md) and the coordinator's answer back:
FindCoordinator, OffsetCommit, OffsetFetch, the classic protocol (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup), ListGroups, DescribeGroups, DeleteGroups (both kinds of group), and
KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe (topic ids mapped to names and back).
Versions: docs/KAFKA.md.
Also Kafka's consumer protocol (the subscription and assignment bytes a classic consumer puts
in JoinGroup and SyncGroup), which the coordinator decodes to show a classic group's
assignment and encodes to describe a KIP-848 group to a classic DescribeGroups.
"""
from __future__ import annotations

import struct
import uuid

from odradek.core.kafka.apis import OPERATIONS_NOT_ASKED, Api, _uuid, register, top_level_error
from odradek.core.protocol import ApiKey, ErrorCode

_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")

# Kafka's state names: classic groups' are the coordinator's own; KIP-848 groups' are mapped.
CONSUMER_STATES = {"empty": "Empty", "reconciling": "Reconciling", "stable": "Stable", "dead": "Dead",
                   "assigning": "Assigning"}


# ---- the consumer protocol (ConsumerProtocolSubscription / ConsumerProtocolAssignment) ---------

class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes):
        self.data, self.at = memoryview(data), 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def i16(self) -> int:
        return _I16.unpack(self.take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self.take(4))[0]

    def string(self) -> str | None:
        n = self.i16()
        return None if n < 0 else bytes(self.take(n)).decode()

    def array(self, item) -> list:
        n = self.i32()
        if n < 0:
            return []
        if n > len(self.data):
            raise ValueError("array longer than the data")
        return [item() for _ in range(n)]

    def done(self) -> bool:
        return self.at >= len(self.data)


def decode_subscription(data: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (any version); [] if it does not parse."""
    try:
        r = _Reader(data)
        r.i16()
        return [t for t in r.array(r.string) if t]
    except (ValueError, struct.error, UnicodeDecodeError):
        return []


def decode_assignment(data: bytes) -> list[dict]:
    """A ConsumerProtocolAssignment -> ``[{"topic", "partitions"}]``; [] if it does not parse."""
    try:
        r = _Reader(data)
        if r.done():
            return []
        r.i16()
        return [{"topic": t, "partitions": ps} for t, ps in r.array(lambda: (r.string(), r.array(r.i32)))]
    except (ValueError, struct.error, UnicodeDecodeError):
        return []


def _string(s: str) -> bytes:
    raw = s.encode()
    return _I16.pack(len(raw)) + raw


def encode_assignment(entries: list[dict]) -> bytes:
    """``[{"topic", "partitions"}]`` -> a ConsumerProtocolAssignment v0 (no user data)."""
    out = [_I16.pack(0), _I32.pack(len(entries))]
    for e in entries:
        out += [_string(e["topic"]), _I32.pack(len(e["partitions"]))] + [_I32.pack(p) for p in e["partitions"]]
    out.append(_I32.pack(-1))
    return b"".join(out)


def encode_subscription(topics: list[str]) -> bytes:
    """Topic names -> a ConsumerProtocolSubscription v0 (no user data)."""
    return b"".join([_I16.pack(0), _I32.pack(len(topics)), *(_string(t) for t in topics), _I32.pack(-1)])


def _body(reply) -> dict:
    return reply.body or {}


def _nullable(value, version: int, nullable_from: int):
    """A string field that is nullable only from some version: "" before it."""
    if value is None and version < nullable_from:
        return ""
    return value


# ---- FindCoordinator (10) -------------------------------------------------------------------------

def find_coordinator_to_internal(version: int, request: dict) -> tuple[dict, list]:
    key_type = request.get("key_type", 0)
    if version >= 4:
        return {"keys": list(request.get("coordinator_keys") or ()), "key_type": key_type}, []
    return {"key": request["key"], "key_type": key_type}, []


def find_coordinator_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = _body(reply)
    if version >= 4:
        return {"coordinators": body.get("coordinators") or []}
    return {"error_code": body.get("error_code", 0), "error_message": body.get("error_message"),
            "node_id": body.get("node_id", -1), "host": body.get("host", ""), "port": body.get("port", -1)}


def find_coordinator_error(version: int, request: dict, code: int, message: str) -> dict:
    if version >= 4:
        return {"coordinators": [{"key": k, "node_id": -1, "host": "", "port": -1, "error_code": code,
                                  "error_message": message} for k in request.get("coordinator_keys") or ()]}
    return {"error_code": code, "error_message": message, "node_id": -1, "host": "", "port": -1}


register(Api(ApiKey.FIND_COORDINATOR, 0, 5, find_coordinator_to_internal, find_coordinator_from_internal,
             find_coordinator_error))


# ---- OffsetCommit (8) ---------------------------------------------------------------------------

def offset_commit_to_internal(version: int, request: dict) -> tuple[dict, list]:
    topics = [{"name": t["name"], "partitions": [
        {"partition_index": p["partition_index"], "committed_offset": p["committed_offset"],
         "committed_leader_epoch": p.get("committed_leader_epoch", -1), "committed_metadata": p.get("committed_metadata")}
        for p in t["partitions"]]} for t in request["topics"]]
    return {"group_id": request["group_id"], "member_id": request.get("member_id") or "",
            "generation_id_or_member_epoch": request.get("generation_id_or_member_epoch", -1),
            "group_instance_id": request.get("group_instance_id"), "topics": topics,
            "any_offset": True}, []  # Kafka takes an offset beyond the log's end (a consumer resets there)


def offset_commit_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [
        {"partition_index": p["partition_index"], "error_code": p.get("error_code", 0)} for p in t["partitions"]]}
        for t in _body(reply).get("topics") or ()]}


def offset_commit_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": code}
                                                          for p in t["partitions"]]} for t in request["topics"]]}


register(Api(ApiKey.OFFSET_COMMIT, 2, 9, offset_commit_to_internal, offset_commit_from_internal, offset_commit_error))


# ---- OffsetFetch (9) ------------------------------------------------------------------------------

def _fetch_topics(topics) -> list | None:
    if topics is None:
        return None
    return [{"name": t["name"], "partition_indexes": list(t["partition_indexes"])} for t in topics]


def offset_fetch_to_internal(version: int, request: dict) -> tuple[dict, list]:
    if version >= 8:
        return {"groups": [{"group_id": g["group_id"], "topics": _fetch_topics(g.get("topics"))}
                           for g in request["groups"]]}, []
    return {"group_id": request["group_id"], "topics": _fetch_topics(request.get("topics"))}, []


def _fetched_topics(topics) -> list:
    return [{"name": t["name"], "partitions": [
        {"partition_index": p["partition_index"], "committed_offset": p.get("committed_offset", -1),
         "committed_leader_epoch": p.get("committed_leader_epoch", -1), "metadata": p.get("metadata") or "",
         "error_code": p.get("error_code", 0)} for p in t["partitions"]]} for t in topics or ()]


def offset_fetch_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = _body(reply)
    if version >= 8:
        return {"groups": [{"group_id": g.get("group_id"), "error_code": g.get("error_code", 0),
                            "topics": _fetched_topics(g.get("topics"))} for g in body.get("groups") or ()]}
    return {"error_code": body.get("error_code", 0), "topics": _fetched_topics(body.get("topics"))}


def offset_fetch_error(version: int, request: dict, code: int, message: str) -> dict:
    def topics(ts):
        return [{"name": t["name"], "partitions": [{"partition_index": i, "committed_offset": -1, "error_code": code}
                                                   for i in t["partition_indexes"]]} for t in ts or ()]
    if version >= 8:
        return {"groups": [{"group_id": g["group_id"], "error_code": code, "topics": topics(g.get("topics"))}
                           for g in request["groups"]]}
    return {"error_code": code, "topics": topics(request.get("topics"))}


register(Api(ApiKey.OFFSET_FETCH, 1, 9, offset_fetch_to_internal, offset_fetch_from_internal, offset_fetch_error))


# ---- JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13): the classic protocol ----------

def join_group_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"group_id": request["group_id"], "session_timeout_ms": request["session_timeout"],
            "rebalance_timeout_ms": request.get("rebalance_timeout", -1), "member_id": request.get("member_id") or "",
            "group_instance_id": request.get("group_instance_id"), "protocol_type": request["protocol_type"],
            "protocols": [{"name": p["name"], "metadata": p["metadata"]} for p in request["protocols"]],
            "require_known_member_id": version >= 4}, []


def join_group_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = _body(reply)
    return {"error_code": body.get("error_code", 0), "generation_id": body.get("generation_id", -1),
            "protocol_type": body.get("protocol_type"),
            "protocol_name": _nullable(body.get("protocol_name"), version, 7),
            "leader": body.get("leader") or "", "skip_assignment": bool(body.get("skip_assignment")),
            "member_id": body.get("member_id") or "",
            "members": [{"member_id": m["member_id"], "group_instance_id": m.get("group_instance_id"),
                         "metadata": m.get("metadata") or b""} for m in body.get("members") or ()]}


def join_group_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "generation_id": -1, "protocol_name": _nullable(None, version, 7), "leader": "",
            "member_id": request.get("member_id") or "", "members": []}


register(Api(ApiKey.JOIN_GROUP, 0, 9, join_group_to_internal, join_group_from_internal, join_group_error))


def sync_group_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"group_id": request["group_id"], "generation_id": request["generation_id"],
            "member_id": request["member_id"], "group_instance_id": request.get("group_instance_id"),
            "protocol_type": request.get("protocol_type"), "protocol_name": request.get("protocol_name"),
            "assignments": [{"member_id": a["member_id"], "assignment": a["assignment"]}
                            for a in request.get("assignments") or ()]}, []


def sync_group_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = _body(reply)
    return {"error_code": body.get("error_code", 0), "protocol_type": body.get("protocol_type"),
            "protocol_name": body.get("protocol_name"), "assignment": body.get("assignment") or b""}


def sync_group_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "assignment": b""}


register(Api(ApiKey.SYNC_GROUP, 0, 5, sync_group_to_internal, sync_group_from_internal, sync_group_error))


def heartbeat_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"group_id": request["group_id"], "generation_id": request["generation_id"],
            "member_id": request["member_id"], "group_instance_id": request.get("group_instance_id")}, []


def heartbeat_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"error_code": _body(reply).get("error_code", 0)}


register(Api(ApiKey.HEARTBEAT, 0, 4, heartbeat_to_internal, heartbeat_from_internal, top_level_error))


def leave_group_to_internal(version: int, request: dict) -> tuple[dict, list]:
    if version < 3:
        members = [{"member_id": request["member_id"]}]
    else:
        members = [{"member_id": m.get("member_id") or "", "group_instance_id": m.get("group_instance_id")}
                   for m in request["members"]]
    return {"group_id": request["group_id"], "members": members}, []


def leave_group_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = _body(reply)
    members = body.get("members") or []
    if version < 3:
        code = body.get("error_code") or next((m.get("error_code") for m in members if m.get("error_code")), 0)
        return {"error_code": code}
    return {"error_code": body.get("error_code", 0),
            "members": [{"member_id": m.get("member_id") or "", "group_instance_id": m.get("group_instance_id"),
                         "error_code": m.get("error_code", 0)} for m in members]}


def leave_group_error(version: int, request: dict, code: int, message: str) -> dict:
    if code == ErrorCode.GROUP_ID_NOT_FOUND:  # no group of that id: the member is unknown, as Kafka says it
        code = int(ErrorCode.UNKNOWN_MEMBER_ID)
    return {"error_code": code}


register(Api(ApiKey.LEAVE_GROUP, 0, 5, leave_group_to_internal, leave_group_from_internal, leave_group_error))


# ---- ListGroups (16), DescribeGroups (15), DeleteGroups (42) --------------------------------------------

def _state(g: dict) -> str:
    state = g.get("group_state") or ""
    return state if g.get("group_type") == "classic" else CONSUMER_STATES.get(state, state)


def list_groups_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"states_filter": list(request.get("states_filter") or ()),
            "types_filter": list(request.get("types_filter") or ())}, []


def list_groups_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = _body(reply)
    return {"error_code": body.get("error_code", 0), "groups": [
        {"group_id": g["group_id"], "protocol_type": g.get("protocol_type") or "", "group_state": _state(g),
         "group_type": "Classic" if g.get("group_type") == "classic" else "Consumer"}
        for g in body.get("groups") or ()]}


register(Api(ApiKey.LIST_GROUPS, 0, 5, list_groups_to_internal, list_groups_from_internal, top_level_error))


def describe_groups_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"group_ids": list(request["groups"]),
            "include_authorized_operations": bool(request.get("include_authorized_operations"))}, []


def _described(g: dict) -> dict:
    if g.get("error_code") == ErrorCode.GROUP_ID_NOT_FOUND:
        # Kafka's classic DescribeGroups (v0-v5) answers an unknown group as Dead, with no error
        return {"error_code": 0, "group_id": g.get("group_id"), "group_state": "Dead", "protocol_type": "",
                "protocol_data": "", "members": [], "authorized_operations": OPERATIONS_NOT_ASKED}
    if g.get("error_code"):
        return {"error_code": g["error_code"], "group_id": g.get("group_id"), "group_state": "", "protocol_type": "",
                "protocol_data": "", "members": [], "authorized_operations": OPERATIONS_NOT_ASKED}
    classic = g.get("group_type") == "classic"
    members = []
    for m in g.get("members") or ():
        if classic:
            meta, assignment = m.get("member_metadata") or b"", m.get("member_assignment") or b""
        else:
            meta = encode_subscription(list(m.get("subscribed_topic_names") or ()))
            assignment = encode_assignment(m.get("assignment") or [])
        members.append({"member_id": m["member_id"], "group_instance_id": m.get("instance_id"),
                        "client_id": m.get("client_id") or "", "client_host": m.get("client_host") or "",
                        "member_metadata": meta, "member_assignment": assignment})
    return {"error_code": 0, "group_id": g["group_id"], "group_state": _state(g),
            "protocol_type": (g.get("protocol_type") or "") if classic else "consumer",
            "protocol_data": (g.get("protocol_data") or "") if classic else (g.get("assignor_name") or ""),
            "members": members, "authorized_operations": g.get("authorized_operations", OPERATIONS_NOT_ASKED)}


def describe_groups_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"groups": [_described(g) for g in _body(reply).get("groups") or ()]}


def describe_groups_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"groups": [{"error_code": code, "group_id": gid, "group_state": "", "protocol_type": "",
                        "protocol_data": "", "members": []} for gid in request.get("groups") or ()]}


register(Api(ApiKey.DESCRIBE_GROUPS, 0, 5, describe_groups_to_internal, describe_groups_from_internal,
             describe_groups_error))


def delete_groups_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"groups_names": list(request["groups_names"])}, []


def delete_groups_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"results": [{"group_id": r["group_id"], "error_code": r.get("error_code", 0)}
                        for r in _body(reply).get("results") or ()]}


def delete_groups_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"results": [{"group_id": gid, "error_code": code} for gid in request.get("groups_names") or ()]}


register(Api(ApiKey.DELETE_GROUPS, 0, 2, delete_groups_to_internal, delete_groups_from_internal,
             delete_groups_error))


# ---- ConsumerGroupHeartbeat (68), ConsumerGroupDescribe (69): KIP-848 --------------------------------
# Kafka names topics by id here; the coordinator works with names. Internally ids travel as
# the hex of the UUID the broker's Metadata gives (``kafka_topic_id``); the coordinator maps
# them to names and back (``"topic_ids": True`` asks it to).

def kafka_topic_id(stored) -> str:
    """The hex of a topic's Kafka UUID, as Metadata gives it, from the id the broker stores."""
    return _uuid(stored).hex


_NO_TOPIC = uuid.UUID(int=0)


def _topic_uuid(hex_id) -> uuid.UUID:
    try:
        return uuid.UUID(hex=hex_id) if hex_id else uuid.UUID(int=0)
    except (ValueError, TypeError, AttributeError):
        return uuid.UUID(int=0)


def consumer_heartbeat_to_internal(version: int, request: dict) -> tuple[dict, list]:
    owned = request.get("topic_partitions")
    rebalance = request.get("rebalance_timeout", -1)
    return {"group_id": request["group_id"], "member_id": request.get("member_id") or "",
            "member_epoch": request["member_epoch"], "instance_id": request.get("instance_id"),
            "rebalance_timeout_ms": rebalance if rebalance is not None and rebalance > 0 else None,
            "subscribed_topic_names": None if request.get("subscribed_topic_names") is None
            else list(request["subscribed_topic_names"]),
            "subscribed_topic_regex": request.get("subscribed_topic_regex"),
            "server_assignor": request.get("server_assignor"),
            "topic_partitions": None if owned is None else
            # kio reads the all-zero id (no topic) as None
            [{"topic_id": (t["topic_id"] or _NO_TOPIC).hex, "partitions": list(t["partitions"])} for t in owned],
            "topic_ids": True}, []


def consumer_heartbeat_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = _body(reply)
    if body.get("error_code"):
        return {"error_code": body["error_code"], "error_message": body.get("error_message"), "member_epoch": -1}
    return {"error_code": 0, "member_id": body.get("member_id"), "member_epoch": body.get("member_epoch", -1),
            "heartbeat_interval": body.get("heartbeat_interval_ms", 3000),
            "assignment": {"topic_partitions": [{"topic_id": _topic_uuid(a.get("topic_id")),
                                                 "partitions": a["partitions"]}
                                                for a in body.get("assignment") or () if a.get("topic_id")]}}


def consumer_heartbeat_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "error_message": message, "member_epoch": -1}


register(Api(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1, consumer_heartbeat_to_internal,
             consumer_heartbeat_from_internal, consumer_heartbeat_error))


def consumer_describe_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"group_ids": list(request["group_ids"]), "topic_ids": True,
            "include_authorized_operations": bool(request.get("include_authorized_operations"))}, []


def _topic_partitions(entries) -> dict:
    return {"topic_partitions": [{"topic_id": _topic_uuid(e.get("topic_id")), "topic_name": e["topic"],
                                  "partitions": e["partitions"]} for e in entries or ()]}


def consumer_describe_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    out = []
    for g in _body(reply).get("groups") or ():
        if g.get("error_code"):
            out.append({"error_code": g["error_code"], "error_message": g.get("error_message"),
                        "group_id": g.get("group_id"), "authorized_operations": OPERATIONS_NOT_ASKED})
            continue
        out.append({"error_code": 0, "group_id": g["group_id"], "group_state": _state(g),
                    "group_epoch": g.get("group_epoch", 0), "assignment_epoch": g.get("assignment_epoch", 0),
                    "assignor_name": g.get("assignor_name") or "",
                    "authorized_operations": g.get("authorized_operations", OPERATIONS_NOT_ASKED),
                    "members": [{"member_id": m["member_id"], "instance_id": m.get("instance_id"),
                                 "member_epoch": m.get("member_epoch", 0), "client_id": m.get("client_id") or "",
                                 "client_host": m.get("client_host") or "",
                                 "subscribed_topic_names": list(m.get("subscribed_topic_names") or ()),
                                 "subscribed_topic_regex": m.get("subscribed_topic_regex"),
                                 "assignment": _topic_partitions(m.get("assignment")),
                                 "target_assignment": _topic_partitions(m.get("target_assignment")),
                                 "member_type": 1} for m in g.get("members") or ()]})
    return {"groups": out}


def consumer_describe_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"groups": [{"error_code": code, "error_message": message, "group_id": gid,
                        "authorized_operations": OPERATIONS_NOT_ASKED}
                       for gid in request.get("group_ids") or ()]}


register(Api(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1, consumer_describe_to_internal, consumer_describe_from_internal,
             consumer_describe_error))
