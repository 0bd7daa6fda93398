"""Issue 16, defect 4 in cluster mode: a topic created while one broker's disk is full. The
controller keeps the replicas that opened (the partition led and acknowledged by them), or
refuses the topic with KAFKA_STORAGE_ERROR when a partition has none; never a topic answered
as created with a partition that has no leader. Broker 3's data directory is a real 16 MiB
tmpfs (root in a container that allows mounts, as tests/odradek/test_storage_defects.py)."""
from __future__ import annotations

import os

import pytest

from odradek import Admin, Producer
from odradek.core.protocol import ErrorCode, OdradekError
from tests.cluster.test_faults import wait_healed
from tests.odradek.test_storage_defects import fill

pytestmark = pytest.mark.slow


def test_a_topic_created_while_a_brokers_disk_is_full_is_led_by_the_others_or_refused(make_cluster, small_disk):
    data_3 = os.path.join(small_disk, "data")
    cluster = make_cluster(3, broker_settings={3: {"log.dirs": data_3}}, min_insync_replicas=2)
    filler = fill(small_disk)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("full", partitions=3, replication_factor=3)
        # every partition is led (by broker 1 or 2, broker 3 out of the ISR) and takes acks=all writes
        for p in range(3):
            assert cluster.leader("full", p) in (1, 2) and 3 not in cluster.isr("full", p), \
                (p, cluster.partition_state("full", p))
        with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=20000) as producer:
            for p in range(3):
                assert producer.send("full", b"x", partition=p).result(20).offset == 0
        # replication factor 1 over three brokers: one partition can only be on broker 3
        with pytest.raises(OdradekError) as err:
            admin.create_topic("alone", partitions=3, replication_factor=1)
        assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR and "not created" in err.value.message, err.value
        assert "alone" not in admin.list_topics()
        assert cluster.topic_assignment("alone") is None
        os.unlink(filler)
        admin.create_topic("alone", partitions=3, replication_factor=1)
    # broker 3's replicas of "full" open when it is told again (its restart), and rejoin the ISR
    cluster.restart(3)
    wait_healed(cluster, "full", 3)
