"""Availability while one broker of three is down (issue 16): acks=all, RF 3,
``min.insync.replicas=2`` must go on with two live replicas, after a session timeout and an
election, and not stall for the follower's 30-s request timeout.

The cluster's inter-broker links go through the fault battery's proxy (``odradek.chaos.proxy``),
as in ``odradek chaos``, so a network partition can leave a follower's connection open with
its request lost in it (the state a blackholed TCP connection, or a middlebox that forgot it,
leaves behind).
"""
from __future__ import annotations

import threading
import time

import pytest

from odradek import Producer
from odradek.chaos.proxy import FaultProxy
from odradek.local import LocalCluster
from tests.cluster.fixtures import TEST_SETTINGS
from tests.cluster.test_faults import create_replicated_topic, wait_healed

pytestmark = pytest.mark.slow

TOPIC = "available"


@pytest.fixture
def proxied_cluster(zookeeper, tmp_path):
    proxy = FaultProxy()
    ref: list = []
    settings = {}
    for i in (1, 2, 3):
        port = proxy.add(f"broker-{i}", lambda i=i: ("127.0.0.1", ref[0].broker(i).port))
        settings[i] = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"}
    cluster = LocalCluster(str(tmp_path), 3, TEST_SETTINGS, zk=zookeeper, chroot="/odradek-availability",
                           broker_settings=settings)
    ref.append(cluster)
    try:
        cluster.start()
        cluster.wait_ready()
        yield cluster, proxy
    finally:
        cluster.stop(graceful=False)
        proxy.close()


def test_a_follower_cut_off_then_healed_is_back_in_sync_before_another_broker_dies_without_a_long_stall(
        proxied_cluster):
    cluster, proxy = proxied_cluster
    create_replicated_topic(cluster, TOPIC, 3)
    acks: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        with Producer(cluster.bootstrap, acks="all", linger_ms=5, request_timeout_ms=10000,
                      delivery_timeout_ms=120000, retry_backoff_ms=100) as producer:
            while not stop.is_set():
                producer.send(TOPIC, b"x").add_done_callback(
                    lambda f: f.exception(0) is None and acks.append(time.monotonic()))
                time.sleep(0.005)
            producer.flush(120)
    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        cluster.wait_for(lambda: len(acks) > 200, 30, "acknowledgements")
        # broker 3 cut off from the others (both ways) while its fetches are in flight, then healed
        rules = [(f"broker-{o}", 3, "blackhole") for o in (1, 2)] + [("broker-3", o, "blackhole") for o in (1, 2)]
        for link, source, mode in rules:
            proxy.set_rule(link, source, mode)

        def cut_off(p: int) -> bool:  # broker 3 out of the others' ISRs, alone in its own (it still has ZooKeeper)
            leader, isr = cluster.leader(TOPIC, p), cluster.isr(TOPIC, p)
            return isr == [3] if leader == 3 else 3 not in isr
        cluster.wait_for(lambda: all(cut_off(p) for p in range(3)), 30, "broker 3 cut off")
        proxy.heal()
        healed = time.monotonic()
        wait_healed(cluster, TOPIC, 3, timeout=60)
        back = time.monotonic() - healed
        print(f"broker 3 back in every ISR {back:.1f} s after the partition healed")
        assert back < 12, f"broker 3 took {back:.1f} s to rejoin the ISRs after the partition healed"
        # now another broker dies: two replicas live, so acks=all goes on after an election
        killed = time.monotonic()
        cluster.kill(1)
        time.sleep(15)
        window = [t for t in acks if t >= killed - 1]
        gaps = [b - a for a, b in zip(window, window[1:])] + [time.monotonic() - window[-1]] if window else [15.0]
        print(f"longest gap between acknowledgements after broker 1 died: {max(gaps):.1f} s")
        assert max(gaps) < 8, f"no acknowledgement for {max(gaps):.1f} s with two of three replicas alive"
    finally:
        stop.set()
        proxy.heal()
        thread.join(150)
