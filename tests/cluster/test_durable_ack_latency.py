"""Durable acknowledgement (issue 33) in a real cluster: a follower's fsync is reported to the
leader as soon as it ends, not in the follower's next FETCH.

A follower answers its replica fetcher right after the append and fsyncs while its next FETCH
is on the way; that FETCH, finding no new data on an idle partition, waits at the leader up to
``replica.fetch.wait.max.ms``. Were the fsynced offset told only by a FETCH, every acks=all
produce to an idle partition would wait that long (2 s here). The progress report (a FETCH
with ``progress_only`` on a second connection) tells it at once."""
from __future__ import annotations

import statistics
import time

import pytest

from odradek import Producer
from tests.cluster.test_faults import create_replicated_topic

pytestmark = pytest.mark.slow

FETCH_WAIT_MS = 2000


def test_an_acks_all_produce_to_an_idle_partition_does_not_wait_for_the_followers_parked_fetch(make_cluster):
    cluster = make_cluster(3, replica_fetch_wait_max_ms=FETCH_WAIT_MS)  # log.flush.before.ack: the default
    create_replicated_topic(cluster, "idle", partitions=1)
    with Producer(cluster.bootstrap, acks="all", linger_ms=0) as producer:
        producer.send("idle", b"warm", partition=0).get(timeout=30)
        took = []
        for i in range(5):
            time.sleep(0.3)  # every follower's FETCH is parked at the leader again
            start = time.monotonic()
            meta = producer.send("idle", b"v%d" % i, partition=0).get(timeout=30)
            took.append(time.monotonic() - start)
            assert meta.offset == i + 1
    # structural, not a timing bound: waiting for a parked FETCH would take FETCH_WAIT_MS
    assert statistics.median(took) < FETCH_WAIT_MS / 2000, [round(t, 3) for t in took]
