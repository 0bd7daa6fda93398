"""Cluster mode with several secure listeners (real ZooKeeper, two real brokers, one cluster
for the module): every broker registers each listener's endpoint in ZooKeeper, clients are
given every broker's address on the listener they came in on (Metadata, FindCoordinator),
and the brokers reach each other on ``inter.broker.listener.name`` with TLS and SASL as the
broker's own user. The cluster has no PLAINTEXT listener at all, and its authorizer lets only
super users do cluster actions (the followers' fetches, LEADER_AND_ISR), so replication works
only if the replica fetcher and the controller channel sign in as ``User:broker``."""
from __future__ import annotations

import os
import ssl
import time
import uuid

import confluent_kafka
import confluent_kafka.admin
import pytest

from odradek.local import LocalCluster
from odradek.network import secstore
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from tests.cluster.fixtures import TEST_SETTINGS
from tests.security.fixtures import listeners_of, warm_kafka

PASSWORDS = {"broker": "broker-secret", "alice": "alice-secret"}
NAMES = ("INTERNAL", "EXTERNAL")


@pytest.fixture(scope="module")
def secure_cluster(zookeeper, certs, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("secure-cluster"))
    chroot = f"/odradek-sec-listeners-{uuid.uuid4().hex[:6]}"
    users = secstore.Users(base, {"zookeeper.connect": zookeeper.connect + chroot})
    for name, password in PASSWORDS.items():
        users.add(name, password, iterations=4096)
    users.store.close()
    password_file = os.path.join(base, "broker.password")
    with open(os.open(password_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(PASSWORDS["broker"] + "\n")
    settings = {**TEST_SETTINGS,
                "listeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
                "listener.security.protocol.map": "INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL",
                "inter.broker.listener.name": "INTERNAL",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                "sasl.inter.broker.username": "broker", "sasl.inter.broker.password.file": password_file,
                "ssl.certfile": certs["broker"] + ".pem", "ssl.keyfile": certs["broker"] + ".key",
                "ssl.cafile": certs["ca"] + ".pem",
                "authorizer": True, "super.users": "User:broker;User:alice",
                "min.insync.replicas": 2, "offsets.topic.replication.factor": 2,
                "transaction.state.log.replication.factor": 2, "transaction.state.log.num.partitions": 2}
    cluster = LocalCluster(base, 2, settings, zk=zookeeper, chroot=chroot, start_timeout=240,
                           client_security=_bundled_options(certs))
    try:
        cluster.start()
        cluster.wait_ready(120)
        cluster.listeners = {i: listeners_of(cluster.broker(i)) for i in cluster.ids}
        for i in cluster.ids:
            _warm_kafka(*cluster.listeners[i]["EXTERNAL"][:2], certs)
        yield cluster
    finally:
        cluster.stop(graceful=False)


def _bundled_options(certs) -> dict:
    return {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "alice",
            "sasl_plain_password": PASSWORDS["alice"], "ssl_cafile": certs["ca"] + ".pem"}


def _warm_kafka(host: str, port: int, certs, connections: int = 3) -> None:
    warm_kafka(host, port, connections, context=ssl.create_default_context(cafile=certs["ca"] + ".pem"))


def _confluent(cluster, certs, listener: str, broker: int = 1) -> dict:
    host, port, _proto = cluster.listeners[broker][listener]
    return {"bootstrap.servers": f"{host}:{port}", "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": PASSWORDS["alice"],
            "ssl.ca.location": certs["ca"] + ".pem", "socket.timeout.ms": 20000}


def test_every_broker_registers_each_listeners_endpoint_in_zookeeper(secure_cluster):
    for i in secure_cluster.ids:
        node = secure_cluster._json(f"/brokers/ids/{i}")
        mine = secure_cluster.listeners[i]
        assert sorted(node["endpoints"]) == sorted(f"{n}://{h}:{p}" for n, (h, p, _proto) in mine.items())
        assert node["listener_security_protocol_map"] == {"INTERNAL": "SASL_SSL", "EXTERNAL": "SASL_SSL"}
        assert (node["host"], node["port"]) == mine["INTERNAL"][:2]  # the inter-broker listener's


@pytest.mark.parametrize("listener", NAMES)
def test_a_kafka_client_is_given_every_brokers_address_on_the_listener_it_came_in_on(secure_cluster, certs,
                                                                                     listener):
    admin = confluent_kafka.admin.AdminClient(_confluent(secure_cluster, certs, listener))
    brokers = admin.list_topics(timeout=60).brokers
    assert {b.id: (b.host, b.port) for b in brokers.values()} == {
        i: secure_cluster.listeners[i][listener][:2] for i in secure_cluster.ids}


def test_find_coordinator_gives_the_coordinators_address_on_the_listener_asked(secure_cluster, certs):
    group = f"g-{uuid.uuid4().hex[:6]}"
    for listener in NAMES:
        for i in secure_cluster.ids:  # one of the two is not the coordinator: its answer names the other
            host, port, _proto = secure_cluster.listeners[i][listener]
            with BrokerConnection(host, port, client_id="coordinator-test", **_bundled_options(certs)) as conn:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        body = conn.request(ApiKey.FIND_COORDINATOR, {"key": group, "key_type": 0}).body
                        break
                    except OdradekError as exc:  # __consumer_offsets is being created
                        assert exc.code == ErrorCode.COORDINATOR_NOT_AVAILABLE and time.monotonic() < deadline, exc
                        time.sleep(0.5)
            node = body["node_id"]
            assert (body["host"], body["port"]) == secure_cluster.listeners[node][listener][:2]


def test_a_cluster_whose_only_listeners_are_sasl_ssl_replicates_over_its_inter_broker_listener(secure_cluster,
                                                                                              certs):
    topic = f"replicated-{uuid.uuid4().hex[:6]}"
    conf = _confluent(secure_cluster, certs, "EXTERNAL")
    admin = confluent_kafka.admin.AdminClient(conf)
    for f in admin.create_topics([confluent_kafka.admin.NewTopic(topic, 1, 2)], operation_timeout=30).values():
        f.result(60)
    secure_cluster.wait_for(lambda: len(secure_cluster.isr(topic, 0)) == 2, 60, "both replicas in the ISR")
    out = []
    producer = confluent_kafka.Producer({**conf, "acks": "all", "message.timeout.ms": 60000})
    for n in range(20):  # acks=all with min.insync.replicas=2: each is on the follower too
        producer.produce(topic, b"v%d" % n, on_delivery=lambda err, msg: out.append(err))
    producer.flush(90)
    assert out == [None] * 20
    assert sorted(secure_cluster.isr(topic, 0)) == secure_cluster.ids


def test_a_transaction_across_both_brokers_commits_with_markers_sent_over_the_inter_broker_listener(
        secure_cluster, certs):
    """The transaction coordinator writes the markers of partitions the other broker leads with
    WRITE_TXN_MARKERS (a cluster action): only over the inter-broker listener, signed in as
    ``User:broker``, can it reach that broker at all here."""
    topic = f"txn-{uuid.uuid4().hex[:6]}"
    conf = _confluent(secure_cluster, certs, "EXTERNAL")
    admin = confluent_kafka.admin.AdminClient(conf)
    for f in admin.create_topics([confluent_kafka.admin.NewTopic(topic, 2, 1, config={"min.insync.replicas": "1"})],
                                        operation_timeout=30).values():
        f.result(60)
    leaders = secure_cluster.wait_for(
        lambda: (lambda ls: ls if None not in ls else None)([secure_cluster.leader(topic, p) for p in (0, 1)]),
        60, "leaders")
    assert sorted(leaders) == sorted(secure_cluster.ids), leaders  # one partition on each broker
    producer = confluent_kafka.Producer({**conf, "transactional.id": f"tx-{topic}", "message.timeout.ms": 60000})
    producer.init_transactions(90)
    producer.begin_transaction()
    for p in (0, 1):
        producer.produce(topic, b"committed-%d" % p, partition=p)
    producer.commit_transaction(90)
    consumer = confluent_kafka.Consumer({**conf, "group.id": f"g-{topic}", "isolation.level": "read_committed",
                                         "auto.offset.reset": "earliest", "enable.partition.eof": True})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in (0, 1)])
    got, at_end = [], set()
    deadline = time.monotonic() + 60
    try:
        while len(at_end) < 2 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, m.error()
                at_end.add(m.partition())
            else:
                got.append(m.value())
    finally:
        consumer.close()
    assert sorted(got) == [b"committed-0", b"committed-1"]


def test_a_sasl_inter_broker_listener_without_the_brokers_user_is_refused_at_start():
    from odradek import config as cfg
    with pytest.raises(cfg.ConfigError, match="sasl.inter.broker.username"):
        cfg.load(None, ["zookeeper.connect=127.0.0.1:2181", "listeners=SASL_PLAINTEXT://127.0.0.1:0"])
