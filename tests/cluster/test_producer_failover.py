"""Losing one broker of three is invisible to an acks=all producer (issue 16, defect 19).

Three brokers, replication factor 3, min.insync.replicas=2, producers with Kafka's defaults
(retries unbounded, ``delivery_timeout_ms`` 120 s). One broker's supervisor is killed -9 (its
actors see their parent die and stop, answering what they held), it comes back; then another
broker is stopped with SIGTERM (a controlled shutdown) and comes back. Before, 782 of 30,000
sends failed with ``BROKER_NOT_AVAILABLE: log-1 is stopping; 'produce' was not completed``:
a stopping broker answered a produce it had not done with an error the client takes as
final. Now no send fails, and every acknowledged record is read back at its offset.
"""
from __future__ import annotations

import pytest

from tests.cluster.test_faults import TOPIC, create_replicated_topic, finish, wait_healed
from tests.cluster.verify import Workload

pytestmark = pytest.mark.slow


def kill_supervisor_only(cluster, broker_id: int) -> None:
    """kill -9 of the supervisor alone: its actors get their parent-death signal and stop."""
    proc = cluster.broker(broker_id).proc
    proc.kill()
    proc.wait(30)


def test_no_send_fails_when_one_broker_is_killed_and_another_stopped(make_cluster):
    cluster = make_cluster()
    create_replicated_topic(cluster)
    with Workload(cluster.bootstrap, TOPIC, rate=300,
                  producer_settings={"delivery_timeout_ms": 120000, "request_timeout_ms": 30000}) as load:
        load.wait_acked(300)
        crashed = cluster.leader(TOPIC, 0)
        kill_supervisor_only(cluster, crashed)
        load.wait_acked(300, timeout=60)
        cluster.restart(crashed)
        wait_healed(cluster)
        load.wait_acked(300, timeout=60)

        stopped = cluster.leader(TOPIC, 1)
        assert cluster.broker(stopped).terminate(timeout=60) is not None, "SIGTERM did not stop the broker"
        load.wait_acked(300, timeout=60)
        cluster.restart(stopped)
        wait_healed(cluster)
        finish(cluster, load)  # stops the producers; every acknowledged record read at its offset
        failed = load.acked.failed
        assert not failed, f"{len(failed)} of {load.acked.sent} sends failed, e.g. {failed[:3]}"
