"""/metrics of a replicated cluster (ZooKeeper and two brokers on 127.0.0.1): an acks=all
produce's wait for its ISR is the leader's remote time; a follower that dies makes the
leader's ISR shrink, its partition under-replicated and under min ISR, per topic."""
from __future__ import annotations

import os
import time

import pytest

from odradek import Admin, Producer
from tests.observability.test_metrics import scrape, value


@pytest.mark.slow
def test_an_isr_wait_is_remote_time_and_a_dead_follower_shows_in_the_leaders_metrics(make_cluster):
    cluster = make_cluster(brokers=2)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("replicated", partitions=1, replication_factor=2, config={"min.insync.replicas": "2"})
    cluster.wait_for(lambda: len(cluster.isr("replicated", 0)) == 2, 30, "both replicas in the ISR")
    leader = cluster.brokers[cluster.leader("replicated", 0)]
    follower_id = next(i for i in cluster.ids if i != cluster.leader("replicated", 0))
    before = scrape(leader)
    with Producer(cluster.bootstrap, acks="all", linger_ms=0) as producer:
        for _ in range(5):  # one at a time: each waits for the follower's next fetch
            producer.send("replicated", value=os.urandom(100), partition=0).result(30)
    after = scrape(leader)

    def moved(name: str) -> float:
        return value(after, name, api="produce") - value(before, name, api="produce")
    assert moved("odradek_request_remote_time_seconds_count") >= 5
    assert moved("odradek_request_remote_time_seconds_sum") > 0
    assert value(after, "odradek_topic_under_replicated_partitions", topic="replicated") == 0

    shrinks = value(after, "odradek_isr_shrinks_total")
    cluster.kill(follower_id)
    deadline, samples = time.monotonic() + 30, after
    while time.monotonic() < deadline:
        samples = scrape(leader)
        if value(samples, "odradek_topic_under_min_isr_partitions", topic="replicated") == 1:
            break
        time.sleep(0.5)
    assert value(samples, "odradek_topic_under_replicated_partitions", topic="replicated") == 1
    assert value(samples, "odradek_topic_under_min_isr_partitions", topic="replicated") == 1
    assert value(samples, "odradek_under_replicated_partitions") >= 1
    assert value(samples, "odradek_isr_shrinks_total") == shrinks + 1
    assert value(samples, "odradek_topic_leaders", topic="replicated") == 1
