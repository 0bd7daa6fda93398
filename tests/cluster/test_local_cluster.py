"""The cluster launcher itself (odradek.local.LocalZooKeeper / LocalCluster): processes, ports,
ZooKeeper, kill / restart / pause / resume, and that nothing is left behind."""
from __future__ import annotations

import os

import psutil

from odradek.local import LocalCluster, LocalZooKeeper, four_letter


def test_zookeeper_starts_answers_and_stops(tmp_path):
    zk = LocalZooKeeper(str(tmp_path)).start()
    try:
        assert four_letter(zk.port, "ruok") == "imok"
        client = zk.client()
        try:
            client.ensure_path("/x/y")
            assert client.exists("/x/y")
        finally:
            client.stop()
            client.close()
    finally:
        zk.stop()
    assert not psutil.pid_exists(zk.pid) or psutil.Process(zk.pid).status() == psutil.STATUS_ZOMBIE
    assert four_letter(zk.port, "ruok", timeout=0.5) is None


def test_cluster_processes(make_cluster, zookeeper):
    cluster = make_cluster(brokers=3)
    assert cluster.ids == [1, 2, 3]
    assert len(cluster.bootstrap.split(",")) == 3
    for i in cluster.ids:
        b = cluster.broker(i)
        assert b.data_dir.endswith(f"broker-{i}") and os.path.isdir(b.data_dir)
        assert b.settings["broker.id"] == i
        assert b.settings["zookeeper.connect"] == zookeeper.connect + cluster.chroot
    # the chroot exists; the brokers' view of ZooKeeper starts there
    root = zookeeper.client()
    try:
        assert root.exists(cluster.chroot)
    finally:
        root.stop()
        root.close()

    # pause: the supervisor and every actor stopped; resume: all running again
    b2 = cluster.broker(2)
    procs = [psutil.Process(b2.pid)] + b2.children()
    assert len(procs) > 1
    cluster.pause(2)
    assert all(p.status() == psutil.STATUS_STOPPED for p in procs)
    cluster.resume(2)
    assert all(p.status() != psutil.STATUS_STOPPED for p in procs)

    # kill -9: every process of that broker gone; restart: same data, same port
    b1 = cluster.broker(1)
    port, procs = b1.port, [psutil.Process(b1.pid)] + b1.children()
    cluster.kill(1)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    cluster.restart(1)
    assert b1.running and b1.port == port and b1.settings["broker.id"] == 1

    # stop with a broker paused: nothing left
    cluster.pause(3)
    everything = [psutil.Process(cluster.broker(i).pid) for i in cluster.ids]
    everything += [k for i in cluster.ids for k in cluster.broker(i).children()]
    cluster.stop()
    psutil.wait_procs(everything, timeout=5)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in everything)
    assert zookeeper.running  # a shared ZooKeeper is not the cluster's to stop


def test_cluster_with_its_own_zookeeper(tmp_path):
    cluster = LocalCluster(str(tmp_path), brokers=1, settings={"shutdown.timeout.ms": 10000}).start()
    try:
        assert cluster.own_zk and cluster.zk.running
        assert cluster.zookeeper_connect.endswith("/odradek")
        assert cluster.controller_id() is None or cluster.controller_id() == 1
        zk_pid = cluster.zk.pid
    finally:
        cluster.stop()
    assert not cluster.zk.running
    assert not psutil.pid_exists(zk_pid) or psutil.Process(zk_pid).status() == psutil.STATUS_ZOMBIE
