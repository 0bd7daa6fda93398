"""ZooKeeper out of reach while a broker runs: the broker waits for it, it does not stop.

A controller actor restarted in a running broker (a crash, a liveness kill after a long pause)
used to give up when ZooKeeper did not answer within ``zookeeper.connection.timeout.ms``; each
attempt counted as a death, and the supervisor's restart limit then shut the whole broker down
although its partitions were on disk and ZooKeeper came back seconds later (seen in the chaos
runs). At the broker's own start ZooKeeper out of reach stays fatal, with the reason."""
from __future__ import annotations

import time

import pytest

from odradek import Admin, Consumer, Producer, TopicPartition
from odradek.local import LocalCluster, zookeeper_missing
from tests.cluster.fixtures import TEST_SETTINGS


@pytest.fixture
def lone_cluster(tmp_path):
    missing = zookeeper_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    # one broker on a ZooKeeper of its own (the test kills it); restarts of one actor are allowed
    # 5 in 60 s, and each attempt to reach ZooKeeper gives up after 1 s
    cluster = LocalCluster(str(tmp_path), 1, {**TEST_SETTINGS, "zookeeper.connection.timeout.ms": 1000})
    try:
        cluster.start()
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop(graceful=False)


def test_a_controller_actor_restarted_while_zookeeper_is_down_waits_for_it_and_the_broker_keeps_running(
        lone_cluster):
    cluster = lone_cluster
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("kept", partitions=1, replication_factor=1)
    with Producer(cluster.bootstrap, acks=1) as producer:
        producer.send("kept", b"before", partition=0).result(30)

    broker = cluster.broker(1)
    cluster.zk.kill()
    broker.actor_process("controller").kill()
    deadline = time.monotonic() + 20  # before the fix: 6 deaths of 1 s each and the broker stopped
    while time.monotonic() < deadline:
        assert broker.proc.poll() is None, "the broker shut down while ZooKeeper was out of reach"
        time.sleep(0.2)
    controller = broker.actor("controller")
    assert controller["state"] == "restarting" and "ZooKeeper" in controller["progress"], controller

    cluster.zk.requested_port = cluster.zk.port  # the broker knows this port
    cluster.close_kazoo()
    cluster.zk.start()
    cluster.wait_for(lambda: broker.actor("controller")["state"] == "running", 60, "the controller actor running")
    cluster.wait_ready()
    with Producer(cluster.bootstrap, acks=1) as producer:
        producer.send("kept", b"after", partition=0).result(30)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("kept", 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(timeout_ms=1000)]
    assert got == [b"before", b"after"]
