"""Issue 27, item 1: the internal topics (``__consumer_offsets``, ``__transaction_state``) are
the broker's own state. A client may read them but never write, delete or alter them: every
such request is answered INVALID_TOPIC_EXCEPTION (Kafka's 17), by the native and the Kafka
protocol alike, from the bundled client, the CLI and confluent-kafka. Before the
fix an anonymous Produce of a forged commit was acknowledged and became the group's offset at
the next start, and the CLI deleted ``__consumer_offsets``."""
from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import KafkaError
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions,
                                   NewTopic)

from odradek import Admin, Producer
from odradek.coordinator.offsets import Committed, offset_record, partition_for
from odradek.core.records import encode_batch
from odradek.network.client import BrokerConnection
from odradek.core.protocol import OFFSETS_TOPIC, TXN_STATE_TOPIC, ApiKey, ErrorCode, OdradekError

INVALID_TOPIC = int(ErrorCode.INVALID_TOPIC_EXCEPTION)


def topic_with_records(bootstrap: str, topic: str, count: int) -> None:
    """A one-partition topic holding ``count`` records (offsets to commit)."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    with Producer(bootstrap) as producer:
        for i in range(count):
            producer.send(topic, b"%d" % i, partition=0)
        producer.flush()


def commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[CKTopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str) -> int:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return c.committed([CKTopicPartition(topic, 0)], timeout=30)[0].offset
    finally:
        c.close()


def _error_code(future) -> int:
    try:
        future.result(30)
    except Exception as exc:  # confluent-kafka raises KafkaException(KafkaError)
        return exc.args[0].code()
    return 0


def test_no_client_can_write_delete_or_alter_an_internal_topic_and_offsets_survive_a_restart(start_broker,
                                                                                                tmp_path):
    data = str(tmp_path / "data")
    broker = start_broker(data)
    topic_with_records(broker.bootstrap, "orders", 8)
    commit(broker.bootstrap, "victim", "orders", 5)  # creates __consumer_offsets
    with Admin(broker.bootstrap) as admin:
        partitions = len(admin.describe_topic(OFFSETS_TOPIC).partitions)
    target = partition_for("victim", partitions)

    # The native protocol: a forged commit (well formed) and an unreadable record.
    forged = encode_batch([offset_record("victim", "orders", 0, Committed(999_999))], compression=None)
    garbage = encode_batch([(b"\xc1not msgpack", b"\xc1")], compression=None)
    conn = BrokerConnection(broker.host, broker.port)
    try:
        for batch in (forged, garbage):
            body = conn.request(ApiKey.PRODUCE, {"acks": -1, "timeout_ms": 5000, "topics": [
                {"name": OFFSETS_TOPIC, "partitions": [{"index": target, "frame": 0}]},
                {"name": "orders", "partitions": [{"index": 0, "frame": 0}]}]}, [batch]).body
            by_topic = {t["name"]: t["partitions"][0] for t in body["topics"]}
            assert by_topic[OFFSETS_TOPIC]["error_code"] == INVALID_TOPIC, body
            assert "internal topic" in by_topic[OFFSETS_TOPIC]["error_message"], body
            assert by_topic["orders"]["error_code"] == 0, body  # the other topic of the request is served
        body = conn.request(ApiKey.DELETE_RECORDS, {"topics": [
            {"name": OFFSETS_TOPIC, "partitions": [{"index": target, "offset": -1}]}]}).body
        assert body["topics"][0]["partitions"][0]["error_code"] == INVALID_TOPIC, body
        # a Metadata asking to auto-create an internal topic does not create it
        body = conn.request(ApiKey.METADATA, {"topics": [TXN_STATE_TOPIC], "allow_auto_topic_creation": True}).body
        assert body["topics"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, body
    finally:
        conn.close()

    # The Kafka protocol (librdkafka's Produce; the refusal is after the codec, whatever the version).
    reports = []
    p = CKProducer({"bootstrap.servers": broker.bootstrap, "acks": "all", "retries": 0})
    p.produce(OFFSETS_TOPIC, forged, partition=target, on_delivery=lambda err, _m: reports.append(err))
    p.flush(30)
    assert reports and reports[0] is not None and reports[0].code() == KafkaError.TOPIC_EXCEPTION, reports

    # Kafka's admin APIs: delete, alter (both APIs), add partitions, create, delete records.
    ka = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert _error_code(ka.delete_topics([OFFSETS_TOPIC], operation_timeout=10)[OFFSETS_TOPIC]) == INVALID_TOPIC
    resource = ConfigResource("TOPIC", OFFSETS_TOPIC, incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)])
    assert _error_code(ka.incremental_alter_configs([resource])[resource]) == INVALID_TOPIC
    legacy = ConfigResource("TOPIC", OFFSETS_TOPIC, set_config={"retention.ms": "1"})
    assert _error_code(ka.alter_configs([legacy])[legacy]) == INVALID_TOPIC
    grow = ka.create_partitions([NewPartitions(OFFSETS_TOPIC, partitions + 7)])[OFFSETS_TOPIC]
    assert _error_code(grow) == INVALID_TOPIC
    # a creation with a client's settings (here: not compacted, so committed offsets would expire)
    created = ka.create_topics([NewTopic(TXN_STATE_TOPIC, 1, 1), NewTopic("allowed", 1, 1)])
    assert _error_code(created[TXN_STATE_TOPIC]) == INVALID_TOPIC
    assert _error_code(created["allowed"]) == 0  # the other topic of the request is created
    hostile = NewTopic(TXN_STATE_TOPIC, 1, 1, config={"cleanup.policy": "compact", "retention.ms": "1"})
    assert _error_code(ka.create_topics([hostile])[TXN_STATE_TOPIC]) == INVALID_TOPIC
    deleted = ka.delete_records([CKTopicPartition(OFFSETS_TOPIC, target, 0)])
    assert _error_code(next(iter(deleted.values()))) == INVALID_TOPIC

    # The bundled admin client (the console's path) and the CLI.
    with Admin(broker.bootstrap) as admin:
        with pytest.raises(OdradekError) as err:
            admin.delete_topic(OFFSETS_TOPIC)
        assert err.value.code == INVALID_TOPIC and "internal topic" in err.value.message, err.value
        with pytest.raises(OdradekError) as err:
            admin.alter_configs(OFFSETS_TOPIC, set={"cleanup.policy": "delete"})
        assert err.value.code == INVALID_TOPIC, err.value
        # what an operator may set on an internal topic, as in Kafka: the replication
        # throttles a reassignment of its partitions sets (odradek reassign --throttle)
        admin.alter_configs(OFFSETS_TOPIC, set={"leader.replication.throttled.replicas": "*"})
        admin.alter_configs(OFFSETS_TOPIC, delete=["leader.replication.throttled.replicas"])
    cli = subprocess.run([sys.executable, "-m", "odradek", "topics", "--bootstrap-server", broker.bootstrap,
                          "--delete", "--topic", OFFSETS_TOPIC], capture_output=True, text=True, timeout=60)
    assert cli.returncode != 0 and "internal topic" in cli.stderr + cli.stdout, (cli.stdout, cli.stderr)

    with Admin(broker.bootstrap) as admin:
        assert OFFSETS_TOPIC in admin.list_topics(include_internal=True)
        assert len(admin.describe_topic(OFFSETS_TOPIC).partitions) == partitions
    assert committed(broker.bootstrap, "victim", "orders") == 5
    broker.stop()
    broker = start_broker(data)  # ready, with the group's own commit and nothing a client wrote
    assert committed(broker.bootstrap, "victim", "orders") == 5


# ---- AddPartitionsToTxn of an internal topic's partitions (issue 27) ------------------------------
# Kafka's handleAddPartitionsToTxnRequest leaves internal topics out of the topics a client may add
# (authorizer or not): they get TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED, and
# nothing joins the transaction. Before the fix each was added (error 0). v4+ (the brokers' batched
# verify form, KIP-890) is not served here: ApiVersions advertises 0 to 3.

TOPIC_DENIED, NOT_ATTEMPTED = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED), int(ErrorCode.OPERATION_NOT_ATTEMPTED)


def test_add_partitions_to_txn_of_an_internal_topic_adds_nothing_at_every_version(broker):
    from odradek.core.kafka import apis
    from tests.security.fixtures import RawKafka
    assert apis.REGISTRY[ApiKey.ADD_PARTITIONS_TO_TXN].max_version == 3
    topic_with_records(broker.bootstrap, "orders", 1)
    commit(broker.bootstrap, "g", "orders", 1)  # creates __consumer_offsets
    conn = RawKafka(broker.bootstrap)
    try:
        for version in range(0, 4):
            txn = f"tx-internal-{version}"
            pid, epoch = conn.init_producer_id(txn)
            r = conn.call(ApiKey.ADD_PARTITIONS_TO_TXN, version, {
                "v3_and_below_transactional_id": txn, "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": [{"name": OFFSETS_TOPIC, "partitions": [0]}, {"name": "orders", "partitions": [0]},
                                        {"name": TXN_STATE_TOPIC, "partitions": [0, 1]}]})
            got = {(t["name"], p["partition_index"]): p["partition_error_code"]
                   for t in r["results_by_topic_v3_and_below"] for p in t["results_by_partition"]}
            assert got == {(OFFSETS_TOPIC, 0): TOPIC_DENIED, ("orders", 0): NOT_ATTEMPTED,
                           (TXN_STATE_TOPIC, 0): TOPIC_DENIED, (TXN_STATE_TOPIC, 1): TOPIC_DENIED}, f"v{version}"
            assert _partitions_in(broker, txn) == [], f"v{version}: partitions joined the transaction"
    finally:
        conn.close()
    # the native protocol: the bundled client's transaction APIs take the same path
    host, port = broker.bootstrap.rsplit(":", 1)
    with BrokerConnection(host, int(port)) as native:
        txn = "tx-internal-native"
        init = native.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": txn, "transaction_timeout_ms": 60000,
                                                        "producer_id": -1, "producer_epoch": -1}).body
        added = native.request(ApiKey.ADD_PARTITIONS_TO_TXN, {
            "transactional_id": txn, "producer_id": init["producer_id"], "producer_epoch": init["producer_epoch"],
            "topics": [{"name": OFFSETS_TOPIC, "partitions": [0]}]}).body
        assert [p["partition_error_code"] for t in added["results"] for p in t["results"]] == [TOPIC_DENIED]
    assert _partitions_in(broker, txn) == []


def _partitions_in(broker, txn: str) -> list:
    """The partitions of ``txn``'s open transaction (DescribeTransactions, native protocol)."""
    host, port = broker.bootstrap.rsplit(":", 1)
    with BrokerConnection(host, int(port)) as conn:
        states = conn.request(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [txn]}).body["transaction_states"]
    assert [s["error_code"] for s in states] == [0], states
    return [(t["topic"], p) for s in states for t in s["topics"] for p in t["partitions"]]
