"""ACLs on a real broker with ``authorizer`` on: SASL users signed in with the bundled
client and confluent-kafka, ACLs managed with ``odradek acls`` as a super user. No Write ->
no produce, no Read -> no fetch and no group, deny beats allow, prefixed patterns, super
users, Metadata hides what a principal may not Describe, a restart keeps users and ACLs."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import confluent_kafka
import confluent_kafka.admin
import pytest

from odradek import Admin, Consumer, Producer
from odradek.local import LocalBroker
from odradek.network import secstore
from odradek.core.protocol import ErrorCode, OdradekError
from odradek.types import TopicPartition
from tests.security.fixtures import listeners_of, warm_kafka

USERS = {"alice": "alice-pw", "bob": "bob-pw", "admin": "admin-pw"}
DELAY_MS = 300


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    data = os.path.abspath(str(tmp_path_factory.mktemp("acl-broker")))
    users = secstore.Users(data)
    for name, password in USERS.items():
        users.add(name, password, iterations=4096)
    broker = LocalBroker(data, {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                                "authorizer": True, "super.users": "User:admin",
                                "failed.authentication.delay.ms": DELAY_MS, "shutdown.timeout.ms": 10000,
                                "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"},  # PLAIN: opt-in
                         start_timeout=240).start()
    try:
        broker.listeners = listeners_of(broker)
        warm_kafka(*broker.listeners["PLAINTEXT"][:2])
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


def sasl_addr(broker) -> str:
    host, port, _ = broker.listeners["SASL_PLAINTEXT"]
    return f"{host}:{port}"


def as_user(user: str, mechanism: str = "SCRAM-SHA-256") -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism, "sasl_plain_username": user,
            "sasl_plain_password": USERS[user]}


def acls(broker, *args: str) -> str:
    cmd = [sys.executable, "-m", "odradek", "acls", "--bootstrap-server", sasl_addr(broker),
           "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-512", "--user", "admin",
           "--password", USERS["admin"], *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def topics(acl_broker) -> dict:
    """Topics made by the super user, and the ACLs of the module."""
    names = {"a": f"a-{uuid.uuid4().hex[:6]}", "secret": f"a-secret-{uuid.uuid4().hex[:6]}",
             "other": f"other-{uuid.uuid4().hex[:6]}"}
    with Admin(sasl_addr(acl_broker), **as_user("admin")) as admin:
        for name in names.values():
            admin.create_topic(name)
    acls(acl_broker, "--add", "--allow-principal", "User:alice", "--operation", "Write", "--operation", "Read",
         "--topic", "a-", "--resource-pattern-type", "prefixed")
    acls(acl_broker, "--add", "--allow-principal", "User:bob", "--operation", "Read", "--topic", "a-",
         "--resource-pattern-type", "prefixed")
    acls(acl_broker, "--add", "--deny-principal", "User:bob", "--operation", "Read", "--topic", names["secret"])
    acls(acl_broker, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--group", "alice-group")
    time.sleep(0.5)  # handlers re-read the ACL file at most every 0.2 s
    return names


def produce(broker, user: str, topic: str, value: bytes = b"v") -> int:
    with Producer(sasl_addr(broker), linger_ms=0, retries=0, delivery_timeout_ms=10000, **as_user(user)) as p:
        return p.send(topic, value).get(timeout=15).offset


def fetch_one(broker, user: str, topic: str) -> list:
    with Consumer(sasl_addr(broker), auto_offset_reset="earliest", **as_user(user)) as c:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            records = c.poll(500)
            if records:
                return records
    return []


def test_a_principal_with_write_produces_through_a_prefixed_acl(acl_broker, topics):
    assert produce(acl_broker, "alice", topics["a"], b"first") >= 0


def test_a_principal_without_write_cannot_produce(acl_broker, topics):
    with pytest.raises(OdradekError) as info:
        produce(acl_broker, "bob", topics["a"])
    assert info.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_confluent_kafka_without_write_gets_topic_authorization_failed(acl_broker, topics):
    out = []
    p = confluent_kafka.Producer({"bootstrap.servers": sasl_addr(acl_broker), "security.protocol": "SASL_PLAINTEXT",
                                  "sasl.mechanism": "PLAIN", "sasl.username": "bob", "sasl.password": USERS["bob"],
                                  "message.timeout.ms": 10000})
    p.produce(topics["a"], b"x", on_delivery=lambda err, msg: out.append(err))
    p.flush(15)
    assert out and out[0] is not None and out[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_principal_with_read_fetches_and_without_it_cannot(acl_broker, topics):
    produce(acl_broker, "admin", topics["other"], b"hidden")
    assert fetch_one(acl_broker, "bob", topics["a"]) or produce(acl_broker, "alice", topics["a"]) >= 0
    with pytest.raises(OdradekError) as info:
        fetch_one(acl_broker, "alice", topics["other"])
    assert info.value.code in (ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)


def test_deny_beats_allow(acl_broker, topics):
    produce(acl_broker, "alice", topics["secret"], b"s")
    assert fetch_one(acl_broker, "alice", topics["secret"])
    with pytest.raises(OdradekError):
        fetch_one(acl_broker, "bob", topics["secret"])


def test_metadata_hides_the_topics_a_principal_may_not_describe(acl_broker, topics):
    with Admin(sasl_addr(acl_broker), **as_user("bob")) as admin:
        seen = set(admin.list_topics())
    assert topics["a"] in seen and topics["other"] not in seen
    with Admin(sasl_addr(acl_broker), **as_user("admin")) as admin:
        assert topics["other"] in set(admin.list_topics())


def test_a_group_needs_read_on_the_group(acl_broker, topics):
    produce(acl_broker, "alice", topics["a"], b"g")
    tp = TopicPartition(topics["a"], 0)
    with Consumer(sasl_addr(acl_broker), group_id="alice-group", enable_auto_commit=False, **as_user("alice")) as c:
        c.assign([tp])
        c.commit({tp: 1})
        assert c.committed(tp) == 1
    with Consumer(sasl_addr(acl_broker), group_id="bob-group", enable_auto_commit=False, **as_user("bob")) as c:
        c.assign([tp])
        with pytest.raises(OdradekError) as info:
            c.commit({tp: 1})
    assert info.value.code == ErrorCode.GROUP_AUTHORIZATION_FAILED


def test_anonymous_clients_get_nothing_once_the_authorizer_is_on(acl_broker, topics):
    host, port, _ = acl_broker.listeners["PLAINTEXT"]
    with Admin(f"{host}:{port}") as admin:
        assert admin.list_topics() == []
        with pytest.raises(OdradekError) as info:
            admin.create_topic(f"anon-{uuid.uuid4().hex[:6]}")
    assert info.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_the_bundled_client_with_a_wrong_password_is_refused_after_the_delay(acl_broker):
    began = time.monotonic()
    with pytest.raises(OdradekError) as info:
        with Admin(sasl_addr(acl_broker), request_timeout_ms=3000, security_protocol="SASL_PLAINTEXT",
                   sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice", sasl_plain_password="nope") as admin:
            admin.list_topics()
    assert info.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert time.monotonic() - began >= DELAY_MS / 1000


def test_denials_and_authentication_failures_are_counted_in_metrics(acl_broker, topics):
    import urllib.request
    with pytest.raises(OdradekError):
        produce(acl_broker, "bob", topics["a"])
    with pytest.raises(OdradekError):
        with Admin(sasl_addr(acl_broker), request_timeout_ms=3000, security_protocol="SASL_PLAINTEXT",
                   sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password="nope") as admin:
            admin.list_topics()
    text = urllib.request.urlopen(acl_broker.console_url + "metrics", timeout=10).read().decode()
    assert 'odradek_authorization_denied_total{operation="Write",resource="Topic"}' in text
    assert 'odradek_authentication_failures_total{listener="SASL_PLAINTEXT"}' in text


def test_acls_list_shows_what_was_added(acl_broker, topics):
    out = acls(acl_broker, "--list", "--topic", "a-", "--resource-pattern-type", "prefixed")
    assert "principal=User:alice" in out and "operation=Write" in out


def _confluent_as(broker, user: str, **extra) -> dict:
    return {"bootstrap.servers": sasl_addr(broker), "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": USERS[user], **extra}


def test_a_produce_to_a_denied_and_an_allowed_topic_fails_only_the_denied_ones_partitions(acl_broker, topics):
    from odradek.core.records import encode_batch
    from odradek.network.client import BrokerConnection
    from odradek.core.protocol import ApiKey
    writable = f"b-writable-{uuid.uuid4().hex[:6]}"
    with Admin(sasl_addr(acl_broker), **as_user("admin")) as admin:
        admin.create_topic(writable)
    acls(acl_broker, "--add", "--allow-principal", "User:bob", "--operation", "Write", "--topic", writable)
    time.sleep(0.5)  # handlers re-read the ACL file at most every 0.2 s
    # bob may Describe topics["a"] (his Read implies it) but not Write it: one request, both topics
    host, port, _ = acl_broker.listeners["SASL_PLAINTEXT"]
    with BrokerConnection(host, port, client_id="bob", **as_user("bob")) as conn:
        body = conn.request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 5000, "topics": [
            {"name": topics["a"], "partitions": [{"index": 0, "frame": 0}]},
            {"name": writable, "partitions": [{"index": 0, "frame": 1}]}]},
            [encode_batch([(None, b"denied")]), encode_batch([(None, b"allowed")])]).body
    codes = {t["name"]: t["partitions"][0]["error_code"] for t in body["topics"]}
    assert codes == {topics["a"]: ErrorCode.TOPIC_AUTHORIZATION_FAILED, writable: 0}
    out = {}
    p = confluent_kafka.Producer(_confluent_as(acl_broker, "bob", **{"linger.ms": 200, "message.timeout.ms": 15000}))
    for topic in (topics["a"], writable):
        p.produce(topic, b"x", on_delivery=lambda err, msg: out.__setitem__(msg.topic(), err))
    p.flush(20)
    assert out[writable] is None
    assert out[topics["a"]].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_fetch_of_a_denied_and_an_allowed_topic_serves_the_allowed_one(acl_broker, topics):
    produce(acl_broker, "alice", topics["a"], b"readable")
    produce(acl_broker, "alice", topics["secret"], b"not for bob")
    # bob's Read on a- is denied on topics["secret"] (he may still Describe it)
    consumer = confluent_kafka.Consumer(_confluent_as(acl_broker, "bob", **{
        "group.id": "unused", "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    try:
        consumer.assign([confluent_kafka.TopicPartition(topics["a"], 0, 0),
                         confluent_kafka.TopicPartition(topics["secret"], 0, 0)])
        values, errors = [], []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (values and any(t == topics["secret"] for t, _ in errors)):
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is None:
                values.append((m.topic(), m.value()))
            else:  # (bob may not Describe the group "unused" either: librdkafka reports that too)
                errors.append((m.topic(), m.error().code()))
    finally:
        consumer.close()
    assert values and {t for t, _ in values} == {topics["a"]}
    assert (topics["secret"], confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED) in errors


def test_metadata_for_a_named_topic_the_principal_may_not_describe_says_so_and_creates_nothing(acl_broker, topics):
    named = f"never-{uuid.uuid4().hex[:6]}"
    admin = confluent_kafka.admin.AdminClient(_confluent_as(acl_broker, "bob"))
    for topic in (topics["other"], named):
        md = admin.list_topics(topic=topic, timeout=30)
        assert md.topics[topic].error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    with Admin(sasl_addr(acl_broker), **as_user("admin")) as su:
        assert named not in su.list_topics()


@pytest.mark.slow
def test_a_restart_keeps_users_and_acls(acl_broker, topics):
    acl_broker.stop()
    acl_broker.start()
    acl_broker.listeners = listeners_of(acl_broker)
    assert produce(acl_broker, "alice", topics["a"], b"after restart") >= 0
    with pytest.raises(OdradekError) as info:
        produce(acl_broker, "bob", topics["a"])
    assert info.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_confluent_kafkas_admin_client_creates_describes_and_deletes_acls(acl_broker, topics):
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)
    admin = AdminClient({"bootstrap.servers": sasl_addr(acl_broker), "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "admin", "sasl.password": USERS["admin"]})
    name = f"kafka-admin-{uuid.uuid4().hex[:6]}"
    binding = AclBinding(ResourceType.TOPIC, name, ResourcePatternType.LITERAL, "User:carol", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    for future in admin.create_acls([binding]).values():
        future.result(timeout=30)
    flt = AclBindingFilter(ResourceType.TOPIC, name, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                           AclPermissionType.ANY)
    assert admin.describe_acls(flt).result(timeout=30) == [binding]
    deleted = [b for f in admin.delete_acls([flt]).values() for b in f.result(timeout=30)]
    assert deleted == [binding]
    assert admin.describe_acls(flt).result(timeout=30) == []


def test_the_offsets_of_all_topics_of_a_group_are_those_the_principal_may_describe(acl_broker, topics):
    """Kafka's OffsetFetch with no topics named (an admin client's list of a group's offsets)
    answers the committed offsets of the topics the principal may Describe, not all of them:
    alice may Describe 'a-...' but not 'other-...', both committed in her group by the admin."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    group = "alice-group"
    with Consumer(sasl_addr(acl_broker), group_id=group, enable_auto_commit=False, **as_user("admin")) as c:
        tps = [TopicPartition(topics["a"], 0), TopicPartition(topics["other"], 0)]
        c.assign(tps)
        c.commit({tp: 0 for tp in tps})
    for user, expected in (("admin", {topics["a"], topics["other"]}), ("alice", {topics["a"]})):
        admin = confluent_kafka.admin.AdminClient(_confluent_as(acl_broker, user))
        future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
        assert {tp.topic for tp in future.result(timeout=30).topic_partitions} == expected, user
