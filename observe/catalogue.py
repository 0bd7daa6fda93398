"""Every metric the broker exports: its Prometheus name, type, help (Kafka's meaning), labels.

Pure data, the one place that names metrics. Actors count under short internal names with
label *values* only (``actors.metrics.Metrics``; gauges from ``Actor.metric_gauges``); the
collector (``observe.collector``) looks each name up here. docs/OBSERVABILITY.md lists the
same table and a test keeps the two in step.

Prometheus conventions: ``odradek_`` prefix, base units (bytes, seconds), counters end in
``_total``; latencies, counted in milliseconds on the hot path, are exported in seconds.
Values of the same metric and labels from several actors (two processors, two log actors)
are added up: a broker is one target. A log actor answers one ``partition`` row per
partition (``PARTITION_COLUMNS``' order); per-partition series are exported only with
``metrics.partition.level=true``, their ``per_topic`` sums always.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str  # Prometheus name (without _total for counters: prometheus_client adds it)
    type: str  # counter, gauge, histogram
    help: str
    labels: tuple[str, ...] = ()
    kafka: str = ""  # the Kafka metric it stands for, if any
    total: str = ""  # also export the sum over all label values under this gauge name
    per_topic: str = ""  # the sum per topic (or per group and topic), exported by default
    per_topic_help: str = ""


# Counters and histograms kept by actors (``self.metrics.inc`` / ``observe``).
COUNTED: dict[str, Spec] = {
    "bytes_in": Spec("odradek_topic_bytes_in", "counter", "Bytes appended by leaders, per topic.",
                     ("topic",), "BrokerTopicMetrics BytesInPerSec"),
    "records_in": Spec("odradek_topic_records_in", "counter", "Records appended by leaders, per topic.",
                       ("topic",), "BrokerTopicMetrics MessagesInPerSec"),
    "bytes_out": Spec("odradek_topic_bytes_out", "counter", "Bytes served to consumers by fetches, per topic.",
                      ("topic",), "BrokerTopicMetrics BytesOutPerSec"),
    "records_out": Spec("odradek_topic_records_out", "counter",
                        "Records served to consumers by fetches, per topic (offsets from each fetch offset to "
                        "the end of the last batch served: control records and offsets compaction removed count "
                        "too).", ("topic",), "none: Kafka counts bytes out only"),
    "replication_bytes_out": Spec("odradek_topic_replication_bytes_out", "counter",
                                  "Bytes served to follower replicas, per topic.", ("topic",),
                                  "BrokerTopicMetrics ReplicationBytesOutPerSec"),
    "isr_shrinks": Spec("odradek_isr_shrinks", "counter", "Times a leader removed a follower from an ISR.",
                        (), "ReplicaManager IsrShrinksPerSec"),
    "isr_expands": Spec("odradek_isr_expands", "counter", "Times a leader added a follower back to an ISR.",
                        (), "ReplicaManager IsrExpandsPerSec"),
    "requests": Spec("odradek_requests", "counter", "Requests received, per API.", ("api",),
                     "RequestMetrics RequestsPerSec"),
    "errors": Spec("odradek_request_errors", "counter",
                   "Requests answered with a request-level error, per API and error code.", ("api", "error"),
                   "RequestMetrics ErrorsPerSec"),
    "request_total_ms": Spec("odradek_request_total_time_seconds", "histogram",
                             "From the processor reading a request to handing its response to the socket.",
                             ("api",), "RequestMetrics TotalTimeMs"),
    "request_queue_ms": Spec("odradek_request_queue_time_seconds", "histogram",
                             "From the processor reading a request to a handler picking it up.",
                             ("api",), "RequestMetrics RequestQueueTimeMs"),
    "request_local_ms": Spec("odradek_request_local_time_seconds", "histogram",
                             "A handler's own work on a request (until it answers or hands it on).",
                             ("api",), "RequestMetrics LocalTimeMs"),
    "request_remote_ms": Spec("odradek_request_remote_time_seconds", "histogram",
                              "Time the request was held waiting in a purgatory: an acks=all produce in the "
                              "log actor until its ISR caught up, a long-poll fetch in the fetch actor until "
                              "min_bytes arrived or max_wait_ms passed (0 for the others).", ("api",),
                              "RequestMetrics RemoteTimeMs"),
    "client_requests": Spec("odradek_client_requests", "counter",
                            "Requests received, per client.id (at most 100 ids per processor, each up to 100 "
                            "characters, an id of no open connection giving its place and its count to '(other)' "
                            "for a new one; the ids past the cap as '(other)', none as '(none)').",
                            ("client_id",), "RequestMetrics RequestsPerSec by client (quota metrics' client-id)"),
    "response_send_ms": Spec("odradek_response_send_time_seconds", "histogram",
                             "From the answer reaching the processor to its bytes going to the socket "
                             "(Kafka's response queue + send).", ("api",),
                             "RequestMetrics ResponseQueueTimeMs + ResponseSendTimeMs"),
    # security (docs/SECURITY.md)
    "throttle_ms": Spec("odradek_throttle_time_seconds", "histogram",
                        "Time a quota held an answer (and its connection) back, per kind (produce, fetch, "
                        "request).",
                        ("kind",), "Produce/Fetch/Request throttle-time"),
    "authentication_failures": Spec("odradek_authentication_failures", "counter",
                                    "Failed TLS handshakes and SASL authentications, per listener.", ("listener",),
                                    "socket-server-metrics failed-authentication-total"),
    "authorization_denied": Spec("odradek_authorization_denied", "counter",
                                 "Requests refused by the ACLs, per operation and resource type.",
                                 ("operation", "resource"), "(audit log of the authorizer)"),
}

# Gauges read at scrape time (``Actor.metric_gauges``).
GAUGES: dict[str, Spec] = {
    "connections": Spec("odradek_connections", "gauge", "Open client connections, per listener.",
                        ("listener",), "socket-server-metrics connection-count"),
    "delayed_fetches": Spec("odradek_delayed_fetches", "gauge", "Fetches waiting in the fetch purgatory.",
                            (), "DelayedFetchMetrics / purgatory size"),
    "active_controller": Spec("odradek_active_controller", "gauge", "1 if this broker is the active controller.",
                              (), "KafkaController ActiveControllerCount"),
    "offline_partitions": Spec("odradek_offline_partitions", "gauge",
                               "Partitions without a live leader (counted by the active controller).",
                               (), "KafkaController OfflinePartitionsCount"),
    "group_members": Spec("odradek_consumer_group_members", "gauge",
                          "Members of a consumer group this broker coordinates; the state label is its state.",
                          ("group", "state"), "GroupMetadataManager NumGroups<state>"),
}

# The log actors' row per partition, in its column order (``LogActor.metric_gauges``). Each
# column is a per-partition gauge, exported only with ``metrics.partition.level=true``; its
# ``per_topic`` sum is exported always, its ``total`` (the sum over the broker) always.
PARTITION_COLUMNS: dict[str, Spec] = {
    "log_size": Spec("odradek_log_size_bytes", "gauge", "Bytes of a partition's log on disk.",
                     ("topic", "partition"), "Log Size",
                     per_topic="odradek_topic_log_size_bytes",
                     per_topic_help="Bytes on disk of the topic's partitions hosted here."),
    "log_segments": Spec("odradek_log_segments", "gauge", "Segments of a partition's log.",
                         ("topic", "partition"), "Log NumLogSegments",
                         per_topic="odradek_topic_log_segments",
                         per_topic_help="Segments of the topic's partitions hosted here."),
    "log_end_offset": Spec("odradek_log_end_offset", "gauge", "The offset the next record will get.",
                           ("topic", "partition"), "Log LogEndOffset"),
    "log_start_offset": Spec("odradek_log_start_offset", "gauge", "The first offset still in the log.",
                             ("topic", "partition"), "Log LogStartOffset"),
    "high_watermark": Spec("odradek_high_watermark", "gauge", "The last committed offset + 1 (what consumers see).",
                           ("topic", "partition"), "Partition HighWatermark"),
    "leader": Spec("odradek_partition_leader", "gauge", "1 if this broker leads the partition.",
                   ("topic", "partition"), "", total="odradek_leaders",
                   per_topic="odradek_topic_leaders", per_topic_help="Partitions of the topic this broker leads."),
    "under_replicated": Spec("odradek_partition_under_replicated", "gauge",
                             "1 if this broker leads the partition and its ISR is smaller than its replicas.",
                             ("topic", "partition"), "", total="odradek_under_replicated_partitions",
                             per_topic="odradek_topic_under_replicated_partitions",
                             per_topic_help="Partitions of the topic this broker leads whose ISR is smaller "
                                            "than their replicas."),
    "under_min_isr": Spec("odradek_partition_under_min_isr", "gauge",
                          "1 if this broker leads the partition and its ISR is below min.insync.replicas.",
                          ("topic", "partition"), "", total="odradek_under_min_isr_partitions",
                          per_topic="odradek_topic_under_min_isr_partitions",
                          per_topic_help="Partitions of the topic this broker leads whose ISR is below "
                                         "min.insync.replicas."),
}

# Per-partition group offsets: exported per partition only with metrics.partition.level=true.
GROUP_PARTITION: dict[str, Spec] = {
    "committed_offset": Spec("odradek_consumer_group_committed_offset", "gauge",
                             "A group's committed offset of a partition.", ("group", "topic", "partition"),
                             "kafka-exporter kafka_consumergroup_current_offset"),
    "lag": Spec("odradek_consumer_group_lag", "gauge",
                "High watermark minus the group's committed offset (both known on this broker).",
                ("group", "topic", "partition"), "kafka-exporter kafka_consumergroup_lag",
                per_topic="odradek_consumer_group_topic_lag",
                per_topic_help="A group's lag summed over the topic's partitions (both ends known on this "
                               "broker; kafka-exporter's kafka_consumergroup_lag_sum)."),
}

# Derived by the collector from the above and from the supervisor's ``status``.
DERIVED: dict[str, Spec] = {
    "partitions": Spec("odradek_partitions", "gauge", "Partitions (replicas) this broker hosts.", (),
                       "ReplicaManager PartitionCount"),
    "topic_partitions": Spec("odradek_topic_partitions", "gauge", "Partitions of the topic this broker hosts.",
                             ("topic",)),
    "actor_up": Spec("odradek_actor_up", "gauge", "1 if the actor is running.", ("actor", "role")),
    "actor_restarts": Spec("odradek_actor_restarts", "counter", "Times the supervisor started the actor "
                           "after its first start.", ("actor", "role")),
    "actor_messages": Spec("odradek_actor_messages", "counter", "Messages the actor handled.", ("actor", "role")),
    "actor_open_requests": Spec("odradek_actor_open_requests", "gauge",
                                "Requests the actor received and has not answered yet (its backlog).",
                                ("actor", "role")),
    "actor_backlog": Spec("odradek_actor_backlog", "gauge",
                          "The actor's own queue of work (a processor's requests in flight, ...).",
                          ("actor", "role")),
    "actor_rss": Spec("odradek_actor_resident_memory_bytes", "gauge", "Resident memory of the actor's process.",
                      ("actor", "role")),
    "actor_cpu": Spec("odradek_actor_cpu_ratio", "gauge",
                      "CPU used by the actor's process over the last second (1 = one core).", ("actor", "role")),
    "actor_cpu_seconds": Spec("odradek_actor_cpu_seconds", "counter",
                              "CPU time (user + system) the actor's current process has used since it started "
                              "(a restart starts it again from 0, as Prometheus expects of a counter).",
                              ("actor", "role"), "process_cpu_seconds_total, per process"),
    "actor_start_time": Spec("odradek_actor_start_time_seconds", "gauge",
                             "When the actor's current process started, in seconds since the epoch.",
                             ("actor", "role"), "process_start_time_seconds, per process"),
    "actor_open_fds": Spec("odradek_actor_open_fds", "gauge", "File descriptors the actor's process holds open.",
                           ("actor", "role"), "process_open_fds, per process"),
    "build_info": Spec("odradek_build_info", "gauge",
                       "Always 1; the labels say which Odradek and which Python this broker runs.",
                       ("version", "python"), "app-info (kafka.server:type=app-info) version"),
    "scrape_answered": Spec("odradek_scrape_actor_answered", "gauge",
                            "1 if the actor answered this scrape's metrics request in time.", ("actor",)),
    "scrape_duration": Spec("odradek_scrape_duration_seconds", "gauge", "How long gathering this scrape took."),
}


def all_specs() -> list[Spec]:
    """Every exported metric (totals and per-topic sums included), for the docs test and the
    dashboard test."""
    specs = [*COUNTED.values(), *GAUGES.values(), *PARTITION_COLUMNS.values(), *GROUP_PARTITION.values(),
             *DERIVED.values()]
    totals = [Spec(s.total, "gauge", f"Sum of {s.name}.") for s in specs if s.total]
    topics = [Spec(s.per_topic, "gauge", s.per_topic_help, ("group", "topic") if "group" in s.labels else ("topic",))
              for s in specs if s.per_topic]
    return specs + totals + topics
