"""Every config Kafka 3.x accepts is accepted (issue 28): the topic configs Odradek does not
implement (compression.type, preallocate, the remote-storage ones, ...) through CreateTopics,
AlterConfigs, IncrementalAlterConfigs and DescribeConfigs, judged by confluent-kafka's and
kafka-python's admin clients against the package's broker; checked as Kafka checks them (a
bad value is still INVALID_CONFIG, as on Kafka)."""
from __future__ import annotations

from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic
from kafka import KafkaAdminClient
from kafka.admin import NewTopic as KNewTopic

from odradek.log.config import KAFKA_TOPIC_CONFIGS, LogConfig
from tests.kafka.test_admin import name, outcome

WAIT = 60
# Kafka's topic configs that LogConfig has no field for (a value Kafka accepts for each)
UNIMPLEMENTED = {"compression.type": "zstd", "compression.gzip.level": "-1", "compression.lz4.level": "9",
                 "compression.zstd.level": "3", "local.retention.bytes": "-2", "local.retention.ms": "-2",
                 "max.compaction.lag.ms": "86400000", "message.downconversion.enable": "false",
                 "message.format.version": "3.0-IV1", "message.timestamp.after.max.ms": "3600000",
                 "message.timestamp.before.max.ms": "3600000", "message.timestamp.difference.max.ms": "3600000",
                 "preallocate": "true", "remote.log.copy.disable": "false", "remote.log.delete.on.disable": "false",
                 "remote.storage.enable": "false", "segment.jitter.ms": "1000"}


def described(admin: AdminClient, topic: str) -> dict:
    res = ConfigResource("topic", topic)
    return admin.describe_configs([res])[res].result(timeout=WAIT)


def test_the_table_covers_every_kafka_topic_config_odradek_does_not_implement():
    implemented = set(LogConfig().to_properties())
    assert set(KAFKA_TOPIC_CONFIGS) - implemented == set(UNIMPLEMENTED) - implemented
    assert implemented <= set(KAFKA_TOPIC_CONFIGS)  # no name of ours that Kafka does not have


def test_create_alter_and_describe_take_every_kafka_topic_config(kafka_broker):
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    try:
        t = name()
        assert outcome(admin.create_topics([NewTopic(t, 1, 1, config=UNIMPLEMENTED)])[t]) is None
        got = described(admin, t)
        for key, value in UNIMPLEMENTED.items():
            assert got[key].value == value and got[key].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, key
        # IncrementalAlterConfigs sets and deletes one; AlterConfigs (replace-all) drops what it leaves out
        res = ConfigResource("topic", t, incremental_configs=[
            ConfigEntry("compression.type", "lz4", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("preallocate", None, incremental_operation=AlterConfigOpType.DELETE)])
        assert outcome(admin.incremental_alter_configs([res])[res]) is None
        got = described(admin, t)
        assert got["compression.type"].value == "lz4" and "preallocate" not in got
        res = ConfigResource("topic", t, set_config={"segment.jitter.ms": "5", "retention.ms": "60000"})
        assert outcome(admin.alter_configs([res])[res]) is None
        got = described(admin, t)
        assert got["segment.jitter.ms"].value == "5" and "compression.type" not in got
        assert got["retention.ms"].value == "60000"
        # checked as Kafka checks them
        bad = [NewTopic(name(), 1, 1, config=c) for c in ({"compression.type": "brotli"}, {"preallocate": "yes"},
                                                          {"compression.gzip.level": "0"}, {"no.such.config": "1"})]
        assert {k: outcome(f) for k, f in admin.create_topics(bad).items()} == {
            n.topic: KafkaError.INVALID_CONFIG for n in bad}
        res = ConfigResource("topic", t, incremental_configs=[
            ConfigEntry("compression.zstd.level", "99", incremental_operation=AlterConfigOpType.SET)])
        assert outcome(admin.incremental_alter_configs([res])[res]) == KafkaError.INVALID_CONFIG
    finally:
        del admin


def test_kafka_python_creates_a_topic_with_a_deprecated_config(kafka_broker):
    kadmin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap, request_timeout_ms=WAIT * 1000)
    try:
        t = name()
        kadmin.create_topics([KNewTopic(t, 1, 1, topic_configs={"message.format.version": "2.8-IV1",
                                                                "message.timestamp.difference.max.ms": "1000"})])
        admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
        got = described(admin, t)
        del admin
        assert got["message.format.version"].value == "2.8-IV1"
        assert got["message.timestamp.difference.max.ms"].value == "1000"
    finally:
        kadmin.close()
