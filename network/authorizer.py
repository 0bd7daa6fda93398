"""ACLs and the authorization decision, as Kafka's AclAuthorizer makes it. Pure, no I/O (the ACLs
come from network/secstore.py; the handlers call ``Authorizer.authorize``).

An ACL: principal (``User:alice``, ``User:*``), host, resource type (Topic, Group, Cluster,
TransactionalId), pattern type (LITERAL, or PREFIXED), resource name, operation, permission
(Allow, Deny). Kafka's rules: super users may do everything; a matching Deny wins over any
Allow; ``All`` matches every operation; Read, Write, Delete and Alter imply Describe, and
AlterConfigs implies DescribeConfigs; a resource no ACL matches is allowed only with
``allow.everyone.if.no.acl.found``. Decisions are cached until the ACLs change.
``requirements(api, body, transactional)`` is Kafka's per-API operation table over the internal
request shapes: the (operation, resource type, name) each request needs. Invariant:
``transactional`` is what the broker read in a Produce's batches, never what the client says.
"""
from __future__ import annotations

import collections
from typing import Iterable, NamedTuple

from odradek.core.kafka_batch import HEADER_SIZE, LENGTH_AND_ATTRIBUTES, LOG_OVERHEAD, TRANSACTIONAL_BIT
from odradek.core.protocol import ApiKey, ErrorCode

# Kafka's wire codes (AclOperation, ResourceType, PatternType, AclPermissionType).
OPERATIONS = {"Any": 1, "All": 2, "Read": 3, "Write": 4, "Create": 5, "Delete": 6, "Alter": 7, "Describe": 8,
              "ClusterAction": 9, "DescribeConfigs": 10, "AlterConfigs": 11, "IdempotentWrite": 12}
RESOURCES = {"Any": 1, "Topic": 2, "Group": 3, "Cluster": 4, "TransactionalId": 5}
PATTERNS = {"Any": 1, "Match": 2, "Literal": 3, "Prefixed": 4}
PERMISSIONS = {"Any": 1, "Deny": 2, "Allow": 3}
CLUSTER = "kafka-cluster"
WILDCARD = "*"
IMPLIES = {"Describe": ("Read", "Write", "Delete", "Alter"), "DescribeConfigs": ("AlterConfigs",)}
DENIED = {"Topic": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Group": ErrorCode.GROUP_AUTHORIZATION_FAILED,
          "Cluster": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
          "TransactionalId": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}


def _canon(table: dict, value, what: str) -> str:
    """A name of ``table`` from its name in any case (``read``, ``READ``, ``Read``), or its code."""
    if isinstance(value, int) and not isinstance(value, bool):
        for name, code in table.items():
            if code == value:
                return name
    elif isinstance(value, str):
        key = value.replace("_", "").lower()
        for name in table:
            if name.lower() == key:
                return name
    raise ValueError(f"{what} {value!r} is not one of {', '.join(table)}")


class Acl(NamedTuple):
    principal: str
    host: str
    resource: str  # Topic, Group, Cluster, TransactionalId
    pattern: str  # Literal, Prefixed
    name: str
    operation: str
    permission: str  # Allow, Deny

    @classmethod
    def make(cls, principal: str, resource, name: str, operation, permission="Allow", pattern="Literal",
             host: str = "*") -> "Acl":
        if not isinstance(principal, str) or ":" not in principal:
            raise ValueError(f"principal {principal!r} must be of the form User:<name> (or User:*)")
        acl = cls(principal, host or "*", _canon(RESOURCES, resource, "resource type"),
                  _canon(PATTERNS, pattern, "pattern type"), str(name), _canon(OPERATIONS, operation, "operation"),
                  _canon(PERMISSIONS, permission, "permission"))
        if acl.resource == "Any" or acl.operation == "Any" or acl.permission == "Any" or \
                acl.pattern not in ("Literal", "Prefixed"):
            raise ValueError("an ACL names one resource type, operation, permission and a LITERAL or PREFIXED pattern")
        if not acl.name:
            raise ValueError("an ACL needs a resource name ('*' for every one)")
        if acl.resource == "Cluster" and acl.name != CLUSTER:
            raise ValueError(f"the cluster resource is named {CLUSTER!r}")
        return acl

    def as_list(self) -> list:
        return list(self)


class Filter(NamedTuple):
    """DescribeAcls / DeleteAcls: None (or "Any") matches anything; pattern "Match" matches the
    ACLs that would apply to the named resource (literal, wildcard and prefixes)."""
    principal: str | None = None
    host: str | None = None
    resource: str | None = None
    pattern: str | None = None
    name: str | None = None
    operation: str | None = None
    permission: str | None = None

    def matches(self, acl: Acl) -> bool:
        if self.principal not in (None, acl.principal) or self.host not in (None, acl.host):
            return False
        if self.resource not in (None, "Any", acl.resource) or self.operation not in (None, "Any", acl.operation):
            return False
        if self.permission not in (None, "Any", acl.permission):
            return False
        if self.pattern in (None, "Any"):
            return self.name is None or self.name == acl.name
        if self.pattern == "Match":
            return self.name is None or _applies(acl, self.name)
        return self.pattern == acl.pattern and (self.name is None or self.name == acl.name)


def _applies(acl: Acl, name: str) -> bool:
    if acl.pattern == "Prefixed":
        return name.startswith(acl.name)
    return acl.name in (name, WILDCARD)


class Authorizer:
    def __init__(self, acls: Iterable[Acl] = (), super_users: Iterable[str] = (), allow_if_no_acl: bool = False):
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._literal: dict[str, dict[str, list[Acl]]] = collections.defaultdict(lambda: collections.defaultdict(list))
        self._prefixed: dict[str, dict[str, list[Acl]]] = collections.defaultdict(lambda: collections.defaultdict(list))
        self._lengths: dict[str, set[int]] = collections.defaultdict(set)
        self._cache: dict[tuple, bool] = {}
        self.count = 0
        for acl in acls:
            if acl.pattern == "Prefixed":
                self._prefixed[acl.resource][acl.name].append(acl)
                self._lengths[acl.resource].add(len(acl.name))
            else:
                self._literal[acl.resource][acl.name].append(acl)
            self.count += 1

    def matching(self, resource: str, name: str) -> list[Acl]:
        """Every ACL that applies to the resource (any principal, operation)."""
        out = list(self._literal[resource].get(name, ()))
        if name != WILDCARD:
            out.extend(self._literal[resource].get(WILDCARD, ()))
        prefixed = self._prefixed.get(resource)
        if prefixed:
            for n in self._lengths[resource]:
                if n <= len(name):
                    out.extend(prefixed.get(name[:n], ()))
        return out

    def authorize(self, principal: str, host: str, operation: str, resource: str, name: str) -> bool:
        if principal in self.super_users:
            return True
        key = (principal, host, operation, resource, name)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(principal, host, operation, resource, name)
            if len(self._cache) > 100000:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def authorize_any(self, principal: str, host: str, operation: str, resource: str) -> bool:
        """Kafka's authorizeByResourceType: may the principal do ``operation`` on at least one
        resource of the type? Some Allow of it (literal or prefixed) that no Deny of the
        principal covers: a Deny on the literal ``*``, on that name, or on a prefix of it."""
        if principal in self.super_users:
            return True
        literal, prefixed = self._literal.get(resource) or {}, self._prefixed.get(resource) or {}
        if not literal and not prefixed:
            return self.allow_if_no_acl

        def mine(acls, permission):
            return any(a.permission == permission and a.principal in (principal, "User:*") and a.host in ("*", host)
                       and a.operation in (operation, "All") for a in acls)
        denied_prefixes = [n for n, acls in prefixed.items() if mine(acls, "Deny")]
        if mine(literal.get(WILDCARD, ()), "Deny"):
            return False
        for name, acls in literal.items():
            if mine(acls, "Allow") and not mine(acls, "Deny") and not any(name.startswith(d) for d in denied_prefixes):
                return True
        return any(mine(acls, "Allow") and not any(name.startswith(d) for d in denied_prefixes)
                   for name, acls in prefixed.items())

    def _decide(self, principal: str, host: str, operation: str, resource: str, name: str) -> bool:
        acls = self.matching(resource, name)
        if not acls:
            return self.allow_if_no_acl
        mine = [a for a in acls if a.principal in (principal, "User:*") and a.host in ("*", host)]
        if any(a.permission == "Deny" and a.operation in (operation, "All") for a in mine):
            return False
        allowed_ops = (operation, "All", *IMPLIES.get(operation, ()))
        return any(a.permission == "Allow" and a.operation in allowed_ops for a in mine)


# ---- Kafka's per-API operation table, over the internal request bodies ---------------------------------

def _names(body: dict, key: str = "topics", field: str = "name") -> list[str]:
    items = body.get(key) or []
    return [t.get(field) if isinstance(t, dict) else t for t in items if isinstance(t, (dict, str))]


def _configs(body: dict, op: str) -> list[tuple]:
    out = []
    for r in body.get("resources") or []:
        if isinstance(r, dict):
            out.append((op, "Topic", str(r.get("name"))) if r.get("type") == "topic" else (op, "Cluster", CLUSTER))
    return out


def offset_fetch_groups(body: dict) -> list[dict]:
    """An OffsetFetch body's groups, request or answer: its ``groups`` (Kafka v8+), else itself.
    A group's ``topics`` None asks for all its topics (the handler keeps those one may Describe)."""
    groups = body.get("groups")
    return [g for g in groups if isinstance(g, dict)] if isinstance(groups, list) else [body]


def claims_replica(body: dict) -> bool:
    """A Fetch or OffsetForLeaderEpoch sent as a follower: any ``replica_id`` but absent or -1
    (a consumer's) is a broker's claim, which only a proven broker may make."""
    return body.get("replica_id", -1) not in (None, -1)


IDEMPOTENT = ("IdempotentWrite", "Cluster", CLUSTER)  # or Write on any topic (KIP-679)
INTER_BROKER = (ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA, ApiKey.UPDATE_METADATA, ApiKey.CONTROLLED_SHUTDOWN,
                ApiKey.WRITE_TXN_MARKERS)
# The requests only a broker sends, and the field of each that names the sending broker. Kafka
# guards them with ClusterAction on the cluster; Odradek also when the authorizer is off: the
# connection must have proved it is that broker (BROKER_PROOF, docs/SECURITY.md).
BROKER_CLAIMS = {ApiKey.LEADER_AND_ISR: "controller_id", ApiKey.STOP_REPLICA: "controller_id",
                 ApiKey.UPDATE_METADATA: "controller_id", ApiKey.CONTROLLED_SHUTDOWN: "broker_id",
                 ApiKey.WRITE_TXN_MARKERS: "broker_id", ApiKey.FETCH: "replica_id",
                 ApiKey.OFFSET_FOR_LEADER_EPOCH: "replica_id"}


def broker_claim(api: int, body: dict) -> str | None:
    """The field naming the broker that sends this request if only a broker may send it, else
    None: a Fetch or OffsetForLeaderEpoch as a consumer (``claims_replica`` false), and
    WRITE_TXN_MARKERS with ``broker_id`` -1 (an operator's abort markers: ClusterAction
    with the authorizer on, as Kafka's admin abort) are any client's."""
    field = BROKER_CLAIMS.get(api)
    if field == "replica_id" and not claims_replica(body):
        return None
    if api == ApiKey.WRITE_TXN_MARKERS and body.get("broker_id") == -1:
        return None
    return field


def has_transactional_batch(frames) -> bool:
    """Whether any batch of a Produce's record frames has the transactional bit (Kafka's
    RequestUtils.hasTransactionalRecords reads each partition's first batch; here every batch
    of a frame is read, as the native protocol carries several per partition). Two header
    fields per batch; a frame that does not frame as batches is left to the produce path's
    validation (it is refused there)."""
    for frame in frames:
        pos, end = 0, len(frame)
        while end - pos >= HEADER_SIZE:
            length, attributes = LENGTH_AND_ATTRIBUTES.unpack_from(frame, pos)
            if attributes & TRANSACTIONAL_BIT:
                return True
            if length < HEADER_SIZE - LOG_OVERHEAD:
                break
            pos += LOG_OVERHEAD + length
    return False


FREE = (ApiKey.API_VERSIONS, ApiKey.PING, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
        ApiKey.METADATA,  # Metadata filters its answer instead
        ApiKey.DESCRIBE_CLUSTER)  # Kafka's too: the brokers and the controller, to anyone signed in


def requirements(api: int, body: dict, transactional: bool = False) -> list[tuple[str, str, str]]:
    """(operation, resource type, name) triples the request needs; an API this table does not
    know needs Alter on the cluster (closed by default). A Produce holding transactional
    batches (``transactional``) needs Write on its ``transactional_id`` first (Kafka's
    handleProduceRequest: the whole request fails, before any topic is looked at)."""
    if api in FREE:
        return []
    if api == ApiKey.PRODUCE:
        topics = [("Write", "Topic", n) for n in _names(body)]
        return [("Write", "TransactionalId", str(body.get("transactional_id")))] + topics if transactional else topics
    if api == ApiKey.FETCH:
        return [("ClusterAction", "Cluster", CLUSTER)] if claims_replica(body) else \
            [("Read", "Topic", n) for n in _names(body)]
    if api == ApiKey.OFFSET_FOR_LEADER_EPOCH:
        return [("ClusterAction", "Cluster", CLUSTER)] if claims_replica(body) else \
            [("Describe", "Topic", n) for n in _names(body)]
    if api == ApiKey.LIST_OFFSETS:
        return [("Describe", "Topic", n) for n in _names(body)]
    if api == ApiKey.CREATE_TOPICS:
        return [("Create", "Topic", n) for n in _names(body)]
    if api in (ApiKey.DELETE_TOPICS, ApiKey.DELETE_RECORDS):
        return [("Delete", "Topic", n) for n in _names(body)]
    if api == ApiKey.CREATE_PARTITIONS:
        return [("Alter", "Topic", n) for n in _names(body)]
    if api == ApiKey.DESCRIBE_CONFIGS:
        return _configs(body, "DescribeConfigs")
    if api in (ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.ALTER_CONFIGS):
        return _configs(body, "AlterConfigs")
    if api == ApiKey.OFFSET_COMMIT:
        return [("Read", "Group", str(body.get("group_id")))] + [("Read", "Topic", n) for n in _names(body)]
    if api == ApiKey.OFFSET_FETCH:  # v8+ (librdkafka 2.x, Kafka 3 clients) asks for several groups at once
        return [need for g in offset_fetch_groups(body) for need in [("Describe", "Group", str(g.get("group_id")))] +
                [("Describe", "Topic", n) for n in _names(g)]]
    if api in (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.LEAVE_GROUP) or api in (11, 12, 14):  # Join, Heartbeat, Sync
        return [("Read", "Group", str(body.get("group_id")))]
    if api == ApiKey.FIND_COORDINATOR:
        kind = "TransactionalId" if body.get("key_type") == 1 else "Group"
        return [("Describe", kind, str(k)) for k in body.get("keys") or [body.get("key")]]
    if api == ApiKey.INIT_PRODUCER_ID:
        # an idempotent producer: IdempotentWrite on the cluster, or (Kafka 3, KIP-679) Write on
        # some topic, which the guard asks ``Authorizer.authorize_any`` when this is refused
        txn = body.get("transactional_id")
        return [("Write", "TransactionalId", str(txn))] if txn is not None else [IDEMPOTENT]
    if api in (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT):
        need = [("Write", "TransactionalId", str(body.get("transactional_id")))]
        if api == ApiKey.ADD_PARTITIONS_TO_TXN:
            need += [("Write", "Topic", n) for n in _names(body)]
        if api in (ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.TXN_OFFSET_COMMIT):
            need.append(("Read", "Group", str(body.get("group_id"))))
        if api == ApiKey.TXN_OFFSET_COMMIT:
            need += [("Read", "Topic", n) for n in _names(body)]
        return need
    if api == ApiKey.DESCRIBE_TRANSACTIONS:
        return [("Describe", "TransactionalId", str(t)) for t in body.get("transactional_ids") or []]
    if api == ApiKey.LIST_TRANSACTIONS:  # Kafka filters the list by Describe instead; here all or nothing
        return [("Describe", "Cluster", CLUSTER)]
    if api == ApiKey.DESCRIBE_PRODUCERS:
        return [("Read", "Topic", n) for n in _names(body)]
    if api in (ApiKey.DESCRIBE_GROUPS, ApiKey.CONSUMER_GROUP_DESCRIBE):
        return [("Describe", "Group", str(g)) for g in body.get("group_ids") or []]
    if api == ApiKey.OFFSET_DELETE:  # Kafka's: Delete on the group, Read on each topic
        return [("Delete", "Group", str(body.get("group_id")))] + [("Read", "Topic", n) for n in _names(body)]
    if api == ApiKey.DELETE_GROUPS:
        return [("Delete", "Group", str(g)) for g in body.get("groups_names") or []]
    if api == ApiKey.LIST_GROUPS:  # Kafka's: filtered, not refused (the handler keeps the groups one may Describe)
        return []
    if api in (ApiKey.DESCRIBE_ACLS, ApiKey.LIST_PARTITION_REASSIGNMENTS, ApiKey.DESCRIBE_LOG_DIRS,
               ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS):
        return [("Describe", "Cluster", CLUSTER)]
    if api in INTER_BROKER:
        return [("ClusterAction", "Cluster", CLUSTER)]
    return [("Alter", "Cluster", CLUSTER)]  # CreateAcls, DeleteAcls, ElectLeaders, reassignments, unknown APIs
