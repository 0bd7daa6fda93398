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


def test_a_broker_that_registered_again_while_the_controller_was_cut_from_zookeeper_is_told_its_partitions(
        zookeeper, tmp_path):
    """The controller's connection to ZooKeeper breaks (its session survives); meanwhile a
    broker stops and registers again. kazoo's ChildrenWatch re-reads ``/brokers/ids`` when the
    connection comes back and calls nobody when the ids are the same, so the controller never
    saw the new registration: the restarted broker was never sent LEADER_AND_ISR, followed
    nothing, and a partition it led had no working leader (the short chaos schedule's
    'cluster did not heal': a replica below the high watermark, a partition with no leader).
    Seen failing before the fix: the ISRs never became whole again."""
    from odradek.chaos.proxy import FaultProxy
    from tests.cluster.fixtures import new_cluster
    proxy = FaultProxy()
    cluster = None
    try:
        # every broker reaches ZooKeeper through a link of the proxy; sessions long enough to
        # outlive the cut (60 s, the server's maximum); no controlled shutdown (it would wait
        # for the cut-off controller)
        broker_settings = {}
        for i in (1, 2, 3):
            port = proxy.add(f"zk-{i}", lambda: ("127.0.0.1", zookeeper.port), owner=i)
            broker_settings[i] = {"zookeeper.connect": f"127.0.0.1:{port}/odradek-zk-cut",
                                  "zookeeper.session.timeout.ms": 60000, "controlled.shutdown.enable": False}
        cluster = LocalCluster(str(tmp_path), 3, TEST_SETTINGS, zk=zookeeper, chroot="/odradek-zk-cut",
                               broker_settings=broker_settings)
        cluster.start()
        controller = cluster.wait_ready(60)
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic("cut", partitions=3, replication_factor=3, config={"min.insync.replicas": 2})
        full = lambda: all(sorted(cluster.isr("cut", p)) == [1, 2, 3] and cluster.leader("cut", p)
                           for p in range(3))
        cluster.wait_for(full, 60, "every partition of cut led with a full ISR")
        victim = next(i for i in (1, 2, 3) if i != controller)
        owner = cluster.kazoo.exists("/controller").owner_session_id
        before = cluster.kazoo.exists(f"/brokers/ids/{victim}").czxid

        proxy.set_rule(f"zk-{controller}", "*", "drop")  # the controller's connection breaks
        cluster.restart(victim)  # SIGTERM (its session closes: its node goes at once), then start
        cluster.wait_for(lambda: (s := cluster.kazoo.exists(f"/brokers/ids/{victim}")) and s.czxid != before,
                         60, f"broker {victim} registered again")
        proxy.heal()

        cluster.wait_for(full, 60, "every partition of cut led with a full ISR after the cut")
        # the controller kept its session throughout (else a new controller would have read
        # everything afresh and this test would not test the reconnection)
        assert cluster.kazoo.exists("/controller").owner_session_id == owner
        with Producer(cluster.bootstrap, acks="all") as producer:
            for p in range(3):
                producer.send("cut", b"after", partition=p).result(60)
    finally:
        if cluster is not None:
            cluster.stop(graceful=False)
        proxy.close()


def test_the_controller_actors_blocking_zookeeper_calls_give_up_while_zookeeper_cannot_be_reached(zookeeper):
    """kazoo's blocking calls wait without a limit, and one made while the connection is being
    re-established waits until it is: the controller actor's loop stood still past the
    supervisor's liveness timeout and was killed, 30 s at a time, in the short chaos schedule.
    ``coordinator.zk_client`` makes them raise ConnectionLoss after the request timeout."""
    import threading

    from kazoo.exceptions import ConnectionLoss

    from odradek.chaos.proxy import FaultProxy
    from odradek.coordinator.zk_client import bounded_client

    proxy = FaultProxy()
    port = proxy.add("zk", lambda: ("127.0.0.1", zookeeper.port))
    zk = bounded_client(f"127.0.0.1:{port}", session_timeout=30.0, request_timeout=1.0)
    try:
        zk.start(10)
        assert zk.get_children("/") is not None
        proxy.set_rule("zk", "*", "drop")  # every connection reset, every new one refused
        deadline = time.monotonic() + 10
        while zk.state != "SUSPENDED" and time.monotonic() < deadline:  # kazoo is reconnecting
            time.sleep(0.05)
        assert zk.state == "SUSPENDED"
        outcome: list = []

        def call():
            try:
                outcome.append(zk.get("/"))
            except Exception as exc:  # noqa: BLE001 - what it raised is the result
                outcome.append(exc)
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(10)
        assert not caller.is_alive(), "a blocking call waited for ZooKeeper without a limit"
        assert isinstance(outcome[0], ConnectionLoss), outcome
        proxy.heal()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                assert zk.get_children("/") is not None  # the same session goes on
                break
            except ConnectionLoss:
                time.sleep(0.2)
        else:
            pytest.fail("no answer from ZooKeeper after the network healed")
    finally:
        zk.stop()
        zk.close()
        proxy.close()
