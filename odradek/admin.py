"""Admin: topics, configs, log directories, ACLs and SCRAM users, one blocking request per
call (like kafka-python's admin client).

Runs in the caller's thread; starts no thread. Thread-safe: every request goes through the
``Cluster``'s lock and private connections.

Routing (as Kafka's admin client): CreateTopics, DeleteTopics and topic config changes go to
the controller (``controller_id`` of the metadata), followed through NOT_CONTROLLER and
lost connections (metadata refreshed, ``retry_backoff_ms`` between tries, until
``request_timeout_ms``); DeleteRecords and ListOffsets go to each partition's leader,
retried on leader errors; a broker's own configs go to that broker; the rest to any broker.

    with Admin("127.0.0.1:9092") as admin:
        admin.create_topic("orders", partitions=3, config={"retention.ms": "86400000"})
        print(admin.describe_topic("orders"))

Failures raise the ``odradek.errors`` class for the broker's code (``TopicAlreadyExistsError``,
``UnknownTopicOrPartitionError``, ``InvalidTopicError``, ...) with the broker's message,
prefixed by what was being done.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Callable, Iterable

from odradek.core import sasl
from odradek.network.clientauth import ClientSecurity
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.cluster import NETWORK_ERRORS, STALE_METADATA, Cluster
from odradek.errors import check, error_for
from odradek.types import ConfigEntry, PartitionMetadata, TopicDescription, TopicPartition

log = logging.getLogger("odradek.admin")

DEFAULT_TIMEOUT_MS = 30000


class Admin:
    def __init__(self, bootstrap_servers="127.0.0.1:9092", client_id: str = "odradek-admin",
                 request_timeout_ms: int = DEFAULT_TIMEOUT_MS, retry_backoff_ms: int = 100, **security):
        self.request_timeout_ms = request_timeout_ms
        self._cluster = Cluster(bootstrap_servers, client_id, request_timeout_ms, retry_backoff_ms,
                                security=ClientSecurity.from_options(security))  # TLS/SASL options

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._cluster.close()

    def _call(self, api: ApiKey, body: dict) -> dict:
        return self._cluster.request(api, body).header["body"]

    def _controller_call(self, api: ApiKey, body: dict, items: str) -> dict:
        """``api`` sent to the controller; NOT_CONTROLLER (top-level or in any of the answer's
        ``items``) and lost connections refresh the metadata and try again after the backoff."""
        return _retrying(self._cluster, self.request_timeout_ms / 1000, lambda: self._controller_once(api, body, items))

    def _controller_once(self, api: ApiKey, body: dict, items: str) -> dict:
        cluster = self._cluster
        if cluster.controller_id is None or cluster.address(cluster.controller_id) is None:
            cluster.refresh([])
        node = cluster.controller_id
        if node is None or cluster.address(node) is None:
            raise error_for(ErrorCode.NOT_CONTROLLER, "the metadata names no live controller")
        answer = cluster.request_node(node, api, body).header["body"]
        for item in answer.get(items) or ():
            if item.get("error_code") == ErrorCode.NOT_CONTROLLER:
                raise error_for(ErrorCode.NOT_CONTROLLER, f"broker {node}: {item.get('error_message') or ''}")
        return answer

    def _resources_call(self, api: ApiKey, body: dict, resource_type: str, name: str, controller: bool) -> dict:
        """Configs: a broker's go to that broker; topic ones to the controller (changes) or any
        broker (descriptions)."""
        if resource_type == "broker" and str(name).lstrip("-").isdigit():
            node = int(name)

            def once() -> dict:
                if self._cluster.address(node) is None:
                    self._cluster.refresh([])
                return self._cluster.request_node(node, api, body).header["body"]
            return _retrying(self._cluster, self.request_timeout_ms / 1000, once)
        if controller:
            return self._controller_call(api, body, "resources")
        return self._call(api, body)

    # ---- topics ----------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: dict | None = None, validate_only: bool = False) -> dict:
        """Create a topic; ``partitions=-1`` / ``replication_factor=-1`` take the broker's
        defaults. Returns ``{"name", "num_partitions", "replication_factor"}``."""
        body = {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": replication_factor,
                            "configs": {str(k): str(v) for k, v in (config or {}).items()}}],
                "timeout_ms": self.request_timeout_ms, "validate_only": validate_only}
        result = self._one(self._controller_call(ApiKey.CREATE_TOPICS, body, "topics")["topics"], name,
                           f"create topic '{name}'")
        return {"name": name, "num_partitions": result.get("num_partitions", partitions),
                "replication_factor": result.get("replication_factor", replication_factor)}

    def delete_topic(self, name: str) -> None:
        body = {"topics": [name], "timeout_ms": self.request_timeout_ms}
        self._one(self._controller_call(ApiKey.DELETE_TOPICS, body, "topics")["topics"], name,
                  f"delete topic '{name}'")

    def elect_leaders(self, partitions: Iterable[TopicPartition] | None = None) -> dict:
        """Preferred leader election (ELECT_LEADERS): move each partition's leadership to its
        first replica where that one is alive and in sync. ``None``: every partition.
        Returns ``{TopicPartition: None | OdradekError}`` (ELECTION_NOT_NEEDED included)."""
        wanted = None
        if partitions is not None:
            by_topic: dict[str, list] = {}
            for tp in partitions:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            wanted = [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]
        answer = self._controller_call(ApiKey.ELECT_LEADERS, {"election_type": 0, "topic_partitions": wanted},
                                       "partitions")
        check(answer.get("error_code"), answer.get("error_message"), "elect leaders")
        return {TopicPartition(p["topic"], p["partition"]):
                error_for(p["error_code"], p.get("error_message") or "") if p.get("error_code") else None
                for p in answer.get("partitions") or ()}

    # ---- partitions: reassignment and growth ---------------------------------------------------
    def alter_partition_reassignments(self, moves: dict) -> dict:
        """Move partitions: ``{TopicPartition: [broker ids] | None}`` (None cancels a move in
        progress). Returns ``{TopicPartition: None | OdradekError}``; the moves complete in the
        background (``list_partition_reassignments`` shows the ones in progress)."""
        by_topic: dict[str, list] = {}
        for tp, replicas in moves.items():
            tp = TopicPartition(*tp)
            by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition,
                                                      "replicas": None if replicas is None else list(replicas)})
        answer = self._controller_call(ApiKey.ALTER_PARTITION_REASSIGNMENTS, {
            "timeout_ms": self.request_timeout_ms, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]},
            "responses")
        check(answer.get("error_code"), answer.get("error_message"), "alter partition reassignments")
        return {TopicPartition(t["name"], p["partition_index"]):
                error_for(p["error_code"], p.get("error_message") or "") if p.get("error_code") else None
                for t in answer.get("responses") or () for p in t.get("partitions") or ()}

    def list_partition_reassignments(self, partitions: Iterable[TopicPartition] | None = None) -> dict:
        """Moves in progress: ``{TopicPartition: {"replicas", "adding_replicas", "removing_replicas"}}``."""
        wanted = None
        if partitions is not None:
            by_topic: dict[str, list] = {}
            for tp in partitions:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            wanted = [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]
        answer = self._controller_call(ApiKey.LIST_PARTITION_REASSIGNMENTS, {"topics": wanted}, "topics")
        check(answer.get("error_code"), answer.get("error_message"), "list partition reassignments")
        return {TopicPartition(t["name"], p["partition_index"]): {k: p[k] for k in ("replicas", "adding_replicas",
                                                                                     "removing_replicas")}
                for t in answer.get("topics") or () for p in t.get("partitions") or ()}

    def create_partitions(self, name: str, count: int, assignments: list[list[int]] | None = None,
                          validate_only: bool = False) -> None:
        """Grow topic ``name`` to ``count`` partitions; ``assignments`` places the new ones
        (one replica list each), else the controller does (rack-aware where racks are set)."""
        body = {"topics": [{"name": name, "count": count,
                            "assignments": None if assignments is None else [{"broker_ids": list(a)} for a in assignments]}],
                "timeout_ms": self.request_timeout_ms, "validate_only": validate_only}
        self._one(self._controller_call(ApiKey.CREATE_PARTITIONS, body, "results")["results"], name,
                  f"create partitions of '{name}'")

    def broker_racks(self) -> dict[int, str | None]:
        """``{broker id: its broker.rack or None}`` of the live brokers (from the metadata)."""
        body = self._cluster.refresh([])
        return {b["node_id"]: b.get("rack") for b in body.get("brokers", [])}

    def list_topics(self, include_internal: bool = False) -> list[str]:
        """Names of the topics, sorted."""
        body = self._cluster.refresh(None)
        return sorted(t["name"] for t in body.get("topics", [])
                      if not t.get("error_code") and (include_internal or not t.get("is_internal")))

    def describe_topic(self, name: str, configs: bool = True) -> TopicDescription:
        """Partitions (leader, replicas, ISR) and the topic's configs (none with ``configs``
        False: DescribeConfigs is an ACL of its own)."""
        body = self._cluster.refresh([name])
        topic = next((t for t in body.get("topics", []) if t["name"] == name), None)
        if topic is None:
            raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"describe topic '{name}': not in the answer")
        check(topic.get("error_code"), topic.get("error_message"), f"describe topic '{name}'")
        parts = tuple(PartitionMetadata(name, p.partition, p.leader, p.leader_epoch, p.replicas, p.isr, p.error_code)
                      for p in self._cluster.partitions(name) or ())
        found = {c.name: c.value for c in self.describe_configs(name)} if configs else {}
        return TopicDescription(name, bool(topic.get("is_internal", False)), parts, found)

    # ---- configs ---------------------------------------------------------------------------
    def describe_configs(self, name: str, keys: Iterable[str] | None = None,
                         resource_type: str = "topic") -> list[ConfigEntry]:
        """Configs of a topic (or, with ``resource_type="broker"``, a broker id as a string)."""
        body = {"resources": [{"type": resource_type, "name": str(name), "keys": list(keys) if keys else None}]}
        res = self._one(self._resources_call(ApiKey.DESCRIBE_CONFIGS, body, resource_type, name, False)["resources"],
                        str(name), f"describe configs of {resource_type} '{name}'")
        return [ConfigEntry(c["name"], c.get("value"), c.get("source", "unknown"), bool(c.get("read_only", False)))
                for c in res.get("configs", [])]

    def alter_configs(self, name: str, set: dict | None = None, delete: Iterable[str] = (),
                      resource_type: str = "topic") -> None:
        """Incrementally set and delete configs (``delete`` falls back to the default)."""
        configs = [{"name": k, "value": str(v), "op": "set"} for k, v in (set or {}).items()]
        configs += [{"name": k, "value": None, "op": "delete"} for k in delete]
        if not configs:
            raise ValueError("alter_configs: nothing to set or delete")
        body = {"resources": [{"type": resource_type, "name": str(name), "configs": configs}]}
        self._one(self._resources_call(ApiKey.INCREMENTAL_ALTER_CONFIGS, body, resource_type, name, True)["resources"],
                  str(name), f"alter configs of {resource_type} '{name}'")

    # ---- records ---------------------------------------------------------------------------
    def delete_records(self, offsets: dict) -> dict:
        """Delete records below the given offsets: ``{TopicPartition: offset}`` -> the new
        low watermark of each partition (``{TopicPartition: low_watermark}``). Each partition
        is asked of its leader."""
        wanted = {TopicPartition(*tp): offset for tp, offset in offsets.items()}

        def body_of(tps: list) -> dict:
            return {"topics": _by_topic((tp, {"offset": wanted[tp]}) for tp in tps),
                    "timeout_ms": self.request_timeout_ms}
        return by_leader(self._cluster, list(wanted), ApiKey.DELETE_RECORDS, body_of,
                         lambda p: p.get("low_watermark", -1), "delete records of", self.request_timeout_ms / 1000)

    def list_offsets(self, partitions: Iterable[TopicPartition], timestamp: int = -1) -> dict:
        """``{TopicPartition: offset}`` for ``timestamp`` -1 (latest), -2 (earliest) or a time in
        ms (the first offset with a timestamp at or after it; -1 if none). Asked of each leader."""
        return list_offsets(self._cluster, [TopicPartition(*tp) for tp in partitions], timestamp,
                            self.request_timeout_ms / 1000)

    # ---- log directories --------------------------------------------------------------------
    def describe_log_dirs(self, broker: int, topics: list[tuple[str, list[int]]] | None = None) -> list[dict]:
        """DescribeLogDirs of one broker: its log directories, each ``{log_dir, total_bytes,
        usable_bytes, topics: [{name, partitions: [{partition_index, partition_size, ...}]}]}``
        (``topics`` None: every partition it hosts; ``[]``: none, the volumes only)."""
        body = {"topics": None if topics is None else [{"topic": t, "partitions": list(ps)} for t, ps in topics]}

        def once() -> dict:
            if self._cluster.address(broker) is None:
                self._cluster.refresh([])
            return self._cluster.request_node(broker, ApiKey.DESCRIBE_LOG_DIRS, body).header["body"]
        answer = _retrying(self._cluster, self.request_timeout_ms / 1000, once)
        check(answer.get("error_code"), answer.get("error_message"), f"describe log dirs of broker {broker}")
        return answer.get("results") or []

    # ---- ACLs and SCRAM users (kafka-acls, kafka-configs --entity-type users) -------------------
    def create_acls(self, acls: Iterable) -> None:
        """CreateAcls of ``authorizer.Acl`` rows (Alter on the cluster, as Kafka)."""
        acls = list(acls)
        body = {"creations": [{"principal": a.principal, "host": a.host, "resource_type": a.resource,
                               "resource_name": a.name, "resource_pattern_type": a.pattern, "operation": a.operation,
                               "permission_type": a.permission} for a in acls]}
        answer = self._call(ApiKey.CREATE_ACLS, body)
        for a, r in zip(acls, answer.get("results") or ()):
            check(r.get("error_code"), r.get("error_message"), f"create ACL {a.permission} {a.principal} "
                                                                f"{a.operation} on {a.resource}:{a.name}")

    def delete_acls(self, acls: Iterable) -> int:
        """DeleteAcls of exactly these ``authorizer.Acl`` rows (each a filter naming every
        field): how many ACLs were removed."""
        filters = [{"resource_type_filter": a.resource, "resource_name_filter": a.name,
                    "pattern_type_filter": a.pattern, "principal_filter": a.principal, "host_filter": a.host,
                    "operation": a.operation, "permission_type": a.permission} for a in acls]
        answer = self._call(ApiKey.DELETE_ACLS, {"filters": filters})
        removed = 0
        for r in answer.get("filter_results") or ():
            check(r.get("error_code"), r.get("error_message"), "delete ACLs")
            removed += len(r.get("matching_acls") or ())
        return removed

    def upsert_scram_user(self, user: str, password: str, mechanisms: Iterable[str],
                          iterations: int = sasl.DEFAULT_ITERATIONS) -> None:
        """AlterUserScramCredentials: store ``user``'s password for each SCRAM mechanism. The
        request carries a salt and the salted password (RFC 5802's Hi), never the password,
        as Kafka's admin client sends it."""
        if not sasl.MIN_ITERATIONS <= int(iterations) <= sasl.MAX_ITERATIONS:  # checked before hashing: the
            # broker refuses such a count anyway, and a huge one would keep this thread hashing
            raise ValueError(f"iterations must be {sasl.MIN_ITERATIONS} to {sasl.MAX_ITERATIONS} (as Kafka's "
                             f"AlterUserScramCredentials), not {iterations}")
        upsertions = []
        for mechanism in mechanisms:
            if mechanism not in sasl.SCRAM:
                raise ValueError(f"{mechanism!r} is not a SCRAM mechanism ({', '.join(sasl.SCRAM)})")
            salt = os.urandom(32)
            upsertions.append({"name": user, "mechanism": mechanism, "iterations": int(iterations), "salt": salt,
                               "salted_password": hashlib.pbkdf2_hmac(sasl.SCRAM[mechanism], password.encode("utf-8"),
                                                                      salt, int(iterations))})
        self._alter_scram(user, {"deletions": [], "upsertions": upsertions}, "store the credentials of")

    def delete_scram_user(self, user: str, mechanisms: Iterable[str]) -> None:
        """AlterUserScramCredentials: delete ``user``'s credential of each mechanism."""
        self._alter_scram(user, {"deletions": [{"name": user, "mechanism": m} for m in mechanisms],
                                 "upsertions": []}, "delete the credentials of")

    def _alter_scram(self, user: str, body: dict, doing: str) -> None:
        for r in self._call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, body).get("results") or ():
            check(r.get("error_code"), r.get("error_message"), f"{doing} user '{user}'")

    @staticmethod
    def _one(items: list, name: str, doing: str) -> dict:
        item = next((i for i in items if i.get("name") == name), None)
        if item is None:
            raise error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"{doing}: the broker's answer does not mention it")
        check(item.get("error_code"), item.get("error_message"), doing)
        return item


def _by_topic(entries) -> list[dict]:
    """``[(TopicPartition, fields)]`` -> the request's ``topics`` list, partitions grouped by topic."""
    by_topic: dict[str, list] = {}
    for tp, fields in entries:
        by_topic.setdefault(tp.topic, []).append({"index": tp.partition, **fields})
    return [{"name": t, "partitions": ps} for t, ps in by_topic.items()]


def _retrying(cluster: Cluster, timeout: float, once: Callable[[], dict]) -> dict:
    """``once()`` until it stops raising retriable errors (NOT_CONTROLLER, lost connections,
    ...) or ``timeout`` passes; metadata is refreshed (``retry_backoff_ms`` apart) between tries."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return once()
        except OdradekError as exc:
            if not exc.retriable or time.monotonic() + cluster.retry_backoff >= deadline:
                raise
            log.info("%s; retrying after a metadata refresh", exc)
        time.sleep(max(cluster.retry_backoff, cluster.refresh_due()))
        cluster.maybe_refresh([], timeout=max(0.1, deadline - time.monotonic()))


def by_leader(cluster: Cluster, tps: list, api: ApiKey, body_of: Callable[[list], dict],
              value_of: Callable[[dict], object], doing: str, timeout: float) -> dict:
    """A per-partition request (ListOffsets, DeleteRecords) sent to each partition's leader:
    ``{tp: value_of(partition answer)}``. Leader errors (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH,
    no leader, a dead leader) refresh the metadata and retry the partitions concerned after
    the backoff until ``timeout``; other errors raise (the first one, with ``doing`` and the partition)."""
    deadline = time.monotonic() + timeout
    if any(tp.topic not in cluster.topics for tp in tps):
        cluster.refresh(sorted({tp.topic for tp in tps}))
    out: dict = {}
    todo = list(tps)
    while todo:
        groups: dict[int, list] = {}
        for tp in todo:
            groups.setdefault(cluster.leader(tp.topic, tp.partition), []).append(tp)
        errors: dict = {}
        for node, group in groups.items():
            if node < 0:
                for tp in group:
                    errors[tp] = error_for(ErrorCode.LEADER_NOT_AVAILABLE, "no leader known")
                continue
            try:
                answer = cluster.request_node(node, api, body_of(group),
                                              timeout=max(0.1, deadline - time.monotonic())).header["body"]
            except OdradekError as exc:
                if not exc.retriable:
                    raise
                for tp in group:
                    errors[tp] = exc
                continue
            for t in answer.get("topics", []):
                for p in t.get("partitions", []):
                    tp = TopicPartition(t["name"], p["index"])
                    if p.get("error_code"):
                        errors[tp] = error_for(p["error_code"], p.get("error_message"))
                    else:
                        out[tp] = value_of(p)
        for tp, exc in errors.items():
            if not exc.retriable or time.monotonic() + cluster.retry_backoff >= deadline:
                raise error_for(exc.code, f"{doing} {tp.topic}-{tp.partition}: {exc.message}")
        todo = [tp for tp in todo if tp in errors]
        if todo:
            time.sleep(max(cluster.retry_backoff, cluster.refresh_due()))
            if any(e.code in STALE_METADATA or e.code in NETWORK_ERRORS for e in errors.values()):
                cluster.maybe_refresh(sorted({tp.topic for tp in todo} | set(cluster.topics)))
    return out


def list_offsets(cluster: Cluster, tps: list, timestamp: int, timeout: float, isolation_level: int = 0) -> dict:
    """``{tp: offset}`` from each partition's leader (see ``by_leader``); with
    ``isolation_level`` 1 (read_committed) "latest" (-1) is the last stable offset."""
    def body_of(group: list) -> dict:
        return {"replica_id": -1, "isolation_level": isolation_level, "topics": _by_topic(
            (tp, {"timestamp": timestamp, "current_leader_epoch": cluster.leader_epoch(tp.topic, tp.partition)})
            for tp in group)}
    if not tps:
        return {}
    return by_leader(cluster, tps, ApiKey.LIST_OFFSETS, body_of, lambda p: p.get("offset", -1),
                     "list offsets of", timeout)
