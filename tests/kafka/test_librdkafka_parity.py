"""What librdkafka's regression suite (docs/KAFKA.md, "librdkafka's regression suite") found
in 0011 and 0081, judged by confluent-kafka (librdkafka): a compaction policy set by
IncrementalAlterConfigs holds for the very next produce; ListOffsets MAX_TIMESTAMP (KIP-734);
the per-listener broker configs Kafka takes dynamically."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (AclOperation, AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic,
                                   OffsetSpec)

from tests.security.test_acl_matrix import TOPIC as ACL_TOPIC, _librdkafka_security
from tests.security.test_acl_matrix import broker as acl_broker  # noqa: F401 (its module's fixture: ACLs on)

TOPIC_OPERATIONS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER,
                    AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
CLUSTER_OPERATIONS = {AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                      AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                      AclOperation.DESCRIBE}
GROUP_OPERATIONS = {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = _admin(bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


@pytest.mark.parametrize("attempt", range(3))
def test_a_compaction_policy_set_just_before_a_produce_refuses_its_keyless_records(bootstrap, topic, attempt):
    """0011 (test_message_single_partition_record_fail): APPEND compact to cleanup.policy,
    then produce at once; every keyless record fails alone with INVALID_RECORD."""
    _create(bootstrap, topic)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    admin = _admin(bootstrap)
    admin.incremental_alter_configs([res])[res].result(60)
    p = Producer({"bootstrap.servers": bootstrap, "batch.size": 1})  # one record per batch, as variation 1
    reports = []
    for i in range(10):
        p.produce(topic, key=None if i % 5 == 0 else b"k%d" % i, value=b"v", partition=0,
                  on_delivery=lambda e, m: reports.append((m.key(), e.code() if e else None)))
    assert p.flush(60) == 0
    assert sorted(reports, key=repr) == sorted(
        [(None, KafkaError.INVALID_RECORD)] * 2 + [(b"k%d" % i, None) for i in range(10) if i % 5], key=repr)


def test_list_offsets_max_timestamp_is_the_first_record_with_the_largest_timestamp(bootstrap, topic):
    """0081's ListOffsets part (KIP-734, ListOffsets v7, OffsetSpec -3): records stamped
    +100, +400, +250 in one batch, then +400 again and +50 in later batches: offset 1."""
    _create(bootstrap, topic)
    admin, tp = _admin(bootstrap), TopicPartition(topic, 0)

    def max_timestamp():
        return admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(60)

    empty = max_timestamp()
    assert (empty.offset, empty.timestamp) == (-1, -1)
    base = int(time.time() * 1000) - 10_000
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 500})
    for delta in (100, 400, 250):
        p.produce(topic, value=b"v", partition=0, timestamp=base + delta)
    assert p.flush(60) == 0
    for delta in (400, 50):
        p.produce(topic, value=b"v", partition=0, timestamp=base + delta)
        assert p.flush(60) == 0
    found = max_timestamp()
    assert (found.offset, found.timestamp) == (1, base + 400)
    p.produce(topic, value=b"v", partition=0, timestamp=base + 900)
    assert p.flush(60) == 0
    found = max_timestamp()
    assert (found.offset, found.timestamp) == (5, base + 900)


def test_kafkas_dynamic_kerberos_configs_are_taken_by_both_alter_apis_and_checked(bootstrap):
    """0081's AlterConfigs and IncrementalAlterConfigs parts set the broker config
    sasl.kerberos.min.time.before.relogin, which Kafka takes at run time (a per-listener
    dynamic config); Odradek has no Kerberos: taken, its value checked as Kafka's type, no effect."""
    admin = _admin(bootstrap)
    broker = "0"  # the package's broker (broker.id's default)

    def incremental(value):
        res = ConfigResource(ConfigResource.Type.BROKER, broker, incremental_configs=[ConfigEntry(
            "sasl.kerberos.min.time.before.relogin", value, incremental_operation=AlterConfigOpType.SET)])
        return admin.incremental_alter_configs([res])[res]

    incremental("58000").result(60)
    res = ConfigResource(ConfigResource.Type.BROKER, broker,
                         set_config={"sasl.kerberos.min.time.before.relogin": "58000"})
    admin.alter_configs([res])[res].result(60)
    with pytest.raises(Exception) as refused:
        incremental("soon").result(60)
    error = refused.value.args[0]
    assert error.code() == KafkaError.INVALID_CONFIG and "not a valid long" in error.str(), error


def test_describe_topics_and_cluster_answer_the_authorized_operations_asked_for(bootstrap, topic):
    """0081's DescribeTopics and DescribeCluster parts: with include_authorized_operations the
    answer lists the operations the principal may perform: with the authorizer off, every one
    Kafka supports on a topic (8) and on the cluster (7), as Kafka without an authorizer."""
    _create(bootstrap, topic)
    admin = _admin(bootstrap)
    assert _operations(admin, topic) == (TOPIC_OPERATIONS, CLUSTER_OPERATIONS)
    plain = admin.describe_topics(TopicCollection([topic]))[topic].result(60)
    assert not plain.authorized_operations


def _operations(admin: AdminClient, topic: str) -> tuple[set, set]:
    described = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[topic].result(60)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(60)
    return set(described.authorized_operations or ()), set(cluster.authorized_operations or ())


@pytest.mark.parametrize("user,expected", [
    ("admin", (TOPIC_OPERATIONS, CLUSTER_OPERATIONS)),  # a super user
    ("consumer", ({AclOperation.READ, AclOperation.DESCRIBE}, set())),  # Read on the topic implies Describe
    ("producer", ({AclOperation.WRITE, AclOperation.DESCRIBE}, set())),  # no IdempotentWrite granted
])
def test_the_authorized_operations_are_the_principals_by_its_acls(acl_broker, user, expected):
    """With the authorizer on, each operation is the principal's as its ACLs decide."""
    admin = AdminClient({"bootstrap.servers": acl_broker.address, **_librdkafka_security(user)})
    assert _operations(admin, ACL_TOPIC) == expected


def _group_operations(admin: AdminClient, topic: str, group: str) -> set:
    """The group is made by committing an offset for it; then described with its operations."""
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 0)])])[
        group].result(60)
    described = admin.describe_consumer_groups([group], include_authorized_operations=True)[group].result(60)
    return set(described.authorized_operations or ())


def test_describe_groups_answers_the_authorized_operations_asked_for(bootstrap, topic):
    """0081's DescribeConsumerGroups_with_authorized_ops (run by the suite with TEST_SASL):
    the group's operations were never filled in ("Expected 3 authorized operations, got 0"):
    with the authorizer off every one Kafka supports on a group (Read, Describe, Delete)."""
    _create(bootstrap, topic)
    admin = _admin(bootstrap)
    assert _group_operations(admin, topic, f"{topic}-g") == GROUP_OPERATIONS
    plain = admin.describe_consumer_groups([f"{topic}-g"])[f"{topic}-g"].result(60)
    assert not plain.authorized_operations


@pytest.mark.parametrize("user,expected", [
    ("admin", GROUP_OPERATIONS),  # a super user
    ("consumer", {AclOperation.READ, AclOperation.DESCRIBE}),  # Read on g-* implies Describe; no Delete
])
def test_a_groups_authorized_operations_are_the_principals_by_its_acls(acl_broker, user, expected):
    admin = AdminClient({"bootstrap.servers": acl_broker.address, **_librdkafka_security(user)})
    assert _group_operations(admin, ACL_TOPIC, f"g-ops-{user}") == expected
