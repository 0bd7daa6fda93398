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
from tests.cluster.conftest import make_cluster, zookeeper  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


def test_acks_all_producer_and_group_consumer_lose_nothing_across_a_leaders_kill(make_cluster):  # noqa: F811
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
