"""Broker configuration: one TOML file, Kafka's property names, ``--set key=value`` overrides.

Every setting is declared once in ``SETTINGS`` (type, default, meaning, checks); docs/CONFIG.md
lists the same table and a test keeps the two in step. Loading is strict: an unknown key, a
value of the wrong type or out of range stops start-up with a message naming the setting.

Kafka's other broker configs (``odradek.kafka_configs``: every name of Kafka 3.0 to 3.9) are
accepted, checked as Kafka checks them, with a warning: they have no effect here.

TOML accepts both spellings Kafka users reach for::

    "log.dirs" = "/var/lib/odradek"      # a quoted flat key
    [num]                                 # or nested tables, joined with dots
    io.threads = 4

The resolved config is a plain ``dict`` (name -> value) so it crosses process boundaries.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import logging
import os
import tomllib
from typing import Any, Callable

from odradek.kafka_configs import BROKER_CONFIGS as KAFKA_BROKER_CONFIGS
from odradek.kafka_configs import DEPRECATED as KAFKA_DEPRECATED
from odradek.kafka_configs import DYNAMIC as KAFKA_DYNAMIC
from odradek.kafka_configs import LISTENER_PREFIX_ONLY as KAFKA_LISTENER_PREFIX_ONLY
from odradek.core.config import kafka_value
from odradek.core.errors import InvalidConfigError
from odradek.network import listeners as _listeners
from odradek.core.protocol import ErrorCode, OdradekError, parse_listener


log = logging.getLogger("odradek.config")


class ConfigError(OdradekError):
    code = ErrorCode.INVALID_CONFIG


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None  # returns a problem, or None
    dynamic: bool = False  # changeable at run time (IncrementalAlterConfigs)


def _at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be at least {n}"


def _between(lo: int, hi: int) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be from {lo} to {hi}"


def _listener(v: str) -> str | None:
    try:
        _listeners.parse(v, None)  # names are checked against the map in ``load``
    except ValueError as exc:
        return str(exc)
    return None


def _protocol_map(v: str) -> str | None:
    try:
        _listeners.parse_map(v)
    except ValueError as exc:
        return str(exc)
    return None


def _admin_listener(v: str) -> str | None:
    if not v:
        return None
    host, sep, port = v.rpartition(":")
    digits = port[1:] if port.startswith("+") else port
    if not sep or not host or not digits.isdigit() or int(digits) > 65535:
        return "must be host:port, host:+N (the Kafka port plus N) or empty (off)"
    return None


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


SETTINGS: dict[str, Setting] = {s.name: s for s in [
    # --- identity and listeners ---
    Setting("broker.id", int, 0, "This broker's id, unique in a cluster.", _at_least(0)),
    Setting("cluster.id", str, "odradek", "The cluster's name, reported in Metadata."),
    Setting("listeners", str, "PLAINTEXT://127.0.0.1:9092",
            "Addresses the acceptor listens on, comma-separated `NAME://host:port` (e.g. "
            "`PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093`); NAME is a security protocol (PLAINTEXT, "
            "SSL, SASL_PLAINTEXT, SASL_SSL) or a name mapped to one by `listener.security.protocol.map`; "
            "port 0 picks a free port. Each listener serves both the native protocol and Kafka's.", _listener),
    Setting("advertised.listeners", str, "",
            "Addresses given to clients in Metadata, `NAME://host:port` per listener (a client is given the "
            "address of the listener it came in on, for every broker of a cluster: each listener's address is "
            "registered in ZooKeeper); a listener left out, or empty, means its own address; port 0 "
            "means the listener's bound port. `odradek chaos` points it at a fault proxy.",
            lambda v: None if not v else _listener(v)),
    Setting("listener.security.protocol.map", str, "",
            "Listener names other than the protocols' own, `NAME:PROTOCOL,...` (e.g. `CLIENT:SASL_SSL,"
            "REPLICATION:SSL`), as in Kafka.", _protocol_map),
    Setting("inter.broker.listener.name", str, "",
            "The listener the brokers of a cluster reach each other on (replica fetcher, controller channel), "
            "with its security protocol; empty means the first listener. Every broker registers all its "
            "listeners in ZooKeeper; give all brokers the same listener names."),
    Setting("sasl.mechanism.inter.broker.protocol", str, "SCRAM-SHA-512",
            "The SASL mechanism a broker signs in with on a SASL_PLAINTEXT/SASL_SSL inter-broker listener.",
            lambda v: None if v in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") else
            "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    Setting("sasl.inter.broker.username", str, "",
            "The user (`odradek users --add`) a broker signs in as on a SASL inter-broker listener; with "
            "`authorizer` on, make `User:<it>` a super user (or grant it ClusterAction)."),
    Setting("sasl.inter.broker.password.file", str, "",
            "A file (keep it mode 0600) holding the password of `sasl.inter.broker.username`; the password "
            "itself is never a setting, so it is never shown by DescribeConfigs or logged."),
    # --- security (docs/SECURITY.md) ---
    Setting("ssl.certfile", str, "", "PEM certificate chain of this broker's TLS listeners (SSL, SASL_SSL)."),
    Setting("ssl.keyfile", str, "", "PEM private key of `ssl.certfile` (unencrypted; keep it mode 0600)."),
    Setting("ssl.cafile", str, "", "PEM CA certificates that client certificates must chain to (mutual TLS); "
            "empty: the system's default CAs."),
    Setting("ssl.client.auth", str, "none", "Mutual TLS on SSL/SASL_SSL listeners: `required` (a client "
            "without a certificate the CA signed is refused), `requested` (checked when given) or `none`. On an "
            "SSL listener the principal is `User:<certificate subject>`, e.g. `User:CN=alice,O=example`.",
            _one_of("required", "requested", "none")),
    Setting("sasl.enabled.mechanisms", str, "SCRAM-SHA-256,SCRAM-SHA-512",
            "SASL mechanisms offered on SASL_PLAINTEXT/SASL_SSL listeners (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512); "
            "users and their credentials are managed with `odradek users`. PLAIN is opt-in: it sends the "
            "password itself, in clear on a SASL_PLAINTEXT listener (the broker warns at start).",
            lambda v: None if v and all(m.strip() in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
                                        for m in v.split(",")) else
            "must list PLAIN, SCRAM-SHA-256 and/or SCRAM-SHA-512"),
    Setting("failed.authentication.delay.ms", int, 100,
            "A failed authentication is answered (and its connection closed) this long after it arrived, "
            "which slows password guessing.", _between(0, 60000)),
    Setting("sasl.server.max.receive.size", int, 524288,
            "Largest frame, in bytes, a connection on a SASL listener may send before it has authenticated "
            "(Kafka's name and default, 512 KiB); a larger one closes the connection at once, logged.",
            _at_least(1024)),
    Setting("authorizer", bool, False, "Check every request against the ACLs (`odradek acls`); the principal "
            "is the SASL user (`User:name`), the TLS certificate subject, or `User:ANONYMOUS`."),
    Setting("super.users", str, "", "Principals allowed everything, `;`-separated (`User:admin;User:broker`)."),
    Setting("allow.everyone.if.no.acl.found", bool, False,
            "With `authorizer` on: a resource no ACL matches is open to everyone (off: only super users)."),
    Setting("admin.listener", str, "127.0.0.1:+1000",
            "HTTP address of the metrics actor: `/metrics` (Prometheus), `/health/live`, `/health/ready` "
            "and the web console. `host:port`, or `host:+N` for the Kafka listener's port plus N (an "
            "ephemeral port when that is 0 or the sum is over 65535); empty turns it off. A port that "
            "cannot be bound is logged and leaves the broker running without HTTP.", _admin_listener),
    Setting("schema.registry.listener", str, "127.0.0.1:+2000",
            "HTTP address of the schema registry (Confluent's Schema Registry REST API, docs/SCHEMAS.md). "
            "`host:port`, or `host:+N` for the Kafka listener's port plus N (an ephemeral port when that is 0 "
            "or the sum is over 65535); empty turns it off. Not served in cluster mode yet.", _admin_listener),
    Setting("http.proxy.listener", str, "127.0.0.1:+3000",
            "HTTP address of the HTTP proxy (Confluent REST Proxy's v3 produce and v2 consumers, docs/SCHEMAS.md). "
            "`host:port`, or `host:+N` for the Kafka listener's port plus N (an ephemeral port when that is 0 "
            "or the sum is over 65535); empty turns it off. With SASL listeners it asks for HTTP Basic "
            "credentials (a SCRAM user) and acts as that user.", _admin_listener),
    Setting("metrics.partition.level", bool, False,
            "Export per-partition series on `/metrics` (log size, segments, offsets, leadership, replica "
            "health; a group's committed offset and lag per partition). Off: the same numbers summed per "
            "topic (and per group and topic for lag), as kafka-exporter's `_sum` series, so a broker with "
            "10,000 partitions answers a scrape with a few hundred series instead of over 80,000."),
    Setting("log.dirs", str, "./odradek-data",
            "Directory holding the partitions' logs and the broker's run files (comma-separated; the first is used)."),
    Setting("run.dir", str, "",
            "Directory for the actors' ipc sockets and the pid file; empty means `<log.dirs>/run` "
            "(or a short path under /tmp when that would be too long for a Unix socket). Created 0700; "
            "refused if it is another user's, a symlink, or writable by others."),
    # --- network edge ---
    Setting("num.network.threads", int, 2, "Processor actors: each owns a share of the client connections.",
            _between(1, 64)),
    Setting("num.io.threads", int, 2, "Request handler actors (a pool); changeable at run time with "
            "`odradek configs --alter num.io.threads=N`.", _between(1, 64), dynamic=True),
    Setting("socket.request.max.bytes", int, 104857600, "Largest request a processor accepts, in bytes.",
            _at_least(1024)),
    Setting("max.connections", int, 1000, "Connections the acceptor admits in all; at the limit a new one "
            "takes the place of the least recently used idle one, if there is one.", _at_least(1)),
    Setting("max.connections.per.ip", int, 500, "Connections the acceptor admits from one IP address (below "
            "`max.connections`, so one address cannot lock the others out).", _at_least(1)),
    Setting("max.connection.creation.rate", int, 2147483647,
            "New connections the acceptor takes per second, all listeners together (a burst of one second's "
            "worth); faster ones wait in the kernel's listen backlog. Per IP address: the "
            "`connection_creation_rate` quota (`odradek configs --entity-type ips`).", _at_least(1)),
    Setting("connections.max.idle.ms", int, 600000, "A connection silent this long is closed.", _at_least(100)),
    Setting("queued.max.requests", int, 500,
            "Requests one processor keeps in flight before it stops reading its sockets.", _at_least(1)),
    Setting("queued.max.request.bytes", int, 104857600, "Bytes of requests one processor holds (received, never "
            "merely announced, and not yet answered) before it stops reading its connections; one of them may "
            "still finish the frame it is in the middle of.", _at_least(1024)),
    Setting("request.timeout.ms", int, 30000,
            "A request still unanswered after this long gets REQUEST_TIMED_OUT from its processor; a connection "
            "whose request has not arrived whole this long after its first byte is closed.", _at_least(100)),
    # --- topics and logs (broker-wide defaults; topics override them by topic-level name) ---
    Setting("num.partitions", int, 1, "Partitions of a topic created without a count.", _between(1, 10000)),
    Setting("default.replication.factor", int, 1, "Replication factor of a topic created without one.",
            _at_least(1)),
    Setting("auto.create.topics.enable", bool, True,
            "Create a topic (num.partitions, default.replication.factor) when a client asks Metadata for it "
            "with allow_auto_topic_creation set, as Kafka clients do (Kafka's default); the bundled client "
            "never sets it."),
    Setting("num.log.threads", int, 2,
            "Processes hosting the partitions' log actors; each partition is placed on one by a stable "
            "hash, and each is the single writer of its partitions.", _between(1, 64)),
    Setting("log.segment.bytes", int, 1073741824, "Topic default for `segment.bytes`: roll a segment at this size.",
            _at_least(1024)),
    Setting("log.segment.bytes.min", int, 1048576,
            "Smallest `segment.bytes` a topic may be given (Kafka's floor: 1 MiB; tiny segments cost a file, "
            "and descriptors, per batch). Test-only: lower it (to as little as 14) to test logs of many segments.",
            _at_least(14)),
    Setting("log.roll.ms", int, 604800000, "Topic default for `segment.ms`: roll a segment this old.", _at_least(1)),
    Setting("log.retention.ms", int, 604800000,
            "Topic default for `retention.ms`: delete closed segments older than this; -1 keeps forever.",
            _at_least(-1)),
    Setting("log.retention.bytes", int, -1,
            "Topic default for `retention.bytes`: delete oldest segments beyond this size per partition; -1 no limit.",
            _at_least(-1)),
    Setting("log.retention.check.interval.ms", int, 300000, "How often log actors apply retention.", _at_least(10)),
    Setting("producer.id.expiration.ms", int, 86400000,
            "A partition forgets an idempotent producer idle this long (its next batch must then restart at "
            "sequence 0); checked on the retention timer.", _at_least(1)),
    Setting("transaction.max.timeout.ms", int, 900000,
            "The longest `transaction.timeout.ms` a transactional producer may ask for (InitProducerId "
            "refuses more with INVALID_TRANSACTION_TIMEOUT).", _at_least(1)),
    Setting("transaction.abort.timed.out.transaction.cleanup.interval.ms", int, 10000,
            "How often the transaction coordinator aborts transactions open past their timeout.", _at_least(10)),
    Setting("transaction.state.log.num.partitions", int, 8,
            "Partitions of `__transaction_state` in a cluster, read when it is created (one on a single "
            "broker): the coordinator of a transactional id is the leader of its partition, so more "
            "partitions spread coordinators over brokers (Kafka's default is 50).", _between(1, 1000)),
    Setting("transaction.state.log.replication.factor", int, 3,
            "Replication factor of `__transaction_state` in a cluster (capped at the live brokers when it "
            "is created).", _at_least(1)),
    Setting("log.index.interval.bytes", int, 4096, "Topic default for `index.interval.bytes`.", _at_least(0)),
    Setting("log.index.size.max.bytes", int, 10485760, "Topic default for `segment.index.bytes`.", _at_least(1024)),
    Setting("log.flush.interval.messages", int, (1 << 63) - 1,
            "Topic default for `flush.messages`: fsync after this many records (1 = every append).", _at_least(1)),
    Setting("log.flush.interval.ms", int, (1 << 63) - 1, "Topic default for `flush.ms`.", _at_least(0)),
    Setting("log.flush.before.ack", bool, True,
            "Acknowledge a write only once it is fsynced: acks=1 on the leader's disk, acks=all on the disk "
            "of every in-sync replica (one fsync covers every batch appended meanwhile: group commit). "
            "false is Kafka's way: acknowledged from the page cache, so a power cut of every in-sync replica "
            "at once loses what they had not fsynced (docs/RELIABILITY.md). Same on every broker."),
    Setting("log.flush.scheduler.interval.ms", int, 1000, "How often log actors check `flush.ms`.", _at_least(10)),
    Setting("log.flush.offset.checkpoint.interval.ms", int, 60000,
            "How often log actors write the recovery-point and high-watermark checkpoints.", _at_least(100)),
    Setting("log.cleanup.policy", str, "delete", "Topic default for `cleanup.policy`.",
            _one_of("delete", "compact", "compact,delete", "delete,compact")),
    Setting("log.cleaner.backoff.ms", int, 15000, "How often log actors look for logs to compact.", _at_least(10)),
    Setting("log.cleaner.delete.retention.ms", int, 86400000, "Topic default for `delete.retention.ms`.",
            _at_least(0)),
    Setting("log.cleaner.min.compaction.lag.ms", int, 0, "Topic default for `min.compaction.lag.ms`.", _at_least(0)),
    Setting("log.cleaner.min.cleanable.ratio", float, 0.5, "Topic default for `min.cleanable.dirty.ratio`.",
            lambda v: None if 0.0 <= v <= 1.0 else "must be from 0.0 to 1.0"),
    Setting("log.segment.delete.delay.ms", int, 60000, "Topic default for `file.delete.delay.ms`.", _at_least(0)),
    Setting("log.message.timestamp.type", str, "CreateTime", "Topic default for `message.timestamp.type`.",
            _one_of("CreateTime", "LogAppendTime")),
    Setting("message.max.bytes", int, 1048588, "Topic default for `max.message.bytes`: largest record batch.",
            _at_least(64)),
    # --- consumer groups (the group coordinator actor) ---
    Setting("offsets.topic.num.partitions", int, 8,
            "Partitions of `__consumer_offsets`, read when the coordinator creates it. Kafka's 50 spread "
            "coordinators over brokers; here one coordinator actor serves every group, so partitions only "
            "spread its writes over the log actors and keep each compaction small: 8 covers the usual "
            "`num.log.threads` without 150 idle files.", _between(1, 1000)),
    Setting("offsets.topic.segment.bytes", int, 104857600,
            "`segment.bytes` of `__consumer_offsets` (small segments compact sooner).", _at_least(1024)),
    Setting("offsets.retention.minutes", int, 10080,
            "Committed offsets of a group with no members expire this long after the later of their "
            "commit and the group becoming empty.", _at_least(1)),
    Setting("offsets.retention.check.interval.ms", int, 600000, "How often expired offsets are looked for.",
            _at_least(10)),
    Setting("offset.metadata.max.bytes", int, 4096, "Largest `committed_metadata` string of a commit.",
            _at_least(0)),
    Setting("group.consumer.session.timeout.ms", int, 45000,
            "A member that sends no heartbeat for this long is removed (a client may ask for another value "
            "within the min/max below).", _at_least(1)),
    Setting("group.consumer.min.session.timeout.ms", int, 1000, "Shortest session timeout a member may ask for.",
            _at_least(1)),
    Setting("group.consumer.max.session.timeout.ms", int, 1800000, "Longest session timeout a member may ask for.",
            _at_least(1)),
    Setting("group.consumer.heartbeat.interval.ms", int, 3000,
            "Longest time the coordinator holds a member's heartbeat when nothing changed for it; any "
            "change for the member answers it at once.", _at_least(10)),
    Setting("group.consumer.assignors", str, "uniform,range",
            "Server-side assignors, comma-separated; the first is the default.",
            lambda v: None if v and all(a.strip() in ("uniform", "range") for a in v.split(","))
            else "must list uniform and/or range"),
    Setting("group.max.size", int, 1000, "Members one consumer group admits.", _at_least(1)),
    Setting("group.initial.rebalance.delay.ms", int, 3000,
            "Classic groups: how long the first rebalance of an empty group waits for more members to join "
            "(each new member extends it, up to the rebalance timeout), as Kafka's.", _at_least(0)),
    Setting("group.min.session.timeout.ms", int, 6000,
            "Classic groups: shortest session timeout a member may ask for in its JoinGroup.", _at_least(1)),
    Setting("group.max.session.timeout.ms", int, 1800000,
            "Classic groups: longest session timeout a member may ask for in its JoinGroup.", _at_least(1)),
    Setting("group.classic.max.metadata.bytes", int, 1048576,
            "Classic groups: largest protocol metadata one member may send in a JoinGroup, and largest "
            "assignment a leader may give one member (Kafka bounds them only by the request size; a bound "
            "keeps a group's stored record and the coordinator's memory in check).", _at_least(1024)),
    # --- replication and cluster mode ---
    Setting("zookeeper.connect", str, "",
            "ZooKeeper ensemble (`host:port[,host:port...][/chroot]`) of a cluster. Empty: single-broker mode, "
            "no ZooKeeper."),
    Setting("zookeeper.session.timeout.ms", int, 18000,
            "ZooKeeper session timeout: a broker silent this long is dead to the cluster (its partitions get "
            "new leaders).", _at_least(1000)),
    Setting("zookeeper.connection.timeout.ms", int, 18000,
            "Time a broker waits for ZooKeeper at start before giving up (a controller actor restarted in a "
            "running broker waits as long as it takes).", _at_least(100)),
    Setting("controller.socket.timeout.ms", int, 30000,
            "Time one controller-to-broker request (LeaderAndIsr, UpdateMetadata, StopReplica) waits for its "
            "answer before its connection is closed and the request sent again on a new one.", _at_least(100)),
    Setting("min.insync.replicas", int, 1,
            "Topic default for `min.insync.replicas`: in-sync replicas an acks=all write needs, or it is "
            "refused with NOT_ENOUGH_REPLICAS.", _at_least(1)),
    Setting("unclean.leader.election.enable", bool, False,
            "Topic default for `unclean.leader.election.enable`: elect a replica outside the ISR when no "
            "in-sync one is alive (may lose committed records)."),
    Setting("replica.lag.time.max.ms", int, 30000,
            "A follower that has not caught up with the leader for this long leaves the ISR.", _at_least(10)),
    Setting("replica.fetch.wait.max.ms", int, 500,
            "Longest time a follower's fetch waits at the leader for new data.", _at_least(0)),
    Setting("replica.fetch.min.bytes", int, 1, "Bytes a follower's fetch waits for.", _at_least(1)),
    Setting("replica.fetch.max.bytes", int, 1048576, "Bytes a follower asks for per partition.", _at_least(1024)),
    Setting("replica.fetch.response.max.bytes", int, 10485760, "Bytes a follower asks for per fetch.",
            _at_least(1024)),
    Setting("replica.fetch.backoff.ms", int, 1000,
            "Pause before a follower retries a leader it failed to fetch from.", _at_least(0)),
    Setting("auto.leader.rebalance.enable", bool, True,
            "The controller moves leadership back to each partition's preferred replica (the first one) "
            "when it is in sync."),
    Setting("leader.imbalance.check.interval.seconds", int, 300,
            "How often the controller checks for partitions not led by their preferred replica.", _at_least(1)),
    Setting("offsets.topic.replication.factor", int, 3,
            "Replication factor of `__consumer_offsets` (capped at the live brokers when it is created).",
            _at_least(1)),
    Setting("leader.replication.throttled.rate", int, 2 ** 63 - 1,
            "Bytes/s a leader serves to the replicas reassignments are adding (its fetches beyond it "
            "get no data until the rate catches up); the default is no limit. Dynamic: "
            "`odradek reassign --execute --throttle` sets it on the brokers.", _at_least(1), dynamic=True),
    Setting("follower.replication.throttled.rate", int, 2 ** 63 - 1,
            "Bytes/s a broker fetches for the replicas reassignments are adding on it; the default is "
            "no limit. Dynamic, like the leader's.", _at_least(1), dynamic=True),
    Setting("log.stray.delete.delay.ms", int, 300000,
            "A partition directory this broker holds no replica of (moved away or deleted while it was "
            "down) is removed once the cluster metadata has said so for this long.", _at_least(0)),
    Setting("broker.rack", str, "",
            "This broker's rack (or zone). When every broker has one, new partitions and `odradek reassign "
            "--generate` place each partition's replicas on distinct racks where there are enough."),
    Setting("controlled.shutdown.enable", bool, True,
            "On SIGTERM a cluster broker first stops following and asks the controller to move its "
            "leaderships away and take it out of the ISRs (CONTROLLED_SHUTDOWN)."),
    # --- supervision ---
    Setting("shutdown.timeout.ms", int, 30000, "Time the supervisor gives the actors to stop on SIGTERM.",
            _at_least(100)),
    Setting("supervisor.max.restarts", int, 5,
            "Restarts of one actor within `supervisor.restart.window.ms` before the broker shuts down.",
            _at_least(0)),
    Setting("supervisor.restart.window.ms", int, 60000, "Window for `supervisor.max.restarts`.", _at_least(1)),
    Setting("supervisor.restart.backoff.ms", int, 100,
            "First restart delay; it doubles with each restart in the window, up to 5 s.", _at_least(0)),
    Setting("supervisor.liveness.timeout.ms", int, 30000,
            "An actor that sends no heartbeat for this long is killed and restarted.", _at_least(1000)),
    Setting("actor.memory.limit.bytes", int, 0,
            "An actor whose resident memory passes this is restarted; 0 means no limit.", _at_least(0)),
    Setting("actor.start.timeout.ms", int, 120000,
            "Time an actor has to report ready at start (log actors recover their partitions first: "
            "thousands of partitions after a crash can take tens of seconds).", _at_least(100)),
    Setting("log.level", str, "INFO", "Logging level of every actor.",
            _one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")),
]}


def _flatten(table: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


# Per-listener settings, Kafka's ``listener.name.<name>.<setting>`` (the listener's name in
# lower case, as Kafka writes it): the table's ``<name>`` stands for any listener's name.
LISTENER_PREFIX = "listener.name."
LISTENER_SETTINGS: dict[str, Setting] = {s.name: s for s in [
    Setting("listener.name.<name>.max.connections", int, 0,
            "Connections the acceptor admits on this listener (besides `max.connections` for all); at the "
            "limit new ones wait in the kernel's listen backlog until one of its connections closes. 0: no "
            "limit of its own.", _at_least(0)),
    Setting("listener.name.<name>.max.connection.creation.rate", int, 0,
            "New connections the acceptor takes per second on this listener (a burst of one second's worth; "
            "besides `max.connection.creation.rate` for all); faster ones wait in the backlog. 0: no limit "
            "of its own.", _at_least(0)),
]}


def _listener_setting(name: str) -> tuple[str, Setting] | None:
    """``listener.name.CLIENT.max.connections`` -> its canonical (lower-case) name and its
    table entry; None for any other name."""
    if not name.lower().startswith(LISTENER_PREFIX):
        return None
    listener, _, rest = name[len(LISTENER_PREFIX):].partition(".")
    setting = LISTENER_SETTINGS.get(f"{LISTENER_PREFIX}<name>.{rest}")
    if not listener or setting is None:
        return None
    return f"{LISTENER_PREFIX}{listener.lower()}.{rest}", setting


def canonical(name: str) -> str:
    """A setting's name as the config dict holds it (a listener's name in lower case)."""
    found = _listener_setting(name)
    return found[0] if found else name


def _unknown(name: str) -> ConfigError:
    near = difflib.get_close_matches(name, SETTINGS, n=1)
    hint = f"; did you mean '{near[0]}'?" if near else "; see docs/CONFIG.md for every setting"
    return ConfigError(f"unknown setting '{name}'{hint}")


def coerce(name: str, value: Any, from_text: bool = False) -> Any:
    """Check one value; ``from_text`` values (``--set``, AlterConfigs) are converted from
    strings first, TOML values must already have the right type. Raises ConfigError."""
    setting = SETTINGS.get(name)
    if setting is None and _listener_setting(name):
        setting = _listener_setting(name)[1]
    if setting is None:
        if name in KAFKA_BROKER_CONFIGS:  # Kafka's, not implemented here: checked as Kafka does, kept, no effect
            try:
                value = kafka_value(name, value, KAFKA_BROKER_CONFIGS, "setting")
            except InvalidConfigError as exc:
                raise ConfigError(f"setting {exc.message}") from None
            log.warning("setting %r is accepted as Kafka does%s, but has no effect in Odradek (docs/CONFIG.md)", name,
                        " (deprecated in Kafka)" if name in KAFKA_DEPRECATED else "")
            return value
        raise _unknown(name)
    if from_text and isinstance(value, str) and setting.type is not str:
        text = value.strip()
        try:
            if setting.type is bool:
                if text.lower() not in ("true", "false"):
                    raise ValueError
                value = text.lower() == "true"
            else:
                value = setting.type(text)
        except ValueError:
            raise ConfigError(f"setting '{name}' expects {setting.type.__name__}, got {value!r}") from None
    if setting.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if setting.type is int and isinstance(value, bool) or not isinstance(value, setting.type):
        raise ConfigError(f"setting '{name}' expects {setting.type.__name__}, got {value!r}")
    if setting.check is not None:
        problem = setting.check(value)
        if problem:
            raise ConfigError(f"setting '{name}' = {value!r}: {problem}")
    return value


def load(path: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Defaults, then the TOML file, then ``key=value`` overrides, each checked."""
    config = {name: s.default for name, s in SETTINGS.items()}
    if path:
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        for name, value in _flatten(table).items():
            config[canonical(name)] = coerce(name, value)
    for item in overrides or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        config[canonical(name.strip())] = coerce(name.strip(), value, from_text=True)
    _check_listeners(config)
    return config


def kafka_run_time_configs() -> dict:
    """Kafka's dynamic broker configs that Odradek does not implement, which AlterConfigs on
    the broker accepts without effect as the config file does (name -> Kafka's check, for
    ``core.config.kafka_value``; the request handlers get it). Left out, so refused at run time:
    those Kafka takes only with a listener prefix, and passwords (Kafka stores a dynamic
    password only encrypted with password.encoder.secret; Odradek has no such encoder)."""
    return {name: KAFKA_BROKER_CONFIGS[name] for name in sorted(KAFKA_DYNAMIC - KAFKA_LISTENER_PREFIX_ONLY)
            if name not in SETTINGS and KAFKA_BROKER_CONFIGS[name][0] != "password"}


def data_dir(config: dict) -> str:
    return os.path.abspath(config["log.dirs"].split(",")[0].strip())


# A Unix socket path must fit in sun_path (108 bytes on Linux) with the longest mailbox name.
_MAX_RUN_DIR = 80


def run_dir(config: dict) -> str:
    """Where the actors' sockets live. Deterministic from the config, so ``odradek status``
    finds a broker started with the same settings."""
    if config.get("run.dir"):
        return os.path.abspath(config["run.dir"])
    path = os.path.join(data_dir(config), "run")
    if len(path) <= _MAX_RUN_DIR:
        return path
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    return os.path.join("/tmp", f"odradek-run-{digest}")


def advertised(config: dict) -> tuple[str, int]:
    return parse_listener(config["advertised.listeners"] or config["listeners"])


def _check_listeners(config: dict) -> None:
    """Listener names against the map; TLS listeners need a certificate and key."""
    try:
        found = _listeners.of_config(config)
    except ValueError as exc:
        raise ConfigError(f"setting 'listeners': {exc}") from None
    if any(l.tls for l in found) and not (config["ssl.certfile"] and config["ssl.keyfile"]):
        raise ConfigError("an SSL or SASL_SSL listener needs 'ssl.certfile' and 'ssl.keyfile' (PEM files)")
    for key in config:
        if key.startswith(LISTENER_PREFIX) and _listener_setting(key):
            listener = key[len(LISTENER_PREFIX):].partition(".")[0].upper()
            if listener not in {l.name for l in found}:
                raise ConfigError(f"setting '{key}' names listener {listener!r}, which is none of the listeners "
                                  f"({', '.join(l.name for l in found)})")
    name = config["inter.broker.listener.name"].upper()
    if name and name not in {l.name for l in found}:
        raise ConfigError(f"setting 'inter.broker.listener.name' = {name!r} names none of the listeners "
                          f"({', '.join(l.name for l in found)})")
    if config.get("zookeeper.connect") and _listeners.inter_broker(config).sasl and not (
            config["sasl.inter.broker.username"] and config["sasl.inter.broker.password.file"]):
        raise ConfigError(f"the inter-broker listener {_listeners.inter_broker(config).name} is "
                          f"{_listeners.inter_broker(config).protocol}: set 'sasl.inter.broker.username' and "
                          f"'sasl.inter.broker.password.file' (the user the brokers sign in as)")


# Broker-wide default -> topic-level name (Kafka's pairs).
TOPIC_DEFAULTS = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "message.max.bytes": "max.message.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "log.message.timestamp.type": "message.timestamp.type",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}


def topic_defaults(config: dict) -> dict:
    """The topic-level settings every topic starts from, by topic-level name."""
    # Kafka's throttled replica lists have no broker-level default: every topic starts with none
    none_throttled = {"leader.replication.throttled.replicas": "", "follower.replication.throttled.replicas": ""}
    return {**{topic_key: config[broker_key] for broker_key, topic_key in TOPIC_DEFAULTS.items()}, **none_throttled}


def markdown_table() -> str:
    """The settings table of docs/CONFIG.md (a test keeps the doc equal to this)."""
    lines = ["| setting | type | default | dynamic | meaning |", "|---|---|---|---|---|"]
    for s in [*SETTINGS.values(), *LISTENER_SETTINGS.values()]:
        default = f"`{s.default}`" if s.default != "" else "(empty)"
        lines.append(f"| `{s.name}` | {s.type.__name__} | {default} | {'yes' if s.dynamic else ''} | {s.doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
