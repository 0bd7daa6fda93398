"""Kafka's admin APIs, translated onto the broker's internal ones (registered in ``apis``). Pure.

Each entry turns a Kafka request body (kio's field names) into the internal request a native
client sends for the same job (docs/PROTOCOL.md), and the internal answer back. Mostly the same
key; the exceptions: AlterConfigs (33) becomes INCREMENTAL_ALTER_CONFIGS, deleting every
topic-level key the request leaves out (Kafka's replace-all); DescribeCluster (60) becomes
METADATA for no topics. Families: topics, partitions, records, configs, elections,
reassignments, log dirs, SCRAM credentials, OffsetDelete (versions: docs/KAFKA.md).
Invariant: checks that need no broker state (duplicate names, a null config value, a malformed
assignment, an unknown resource type) are answered here per item, as Kafka does:
``to_internal`` leaves such items out and keeps their errors (``_refused``), which
``from_internal`` merges back in the request's order.
"""
from __future__ import annotations

import uuid

from odradek.core.config import KAFKA_TOPIC_CONFIGS, LogConfig
from odradek.core.kafka.apis import OPERATIONS_NOT_ASKED, Api, register
from odradek.core.protocol import ApiKey, ErrorCode

# Kafka's ConfigResource.Type and ConfigSource numbers.
TOPIC, BROKER = 2, 4
RESOURCE_NAMES = {TOPIC: "topic", BROKER: "broker"}
RESOURCE_TYPES = {v: k for k, v in RESOURCE_NAMES.items()}
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 2, 4, 5
# IncrementalAlterConfigs operations.
OPS = {0: "set", 1: "delete", 2: "append", 3: "subtract"}
# what AlterConfigs may revert: every topic config, Kafka's accepted-but-unimplemented ones too
TOPIC_KEYS = tuple(sorted({*LogConfig.from_properties({}).to_properties(), *KAFKA_TOPIC_CONFIGS}))
SENSITIVE = ("password", "secret", "jaas", "key")


def _refuse(request: dict, key, code: int, message: str) -> None:
    request.setdefault("_refused", {})[key] = (int(code), message)


def _refused(request: dict) -> dict:
    return request.get("_refused") or {}


def _error_entry(code: int, message: str) -> dict:
    return {"error_code": int(code), "error_message": message}


def _duplicates(names: list) -> set:
    seen, twice = set(), set()
    for n in names:
        (twice if n in seen else seen).add(n)
    return twice


# ---- CreateTopics (19) -----------------------------------------------------------------------

def create_topics_to_internal(version: int, request: dict) -> tuple[dict, list]:
    topics = request.get("topics") or []
    twice = _duplicates([t["name"] for t in topics])
    out = []
    for t in topics:
        name = t["name"]
        if name in twice:
            _refuse(request, name, ErrorCode.INVALID_REQUEST, f"topic '{name}' appears more than once in the request")
            continue
        parts, rf = t["num_partitions"], t["replication_factor"]
        assignments = t.get("assignments") or []
        configs = {}
        for c in t.get("configs") or []:
            if c["value"] is None:
                _refuse(request, name, ErrorCode.INVALID_CONFIG,
                        f"config '{c['name']}' of topic '{name}' has a null value")
                break
            configs[c["name"]] = c["value"]
        if name in _refused(request):
            continue
        if assignments:
            problem = _assignment_problem(assignments, parts, rf)
            if problem:
                _refuse(request, name, *problem)
                continue
            parts, rf = len(assignments), len(assignments[0]["broker_ids"])
        entry = {"name": name, "num_partitions": parts, "replication_factor": rf, "configs": configs}
        if assignments:  # the controller checks the brokers (registered); the shape was checked above
            entry["assignments"] = [a["broker_ids"] for a in sorted(assignments, key=lambda a: a["partition_index"])]
        out.append(entry)
    return {"topics": out, "validate_only": bool(request.get("validate_only"))}, []


def _assignment_problem(assignments: list, parts: int, rf: int) -> tuple[int, str] | None:
    if parts != -1 or rf != -1:
        return (ErrorCode.INVALID_REQUEST, "both num_partitions or replication_factor and an explicit "
                                           "assignment were given: give -1 for both with an assignment")
    indexes = sorted(a["partition_index"] for a in assignments)
    if indexes != list(range(len(assignments))):
        return (ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"the assignment's partitions must be 0 to "
                                                      f"{len(assignments) - 1}, each once; got {indexes}")
    sizes = {len(a["broker_ids"]) for a in assignments}
    if len(sizes) != 1 or 0 in sizes:
        return (ErrorCode.INVALID_REPLICA_ASSIGNMENT, "every partition must have the same, non-zero number "
                                                      f"of replicas; got {sorted(sizes)}")
    for a in assignments:
        if len(set(a["broker_ids"])) != len(a["broker_ids"]):
            return (ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"partition {a['partition_index']} names a broker "
                                                          f"twice: {a['broker_ids']}")
    return None


def create_topics_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    answered = {t["name"]: t for t in (reply.body or {}).get("topics") or ()}
    refused = _refused(request)
    out = []
    for t in request.get("topics") or []:
        name = t["name"]
        if name in refused:
            out.append({"name": name, **_error_entry(*refused[name]), "num_partitions": -1, "replication_factor": -1})
            continue
        r = answered.get(name, {"error_code": int(ErrorCode.UNKNOWN_SERVER_ERROR),
                                "error_message": "the controller did not answer for this topic"})
        ok = not r.get("error_code")
        out.append({"name": name, "topic_id": uuid.UUID(int=0), "error_code": r.get("error_code", 0),
                    "error_message": r.get("error_message"),
                    "num_partitions": r.get("num_partitions", -1) if ok else -1,
                    "replication_factor": r.get("replication_factor", -1) if ok else -1, "configs": None})
    return {"topics": out}


def create_topics_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"topics": [{"name": t["name"], **_error_entry(code, message), "num_partitions": -1,
                        "replication_factor": -1} for t in request.get("topics") or []]}


register(Api(ApiKey.CREATE_TOPICS, 0, 7, create_topics_to_internal, create_topics_from_internal,
             create_topics_error))


# ---- DeleteTopics (20) -----------------------------------------------------------------------

def _delete_names(request: dict) -> list:
    if request.get("topic_names") is not None:  # v0-5
        return list(request["topic_names"])
    return [t.get("name") for t in request.get("topics") or []]  # v6: by name or by id


def delete_topics_to_internal(version: int, request: dict) -> tuple[dict, list]:
    names = _delete_names(request)
    for i, name in enumerate(names):
        if name is None:
            _refuse(request, i, ErrorCode.UNKNOWN_TOPIC_ID, "topics are deleted by name here (topic ids are "
                                                            "not served); give the topic's name")
    return {"topics": [n for n in dict.fromkeys(names) if n is not None]}, []


def delete_topics_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    answered = {t["name"]: t for t in (reply.body or {}).get("topics") or ()}
    refused = _refused(request)
    out = []
    for i, name in enumerate(_delete_names(request)):
        if i in refused:
            topic_id = (request.get("topics") or [{}])[i].get("topic_id") if request.get("topics") else None
            out.append({"name": None, "topic_id": topic_id or uuid.UUID(int=0), **_error_entry(*refused[i])})
            continue
        r = answered.get(name, {"error_code": int(ErrorCode.UNKNOWN_SERVER_ERROR),
                                "error_message": "the controller did not answer for this topic"})
        out.append({"name": name, "topic_id": uuid.UUID(int=0), "error_code": r.get("error_code", 0),
                    "error_message": r.get("error_message")})
    return {"responses": out}


def delete_topics_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"responses": [{"name": n, "topic_id": uuid.UUID(int=0), **_error_entry(code, message)}
                          for n in _delete_names(request)]}


register(Api(ApiKey.DELETE_TOPICS, 0, 6, delete_topics_to_internal, delete_topics_from_internal,
             delete_topics_error))


# ---- DeleteRecords (21) ----------------------------------------------------------------------

def delete_records_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"topics": [{"name": t["name"], "partitions": [{"index": p["partition_index"], "offset": p["offset"]}
                                                          for p in t["partitions"]]}
                       for t in request.get("topics") or []]}, []


def delete_records_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [
        {"partition_index": p["index"], "low_watermark": p.get("low_watermark", -1),
         "error_code": p.get("error_code", 0)} for p in t["partitions"]]}
        for t in (reply.body or {}).get("topics") or ()]}


def delete_records_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [
        {"partition_index": p["partition_index"], "low_watermark": -1, "error_code": code} for p in t["partitions"]]}
        for t in request.get("topics") or []]}


register(Api(ApiKey.DELETE_RECORDS, 0, 2, delete_records_to_internal, delete_records_from_internal,
             delete_records_error))


# ---- DescribeConfigs (32) --------------------------------------------------------------------

def describe_configs_to_internal(version: int, request: dict) -> tuple[dict, list]:
    out = []
    for i, r in enumerate(request.get("resources") or []):
        kind = RESOURCE_NAMES.get(r["resource_type"])
        if kind is None:
            _refuse(request, i, ErrorCode.INVALID_REQUEST, f"resource type {r['resource_type']} is not served "
                                                           f"(topic = 2, broker = 4)")
            continue
        keys = r.get("configuration_keys")
        out.append({"type": kind, "name": r["resource_name"], "configs": list(keys) if keys else None})
    return {"resources": out}, []


def describe_configs_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    answered = {(r.get("type"), r.get("name")): r for r in (reply.body or {}).get("resources") or ()}
    refused, synonyms = _refused(request), bool(request.get("include_synonyms"))
    out = []
    for i, r in enumerate(request.get("resources") or []):
        head = {"resource_type": r["resource_type"], "resource_name": r["resource_name"]}
        if i in refused:
            out.append({**head, **_error_entry(*refused[i]), "configs": []})
            continue
        kind = RESOURCE_NAMES[r["resource_type"]]
        got = answered.get((kind, r["resource_name"])) or (answered.get((kind, str(r["resource_name"]))) or {})
        if not got and kind == "broker":  # the handler names itself by its id
            got = next((v for (k, _), v in answered.items() if k == "broker"), {})
        if not got:
            out.append({**head, **_error_entry(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for this resource"),
                        "configs": []})
            continue
        asked = r.get("configuration_keys")  # null: every key; an empty list: none (Kafka's rule)
        configs = [_config_entry(kind, c, version, synonyms) for c in got.get("configs") or ()
                   if asked is None or c["name"] in asked]
        out.append({**head, "error_code": got.get("error_code", 0), "error_message": got.get("error_message") or None,
                    "configs": configs})
    return {"results": out}


def _config_entry(kind: str, c: dict, version: int, synonyms: bool) -> dict:
    name, value = c["name"], c.get("value")
    sensitive = any(s in name for s in SENSITIVE) and "key.serializer" not in name
    if kind == "topic":
        source = DYNAMIC_TOPIC_CONFIG if c.get("source") == "topic" else DEFAULT_CONFIG
        read_only = bool(c.get("read_only"))
    else:
        # set at run time, not set at all (a config Kafka changes at run time), or set at start
        source = {"broker": DYNAMIC_BROKER_CONFIG, "default": DEFAULT_CONFIG}.get(c.get("source"), STATIC_BROKER_CONFIG)
        read_only = not c.get("dynamic")
    entry = {"name": name, "value": None if sensitive else value, "read_only": read_only,
             "is_default": source == DEFAULT_CONFIG, "config_source": source, "is_sensitive": sensitive,
             "synonyms": [], "config_type": 0, "documentation": None}
    if synonyms:
        entry["synonyms"] = [{"name": name, "value": entry["value"], "source": source}]
    return entry


def describe_configs_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"results": [{"resource_type": r["resource_type"], "resource_name": r["resource_name"],
                         **_error_entry(code, message), "configs": []} for r in request.get("resources") or []]}


register(Api(ApiKey.DESCRIBE_CONFIGS, 0, 4, describe_configs_to_internal, describe_configs_from_internal,
             describe_configs_error))


# ---- AlterConfigs (33) and IncrementalAlterConfigs (44) ------------------------------------------

def _alter_to_internal(request: dict, changes) -> tuple[dict, list]:
    """``changes(resource, kind) -> [{name, value, op}]`` or raises ValueError(message) for an
    INVALID_CONFIG of that resource."""
    out = []
    for i, r in enumerate(request.get("resources") or []):
        kind = RESOURCE_NAMES.get(r["resource_type"])
        if kind is None:
            _refuse(request, i, ErrorCode.INVALID_REQUEST, f"resource type {r['resource_type']} cannot be altered "
                                                           f"here (topic = 2, broker = 4)")
            continue
        try:
            configs = changes(r, kind)
        except ValueError as exc:
            _refuse(request, i, ErrorCode.INVALID_CONFIG, str(exc))
            continue
        out.append({"type": kind, "name": r["resource_name"], "configs": configs})
    return {"resources": out, "validate_only": bool(request.get("validate_only"))}, []


def alter_configs_to_internal(version: int, request: dict) -> tuple[dict, list]:
    def changes(r: dict, kind: str) -> list:
        given = {c["name"]: c["value"] for c in r.get("configs") or []}
        ops = [{"name": k, "value": v, "op": "set" if v is not None else "delete"} for k, v in given.items()]
        if kind == "topic":  # replace-all: what the request leaves out goes back to its default
            ops += [{"name": k, "value": None, "op": "delete"} for k in TOPIC_KEYS if k not in given]
        return ops
    return _alter_to_internal(request, changes)


def incremental_alter_to_internal(version: int, request: dict) -> tuple[dict, list]:
    def changes(r: dict, kind: str) -> list:
        ops = []
        for c in r.get("configs") or []:
            op = OPS.get(c["config_operation"])
            if op is None:
                raise ValueError(f"config operation {c['config_operation']} of '{c['name']}' is not one of "
                                 f"0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT")
            if op in ("append", "subtract") and kind != "topic":
                raise ValueError(f"{op.upper()} applies to list configs; broker config '{c['name']}' is not one")
            if op != "delete" and c.get("value") is None:
                raise ValueError(f"config '{c['name']}' needs a value for {op.upper()}")
            ops.append({"name": c["name"], "value": c.get("value"), "op": op})
        return ops
    return _alter_to_internal(request, changes)


def alter_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    answered = {(r.get("type"), r.get("name")): r for r in (reply.body or {}).get("resources") or ()}
    refused = _refused(request)
    out = []
    for i, r in enumerate(request.get("resources") or []):
        head = {"resource_type": r["resource_type"], "resource_name": r["resource_name"]}
        if i in refused:
            out.append({**head, **_error_entry(*refused[i])})
            continue
        kind = RESOURCE_NAMES[r["resource_type"]]
        got = answered.get((kind, r["resource_name"]))
        if got is None and kind == "broker":
            got = next((v for (k, _), v in answered.items() if k == "broker"), None)
        got = got or {"error_code": int(ErrorCode.UNKNOWN_SERVER_ERROR), "error_message": "no answer for it"}
        out.append({**head, "error_code": got.get("error_code", 0), "error_message": got.get("error_message") or None})
    return {"responses": out}


def alter_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"responses": [{"resource_type": r["resource_type"], "resource_name": r["resource_name"],
                           **_error_entry(code, message)} for r in request.get("resources") or []]}


register(Api(ApiKey.ALTER_CONFIGS, 0, 2, alter_configs_to_internal, alter_from_internal, alter_error,
             internal=ApiKey.INCREMENTAL_ALTER_CONFIGS))
register(Api(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, incremental_alter_to_internal, alter_from_internal,
             alter_error))


# ---- CreatePartitions (37) -------------------------------------------------------------------

def create_partitions_to_internal(version: int, request: dict) -> tuple[dict, list]:
    topics = request.get("topics") or []
    twice = _duplicates([t["name"] for t in topics])
    out = []
    for t in topics:
        if t["name"] in twice:
            _refuse(request, t["name"], ErrorCode.INVALID_REQUEST,
                    f"topic '{t['name']}' appears more than once in the request")
            continue
        assignments = t.get("assignments")
        out.append({"name": t["name"], "count": t["count"],
                    "assignments": None if assignments is None else [{"broker_ids": list(a["broker_ids"])}
                                                                     for a in assignments]})
    return {"topics": out, "timeout_ms": request.get("timeout", 30000),
            "validate_only": bool(request.get("validate_only"))}, []


def create_partitions_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    answered = {r["name"]: r for r in (reply.body or {}).get("results") or ()}
    refused = _refused(request)
    out = []
    for t in request.get("topics") or []:
        r = refused.get(t["name"])
        if r is not None:
            out.append({"name": t["name"], **_error_entry(*r)})
            continue
        got = answered.get(t["name"], {"error_code": int(ErrorCode.UNKNOWN_SERVER_ERROR),
                                       "error_message": "the controller did not answer for this topic"})
        out.append({"name": t["name"], "error_code": got.get("error_code", 0),
                    "error_message": got.get("error_message") or None})
    return {"results": out}


def create_partitions_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"results": [{"name": t["name"], **_error_entry(code, message)} for t in request.get("topics") or []]}


register(Api(ApiKey.CREATE_PARTITIONS, 0, 3, create_partitions_to_internal, create_partitions_from_internal,
             create_partitions_error))


# ---- ElectLeaders (43) -----------------------------------------------------------------------

def elect_to_internal(version: int, request: dict) -> tuple[dict, list]:
    tps = request.get("topic_partitions")
    return {"election_type": request.get("election_type", 0),
            "topic_partitions": None if tps is None else [{"topic": t["topic"], "partitions": list(t["partitions"])}
                                                          for t in tps]}, []


def elect_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    per_topic: dict[str, list] = {}
    for p in body.get("partitions") or ():
        per_topic.setdefault(p["topic"], []).append({"partition_id": p["partition"],
                                                     "error_code": p.get("error_code", 0),
                                                     "error_message": p.get("error_message") or None})
    return {"error_code": body.get("error_code", 0), "replica_election_results": [
        {"topic": t, "partition_result": ps} for t, ps in per_topic.items()]}


def elect_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "replica_election_results": [
        {"topic": t["topic"], "partition_result": [{"partition_id": p, **_error_entry(code, message)}
                                                   for p in t["partitions"]]}
        for t in request.get("topic_partitions") or []]}


register(Api(ApiKey.ELECT_LEADERS, 0, 2, elect_to_internal, elect_from_internal, elect_error))


# ---- AlterPartitionReassignments (45), ListPartitionReassignments (46) ---------------------------

def alter_reassignments_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"timeout_ms": request.get("timeout", 60000), "topics": [
        {"name": t["name"], "partitions": [{"partition_index": p["partition_index"],
                                            "replicas": None if p["replicas"] is None else list(p["replicas"])}
                                           for p in t["partitions"]]} for t in request.get("topics") or []]}, []


def alter_reassignments_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"error_code": body.get("error_code", 0), "error_message": body.get("error_message") or None,
            "responses": [{"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": p.get("error_code", 0),
                 "error_message": p.get("error_message") or None} for p in t.get("partitions") or ()]}
                for t in body.get("responses") or ()]}


def alter_reassignments_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "error_message": message, "responses": [
        {"name": t["name"], "partitions": [{"partition_index": p["partition_index"], **_error_entry(code, message)}
                                           for p in t["partitions"]]} for t in request.get("topics") or []]}


def list_reassignments_to_internal(version: int, request: dict) -> tuple[dict, list]:
    topics = request.get("topics")
    return {"topics": None if topics is None else [
        {"name": t["name"], "partition_indexes": list(t["partition_indexes"])} for t in topics]}, []


def list_reassignments_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"error_code": body.get("error_code", 0), "error_message": body.get("error_message") or None,
            "topics": [{"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "replicas": p.get("replicas") or [],
                 "adding_replicas": p.get("adding_replicas") or [],
                 "removing_replicas": p.get("removing_replicas") or []}
                for p in t.get("partitions") or ()]} for t in body.get("topics") or ()]}


register(Api(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 0, alter_reassignments_to_internal,
             alter_reassignments_from_internal, alter_reassignments_error))
register(Api(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0, list_reassignments_to_internal,
             list_reassignments_from_internal))


# ---- DescribeCluster (60): the brokers of an internal Metadata for no topics -----------------------

def describe_cluster_to_internal(version: int, request: dict) -> tuple[dict, list]:
    asked = {"include_cluster_authorized_operations": True} if request.get("include_cluster_authorized_operations") \
        else {}
    return {"topics": [], "allow_auto_topic_creation": False, **asked}, []


def describe_cluster_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    brokers = [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b.get("rack")}
               for b in body.get("brokers") or ()]
    return {"error_code": 0, "endpoint_type": request.get("endpoint_type", 1), "cluster_id": body.get("cluster_id"),
            "controller_id": body.get("controller_id", -1), "brokers": brokers,
            "cluster_authorized_operations": body.get("cluster_authorized_operations", OPERATIONS_NOT_ASKED)}


def describe_cluster_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "error_message": message, "cluster_id": "", "controller_id": -1,
            "cluster_authorized_operations": OPERATIONS_NOT_ASKED}


register(Api(ApiKey.DESCRIBE_CLUSTER, 0, 1, describe_cluster_to_internal, describe_cluster_from_internal,
             describe_cluster_error, internal=ApiKey.METADATA))


# ---- DescribeLogDirs (35): the log actors' partitions and sizes (KIP-113) ------------------------

def describe_log_dirs_to_internal(version: int, request: dict) -> tuple[dict, list]:
    topics = request.get("topics")  # null: every partition (an empty list: none, as Kafka)
    return {"topics": None if topics is None else [{"topic": t["topic"], "partitions": list(t["partitions"])}
                                                   for t in topics]}, []


def describe_log_dirs_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"error_code": body.get("error_code", 0), "results": body.get("results") or []}


def describe_log_dirs_error(version: int, request: dict, code: int, message: str) -> dict:
    # v3+ carries the code at the top; before, Kafka answers an empty list (no directory is told)
    return {"error_code": code, "results": []}


register(Api(ApiKey.DESCRIBE_LOG_DIRS, 1, 4, describe_log_dirs_to_internal, describe_log_dirs_from_internal,
             describe_log_dirs_error))


# ---- DescribeUserScramCredentials (50), AlterUserScramCredentials (51) (KIP-554) -------------------

SCRAM_MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism types
SCRAM_TYPES = {v: k for k, v in SCRAM_MECHANISMS.items()}


def describe_scram_to_internal(version: int, request: dict) -> tuple[dict, list]:
    users = request.get("users")
    return {"users": None if users is None else [u["name"] for u in users]}, []


def describe_scram_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"error_code": body.get("error_code", 0), "error_message": body.get("error_message"), "results": [
        {"user": r["user"], "error_code": r.get("error_code", 0), "error_message": r.get("error_message"),
         "credential_infos": [{"mechanism": SCRAM_TYPES.get(c["mechanism"], 0), "iterations": c["iterations"]}
                              for c in r.get("credential_infos") or ()]}
        for r in body.get("results") or ()]}


def describe_scram_error(version: int, request: dict, code: int, message: str) -> dict:
    # Kafka's getErrorResponse: the code at the top, no user. (librdkafka 2.x frees a pointer it
    # never allocated on this path, as against Kafka: confluent-kafka aborts; kafka-python is fine)
    return {"error_code": code, "error_message": message, "results": []}


def _mechanism(number: int):
    return SCRAM_MECHANISMS.get(number, number)  # an unknown number is refused by the handler, named


def alter_scram_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"deletions": [{"name": d["name"], "mechanism": _mechanism(d["mechanism"])}
                          for d in request.get("deletions") or ()],
            "upsertions": [{"name": u["name"], "mechanism": _mechanism(u["mechanism"]), "iterations": u["iterations"],
                            "salt": bytes(u["salt"]), "salted_password": bytes(u["salted_password"])}
                           for u in request.get("upsertions") or ()]}, []


def alter_scram_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"results": [{"user": r["user"], "error_code": r.get("error_code", 0),
                         "error_message": r.get("error_message")}
                        for r in (reply.body or {}).get("results") or ()]}


def alter_scram_error(version: int, request: dict, code: int, message: str) -> dict:
    users = [c["name"] for c in (request.get("deletions") or []) + (request.get("upsertions") or [])]
    return {"results": [{"user": u, **_error_entry(code, message)} for u in dict.fromkeys(users)]}


register(Api(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0, describe_scram_to_internal, describe_scram_from_internal,
             describe_scram_error))
register(Api(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, alter_scram_to_internal, alter_scram_from_internal,
             alter_scram_error))


# ---- OffsetDelete (47): a group's committed offsets, at its coordinator (KIP-496) ------------------

def offset_delete_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"group_id": request["group_id"], "topics": [
        {"name": t["name"], "partitions": [{"partition_index": p["partition_index"]} for p in t["partitions"]]}
        for t in request.get("topics") or ()]}, []


def offset_delete_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"error_code": body.get("error_code", 0), "topics": body.get("topics") or []}


def offset_delete_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "topics": []}


register(Api(ApiKey.OFFSET_DELETE, 0, 0, offset_delete_to_internal, offset_delete_from_internal,
             offset_delete_error))

