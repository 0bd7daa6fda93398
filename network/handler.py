"""RequestHandler: stateless API logic, a pool of ``num.io.threads``.

Process: ``handler-<i>`` (a scalable pool). Owns nothing but its configuration and a copy of
the topic metadata, so any handler answers any request and the pool grows, shrinks and restarts
freely. Dispatch is one flat table, API -> method: parse the body, authorize (``network.guard``),
act, reply.
Accepts (bodies: ``odradek.actors.messages``):
  request (``Request``) + payload frames: from a processor; answered to it (``Response`` +
      frames or ``_error``), or forwarded to the actor owning the data, which answers the
      processor
  metadata {snapshot}: from the controller, the topic cache; answered ``{version}``
Sends (addresses and parts: ``odradek.actors.names``): ``produce`` to the partitions' log
actors (scattered and gathered here when it spans several); ``delete_records``,
``offset_for_leader_epoch``, ``describe_log_dirs`` to the log actors (gathered here);
``fetch``, ``list_offsets`` to the fetch actor; ``group_request`` to the group coordinator;
``txn_request`` to the transaction coordinator; topic, partition, config, election and
inter-broker requests to the controller; ``scale`` and ``status`` to the supervisor
(``num.io.threads``). Metadata, ApiVersions, DescribeConfigs, Ping, the ACL and SCRAM APIs are
answered here.
Invariants: nothing blocks; a request stamped (``t``) before this incarnation started is
refused NETWORK_EXCEPTION (its processor already failed it), never run twice; a body of the
wrong shape is INVALID_REQUEST naming the field; any other exception is UNKNOWN_SERVER_ERROR
and the handler keeps serving.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import (AlterTopicConfigs, BrokerRequest, CreateTopics, DeleteRecords, DeleteRecordsPart,
                                     DeleteTopics, DescribeLogDirs, EpochQuery, ErrorReply, Fetch, GetBrokerConfigs,
                                     GetMetadata, GroupRequest, ListOffsets, MetadataVersion, OffsetForLeaderEpoch,
                                     PartError, Produce, Response, Scale, SetBrokerConfigs, SetThrottleRates, Status,
                                     TxnRequest)
from odradek.actors.names import CONTROLLER, FETCH_ACTOR, GROUP_COORDINATOR, HANDLER, TXN_COORDINATOR, log_host, log_host_name
from odradek.actors.runtime import Actor
from odradek.core.config import kafka_value
from odradek.core.errors import RecordErrors
from odradek.core.inflate import DEFAULT_LIMIT, limit_for
from odradek.core.records import validate_produced
from odradek.network import listeners as listeners_mod
from odradek.network.authorizer import CLUSTER, OPERATIONS, offset_fetch_groups
from odradek.network.credentials import Credentials
from odradek.core.fields import BadRequest, check_shape, field
from odradek.network.guard import ACL_APIS, Guard
from odradek.core.protocol import (GROUP_APIS, TXN_APIS, ApiKey, ErrorCode, OdradekError, check_topic_name,
                                      is_internal_topic, parse_listener)

log = logging.getLogger("odradek.handler")

# API -> (min version, max version). ApiVersions reports exactly this table.
SUPPORTED: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (0, 0),
    ApiKey.FETCH: (0, 0),
    ApiKey.LIST_OFFSETS: (0, 0),
    ApiKey.CREATE_TOPICS: (0, 0),
    ApiKey.DELETE_TOPICS: (0, 0),
    ApiKey.DELETE_RECORDS: (0, 0),
    ApiKey.METADATA: (0, 0),
    ApiKey.API_VERSIONS: (0, 0),
    ApiKey.DESCRIBE_CONFIGS: (0, 0),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 0),
    ApiKey.PING: (0, 0),
    **{api: (0, 0) for api in ACL_APIS},
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 0),
    ApiKey.OFFSET_COMMIT: (0, 0),
    ApiKey.OFFSET_FETCH: (0, 0),
    ApiKey.FIND_COORDINATOR: (0, 0),
    ApiKey.LIST_GROUPS: (0, 0),
    ApiKey.DESCRIBE_GROUPS: (0, 0),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 0),
    ApiKey.DELETE_GROUPS: (0, 0),
    ApiKey.LEAVE_GROUP: (0, 0),
    ApiKey.JOIN_GROUP: (0, 0),
    ApiKey.SYNC_GROUP: (0, 0),
    ApiKey.HEARTBEAT: (0, 0),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 0),
    ApiKey.LEADER_AND_ISR: (0, 0),
    ApiKey.UPDATE_METADATA: (0, 0),
    ApiKey.STOP_REPLICA: (0, 0),
    ApiKey.CONTROLLED_SHUTDOWN: (0, 0),
    ApiKey.ELECT_LEADERS: (0, 0),
    ApiKey.CREATE_PARTITIONS: (0, 0),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.INIT_PRODUCER_ID: (0, 0),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 0),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 0),
    ApiKey.END_TXN: (0, 0),
    ApiKey.TXN_OFFSET_COMMIT: (0, 0),
    ApiKey.WRITE_TXN_MARKERS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_LOG_DIRS: (0, 0),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}
# Requests between brokers (and ElectLeaders): the broker's controller actor answers them.
CONTROLLER_APIS = (ApiKey.LEADER_AND_ISR, ApiKey.UPDATE_METADATA, ApiKey.STOP_REPLICA, ApiKey.CONTROLLED_SHUTDOWN,
                   ApiKey.ELECT_LEADERS, ApiKey.CREATE_PARTITIONS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
                   ApiKey.LIST_PARTITION_REASSIGNMENTS)

# The shapes of the bodies the handler passes on to actors that read them as given (the
# controllers, the log actors): a body of another shape is answered INVALID_REQUEST naming the
# field, never an actor's TypeError (core/fields.py, check_shape).
PARTITIONS = [{"name": str, "partitions": [dict]}]
BODY_SHAPES = {
    ApiKey.ELECT_LEADERS: {"topic_partitions": (None, [{"topic": str, "partitions": [int]}])},
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: {"topics": [{"name": str, "partitions": [
        {"partition_index": int, "replicas": (None, [int])}]}]},
    ApiKey.LIST_PARTITION_REASSIGNMENTS: {"topics": (None, [{"name": str, "partition_indexes": [int]}])},
    ApiKey.CREATE_PARTITIONS: {"topics": [{"name": str, "count": int, "assignments": (None, list)}]},
    ApiKey.DELETE_RECORDS: {"topics": PARTITIONS},
    ApiKey.OFFSET_FOR_LEADER_EPOCH: {"topics": PARTITIONS},
    ApiKey.INCREMENTAL_ALTER_CONFIGS: {"resources": [{"configs": (None, list)}]},  # each config: checked per resource
}

# Broker configs that IncrementalAlterConfigs may change at run time, with effect. The broker
# assembly adds Kafka's other dynamic broker configs that Odradek does not implement (args
# ``kafka_run_time_configs``: name -> Kafka's check, for ``kafka_value``): each is checked as
# Kafka checks it, kept by the controller actor (``get/set_broker_configs``, kept across
# restarts), reported by DescribeConfigs, and has no effect (a warning says so), as when it is
# set at start (odradek/kafka_configs.py).
THROTTLE_RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")  # bytes/s
DYNAMIC_CONFIGS = {"num.io.threads", *THROTTLE_RATES}
SCALE_TIMEOUT = 60.0  # seconds the supervisor has to add or retire handlers
GATHER_TIMEOUT = 30.0  # seconds the log actors have to answer a scattered request
TOPIC_CHANGE_TIMEOUT = 120.0  # seconds the controller has for a topic change (it may open thousands of partitions)
# The topic changes a client may not make to an internal topic: API -> (the request's list of
# topics, the answer's list of results, the change in words). Produce and DeleteRecords are
# refused per partition, IncrementalAlterConfigs per resource.
TOPIC_CHANGES = {
    ApiKey.CREATE_TOPICS: ("topics", "topics", "create"),
    ApiKey.DELETE_TOPICS: ("topics", "topics", "delete"),
    ApiKey.CREATE_PARTITIONS: ("topics", "results", "add partitions to"),
}
ACKS = (0, 1, -1)
# The ACL operations Kafka reports as authorized operations of each resource type (its
# supported operations: Metadata's and DescribeCluster's include_*_authorized_operations)
SUPPORTED_OPERATIONS = {
    "Topic": ("Read", "Write", "Create", "Delete", "Alter", "Describe", "DescribeConfigs", "AlterConfigs"),
    "Cluster": ("Create", "ClusterAction", "DescribeConfigs", "AlterConfigs", "IdempotentWrite", "Alter", "Describe"),
    "Group": ("Read", "Describe", "Delete"),
}


def _wanted(resource: dict):
    """The config names a DescribeConfigs resource asks for (the bundled Admin's ``keys``, the
    Kafka codec's ``configs``); none: every config."""
    return resource.get("keys") or resource.get("configs")


def _throttle_rate(name: str, value, op: str) -> int | None:
    """A throttle rate change: bytes/s >= 1, or None (op 'delete': back to the broker config)."""
    if op == "delete":
        return None
    try:
        rate = int(str(value).strip())
    except ValueError:
        rate = 0
    if rate < 1:
        raise OdradekError(f"'{name}' must be a positive number of bytes per second, got {value!r}",
                           ErrorCode.INVALID_CONFIG)
    return rate


class RequestHandler(Actor):
    def __init__(self, name, run_dir, args=None, supervisor=None, **kw):
        super().__init__(name, run_dir, args, supervisor, **kw)
        self.config: dict = dict(self.args.get("config", {}))
        self.broker_id = int(self.args.get("broker_id", self.config.get("broker.id", 0)))
        self.run_time_configs: dict = dict(self.args.get("kafka_run_time_configs") or {})
        self.advertised = _advertised(self.config)
        self.listener_addresses = listeners_mod.advertised(self.config)  # the request's listener's, in Metadata
        self.topics: dict[str, dict] = {}
        self.brokers: dict[str, list] = {}
        self.endpoints: dict[str, dict] = {}
        self.racks: dict[str, str] = {}
        self.controller_id = self.broker_id
        self.topic_defaults: dict = {}
        self.metadata_version = -1
        self.log_hosts = int(self.args.get("log_hosts", 1))
        self.dispatch: dict[int, Callable[[Message, dict], None]] = {
            ApiKey.PRODUCE: self.produce_from_client,
            ApiKey.FETCH: self.to_fetch_actor,
            ApiKey.LIST_OFFSETS: self.to_fetch_actor,
            ApiKey.CREATE_TOPICS: self.to_controller,
            ApiKey.DELETE_TOPICS: self.to_controller,
            ApiKey.DELETE_RECORDS: self.delete_records,
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.PING: self.ping,
            ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            ApiKey.DESCRIBE_LOG_DIRS: self.describe_log_dirs,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: lambda msg, body: self.reply(
                msg, Response(self.credentials.describe(body))),
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: lambda msg, body: self.reply(
                msg, Response(self.credentials.alter(body))),
            **{api: self.to_group_coordinator for api in GROUP_APIS},
            **{api: self.to_txn_coordinator for api in TXN_APIS},
            **{api: self.to_controller_actor for api in CONTROLLER_APIS},
            **{api: lambda msg, body: self.reply(msg, Response(self.guard.serve(msg.fields.api, body)))
               for api in ACL_APIS},
        }
        self.guard = Guard(self.config, self.args.get("data_dir") or ".", self.metrics)  # ACLs (authorizer = true)
        self.credentials = Credentials(self.args.get("data_dir") or ".", self.config)  # SCRAM users (KIP-554)

    def on_start(self) -> None:
        self._adopt(self.call(CONTROLLER, GetMetadata(), timeout=60.0).fields.snapshot)

    def on_metadata(self, msg: Message) -> None:
        self._adopt(msg.fields.snapshot)
        self.reply(msg, MetadataVersion(self.metadata_version))

    def _adopt(self, snapshot: dict) -> None:
        if snapshot["version"] >= self.metadata_version:
            self.metadata_version = snapshot["version"]
            self.topics = snapshot["topics"]
            self.topic_defaults = snapshot["defaults"]
            self.brokers = snapshot.get("brokers") or {}
            self.racks = snapshot.get("racks") or {}  # broker.rack of each broker that has one
            self.endpoints = snapshot.get("endpoints") or {}  # broker -> listener name -> [host, port]
            self.controller_id = snapshot.get("controller_id", self.broker_id)

    def stats(self) -> dict:
        return {"topics": len(self.topics), "metadata_version": self.metadata_version}

    # ---- the one entry point -------------------------------------------------------------
    def on_request(self, msg: Message) -> None:
        fields = msg.fields
        if fields.t < self.started_at:
            self.reply_error(msg, ErrorCode.NETWORK_EXCEPTION, "sent to a handler that has since restarted")
            return
        api, version, body = fields.api, fields.v, fields.body
        method = self.dispatch.get(api)
        if method is None:
            raise OdradekError(f"unknown API key {api!r}", ErrorCode.INVALID_REQUEST)
        low, high = SUPPORTED[api]
        if not isinstance(version, int) or not low <= version <= high:
            raise OdradekError(f"{ApiKey(api).name} (key {api}) supports versions {low} to {high}, "
                               f"got {version!r}", ErrorCode.UNSUPPORTED_VERSION)
        if not isinstance(body, dict):
            raise BadRequest(f"{ApiKey(api).name}: the request body must be a map")
        if api in BODY_SHAPES:
            check_shape(body, BODY_SHAPES[api])
        picked_up = time.time()
        self.metrics.observe("request_queue_ms", (api,), (picked_up - fields.t) * 1000)
        try:
            self.guard.check_inter_broker(fields, api, body)  # only a proven broker (CLUSTER_AUTHORIZATION_FAILED)
            denied = self.guard.check(fields, api, body, msg.frames)  # raises *_AUTHORIZATION_FAILED if denied
            if denied:  # Produce, Fetch, AddPartitionsToTxn: some topics denied, the others served (or not attempted)
                self._partly_denied(msg, api, body, denied)
            else:
                method(msg, body)
        except OdradekError:
            raise
        except Exception:  # a bug: name whose request it was (the runtime logs the traceback and answers)
            log.error("%s: %s v%s from %s (client '%s') failed", self.name, ApiKey(api).name, version,
                      fields.peer, fields.client)
            raise
        finally:
            self.metrics.observe("request_local_ms", (api,), (time.time() - picked_up) * 1000)

    # ---- data APIs: routed to the actor that owns the data ---------------------------------
    def _partly_denied(self, msg: Message, api: int, body: dict, denied: dict[str, str]) -> None:
        """Kafka's per-topic answer: every partition of a denied topic gets
        TOPIC_AUTHORIZATION_FAILED (whether or not the topic exists: its existence is not
        told), the other topics are produced or fetched as usual."""
        if api == ApiKey.ADD_PARTITIONS_TO_TXN:
            self._add_partitions_refused(msg, body, set(denied))
            return
        kept, errors = [], []
        for t in field(body, "topics", list):
            name = t.get("name") if isinstance(t, dict) else None
            if name not in denied:
                kept.append(t)
                continue
            for p in t.get("partitions") or () if isinstance(t.get("partitions"), list) else ():
                index = p.get("index") if isinstance(p, dict) else None
                errors.append([name, index, int(ErrorCode.TOPIC_AUTHORIZATION_FAILED), denied[name]])
        body = {**body, "topics": kept}
        if api == ApiKey.PRODUCE:
            self.produce_from_client(msg, body, errors)
            return
        if not kept:
            self.reply(msg, Response({"error_code": 0, **_partition_body(errors, [], FETCH_ERROR)}))
            return

        def merged(reply: Message) -> None:
            if reply.is_error:
                self.reply_error(msg, reply.error_code, reply.error_message)
                return
            out = reply.fields
            # after the served partitions: their records (records_size each) come first, in body order
            extra = _partition_body(errors, [], FETCH_ERROR)["topics"]
            self.reply(msg, out._replace(body={**out.body, "topics": list(out.body.get("topics") or []) + extra}),
                       reply.frames)
        self.request(FETCH_ACTOR, Fetch(body), callback=merged, timeout=GATHER_TIMEOUT + 30)

    def produce_from_client(self, msg: Message, body: dict, denied: list | None = None) -> None:
        """Produce's entry: the partitions of internal topics are refused here, before the
        produce path (INVALID_TOPIC_EXCEPTION, as Kafka's ReplicaManager): only their
        coordinators write them, through their log actors."""
        body, refused = _without_internal_partitions(body, "append to")
        self.produce(msg, body, refused + list(denied or ()))

    def produce(self, msg: Message, body: dict, denied: list | None = None) -> None:
        """``denied``: the partitions of topics the principal may not write, already failed."""
        acks = body.get("acks", 1)
        if acks not in ACKS or isinstance(acks, bool):
            raise OdradekError(f"acks must be 0, 1 or -1 (all), got {acks!r}", ErrorCode.INVALID_REQUIRED_ACKS)
        per_host, errors, record_errors = self._route(msg, field(body, "topics", list))
        errors.extend(denied or ())
        timeout = field(body, "timeout_ms", int, 30000)
        if acks == 0:  # nobody waits: one-way to each log actor
            for host, (parts, frames) in per_host.items():
                self.send(host, tuple.__new__(Produce, (0, parts, timeout, [], False, [])), frames=frames)
            return
        unverified = acks == -1 and body.get("txn_unverified") is True  # docs/TRANSACTIONS.md, "The commit path"
        if not per_host:
            self.reply(msg, Response(_partition_body(errors, [], PRODUCE_ERROR, record_errors)))
            return
        if len(per_host) == 1 and not record_errors:  # per-record errors are answered from here (_gather)
            host, (parts, frames) = next(iter(per_host.items()))
            self.forward(msg, host, tuple.__new__(Produce, (acks, parts, timeout, errors, unverified, [])),
                         frames=frames)
            return
        self._gather(msg, [(host, tuple.__new__(Produce, (acks, parts, timeout, [], unverified, [])), frames)
                           for host, (parts, frames) in per_host.items()], errors, PRODUCE_ERROR, record_errors)

    def _route(self, msg: Message, topics: list) -> tuple[dict, list, dict]:
        """Group a produce's partitions by log actor; errors for the ones that fail checks, and
        the per-record errors of batches refused for some of their records (KIP-467), by
        ``(topic, partition)``. (Leadership and min.insync.replicas are the log actor's to
        check: it knows the ISR.)"""
        per_host: dict[str, tuple[list, list]] = {}
        errors: list[list] = []
        record_errors: dict[tuple, list] = {}
        for t in topics:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or \
                    not isinstance(t.get("partitions"), list):
                raise BadRequest("each topic must be a map with 'name' and a list of 'partitions'")
            name, meta = t["name"], self.topics.get(t["name"])
            rules = self._batch_rules(meta)
            for p in t["partitions"]:
                index, frame = (p.get("index"), p.get("frame")) if isinstance(p, dict) else (None, None)
                problem = self._partition_problem(name, meta, index)
                if problem is None and (not isinstance(frame, int) or not 0 <= frame < len(msg.frames)):
                    problem = (ErrorCode.INVALID_REQUEST, f"{name}-{index}: 'frame' must index one of the "
                               f"{len(msg.frames)} payload frames, got {frame!r}")
                if problem is None:
                    problem = _batch_problem(name, index, msg.frames[frame], *rules)
                if problem is not None:
                    errors.append(PartError(name, index, int(problem[0]), problem[1]))
                    if len(problem) > 2:
                        record_errors[name, index] = problem[2]
                    continue
                parts, frames = per_host.setdefault(self._host(name, index), ([], []))
                parts.append((name, index, len(frames)))  # a ProducePart, built as a plain tuple: the produce path
                frames.append(msg.frames[frame])
        return per_host, errors, record_errors

    def _batch_rules(self, meta: dict | None) -> tuple[bool, int]:
        """What a topic's configs ask of a produced batch: (compacted, inflated-size bound)."""
        if meta is None:
            return False, DEFAULT_LIMIT
        overrides, defaults = meta.get("configs") or {}, self.topic_defaults or {}
        policy = str(overrides.get("cleanup.policy", defaults.get("cleanup.policy", "delete")))
        max_bytes = overrides.get("max.message.bytes", defaults.get("max.message.bytes", 1 << 20))
        return "compact" in policy, limit_for(int(max_bytes))

    def _partition_problem(self, name: str, meta: dict | None, index) -> tuple[ErrorCode, str] | None:
        if meta is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' does not exist"
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < meta["partitions"]:
            return (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic '{name}' has partitions 0 to {meta['partitions'] - 1}, not {index!r}")
        return None

    def _host(self, topic: str, partition: int) -> str:
        return log_host(topic, partition, self.log_hosts)

    def _gather(self, msg: Message, targets: list, errors: list, blank: dict,
                record_errors: dict | None = None) -> None:
        """Scatter ``targets`` (to, body with ``parts``, frames), each answered a ``Response``;
        answer with the merged bodies (``record_errors``: ``_partition_body``'s)."""
        pending = {"n": len(targets), "topics": {}}

        def merge(reply: Message, parts: list) -> None:
            if reply.is_error:
                for name, index, _ in parts:
                    errors.append(PartError(name, index, reply.error_code, reply.error_message))
            else:
                for t in reply.fields.body["topics"]:
                    pending["topics"].setdefault(t["name"], []).extend(t["partitions"])
            pending["n"] -= 1
            if pending["n"] == 0:
                self.reply(msg, Response(_partition_body(errors, pending["topics"].items(), blank, record_errors)))

        for to, request, frames in targets:
            self.request(to, request, frames=frames, timeout=GATHER_TIMEOUT,
                         callback=lambda r, parts=request.parts: merge(r, parts))

    def delete_records(self, msg: Message, body: dict) -> None:
        body, refused = _without_internal_partitions(body, "delete records of")
        self._to_log_actors(msg, body, DeleteRecords, lambda t, i, p: DeleteRecordsPart(t, i, p.get("offset")),
                            DELETE_RECORDS_ERROR, refused)

    def offset_for_leader_epoch(self, msg: Message, body: dict) -> None:
        """A follower asks where a leader epoch ended: the log actors hosting the partitions answer."""
        self._to_log_actors(msg, body, OffsetForLeaderEpoch,
                            lambda t, i, p: EpochQuery(t, i, p.get("current_leader_epoch", -1),
                                                       p.get("leader_epoch", -1)), EPOCH_ERROR)

    def _to_log_actors(self, msg: Message, body: dict, kind: type, part_of: Callable[[str, int, dict], tuple],
                       blank: dict, refused: list | None = None) -> None:
        """Send each log actor ``kind(parts=[part_of(topic, partition, p)])`` for the
        request's partitions it hosts; answer with the merged per-partition entries (and the
        ``refused`` ones, already failed)."""
        per_host: dict[str, list] = {}
        errors: list[list] = list(refused or ())
        for t in field(body, "topics", list):
            name = t.get("name") if isinstance(t, dict) else None
            for p in (t.get("partitions") or []) if isinstance(t, dict) else []:
                index = p.get("index") if isinstance(p, dict) else None
                problem = self._partition_problem(name, self.topics.get(name), index)
                if problem is not None:
                    errors.append(PartError(name, index, int(problem[0]), problem[1]))
                else:
                    per_host.setdefault(self._host(name, index), []).append(part_of(name, index, p))
        if not per_host:
            self.reply(msg, Response(_partition_body(errors, [], blank)))
            return
        self._gather(msg, [(host, kind(parts), ()) for host, parts in per_host.items()], errors, blank)

    def describe_log_dirs(self, msg: Message, body: dict) -> None:
        """Every log actor names the partitions it hosts (of ``topics``, or all) with their
        sizes; one log directory (``log.dirs``) holds them all, with its volume's size."""
        topics = body.get("topics")
        if topics is not None:
            if not isinstance(topics, list) or not all(
                    isinstance(t, dict) and isinstance(t.get("topic"), str) and isinstance(t.get("partitions"), list)
                    and all(isinstance(i, int) for i in t["partitions"]) for t in topics):
                raise BadRequest("'topics' must be null or a list of {topic, partitions: [int]}")
            topics = [[t["topic"], t["partitions"]] for t in topics]
        data_dir = os.path.abspath(self.args.get("data_dir") or ".")
        pending = {"n": self.log_hosts, "parts": [], "failed": None}

        def merge(reply: Message) -> None:
            if reply.is_error:
                pending["failed"] = pending["failed"] or (reply.error_code, reply.error_message)
            else:
                pending["parts"].extend(reply.fields.parts)
            pending["n"] -= 1
            if pending["n"]:
                return
            if pending["failed"]:
                self.reply_error(msg, *pending["failed"])
                return
            per_topic: dict[str, list] = {}
            for topic, partition, size, lag in sorted(pending["parts"]):
                per_topic.setdefault(topic, []).append({"partition_index": partition, "partition_size": size,
                                                        "offset_lag": lag, "is_future_key": False})
            try:
                usage = shutil.disk_usage(data_dir)
                total, usable = usage.total, usage.free
            except OSError:
                total = usable = -1
            self.reply(msg, Response({"error_code": 0, "results": [
                {"error_code": 0, "log_dir": data_dir, "total_bytes": total, "usable_bytes": usable,
                 "topics": [{"name": t, "partitions": ps} for t, ps in per_topic.items()]}]}))

        for i in range(self.log_hosts):
            self.request(log_host_name(i), DescribeLogDirs(topics), callback=merge,
                         timeout=GATHER_TIMEOUT)

    def to_controller_actor(self, msg: Message, body: dict) -> None:
        api = msg.fields.api
        self._change_topics(msg, body, lambda b: BrokerRequest(api, b))

    def to_fetch_actor(self, msg: Message, body: dict) -> None:
        self.forward(msg, FETCH_ACTOR, Fetch(body) if msg.fields.api == ApiKey.FETCH else ListOffsets(body), frames=())

    def to_group_coordinator(self, msg: Message, body: dict) -> None:
        """Group APIs: the coordinator answers the processor. The metadata version lets it
        notice topics it has not heard of yet."""
        request = msg.fields
        api = request.api
        ask = GroupRequest(api, body, request.client, request.peer, self.metadata_version)
        if api == ApiKey.FIND_COORDINATOR and len(self.listener_addresses) > 1:
            # This broker's address as seen from the listener the client came in on (SASL_SSL, ...).
            self.request(GROUP_COORDINATOR, ask, timeout=GATHER_TIMEOUT, callback=lambda reply: (
                self._ask_status(lambda st: self._learn_address(st) or self._coordinator_on_listener(msg, reply))
                if any(p == 0 for _h, p in self.listener_addresses.values())
                else self._coordinator_on_listener(msg, reply)))
            return
        if api == ApiKey.OFFSET_FETCH and self.guard.enabled and any(
                g.get("topics") is None for g in offset_fetch_groups(body)):
            # Kafka's OffsetFetch of all topics: the committed offsets of the topics one may Describe
            self.request(GROUP_COORDINATOR, ask, timeout=GATHER_TIMEOUT,
                         callback=lambda reply: self._describable_offsets(msg, reply))
            return
        if body.get("include_authorized_operations") and api in (ApiKey.DESCRIBE_GROUPS,
                                                                 ApiKey.CONSUMER_GROUP_DESCRIBE):
            # Kafka's include_authorized_operations (KIP-430): the principal's operations on each group
            self.request(GROUP_COORDINATOR, ask, timeout=GATHER_TIMEOUT,
                         callback=lambda reply: self._with_group_operations(msg, reply))
            return
        if api == ApiKey.LIST_GROUPS and not self.guard.allowed(msg.fields, "Describe", "Cluster",
                                                                "kafka-cluster"):
            # Kafka's ListGroups: without Describe on the cluster, the groups one may Describe, no error
            self.request(GROUP_COORDINATOR, ask, timeout=GATHER_TIMEOUT,
                         callback=lambda reply: self._describable_groups(msg, reply))
            return
        self.forward(msg, GROUP_COORDINATOR, ask, frames=())

    def _coordinator_answer(self, msg: Message, reply: Message, change: Callable[[dict], None]) -> None:
        """Answer ``msg`` with the group coordinator's ``reply`` (a ``Response``), its body a copy
        ``change`` edited (or its error)."""
        if reply.is_error:
            self.reply_error(msg, reply.error_code or ErrorCode.UNKNOWN_SERVER_ERROR, reply.error_message)
            return
        body = dict(reply.fields.body or {})
        change(body)
        self.reply(msg, reply.fields._replace(body=body))

    def _describable_groups(self, msg: Message, reply: Message) -> None:
        def allowed(body: dict) -> None:
            body["groups"] = [g for g in body.get("groups") or () if isinstance(g, dict) and
                              self.guard.allowed(msg.fields, "Describe", "Group", str(g.get("group_id")))]
        self._coordinator_answer(msg, reply, allowed)

    def _with_group_operations(self, msg: Message, reply: Message) -> None:
        def operations(body: dict) -> None:
            body["groups"] = [{**g, "authorized_operations": self._operations(msg.fields, "Group",
                                                                              str(g.get("group_id")))}
                              if isinstance(g, dict) and not g.get("error_code") else g
                              for g in body.get("groups") or ()]
        self._coordinator_answer(msg, reply, operations)

    def _describable_offsets(self, msg: Message, reply: Message) -> None:
        def allowed(body: dict) -> None:
            for g in offset_fetch_groups(body):
                if isinstance(g.get("topics"), list):
                    g["topics"] = [t for t in g["topics"] if isinstance(t, dict) and
                                   self.guard.allowed(msg.fields, "Describe", "Topic", str(t.get("name")))]
        self._coordinator_answer(msg, reply, allowed)

    def _coordinator_on_listener(self, msg: Message, reply: Message) -> None:
        listener = msg.fields.listener

        def on_listener(body: dict) -> None:
            for entry in [body] + [c for c in body.get("coordinators") or () if isinstance(c, dict)]:  # v4+: several
                node = entry.get("node_id")
                if node == self.broker_id and listener in self.listener_addresses:
                    entry["host"], entry["port"] = self.listener_addresses[listener]
                elif isinstance(node, int) and node >= 0 and (self.endpoints.get(str(node)) or {}).get(listener):
                    entry["host"], entry["port"] = self.endpoints[str(node)][listener]
        self._coordinator_answer(msg, reply, on_listener)

    def to_txn_coordinator(self, msg: Message, body: dict) -> None:
        """InitProducerId and the transaction APIs: the transaction coordinator answers the processor.
        An AddPartitionsToTxn naming an internal topic's partitions adds none (Kafka's
        handleAddPartitionsToTxnRequest: a client may not write them, authorizer or not)."""
        api = msg.fields.api
        if api == ApiKey.ADD_PARTITIONS_TO_TXN and _names_internal_topic(body):
            self._add_partitions_refused(msg, body, set())
            return
        self.forward(msg, TXN_COORDINATOR, TxnRequest(api, body), frames=())

    def _add_partitions_refused(self, msg: Message, body: dict, denied: set) -> None:
        """An AddPartitionsToTxn that adds nothing, as Kafka answers it: the partitions of the
        ``denied`` topics (not writable by the principal) and of internal topics get
        TOPIC_AUTHORIZATION_FAILED, the request's others OPERATION_NOT_ATTEMPTED."""
        self.reply(msg, Response({"results": [
            {"name": t.get("name"), "results": [
                {"partition_index": p, "partition_error_code": int(
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED if t.get("name") in denied or is_internal_topic(t.get("name"))
                    else ErrorCode.OPERATION_NOT_ATTEMPTED)} for p in field(t, "partitions", list)]}
            for t in field(body, "topics", list) if isinstance(t, dict)]}))

    def to_controller(self, msg: Message, body: dict) -> None:
        self._change_topics(msg, body, CreateTopics if msg.fields.api == ApiKey.CREATE_TOPICS else DeleteTopics)

    def _change_topics(self, msg: Message, body: dict, body_of: Callable[[dict], tuple]) -> None:
        """Forward a request to the controller; a topic change (``TOPIC_CHANGES``) that names
        internal topics has their entries refused here (INVALID_TOPIC_EXCEPTION), merged into
        the controller's answer for the others. Every client's path to the controller (Kafka
        and native APIs, the CLI, the console) comes through here; the coordinators ask their
        own broker's controller directly (in a cluster it relays to the controller's broker,
        through a handler there: a creation as its coordinator asks for it passes)."""
        api = msg.fields.api
        change = TOPIC_CHANGES.get(api)
        items = body.get(change[0]) if change else None
        names = [_topic_name(i) for i in items if _refused_change(api, i)] if isinstance(items, list) else []
        if not names:
            self.forward(msg, CONTROLLER, body_of(body), frames=())
            return
        key, results, words = change
        how = " but as its coordinator does (cleanup.policy=compact, no other config but segment.bytes)" \
            if api == ApiKey.CREATE_TOPICS else ""
        refused = [{"name": n, "error_code": int(ErrorCode.INVALID_TOPIC_EXCEPTION),
                    "error_message": _internal_topic_refusal(n, words) + how} for n in dict.fromkeys(names)]
        rest = [i for i in items if not _refused_change(api, i)]
        if not rest:
            self.reply(msg, Response({results: refused}))
            return

        def merged(reply: Message) -> None:
            if reply.is_error:
                self.reply_error(msg, reply.error_code, reply.error_message)
                return
            answer = dict(reply.fields.body)
            answer[results] = list(answer.get(results) or ()) + refused
            self.reply(msg, reply.fields._replace(body=answer))

        self.request(CONTROLLER, body_of({**body, key: rest}), callback=merged, timeout=TOPIC_CHANGE_TIMEOUT)

    # ---- APIs ----------------------------------------------------------------------------
    def ping(self, msg: Message, body: dict) -> None:
        self.reply(msg, Response(body), msg.frames)

    def api_versions(self, msg: Message, body: dict) -> None:
        apis = [{"api_key": int(k), "name": k.name, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in SUPPORTED.items()]
        self.reply(msg, Response({"error_code": 0, "api_keys": apis}))

    def metadata(self, msg: Message, body: dict) -> None:
        requested = field(body, "topics", list, None)
        fields = msg.fields
        # All topics: those the principal may Describe; a topic asked for by name that it may
        # not: TOPIC_AUTHORIZATION_FAILED, whether it exists or not (Kafka's answers).
        names = [n for n in sorted(self.topics) if self.guard.allowed(fields, "Describe", "Topic", n)] \
            if requested is None else requested
        topics, missing = [], []
        for name in names:
            if not isinstance(name, str):
                raise BadRequest(f"field 'topics' must be a list of strings, got {type(name).__name__}")
            if requested is not None and not self.guard.allowed(fields, "Describe", "Topic", name):
                topics.append({"name": name, "error_code": int(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                               "error_message": f"not allowed to Describe topic '{name}'", "partitions": []})
                continue
            meta = self.topics.get(name)
            if meta is not None:
                topics.append(self._topic_metadata(name, meta))
                if body.get("include_topic_authorized_operations"):
                    topics[-1]["authorized_operations"] = self._operations(fields, "Topic", name)
                continue
            if is_internal_topic(name):  # created by its coordinator when first needed, never by a Metadata
                topics.append({"name": name, "error_code": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                               "error_message": f"internal topic '{name}' does not exist yet: the broker creates it "
                                                f"when its coordinator first needs it", "partitions": []})
                continue
            if self._auto_create(body) and not (self.guard.allowed(fields, "Create", "Topic", name) or
                                                self.guard.allowed(fields, "Create", "Cluster", "kafka-cluster")):
                topics.append({"name": name, "error_code": int(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                               "error_message": f"not allowed to Create topic '{name}'", "partitions": []})
                continue
            if self._auto_create(body):
                try:
                    check_topic_name(name)
                except OdradekError as exc:  # never created: say so (LEADER_NOT_AVAILABLE is retried forever)
                    topics.append({"name": name, "error_code": int(exc.code), "error_message": exc.message,
                                   "partitions": []})
                    continue
            missing.append(name)
            if self._auto_create(body):
                topics.append({"name": name, "error_code": int(ErrorCode.LEADER_NOT_AVAILABLE),
                               "error_message": f"topic '{name}' is being created", "partitions": []})
            else:
                topics.append({"name": name, "error_code": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                               "error_message": f"topic '{name}' does not exist", "partitions": []})
        if missing and self._auto_create(body):
            self.request(CONTROLLER, CreateTopics({"topics": [{"name": n} for n in missing]}), timeout=GATHER_TIMEOUT)
        if self.advertised[1] == 0 or any(p == 0 for _h, p in self.listener_addresses.values()):  # learn it once
            self._ask_status(lambda status: self._learn_address(status) or self._metadata(msg, topics))
        else:
            self._metadata(msg, topics)

    def _auto_create(self, body: dict) -> bool:
        # Only on request: Kafka clients always say (core/kafka/apis.py); the bundled client does not.
        return bool(self.config.get("auto.create.topics.enable")) and body.get("allow_auto_topic_creation") is True

    def _topic_metadata(self, name: str, meta: dict) -> dict:
        partitions = []
        for i, st in enumerate(meta.get("state") or ()):
            entry = {"index": i, "error_code": 0, "leader": st["leader"], "leader_epoch": st["leader_epoch"],
                     "replicas": st["replicas"], "isr": st["isr"]}
            if st["leader"] < 0:
                entry.update(error_code=int(ErrorCode.LEADER_NOT_AVAILABLE),
                             error_message=f"{name}-{i} has no live in-sync replica to lead it")
            partitions.append(entry)
        return {"name": name, "error_code": 0, "is_internal": is_internal_topic(name), "topic_id": meta["id"],
                "partitions": partitions}

    def _metadata(self, msg: Message, topics: list) -> None:
        brokers = []
        listener = msg.fields.listener
        for node, (host, port) in sorted(self.brokers.items(), key=lambda kv: int(kv[0])):
            if int(node) == self.broker_id:
                host, port = self.listener_addresses.get(listener, self.advertised)
            else:  # the other broker's address on the listener this request came in on, as Kafka answers
                host, port = (self.endpoints.get(node) or {}).get(listener) or (host, port)
            rack = self.racks.get(str(node))  # Kafka's nullable field: only brokers with broker.rack carry it
            brokers.append({"node_id": int(node), "host": host, "port": port, **({"rack": rack} if rack else {})})
        if not brokers:
            host, port = self.listener_addresses.get(msg.fields.listener, self.advertised)
            brokers = [{"node_id": self.broker_id, "host": host, "port": port}]
        asked = msg.fields.body.get("include_cluster_authorized_operations")
        self.reply(msg, Response({
            "cluster_id": self.config.get("cluster.id", "odradek"),
            "controller_id": self.controller_id,
            "brokers": brokers,
            "topics": topics,
            **({"cluster_authorized_operations": self._operations(msg.fields, "Cluster", CLUSTER)}
               if asked else {}),
        }))

    def _operations(self, fields: dict, resource: str, name: str) -> int:
        """Kafka's bit set (bit = ACL operation code) of the operations on a resource that the
        request's principal may perform, among those Kafka supports on its type (all of them
        with the authorizer off, as Kafka without an authorizer answers)."""
        return sum(1 << OPERATIONS[op] for op in SUPPORTED_OPERATIONS[resource]
                   if self.guard.allowed(fields, op, resource, name))

    def describe_configs(self, msg: Message, body: dict) -> None:
        topic_out = [self._describe_topic(res) for res in _topic_resources(body)]
        resources = self._broker_resources(body)
        if not resources:
            self.reply(msg, Response({"resources": topic_out}))
            return

        def answer(stored: dict, status: Message) -> None:
            live = self._handler_count(status)
            current = {**self.config, **stored}
            out = []
            for res, problem in resources:
                if problem:
                    out.append(problem)
                    continue
                wanted = _wanted(res)
                # as Kafka, every config it changes at run time, one without a value too (null)
                names = sorted({*current, *self.run_time_configs}) if not wanted else [
                    c["name"] if isinstance(c, dict) else c for c in wanted]
                configs = []
                for name in names:
                    if name not in current and name not in self.run_time_configs:
                        continue
                    value = live if name == "num.io.threads" and live else current.get(name)
                    source = "broker" if name in stored else "default" if name not in current else None
                    configs.append({"name": name, "value": None if value is None else _text(value),
                                    "dynamic": name in DYNAMIC_CONFIGS or name in self.run_time_configs,
                                    **({"source": source} if source else {})})
                out.append({"type": "broker", "name": res["name"], "error_code": 0, "error_message": "",
                            "configs": configs})
            self.reply(msg, Response({"resources": out + topic_out}))

        def with_stored(reply: Message) -> None:
            if reply.is_error:
                log.warning("the broker configs set at run time are not known (%s): described without them",
                            reply.error_message)
            stored = {} if reply.is_error else dict(reply.fields.configs or {})
            self._ask_status(lambda status: answer(stored, status))

        self.request(CONTROLLER, GetBrokerConfigs(), callback=with_stored, timeout=GATHER_TIMEOUT)

    def incremental_alter_configs(self, msg: Message, body: dict) -> None:
        resources = _topic_resources(body)
        locked = [r for r in resources if _locks_internal_state(r)]
        internal = [{"type": "topic", "name": r.get("name"), "error_code": int(ErrorCode.INVALID_TOPIC_EXCEPTION),
                     "error_message": _internal_topic_refusal(r.get("name"), "change " + ", ".join(
                         sorted(set(INTERNAL_TOPIC_LOCKED) & {c.get("name") for c in r.get("configs") or []
                                                              if isinstance(c, dict)})) + " of")}
                    for r in locked]
        topics = [r for r in resources if r not in locked]
        for res in topics:  # APPEND / SUBTRACT (Kafka's list ops) become a SET of the resulting list
            self._resolve_list_ops(res)
        if topics:  # the controller owns topic configs; broker ones are handled here
            def merged(reply: Message) -> None:
                rest = {**body, "resources": [r for r in body["resources"] if r not in resources]}
                done = internal + (reply.fields.body["resources"] if not reply.is_error else [
                    {"type": "topic", "name": r.get("name"), "error_code": reply.error_code,
                     "error_message": reply.error_message} for r in topics])
                if not rest["resources"]:
                    self.reply(msg, Response({"resources": done}))
                else:
                    self._alter_broker(msg, rest, done)
            self.request(CONTROLLER, AlterTopicConfigs({"resources": topics,
                                                        "validate_only": body.get("validate_only")}),
                         callback=merged, timeout=GATHER_TIMEOUT)
            return
        self._alter_broker(msg, body, internal)  # it answers the broker resources (topic ones: ``internal``)

    def _alter_broker(self, msg: Message, body: dict, done: list) -> None:
        resources = self._broker_resources(body)
        results, scale_to, rates, kept = list(done), None, {}, {}
        for res, problem in resources:
            if problem:
                results.append(problem)
                continue
            mine_rates, mine_kept = {}, {}  # a resource is changed whole or not at all
            try:
                scale_to = self._check_alter(res.get("configs") or [], mine_rates, mine_kept) or scale_to
            except OdradekError as exc:
                results.append(_resource_error(res["name"], exc.code, exc.message))
                continue
            rates.update(mine_rates)
            kept.update(mine_kept)
            results.append({"type": "broker", "name": res["name"], "error_code": 0, "error_message": ""})
        # the controller actor keeps them: the throttle rates (coordinator.throttles), then the
        # configs accepted without effect (controller_kit.BrokerConfigStore); then the rest
        stores = [(kind, changes) for kind, changes in ((SetThrottleRates, rates), (SetBrokerConfigs, kept)) if changes]
        if stores and not body.get("validate_only"):
            kind, changes = stores[0]
            rest = {**body, "resources": [{**r, "configs": [c for c in r.get("configs") or []
                                                            if c.get("name") not in changes]}
                                          for r in body.get("resources") or []]}

            def stored(reply: Message) -> None:
                if not reply.is_error:
                    self._alter_broker(msg, rest, done)
                    return
                for r in results[len(done):]:
                    if r["error_code"] == 0:
                        r["error_code"], r["error_message"] = reply.error_code, reply.error_message
                self.reply(msg, Response({"resources": results}))
            self.request(CONTROLLER, kind(changes), timeout=GATHER_TIMEOUT, callback=stored)
            return
        if scale_to is None:
            self.reply(msg, Response({"resources": results}))
            return

        def scaled(reply: Message) -> None:
            for r in results:
                if r["error_code"] == 0 and reply.is_error:
                    r["error_code"], r["error_message"] = reply.error_code, reply.error_message
            self.reply(msg, Response({"resources": results}))

        self.request(self.supervisor, Scale(HANDLER, scale_to), callback=scaled, timeout=SCALE_TIMEOUT)

    # ---- helpers ---------------------------------------------------------------------------
    def _resolve_list_ops(self, res: dict) -> None:
        """Rewrite a topic resource's ``append``/``subtract`` changes as ``set`` of the list
        they make from the topic's current value (its override, else the broker default)."""
        meta = self.topics.get(res.get("name")) or {}
        current: dict = {}
        for c in res.get("configs") or []:
            if not isinstance(c, dict) or c.get("op") not in ("append", "subtract"):
                continue
            name = c.get("name")
            if name not in current:
                value = (meta.get("configs") or {}).get(name, self.topic_defaults.get(name, ""))
                current[name] = [v.strip() for v in _text(value).split(",") if v.strip()]
            items = [v.strip() for v in str(c.get("value") or "").split(",") if v.strip()]
            if c["op"] == "append":
                current[name] += [v for v in items if v not in current[name]]
            else:
                current[name] = [v for v in current[name] if v not in items]
            c["op"], c["value"] = "set", ",".join(current[name])

    def _describe_topic(self, res: dict) -> dict:
        name = res.get("name")
        meta = self.topics.get(name)
        if meta is None:
            return {"type": "topic", "name": name, "error_code": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                    "error_message": f"topic '{name}' does not exist", "configs": []}
        wanted = _wanted(res)
        overrides = meta["configs"]
        configs = [{"name": k, "value": _text(overrides.get(k, v)), "source": "topic" if k in overrides else "default",
                    "read_only": False}  # with Kafka's configs accepted but not implemented that the topic sets
                   for k, v in sorted({**self.topic_defaults, **overrides}.items()) if not wanted or k in wanted]
        return {"type": "topic", "name": name, "error_code": 0, "error_message": "", "configs": configs}

    def _broker_resources(self, body: dict) -> list[tuple[dict, dict | None]]:
        """The request's broker resources, each with None or its per-resource error."""
        out = []
        for res in field(body, "resources", list):
            if not isinstance(res, dict):
                raise BadRequest("field 'resources' must be a list of maps")
            name = str(res.get("name", ""))
            if res.get("type") == "topic":
                continue
            if res.get("type") != "broker":
                out.append((res, _resource_error(name, ErrorCode.INVALID_REQUEST,
                                                 f"resource type {res.get('type')!r} is not supported "
                                                 f"('broker' or 'topic')")))
            elif name not in ("", str(self.broker_id)):
                out.append((res, _resource_error(name, ErrorCode.INVALID_REQUEST,
                                                 f"this is broker {self.broker_id}, not {name!r}")))
            else:
                out.append(({**res, "name": str(self.broker_id)}, None))
        return out

    def _check_alter(self, configs: list, rates: dict, kept: dict) -> int | None:
        """Validate a resource's changes; the new handler count, if any (throttle rates go
        into ``rates``, Kafka's dynamic configs Odradek does not implement into ``kept``, None
        for a delete). Raises INVALID_CONFIG."""
        count = None
        for c in configs:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise BadRequest("each config must be a map with a 'name'")
            name, value, op = c["name"], c.get("value"), c.get("op", "set")
            if name in self.run_time_configs:
                if op not in ("set", "delete"):
                    raise OdradekError(f"operation {op!r} on '{name}' is not supported (only 'set' and 'delete')",
                                       ErrorCode.INVALID_CONFIG)
                kept[name] = kafka_value(name, value, self.run_time_configs) if op == "set" else None
                continue
            if name not in DYNAMIC_CONFIGS:
                raise OdradekError(f"'{name}' is not a dynamic broker config here: Odradek changes "
                                   f"{', '.join(sorted(DYNAMIC_CONFIGS))} at run time and takes Kafka's other "
                                   f"dynamic broker configs without effect; set it in the broker's configuration",
                                   ErrorCode.INVALID_CONFIG)
            if name in THROTTLE_RATES:
                rates[name] = _throttle_rate(name, value, op)
                continue
            if op != "set":
                raise OdradekError(f"operation {op!r} on '{name}' is not supported (only 'set')",
                                   ErrorCode.INVALID_CONFIG)
            try:
                count = int(str(value).strip())
            except ValueError:
                raise OdradekError(f"'{name}' must be an integer, got {value!r}", ErrorCode.INVALID_CONFIG) from None
            if not 1 <= count <= 64:
                raise OdradekError(f"'{name}' must be from 1 to 64, got {count}", ErrorCode.INVALID_CONFIG)
        return count

    def _ask_status(self, callback: Callable[[Message], None]) -> None:
        """The supervisor's status (live pool size, bound address), without blocking."""
        if self.supervisor:
            self.request(self.supervisor, Status(), callback=callback, timeout=5.0)
        else:
            callback(Message("_error", 0, None, ErrorReply(-1, "no supervisor")))

    def _learn_address(self, status: Message) -> None:
        address = status.fields.supervisor.get("address") if not status.is_error else None
        if address and self.advertised[1] == 0:
            host, _, port = str(address).rpartition(":")
            if not self.config.get("advertised.listeners"):
                self.advertised = (host, int(port))
            else:
                self.advertised = (self.advertised[0], int(port))
        bound = status.fields.supervisor.get("listeners") if not status.is_error else None
        for name, address in (bound or {}).items():
            host, _, port = str(address).rpartition(":")
            mine = self.listener_addresses.get(name)
            if mine is not None and mine[1] == 0:
                self.listener_addresses[name] = (mine[0] if self.config.get("advertised.listeners") else host, int(port))

    @staticmethod
    def _handler_count(status: Message) -> int | None:
        if status.is_error:
            return None
        actors = status.fields.actors
        return sum(1 for a in actors if a.get("role") == HANDLER and a.get("state") not in ("retiring", "stopped"))


def _batch_problem(topic: str, partition: int, batch, compacted: bool, limit: int) -> tuple | None:
    """Check every batch's framing, CRC and records as Kafka's LogValidator does
    (``validate_produced``: no control bit, offsets and record count that agree with the
    records, sane timestamps, keys on a compacted topic, compressed records within ``limit``
    bytes) here, in the handler pool, so the partition's single writer need not (it still
    checks sizes and header fields). ``(code, message)``, plus the per-record errors
    ``[(batch index, message)]`` when some records were refused (KIP-467)."""
    try:
        validate_produced(batch, compacted=compacted, limit=limit)
    except RecordErrors as exc:
        return exc.code, f"{topic}-{partition}: {exc.message}", exc.record_errors
    except OdradekError as exc:
        return exc.code, f"{topic}-{partition}: {exc.message}"
    return None


def _topic_name(item):
    """The topic an item of a topic change names: a name, or a map with one."""
    return item.get("name") if isinstance(item, dict) else item


def _refused_change(api: int, item) -> bool:
    """Whether an item of a topic change names an internal topic a client may not change:
    any change but a creation as its coordinator asks for it (compacted, no other config but
    segment.bytes, no assignment). A client may create it so: the same topic its coordinator
    would make; it gets no say in how its state is kept."""
    if not is_internal_topic(_topic_name(item)):
        return False
    if api != ApiKey.CREATE_TOPICS:
        return True
    configs = item.get("configs")
    return not (isinstance(configs, dict) and configs.get("cleanup.policy") == "compact"
                and set(configs) <= {"cleanup.policy", "segment.bytes"} and not item.get("assignments"))


# The configs of an internal topic no client may change, with the value each must keep: they
# decide whether its coordinator's state is kept at all (delete instead of compact would drop
# groups' offsets and open transactions; Kafka's replace-all AlterConfigs resets it so too).
# The others (the replication throttles a reassignment sets, segment size, ...) an operator
# may set, as in Kafka.
INTERNAL_TOPIC_LOCKED = {"cleanup.policy": "compact"}


def _locks_internal_state(res: dict) -> bool:
    """Whether an alter of topic resource ``res`` would change a locked config of an internal topic."""
    return is_internal_topic(res.get("name")) and any(
        isinstance(c, dict) and c.get("name") in INTERNAL_TOPIC_LOCKED
        and not (c.get("op", "set") == "set" and c.get("value") == INTERNAL_TOPIC_LOCKED[c["name"]])
        for c in res.get("configs") or [])


def _internal_topic_refusal(name: str, change: str) -> str:
    return (f"cannot {change} internal topic '{name}': it holds the broker's own state (groups' offsets or "
            f"transactions), which only its coordinator writes")


def _names_internal_topic(body: dict) -> bool:
    topics = body.get("topics")
    return isinstance(topics, list) and any(isinstance(t, dict) and is_internal_topic(t.get("name")) for t in topics)


def _without_internal_partitions(body: dict, change: str) -> tuple[dict, list]:
    """A Produce's or DeleteRecords' body without its internal topics, and a PartError
    (INVALID_TOPIC_EXCEPTION) for each of their partitions. A body of another shape is
    returned as it is, for the API's own checks to refuse."""
    if not _names_internal_topic(body):
        return body, []
    kept, refused = [], []
    for t in body["topics"]:
        if not (isinstance(t, dict) and is_internal_topic(t.get("name"))):
            kept.append(t)
            continue
        for p in t.get("partitions") if isinstance(t.get("partitions"), list) else ():
            index = p.get("index") if isinstance(p, dict) else None
            refused.append(PartError(t["name"], index, int(ErrorCode.INVALID_TOPIC_EXCEPTION),
                                     _internal_topic_refusal(t["name"], change)))
    return {**body, "topics": kept}, refused


def _topic_resources(body: dict) -> list[dict]:
    resources = body.get("resources")
    if not isinstance(resources, list):
        raise BadRequest("missing field 'resources' (a list of maps)")
    return [r for r in resources if isinstance(r, dict) and r.get("type") == "topic"]


# The fields of a failed partition's entry, per API (besides index, error_code, error_message).
PRODUCE_ERROR = {"base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1}
DELETE_RECORDS_ERROR = {"low_watermark": -1}
EPOCH_ERROR = {"leader_epoch": -1, "end_offset": -1}
FETCH_ERROR = {"high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1, "records_size": 0}


def _partition_body(errors: list, topics, blank: dict, record_errors: dict | None = None) -> dict:
    """A per-partition response body from merged partition entries and early errors;
    ``record_errors``, ``{(topic, partition): [(batch index, message)]}``, goes in those
    partitions' entries (a produce's KIP-467 per-record errors)."""
    out = {name: list(parts) for name, parts in topics}
    for name, index, code, message in errors:
        entry = {"index": index, "error_code": code, "error_message": message, **blank}
        if record_errors and (name, index) in record_errors:
            entry["record_errors"] = record_errors[name, index]
        out.setdefault(name, []).append(entry)
    return {"topics": [{"name": name, "partitions": parts} for name, parts in out.items()]}


def _text(value) -> str:
    """A config value as Kafka prints it (``true``/``false`` for booleans)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _resource_error(name: str, code: int, message: str) -> dict:
    return {"type": "broker", "name": name, "error_code": int(code), "error_message": message}


def _advertised(config: dict) -> tuple[str, int]:
    listener = config.get("advertised.listeners") or config.get("listeners") or "PLAINTEXT://127.0.0.1:9092"
    return parse_listener(listener)
