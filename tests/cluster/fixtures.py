"""Cluster fixtures: one ZooKeeper per test session, a fresh cluster of brokers per test.

``zookeeper`` is one ``LocalZooKeeper`` for the whole session (Debian's package;
``bin/test`` installs it), whichever directory's tests use it: modules elsewhere import
these fixtures (tests/kafka, tests/security, ...), which gives each of them a copy of the
fixture, so the server itself is kept here and stopped by the last copy's teardown. ``make_cluster(brokers=3, **settings)`` starts a ``LocalCluster`` on it under
its own chroot (so clusters of different tests never meet), with the tests' short timeouts;
``min_insync_replicas=2`` becomes ``--set min.insync.replicas=2`` as in tests/conftest.py.
It returns once every broker is registered and a controller elected. ``cluster`` is
``make_cluster()``. ``shared_cluster`` is one three-broker cluster (the tests' settings) for
the tests of a module that may kill, pause or restart its brokers but change nothing else
that outlives them (each test has topics of its own): after each test it is healed (paused
brokers resumed, stopped ones restarted on their data) and checked whole (every broker
registered, a controller known to all); one that cannot be healed is thrown away and the
next test gets a new one. Teardown kills every broker, whatever the test did
(killed, paused, restarted); the session's end stops ZooKeeper.
"""
from __future__ import annotations

import base64
import itertools
import json

import pytest

from odradek.chaos.runner import CLUSTER_SETTINGS
from odradek.local import LocalCluster, LocalZooKeeper, zookeeper_missing
from odradek.network.clientauth import ClientSecurity

# Short timeouts, so a fault is noticed in seconds: a dead broker's session expires after
# 3 s, a silent follower leaves the ISR after 2 s.
TEST_SETTINGS = {k: v for k, v in CLUSTER_SETTINGS.items() if k != "log.segment.bytes"}  # the chaos runner's, default segments

_chroots = itertools.count(1)


_shared_zk: dict = {"server": None, "users": 0}


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    missing = zookeeper_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    if _shared_zk["server"] is None or not _shared_zk["server"].running:
        _shared_zk["server"] = LocalZooKeeper(str(tmp_path_factory.mktemp("zookeeper"))).start()
    _shared_zk["users"] += 1
    try:
        yield _shared_zk["server"]
    finally:
        _shared_zk["users"] -= 1
        if _shared_zk["users"] == 0:
            _shared_zk["server"].stop()
            _shared_zk["server"] = None


@pytest.fixture
def make_cluster(zookeeper, tmp_path_factory, _module_cluster):
    clusters: list[LocalCluster] = []

    def make(brokers: int = 3, broker_settings: dict | None = None, **settings) -> LocalCluster:
        if _module_cluster["cluster"] is not None:
            # the module's shared cluster goes first (a later test sharing one starts it again):
            # a second set of brokers idling beside this one slows both on a small machine
            _module_cluster["cluster"].stop(graceful=False)
            _module_cluster["cluster"] = None
        c = new_cluster(zookeeper, str(tmp_path_factory.mktemp("cluster")), brokers, broker_settings, **settings)
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


def new_cluster(zookeeper, base_dir: str, brokers: int = 3, broker_settings: dict | None = None,
                **settings) -> LocalCluster:
    """A cluster (not started) with the tests' settings, under a chroot of its own."""
    settings = {**TEST_SETTINGS, **{k.replace("_", "."): v for k, v in settings.items()}}
    return LocalCluster(base_dir, brokers, settings, zk=zookeeper, chroot=f"/odradek-test-{next(_chroots)}",
                        broker_settings=broker_settings)


def heal(cluster: LocalCluster, timeout: float = 90.0) -> None:
    """Resume paused brokers, restart stopped or killed ones (in parallel) and wait until the
    cluster is whole again; raises if it is not."""
    for b in cluster.brokers.values():
        b.resume()
    down = [i for i, b in cluster.brokers.items() if not b.running]
    cluster._parallel(cluster.restart, down)
    cluster.wait_ready(timeout)
    assert cluster.registered_brokers() == cluster.ids


@pytest.fixture
def shared_cluster(_module_cluster, zookeeper, tmp_path_factory) -> LocalCluster:
    c = _module_cluster["cluster"]
    if c is None:
        c = _module_cluster["cluster"] = new_cluster(zookeeper, str(tmp_path_factory.mktemp("cluster")))
        try:
            c.start()
            c.wait_ready()
        except BaseException:
            _module_cluster["cluster"] = None
            c.stop(graceful=False)
            raise
    yield c
    try:
        heal(c)
    except BaseException:
        _module_cluster["cluster"] = None  # the next test starts a new one
        c.stop(graceful=False)


class ClusterSecret:
    """The cluster's secret as its brokers keep it in ZooKeeper: what a broker proves itself
    with (docs/SECURITY.md, "Inter-broker requests")."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster

    def get(self) -> bytes:
        return base64.b64decode(json.loads(self.cluster.kazoo.get("/config/odradek-secret")[0])["secret"])


def as_broker(cluster: LocalCluster, broker_id: int, secret=None) -> ClientSecurity:
    """The security of a connection that proves it is broker ``broker_id`` (with the cluster's
    secret, or ``secret``): how a test sends what only a broker may."""
    security = ClientSecurity("PLAINTEXT")
    security.broker = (broker_id, secret or ClusterSecret(cluster))
    return security
