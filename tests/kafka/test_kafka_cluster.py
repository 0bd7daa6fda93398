"""Kafka clients against a cluster (three brokers, ZooKeeper): a confluent-kafka acks=all
producer and a confluent-kafka group consumer across the kill -9 of a partition leader;
nothing acknowledged is lost, and the group goes on (its coordinator may be the broker
killed: ``__consumer_offsets`` is replicated, the new leader of its partition takes over)."""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer as KafkaConsumer, Producer as KafkaProducer

from odradek import Admin

pytestmark = pytest.mark.slow


def test_acks_all_producer_and_group_consumer_lose_nothing_across_a_leaders_kill(make_cluster):
    cluster = make_cluster(3, min_insync_replicas=2)
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, 3, 3)
    acked, failed, stop = set(), [], threading.Event()

    def delivered(err, msg) -> None:
        if err is None:
            acked.add(msg.value())
        else:
            failed.append(err)

    def produce() -> None:
        p = KafkaProducer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5,
                           "message.timeout.ms": 120000})
        i = 0
        while not stop.is_set():
            p.produce(topic, value=b"r%d" % i, on_delivery=delivered)
            p.poll(0.002)
            i += 1
        p.flush(120)

    consumed: set = set()
    c = KafkaConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                       "enable.auto.commit": True, "auto.commit.interval.ms": 500, "session.timeout.ms": 10000})
    c.subscribe([topic])
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        def consume_until(condition, timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            while not condition():
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                m = c.poll(0.2)
                if m is not None and not m.error():
                    consumed.add(m.value())

        consume_until(lambda: len(acked) >= 500 and len(consumed) >= 200, 120, "500 acknowledged, 200 consumed")
        victim = cluster.leader(topic, 0)
        cluster.kill(victim)
        at_kill = len(acked)
        consume_until(lambda: len(acked) >= at_kill + 500, 120, "500 more acknowledged after the kill")
        stop.set()
        producer.join(150)
        assert not producer.is_alive()
        consume_until(lambda: acked <= consumed, 120, "every acknowledged record consumed")
    finally:
        stop.set()
        c.close()
    assert acked <= consumed


def test_a_classic_group_follows_its_coordinator_to_another_broker_without_a_rebalance(make_cluster):
    """kill -9 of the broker that coordinates a classic group: the new leader of the group's
    ``__consumer_offsets`` partition loads the group's record, the member finds it and goes on
    in its generation (no partition revoked) and its commits are accepted there."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    cluster = make_cluster(3, min_insync_replicas=2)
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, 2, 3)
    p = KafkaProducer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(20):
        p.produce(topic, value=b"a%d" % i)
    assert p.flush(120) == 0
    revoked, got = [], []
    c = KafkaConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                       "enable.auto.commit": False, "session.timeout.ms": 30000})
    c.subscribe([topic], on_revoke=lambda cons, ps: revoked.append(ps))
    try:
        deadline = time.monotonic() + 120
        while len(got) < 20 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
        assert len(got) == 20
        c.commit(asynchronous=False)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        coordinator = admin.describe_consumer_groups([group], request_timeout=30)[group].result().coordinator.id
        cluster.kill(coordinator)
        for i in range(10):
            p.produce(topic, value=b"b%d" % i)
        assert p.flush(120) == 0
        deadline = time.monotonic() + 120
        while len(got) < 30 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
        assert sorted(got[20:]) == sorted(b"b%d" % i for i in range(10))
        end = time.monotonic() + 10  # heartbeats reach the new coordinator
        while time.monotonic() < end:
            c.poll(0.2)
        assert revoked == []  # the same generation: the group record was loaded by the new coordinator
        c.commit(asynchronous=False)
        committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
        # librdkafka's sticky partitioner may put all 30 records in one partition: the other then
        # has nothing to commit (OFFSET_INVALID, -1001; CI saw it), and the sum counts it as 0
        assert sum(max(tp.offset, 0) for tp in committed) == 30, committed
    finally:
        c.close()
