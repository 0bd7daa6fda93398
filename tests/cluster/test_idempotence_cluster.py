"""The idempotent producer across a leader's kill -9 (issue 12): three brokers, RF 3,
min.insync.replicas=2, idempotent acks=all producers (the bundled producer's default).
Followers carry each producer's sequences, so a batch the dead leader appended and
replicated, whose answer was lost, is recognised by the new leader when it is retried:
every acknowledged record is read back at its offset and no record is stored twice."""
from __future__ import annotations

import collections

import pytest

from odradek.cluster import Connection
from tests.cluster.test_faults import PARTITIONS, TOPIC, create_replicated_topic, finish, new_leader, wait_healed
from tests.cluster.verify import Workload, read_all

pytestmark = pytest.mark.slow


def duplicates(consumed) -> list:
    counts = collections.Counter(consumed.snapshot().values())
    return [v for v, c in counts.items() if c > 1]


def test_a_leader_killed_under_idempotent_producers_leaves_no_duplicate(make_cluster):
    cluster = make_cluster()
    create_replicated_topic(cluster)
    with Workload(cluster.bootstrap, TOPIC, rate=400, producers=3,
                  producer_settings={"linger_ms": 2, "request_timeout_ms": 5000, "delivery_timeout_ms": 120000,
                                     "retry_backoff_ms": 50}) as load:
        load.wait_acked(300)
        for partition in (0, 1):
            state = cluster.partition_state(TOPIC, partition)
            cluster.kill(state["leader"])
            new_leader(cluster, TOPIC, partition, state["leader"], state["leader_epoch"])
            load.wait_acked(300, timeout=60)
            cluster.restart(state["leader"])
            wait_healed(cluster)
        finish(cluster, load)
        assert not load.acked.failed, load.acked.failed[:3]
    fresh = read_all(cluster.bootstrap, TOPIC, range(PARTITIONS))
    dups = duplicates(fresh)
    assert not dups, f"{len(dups)} records stored twice, e.g. {dups[:5]}"


def test_producer_ids_are_unique_across_the_brokers_of_a_cluster(make_cluster):
    cluster = make_cluster()
    ids = []
    for broker_id in cluster.ids:
        b = cluster.broker(broker_id)
        c = Connection(b.host, b.port)
        c.connect()
        try:
            for _ in range(3):
                body = c.request(22, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                      "producer_id": -1, "producer_epoch": -1}).header["body"]
                assert body["error_code"] == 0
                ids.append(body["producer_id"])
        finally:
            c.close()
    assert len(set(ids)) == len(ids)
