"""Kafka's admin APIs against a cluster (real ZooKeeper and three brokers): Kafka clients
bootstrapped on a broker that is not the controller create a replicated topic, throttle and
move a partition (KIP-455's AlterPartitionReassignments / ListPartitionReassignments, issue
17 on the Kafka listener) and cancel the move. The clients find the controller through
Metadata, as they do against Kafka; the brokers relay what reaches another broker."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import KafkaAdminClient
from kafka import errors as kerrors
from kafka.structs import TopicPartition as KTopicPartition


pytestmark = pytest.mark.slow
WAIT = 60


def outcome(future):
    try:
        future.result(timeout=WAIT)
        return None
    except KafkaException as exc:
        return exc.args[0].code()


def test_clients_bootstrapped_on_a_non_controller_create_replicated_topics_and_move_a_partition(
        make_cluster):
    cluster = make_cluster(3)
    controller = cluster.controller_id()
    other = next(b for b in (1, 2, 3) if b != controller)
    bootstrap = cluster.broker(other).bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})

    described = admin.describe_cluster().result(timeout=WAIT)
    assert described.controller.id == controller
    assert sorted(n.id for n in described.nodes) == [1, 2, 3]

    futures = admin.create_topics([NewTopic("rf3", 2, 3), NewTopic("rf4", 1, 4),
                                   NewTopic("moving", 1, replica_assignment=[[other]])])
    assert {t: outcome(f) for t, f in futures.items()} == {
        "rf3": None, "rf4": KafkaError.INVALID_REPLICATION_FACTOR, "moving": None}
    cluster.wait_for(lambda: all(len(p.isr) == 3 for p in admin.describe_topics(TopicCollection(["rf3"]))["rf3"]
                                 .result(timeout=WAIT).partitions), WAIT, "rf3's replicas in sync")

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for _ in range(200):
        producer.produce("moving", value=b"x" * 5000)  # ~1 MB: a hundred seconds at the throttle below
    assert producer.flush(WAIT) == 0
    for b in (1, 2, 3):  # with a Kafka config Odradek takes without effect, kept by each broker
        res = ConfigResource("broker", str(b), incremental_configs=[ConfigEntry(
            "follower.replication.throttled.rate", "10000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("log.cleaner.threads", str(b), incremental_operation=AlterConfigOpType.SET)])
        assert outcome(admin.incremental_alter_configs([res])[res]) is None
    for b in (1, 2, 3):
        res = ConfigResource("broker", str(b))
        assert admin.describe_configs([res])[res].result(timeout=WAIT)["log.cleaner.threads"].value == str(b)
    # the rate applies to the replicas the topic lists (Kafka's rule): all of them here, so
    # the move cannot finish before it is cancelled
    res = ConfigResource("topic", "moving", incremental_configs=[ConfigEntry(
        name, "*", incremental_operation=AlterConfigOpType.SET) for name in
        ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")])
    assert outcome(admin.incremental_alter_configs([res])[res]) is None

    target = next(b for b in (1, 2, 3) if b != other)
    kadmin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=WAIT * 1000)
    try:
        tp = KTopicPartition("moving", 0)
        assert kadmin.alter_partition_reassignments({tp: [other, target]}) == {tp: None}
        listed = kadmin.list_partition_reassignments()
        assert listed[tp]["adding_replicas"] == [target] and sorted(listed[tp]["replicas"]) == sorted([other, target])
        assert kadmin.list_partition_reassignments([KTopicPartition("rf3", 0)]) == {}
        assert kadmin.alter_partition_reassignments({tp: None}) == {tp: None}  # cancel
        cluster.wait_for(lambda: kadmin.list_partition_reassignments() == {}, WAIT, "the move cancelled")
        assert kadmin.alter_partition_reassignments({tp: None}) == {tp: kerrors.NoReassignmentInProgressError}
        assert kadmin.alter_partition_reassignments({tp: [other, 9]}) == {tp: kerrors.InvalidReplicationAssignmentError}
    finally:
        kadmin.close()
    admin = producer = None  # librdkafka stops its threads before the cluster goes
