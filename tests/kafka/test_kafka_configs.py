"""Every config Kafka 3.x accepts is accepted (issue 28): the topic configs Odradek does not
implement (compression.type, preallocate, the remote-storage ones, ...) through CreateTopics,
AlterConfigs, IncrementalAlterConfigs and DescribeConfigs, and the broker configs Kafka
changes at run time that Odradek does not implement (log.cleaner.threads, background.threads,
...) through both alter APIs on the broker, kept across a restart; judged by confluent-kafka's
and kafka-python's admin clients; checked as Kafka checks them (a bad value is still
INVALID_CONFIG, as on Kafka)."""
from __future__ import annotations

from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType as KConfigResourceType
from kafka.admin import NewTopic as KNewTopic

from odradek.core.config import KAFKA_TOPIC_CONFIGS, LogConfig
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


# Kafka's dynamic broker configs that Odradek does not implement (a value Kafka accepts for each)
BROKER_RUN_TIME = {"log.cleaner.threads": "2", "background.threads": "7", "compression.type": "zstd",
                   "log.cleaner.io.max.bytes.per.second": "1048576.0", "num.replica.fetchers": "3",
                   "ssl.cipher.suites": "TLS_AES_128_GCM_SHA256", "sasl.kerberos.service.name": "kafka",
                   "transaction.partition.verification.enable": "false"}


def broker_described(admin: AdminClient, broker: str = "0") -> dict:
    res = ConfigResource("broker", broker)
    return admin.describe_configs([res])[res].result(timeout=WAIT)


def broker_change(admin: AdminClient, changes: dict, op=AlterConfigOpType.SET, broker: str = "0"):
    res = ConfigResource("broker", broker, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v in changes.items()])
    return outcome(admin.incremental_alter_configs([res])[res])


def test_kafkas_dynamic_broker_configs_are_taken_at_run_time_checked_and_described(kafka_broker):
    """confluent-kafka: IncrementalAlterConfigs on the broker sets them (INVALID_CONFIG "not a
    dynamic broker config" before), DescribeConfigs reports them as dynamic broker configs;
    a bad value or one of Kafka's read-only configs is refused; DELETE removes them."""
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    try:
        assert broker_change(admin, BROKER_RUN_TIME) is None
        got = broker_described(admin)
        for key, value in BROKER_RUN_TIME.items():
            assert (got[key].value, got[key].source, got[key].is_read_only) == (
                value, ConfigSource.DYNAMIC_BROKER_CONFIG.value, False), key
        # checked as Kafka checks them (type, range, choices); Kafka's read-only configs stay refused
        for key, value in {"log.cleaner.threads": "two", "background.threads": "0", "compression.type": "brotli",
                           "broker.id": "7", "log.dirs": "/elsewhere", "ssl.keystore.location": "/k.jks"}.items():
            assert broker_change(admin, {key: value}) == KafkaError.INVALID_CONFIG, key
        # a resource is changed whole or not at all
        assert broker_change(admin, {"log.cleaner.threads": "5", "background.threads": "0"}) == \
            KafkaError.INVALID_CONFIG
        assert broker_described(admin)["log.cleaner.threads"].value == "2"
        assert broker_change(admin, {k: None for k in BROKER_RUN_TIME}, AlterConfigOpType.DELETE) is None
        got = broker_described(admin)
        assert all(got[k].value is None and got[k].source == ConfigSource.DEFAULT_CONFIG.value
                   for k in BROKER_RUN_TIME)
    finally:
        del admin


def test_kafka_python_sets_a_dynamic_broker_config_that_outlives_a_restart(start_broker, tmp_path):
    """kafka-python's alter_configs (IncrementalAlterConfigs, then AlterConfigs) asks
    DescribeConfigs which broker configs are dynamic before it sends a change ("Unrecognized
    configs" before: only those Odradek implements were listed); the values are kept by the
    broker and described after a restart, as Kafka keeps its dynamic configs."""
    data = str(tmp_path / "broker")
    broker = start_broker(data_dir=data)
    kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=WAIT * 1000)
    try:
        resource = KConfigResource(KConfigResourceType.BROKER, "0", configs={"num.replica.fetchers": "3"})
        assert kadmin.alter_configs([resource]) == {"broker": {"0": "OK"}}
        resource = KConfigResource(KConfigResourceType.BROKER, "0", configs={"log.cleaner.threads": "4"})
        assert kadmin.alter_configs([resource], incremental=False) == {"broker": {"0": "OK"}}
        resource = KConfigResource(KConfigResourceType.BROKER, "0", configs={"log.cleaner.threads": "-"})
        assert "InvalidConfigurationError" in kadmin.alter_configs([resource])["broker"]["0"]
    finally:
        kadmin.close()
    broker.terminate()
    broker = start_broker(data_dir=data)
    kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=WAIT * 1000)
    try:
        got = kadmin.describe_configs([KConfigResource(KConfigResourceType.BROKER, "0")])["broker"]["0"]
    finally:
        kadmin.close()
    assert {k: (got[k]["value"], got[k]["config_source"]) for k in ("num.replica.fetchers", "log.cleaner.threads")} \
        == {"num.replica.fetchers": ("3", "DYNAMIC_BROKER_CONFIG"), "log.cleaner.threads": ("4", "DYNAMIC_BROKER_CONFIG")}
