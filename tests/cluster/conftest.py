"""Cluster fixtures: one ZooKeeper per test session, a fresh cluster of brokers per test.

``zookeeper`` is a session-scoped ``LocalZooKeeper`` (Debian's package; ``bin/test``
installs it). ``make_cluster(brokers=3, **settings)`` starts a ``LocalCluster`` on it under
its own chroot (so clusters of different tests never meet), with the tests' short timeouts;
``min_insync_replicas=2`` becomes ``--set min.insync.replicas=2`` as in tests/conftest.py.
It returns once every broker is registered and a controller elected. ``cluster`` is
``make_cluster()``. Teardown kills every broker, whatever the test did
(killed, paused, restarted); the session's end stops ZooKeeper.
"""
from __future__ import annotations

import itertools

import pytest

from odradek.local import LocalCluster, LocalZooKeeper, zookeeper_missing

# Short timeouts, so a fault is noticed in seconds: a dead broker's session expires after
# 3 s, a silent follower leaves the ISR after 2 s.
TEST_SETTINGS = {
    "zookeeper.session.timeout.ms": 3000,
    "zookeeper.connection.timeout.ms": 10000,
    "replica.lag.time.max.ms": 2000,
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 200,
    "shutdown.timeout.ms": 10000,
    "group.consumer.heartbeat.interval.ms": 500,
    "group.consumer.session.timeout.ms": 6000,
    "leader.imbalance.check.interval.seconds": 5,
}

_chroots = itertools.count(1)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    missing = zookeeper_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    zk = LocalZooKeeper(str(tmp_path_factory.mktemp("zookeeper"))).start()
    yield zk
    zk.stop()


@pytest.fixture
def make_cluster(zookeeper, tmp_path_factory):
    clusters: list[LocalCluster] = []

    def make(brokers: int = 3, broker_settings: dict | None = None, **settings) -> LocalCluster:
        settings = {**TEST_SETTINGS, **{k.replace("_", "."): v for k, v in settings.items()}}
        c = LocalCluster(str(tmp_path_factory.mktemp("cluster")), brokers, settings, zk=zookeeper,
                         chroot=f"/odradek-test-{next(_chroots)}", broker_settings=broker_settings)
        clusters.append(c)
        c.start()
        c.wait_ready()
        return c

    yield make
    for c in clusters:
        c.stop(graceful=False)  # kill -9: the data is thrown away, and a controlled shutdown takes seconds


@pytest.fixture
def cluster(make_cluster) -> LocalCluster:
    return make_cluster()
