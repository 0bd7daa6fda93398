"""Kafka's admin APIs (core/kafka/admin.py) judged by real clients: confluent-kafka's
AdminClient, kafka-python's KafkaAdminClient and kcat, against one broker per module."""
from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewPartitions, NewTopic)
from kafka import KafkaAdminClient
from kafka import errors as kerrors
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType as KConfigResourceType
from kafka.admin import NewPartitions as KNewPartitions
from kafka.admin import NewTopic as KNewTopic
from kafka.structs import TopicPartition as KTopicPartition

WAIT = 60


@pytest.fixture(scope="module")
def admin(kafka_broker):
    client = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    yield client
    del client  # librdkafka's threads stop with the last reference, before the broker does


@pytest.fixture(scope="module")
def kadmin(kafka_broker):
    client = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap, request_timeout_ms=WAIT * 1000)
    yield client
    client.close()


def name() -> str:
    return f"adm-{uuid.uuid4().hex[:10]}"


def outcome(future):
    """None if the future succeeded, else the Kafka error code it failed with."""
    try:
        future.result(timeout=WAIT)
        return None
    except KafkaException as exc:
        return exc.args[0].code()


def create(admin: AdminClient, *topics: NewTopic, validate_only: bool = False) -> dict:
    return {t: outcome(f) for t, f in admin.create_topics(list(topics), validate_only=validate_only).items()}


def topic_config(admin: AdminClient, topic: str) -> dict:
    res = ConfigResource("topic", topic)
    return admin.describe_configs([res])[res].result(timeout=WAIT)


def produce(bootstrap: str, topic: str, n: int, partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=partition)
    assert p.flush(WAIT) == 0


# ---- confluent-kafka ---------------------------------------------------------------------------

def test_confluent_creates_lists_describes_and_deletes_a_topic(admin):
    t = name()
    assert create(admin, NewTopic(t, 3, 1, config={"retention.ms": "3600000"})) == {t: None}
    assert t in admin.list_topics(timeout=WAIT).topics
    described = admin.describe_topics(TopicCollection([t]))[t].result(timeout=WAIT)
    assert [p.id for p in described.partitions] == [0, 1, 2]
    assert all(p.leader.id == 0 and [r.id for r in p.replicas] == [0] for p in described.partitions)
    assert {t: outcome(f) for t, f in admin.delete_topics([t]).items()} == {t: None}
    assert t not in admin.list_topics(timeout=WAIT).topics


def test_confluent_create_answers_kafkas_error_code_for_each_bad_topic(admin):
    good, taken = name(), name()
    assert create(admin, NewTopic(taken, 1, 1)) == {taken: None}
    got = create(admin, NewTopic(good, 1, 1), NewTopic("bad name!", 1, 1), NewTopic(name(), 100000, 1),
                 NewTopic(name(), 1, 3), NewTopic(taken, 1, 1), NewTopic(name(), 1, 1, config={"retention.ms": "x"}),
                 NewTopic(name(), 1, 1, config={"no.such.config": "1"}))
    assert sorted(code for code in got.values() if code is not None) == sorted([
        KafkaError.TOPIC_EXCEPTION, KafkaError.INVALID_PARTITIONS, KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.TOPIC_ALREADY_EXISTS, KafkaError.INVALID_CONFIG, KafkaError.INVALID_CONFIG])
    assert got[good] is None
    assert good in admin.list_topics(timeout=WAIT).topics


def test_confluent_create_with_validate_only_checks_but_creates_nothing(admin):
    t = name()
    assert create(admin, NewTopic(t, 2, 1), validate_only=True) == {t: None}
    assert create(admin, NewTopic("..", 1, 1), validate_only=True) == {"..": KafkaError.TOPIC_EXCEPTION}
    assert t not in admin.list_topics(timeout=WAIT).topics


def test_confluent_create_with_defaults_takes_the_brokers_num_partitions(admin):
    t = name()
    assert create(admin, NewTopic(t)) == {t: None}  # -1, -1: num.partitions, default.replication.factor
    assert len(admin.list_topics(t, timeout=WAIT).topics[t].partitions) == 1


def test_confluent_create_with_an_explicit_assignment_places_partitions_on_the_named_broker(admin):
    t, bad = name(), name()
    assert create(admin, NewTopic(t, 2, replica_assignment=[[0], [0]])) == {t: None}
    assert [p.replicas for p in admin.list_topics(t, timeout=WAIT).topics[t].partitions.values()] == [[0], [0]]
    assert create(admin, NewTopic(bad, 1, replica_assignment=[[7]])) == {bad: KafkaError.INVALID_REPLICA_ASSIGNMENT}
    assert bad not in admin.list_topics(timeout=WAIT).topics


def test_confluent_delete_of_an_unknown_topic_is_unknown_topic_or_partition(admin):
    assert {t: outcome(f) for t, f in admin.delete_topics(["never-was"]).items()} == {
        "never-was": KafkaError.UNKNOWN_TOPIC_OR_PART}


def test_confluent_describes_topic_configs_with_kafkas_sources(admin):
    t = name()
    assert create(admin, NewTopic(t, 1, 1, config={"retention.ms": "12345"})) == {t: None}
    configs = topic_config(admin, t)
    assert configs["retention.ms"].value == "12345"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].is_default


def test_confluent_describes_the_brokers_configs(admin):
    res = ConfigResource("broker", "0")
    configs = admin.describe_configs([res])[res].result(timeout=WAIT)
    assert configs["num.io.threads"].value.isdigit() and not configs["num.io.threads"].is_read_only
    assert configs["message.max.bytes"].value == "1048576" and configs["message.max.bytes"].is_read_only


def test_confluent_incremental_alter_sets_appends_subtracts_and_deletes(admin):
    t = name()
    assert create(admin, NewTopic(t, 1, 1, config={"retention.ms": "12345"})) == {t: None}

    def alter(*entries) -> int | None:
        res = ConfigResource("topic", t, incremental_configs=list(entries))
        return outcome(admin.incremental_alter_configs([res])[res])

    assert alter(ConfigEntry("segment.ms", "600000", incremental_operation=AlterConfigOpType.SET),
                 ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)) is None
    configs = topic_config(admin, t)
    assert (configs["segment.ms"].value, configs["cleanup.policy"].value) == ("600000", "delete,compact")
    assert alter(ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
                 ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)) is None
    configs = topic_config(admin, t)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert alter(ConfigEntry("segment.ms", "soon", incremental_operation=AlterConfigOpType.SET)) == \
        KafkaError.INVALID_CONFIG
    assert topic_config(admin, t)["segment.ms"].value == "600000"


def test_confluent_alter_configs_replaces_every_setting_of_the_topic(admin):
    t = name()
    assert create(admin, NewTopic(t, 1, 1, config={"retention.ms": "12345"})) == {t: None}
    res = ConfigResource("topic", t, set_config={"segment.ms": "700000"})
    with pytest.warns(DeprecationWarning):
        futures = admin.alter_configs([res])
    assert outcome(futures[res]) is None
    configs = topic_config(admin, t)
    assert configs["segment.ms"].value == "700000"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value  # left out: back to default


def test_confluent_alter_of_an_unknown_topic_or_a_static_broker_config_fails_with_kafkas_codes(admin):
    res = ConfigResource("topic", "never-was", incremental_configs=[
        ConfigEntry("segment.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    assert outcome(admin.incremental_alter_configs([res])[res]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    res = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("log.dirs", "/elsewhere", incremental_operation=AlterConfigOpType.SET)])
    assert outcome(admin.incremental_alter_configs([res])[res]) == KafkaError.INVALID_CONFIG


def test_confluent_creates_partitions_and_refuses_fewer(admin):
    t = name()
    assert create(admin, NewTopic(t, 2, 1)) == {t: None}
    assert {k: outcome(f) for k, f in admin.create_partitions([NewPartitions(t, 5)]).items()} == {t: None}
    assert len(admin.list_topics(t, timeout=WAIT).topics[t].partitions) == 5
    assert {k: outcome(f) for k, f in admin.create_partitions([NewPartitions(t, 3)]).items()} == {
        t: KafkaError.INVALID_PARTITIONS}
    assert {k: outcome(f) for k, f in admin.create_partitions([NewPartitions("never-was", 3)]).items()} == {
        "never-was": KafkaError.UNKNOWN_TOPIC_OR_PART}


def test_confluent_deletes_records_and_the_low_watermark_moves(admin, bootstrap):
    t = name()
    assert create(admin, NewTopic(t, 1, 1)) == {t: None}
    produce(bootstrap, t, 10)
    futures = admin.delete_records([TopicPartition(t, 0, 6)])
    deleted = futures[TopicPartition(t, 0)].result(timeout=WAIT)
    assert deleted.low_watermark == 6
    futures = admin.delete_records([TopicPartition(t, 0, 99)])
    with pytest.raises(KafkaException) as exc:
        futures[TopicPartition(t, 0)].result(timeout=WAIT)
    assert exc.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE


def test_confluent_describes_the_cluster(admin, kafka_broker):
    cluster = admin.describe_cluster().result(timeout=WAIT)
    assert cluster.controller.id == 0
    assert [(n.id, f"{n.host}:{n.port}") for n in cluster.nodes] == [(0, kafka_broker.bootstrap)]
    assert cluster.cluster_id


# ---- kafka-python ------------------------------------------------------------------------------

def test_kafka_python_creates_lists_describes_and_deletes_a_topic(kadmin):
    t = name()
    kadmin.create_topics([KNewTopic(t, 2, 1, topic_configs={"retention.ms": "3600000"})])
    assert t in kadmin.list_topics()
    [described] = kadmin.describe_topics([t])
    assert [p["partition_index"] for p in described["partitions"]] == [0, 1]
    kadmin.delete_topics([t])
    assert t not in kadmin.list_topics()


def test_kafka_python_create_errors_are_kafkas(kadmin):
    t = name()
    kadmin.create_topics([KNewTopic(t, 1, 1)])
    with pytest.raises(kerrors.TopicAlreadyExistsError):
        kadmin.create_topics([KNewTopic(t, 1, 1)])
    with pytest.raises(kerrors.InvalidTopicError):
        kadmin.create_topics([KNewTopic("no/slashes", 1, 1)])
    with pytest.raises(kerrors.InvalidPartitionsError):
        kadmin.create_topics([KNewTopic(name(), 0, 1)])
    with pytest.raises(kerrors.InvalidReplicationFactorError):
        kadmin.create_topics([KNewTopic(name(), 1, 2)])
    with pytest.raises(kerrors.UnknownTopicOrPartitionError):
        kadmin.delete_topics(["never-was"])


def test_kafka_python_create_with_validate_only_creates_nothing(kadmin):
    t = name()
    kadmin.create_topics([KNewTopic(t, 1, 1)], validate_only=True)
    assert t not in kadmin.list_topics()


def test_kafka_python_describes_and_alters_configs(kadmin):
    t = name()
    kadmin.create_topics([KNewTopic(t, 1, 1, topic_configs={"retention.ms": "1000"})])
    described = kadmin.describe_configs([KConfigResource(KConfigResourceType.TOPIC, t, configs=["retention.ms"])])
    assert described["topic"][t]["retention.ms"]["value"] == "1000"
    assert described["topic"][t]["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    keys = ["segment.ms", "retention.ms"]
    change = KConfigResource(KConfigResourceType.TOPIC, t, configs={"segment.ms": "900000"})
    assert kadmin.alter_configs([change]) == {"topic": {t: "OK"}}  # IncrementalAlterConfigs: a SET
    described = kadmin.describe_configs([KConfigResource(KConfigResourceType.TOPIC, t, configs=keys)])["topic"][t]
    assert described["segment.ms"]["value"] == "900000"
    assert described["retention.ms"]["value"] == "1000"
    change = KConfigResource(KConfigResourceType.TOPIC, t, configs={"segment.ms": "800000"})
    assert kadmin.alter_configs([change], incremental=False) == {"topic": {t: "OK"}}  # AlterConfigs: the
    described = kadmin.describe_configs([KConfigResource(KConfigResourceType.TOPIC, t, configs=keys)])["topic"][t]
    assert (described["segment.ms"]["value"], described["retention.ms"]["value"]) == ("800000", "1000")  # client
    # resent retention.ms, knowing that AlterConfigs reverts what it leaves out: its reset leaves retention.ms out
    reset = KConfigResource(KConfigResourceType.TOPIC, t, configs=["retention.ms"])
    assert kadmin.reset_configs([reset], incremental=False) == {"topic": {t: "OK"}}
    described = kadmin.describe_configs([KConfigResource(KConfigResourceType.TOPIC, t, configs=keys)])["topic"][t]
    assert described["segment.ms"]["value"] == "800000"
    assert "retention.ms" not in described  # back to its default (kafka-python lists modified keys only)
    broker = kadmin.describe_configs([KConfigResource(KConfigResourceType.BROKER, "0", configs=["num.io.threads"])],
                                     config_filter="all")
    assert broker["broker"]["0"]["num.io.threads"]["value"].isdigit()
    assert kadmin.describe_configs([KConfigResource(KConfigResourceType.TOPIC, t, configs={})],
                                   config_filter="all") == {"topic": {t: {}}}  # no keys asked: none (Kafka's rule)


def test_kafka_python_creates_partitions_deletes_records_and_describes_the_cluster(kadmin, bootstrap):
    t = name()
    kadmin.create_topics([KNewTopic(t, 1, 1)])
    kadmin.create_partitions({t: KNewPartitions(3)})
    [described] = kadmin.describe_topics([t])
    assert len(described["partitions"]) == 3
    with pytest.raises(kerrors.InvalidPartitionsError):
        kadmin.create_partitions({t: KNewPartitions(2)})
    produce(bootstrap, t, 4, partition=2)
    got = kadmin.delete_records({KTopicPartition(t, 2): 3})
    assert got[KTopicPartition(t, 2)]["low_watermark"] == 3
    cluster = kadmin.describe_cluster()
    assert cluster["controller_id"] == 0 and [b["broker_id"] for b in cluster["brokers"]] == [0]


# ---- kcat --------------------------------------------------------------------------------------

def test_kcat_lists_what_the_admin_clients_made(admin, kadmin, bootstrap, kcat):
    a, b = name(), name()
    assert create(admin, NewTopic(a, 2, 1)) == {a: None}
    kadmin.create_topics([KNewTopic(b, 1, 1)])
    assert {k: outcome(f) for k, f in admin.create_partitions([NewPartitions(a, 4)]).items()} == {a: None}
    listing = json.loads(subprocess.run([kcat, "-L", "-b", bootstrap, "-J"], capture_output=True, check=True,
                                        timeout=WAIT).stdout)
    topics = {t["topic"]: t for t in listing["topics"]}
    assert len(topics[a]["partitions"]) == 4 and len(topics[b]["partitions"]) == 1
    assert [br["id"] for br in listing["brokers"]] == [0]


def test_confluent_elect_leaders_on_one_broker_needs_no_election(admin):
    from confluent_kafka import ElectionType
    t = name()
    assert create(admin, NewTopic(t, 2, 1)) == {t: None}
    result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(t, 0), TopicPartition(t, 1)]) \
        .result(timeout=WAIT)
    assert {tp.partition: err.code() for tp, err in result.items()} == {
        0: KafkaError.ELECTION_NOT_NEEDED, 1: KafkaError.ELECTION_NOT_NEEDED}
