"""DescribeLogDirs in a cluster (slow: ZooKeeper and two brokers): each broker describes the
partitions it hosts, the ones it follows too, with the bytes of their segments; a follower's
copy reaches the leader's size (kafka-python asks each broker)."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.slow


def sizes(answer: list, topic: str) -> dict:
    """{broker: {partition: size}} of ``topic`` in a describe_log_dirs answer."""
    out = {}
    for b in answer:
        for d in b["log_dirs"]:
            for t in d["topics"]:
                if t["name"] == topic:
                    out[b["broker"]] = {p["partition_index"]: p["partition_size"] for p in t["partitions"]}
    return out


def test_every_broker_describes_the_partitions_it_leads_and_follows(make_cluster):
    from kafka import KafkaAdminClient
    cluster = make_cluster(brokers=2)
    topic = f"dirs-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 2)])[topic].result(timeout=60)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(40):
        p.produce(topic, value=b"v" * 500, partition=i % 2)
    assert p.flush(60) == 0
    del admin, p
    kadmin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=60000)
    try:
        deadline = time.monotonic() + 30
        while True:  # acks=all: both replicas have every record; the follower's answer may trail by a fetch
            got = sizes(kadmin.describe_log_dirs(), topic)
            copies = list(got.values())
            if len(copies) == 2 and copies[0] == copies[1] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sorted(got) == sorted(cluster.brokers) and all(sorted(s) == [0, 1] for s in got.values())
        assert copies[0] == copies[1] and all(size > 20 * 500 for size in copies[0].values()), got
    finally:
        kadmin.close()
