"""The controller's own mechanisms, on real three-broker clusters: controller-epoch fencing,
leader election rules (clean by default, unclean per topic), preferred leaders, topic
deletion and config changes reaching every replica. The fault scenarios under load are in
test_faults.py. Tests on the tests' settings share one cluster, healed after each
(``shared_cluster``, tests/cluster/fixtures.py); each has topics of its own."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek import Admin, Producer
from odradek.errors import NotEnoughReplicasError
from odradek.actors.names import partition_dir
from tests.cluster.fixtures import as_broker
from tests.cluster.verify import assert_replicas_identical, high_watermarks, read_all

pytestmark = pytest.mark.slow


def create(cluster, name: str, partitions: int = 1, rf: int = 3, **config) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions, replication_factor=rf,
                           config={k.replace("_", "."): v for k, v in config.items()})
    cluster.wait_for(lambda: all((cluster.partition_state(name, p) or {}).get("leader", -1) >= 0
                                 for p in range(partitions)), 30, f"{name} led")


def request(broker, api: int, body: dict, security=None) -> dict:
    """One raw request; a top-level error comes back as ``{"error_code", "error_message"}``."""
    conn = BrokerConnection(broker.host, broker.port, request_timeout_ms=10000, security=security)
    try:
        return conn.request(api, body).body
    except OdradekError as exc:
        return {"error_code": int(exc.code), "error_message": exc.message}
    finally:
        conn.close()


def test_a_deposed_controllers_requests_are_refused_and_the_new_one_has_a_higher_epoch(shared_cluster):
    cluster = shared_cluster
    old = cluster.controller_id()
    old_epoch = int(cluster.kazoo.get("/controller_epoch")[0])
    cluster.kill(old)
    cluster.wait_for(lambda: cluster.controller_id() not in (None, old), 30, "a new controller")
    new_epoch = int(cluster.kazoo.get("/controller_epoch")[0])
    assert new_epoch > old_epoch
    survivor = cluster.broker(next(b for b in cluster.ids if b != old))
    # the new controller has told every live broker its epoch; a request from the old one is
    # stale (sent over a connection proved as the old controller's broker: anyone else is
    # refused before, tests/cluster/test_inter_broker.py)
    security = as_broker(cluster, old)
    cluster.wait_for(lambda: request(survivor, ApiKey.UPDATE_METADATA, {
        "controller_id": old, "controller_epoch": old_epoch, "brokers": {}, "topics": {}}, security)
        .get("error_code") == ErrorCode.STALE_CONTROLLER_EPOCH, 30, "the old epoch refused")
    answer = request(survivor, ApiKey.LEADER_AND_ISR, {"controller_id": old, "controller_epoch": old_epoch,
                                                       "partitions": [], "brokers": []}, security)
    assert answer["error_code"] == ErrorCode.STALE_CONTROLLER_EPOCH
    with Admin(survivor.bootstrap) as admin:  # the metadata it serves is still the new controller's
        assert admin.list_topics(include_internal=True) is not None


def test_without_unclean_election_a_partition_whose_isr_is_dead_stays_offline(shared_cluster):
    cluster = shared_cluster
    create(cluster, "clean", rf=2, min_insync_replicas=1)
    state = cluster.partition_state("clean", 0)
    replicas = cluster.topic_assignment("clean")[0]
    follower = next(r for r in replicas if r != state["leader"])
    cluster.kill(follower)
    cluster.wait_for(lambda: cluster.isr("clean", 0) == [state["leader"]], 30, "the follower out of the ISR")
    with Producer(cluster.bootstrap, acks=1) as p:  # written only to the leader
        p.send("clean", b"only-on-the-leader", partition=0).result(timeout=30)
    cluster.kill(state["leader"])
    cluster.restart(follower)
    cluster.wait_for(lambda: follower in cluster.registered_brokers(), 30, "the follower back")
    cluster.wait_for(lambda: cluster.partition_state("clean", 0)["leader"] == -1, 30, "the partition offline")

    def offline_in_its_metadata():  # the restarted broker hears of the topic from the controller
        with Admin(cluster.broker(follower).bootstrap) as admin:
            meta = admin.describe_topic("clean").partitions[0]
            return meta if meta.leader == -1 else None

    meta = cluster.wait_for(offline_in_its_metadata, 30, "the partition offline in the metadata")
    assert meta.error_code == ErrorCode.LEADER_NOT_AVAILABLE


def test_unclean_election_per_topic_elects_an_out_of_sync_replica(shared_cluster):
    cluster = shared_cluster
    create(cluster, "unclean", rf=2, min_insync_replicas=1, unclean_leader_election_enable="true")
    state = cluster.partition_state("unclean", 0)
    follower = next(r for r in cluster.topic_assignment("unclean")[0] if r != state["leader"])
    cluster.kill(follower)
    cluster.wait_for(lambda: cluster.isr("unclean", 0) == [state["leader"]], 30, "the follower out of the ISR")
    cluster.kill(state["leader"])
    cluster.restart(follower)
    cluster.wait_for(lambda: cluster.leader("unclean", 0) == follower, 30, "the out-of-sync follower elected")
    with Producer(cluster.broker(follower).bootstrap, acks=1) as p:
        assert p.send("unclean", b"after", partition=0).result(timeout=30).offset >= 0


def test_a_deleted_topic_leaves_no_replica_and_no_znode(shared_cluster):
    cluster = shared_cluster
    create(cluster, "doomed", partitions=2)
    with Producer(cluster.bootstrap, acks="all") as p:
        for i in range(20):
            p.send("doomed", b"x%d" % i, partition=i % 2)
        p.flush(timeout=30)
    dirs = [partition_dir(cluster.broker(b).data_dir, "doomed", p) for b in cluster.ids for p in range(2)]
    assert all(os.path.isdir(d) for d in dirs)
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic("doomed")
        assert "doomed" not in admin.list_topics()
    cluster.wait_for(lambda: not any(os.path.exists(d) for d in dirs), 30, "every replica's directory gone")
    assert cluster.topic_assignment("doomed") is None
    create(cluster, "doomed", partitions=1)  # the name is free again


def test_a_topic_config_change_reaches_the_leaders(shared_cluster):
    cluster = shared_cluster
    create(cluster, "conf", min_insync_replicas=2)
    state = cluster.partition_state("conf", 0)
    follower = next(r for r in state["isr"] if r != state["leader"])
    cluster.kill(follower)
    cluster.wait_for(lambda: len(cluster.isr("conf", 0)) == 2, 30, "ISR of two")
    with Producer(cluster.bootstrap, acks="all") as p:
        p.send("conf", b"two-in-sync", partition=0).result(timeout=30)
    with Admin(cluster.bootstrap) as admin:
        admin.alter_configs("conf", set={"min.insync.replicas": 3})
    with Producer(cluster.bootstrap, acks="all", retries=0) as p:
        f = p.send("conf", b"needs-three", partition=0)
        assert isinstance(f.exception(timeout=30), NotEnoughReplicasError)


def test_a_topic_recreated_while_a_replica_was_down_never_serves_that_replicas_old_data(shared_cluster):
    """Broker B misses the deletion of a topic (it is down); the topic is created again with the
    same name and a replica on B. B's directory still holds the old topic's log: it must be
    thrown away (the topic id differs), not taken as the new topic's data."""
    cluster = shared_cluster
    create(cluster, "reborn")
    with Producer(cluster.bootstrap, acks="all") as p:
        for i in range(20):  # one batch each: a truncation by offset could keep some of them
            p.send("reborn", b"old-%d" % i, partition=0).result(timeout=30)
    victim = next(b for b in cluster.ids if b != cluster.controller_id())
    cluster.kill(victim)
    cluster.wait_for(lambda: victim not in cluster.registered_brokers(), 30, "the victim's session gone")
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic("reborn")
    cluster.restart(victim)
    cluster.wait_for(lambda: victim in cluster.registered_brokers(), 30, "the victim back")
    cluster.wait_ready()
    fetcher = cluster.broker(victim).actor_process("replica_fetcher")
    fetcher.suspend()  # the new topic gets data before the victim's replica compares epochs
    try:
        create(cluster, "reborn")  # replication factor 3: a replica on the victim again
        with Producer(cluster.bootstrap, acks=1) as p:
            for i in range(5):
                p.send("reborn", b"new-%d" % i, partition=0)
            p.flush(timeout=30)
    finally:
        fetcher.resume()
    # committed once the victim's replica has the 5 new records at offsets 0-4
    cluster.wait_for(lambda: high_watermarks(cluster.bootstrap, "reborn", [0])[0] == 5, 60, "high watermark 5")
    assert_replicas_identical(cluster, "reborn", [0], timeout=30)
    got = read_all(cluster.bootstrap, "reborn", [0])
    assert sorted(got.snapshot().values()) == [b"new-%d" % i for i in range(5)]


def test_leadership_returns_to_the_preferred_replica(make_cluster):
    cluster = make_cluster(auto_leader_rebalance_enable="false")
    create(cluster, "pref", partitions=3)
    preferred = {p: r[0] for p, r in cluster.topic_assignment("pref").items()}
    assert all(cluster.leader("pref", p) == preferred[p] for p in preferred)
    victim = preferred[0]
    cluster.kill(victim)
    cluster.wait_for(lambda: cluster.leader("pref", 0) not in (None, victim, -1), 30, "a new leader of pref-0")
    cluster.restart(victim)
    cluster.wait_for(lambda: victim in cluster.isr("pref", 0), 30, "the preferred replica in sync again")
    assert cluster.leader("pref", 0) != victim  # no automatic rebalance: it stays where it is
    # kafka-leader-election's counterpart, through any broker (it relays to the controller)
    other = cluster.broker(next(b for b in cluster.ids if b != victim))
    tool = subprocess.run([sys.executable, "-m", "odradek", "leader-election", "--bootstrap-server", other.bootstrap,
                           "--topic", "pref", "--partition", "0"], capture_output=True, text=True, timeout=60)
    assert tool.returncode == 0 and "Successfully completed leader election (PREFERRED) for pref-0" in tool.stdout, \
        tool.stdout + tool.stderr
    cluster.wait_for(lambda: cluster.leader("pref", 0) == victim, 30, "leadership back on the preferred replica")
    again = request(cluster.broker(victim), ApiKey.ELECT_LEADERS,
                    {"election_type": 0, "topic_partitions": [{"topic": "pref", "partitions": [0]}]})
    assert again["partitions"][0]["error_code"] == ErrorCode.ELECTION_NOT_NEEDED


def test_the_controller_rebalances_preferred_leaders_on_its_own(make_cluster):
    cluster = make_cluster(leader_imbalance_check_interval_seconds=1)
    create(cluster, "auto", partitions=3)
    preferred = {p: r[0] for p, r in cluster.topic_assignment("auto").items()}
    victim = preferred[1]
    cluster.kill(victim)
    cluster.wait_for(lambda: cluster.leader("auto", 1) not in (None, victim, -1), 30, "a new leader")
    cluster.restart(victim)
    cluster.wait_for(lambda: cluster.leader("auto", 1) == victim, 30, "the preferred leader back by itself")


def test_a_controlled_shutdown_moves_leadership_before_the_broker_stops(make_cluster):
    cluster = make_cluster(zookeeper_session_timeout_ms=30000)  # a crash would take 30 s to notice
    create(cluster, "moving", partitions=3, min_insync_replicas=2)
    leader = cluster.leader("moving", 0)
    led = [p for p in range(3) if cluster.leader("moving", p) == leader]
    with Producer(cluster.bootstrap, acks="all") as p:
        p.send("moving", b"before", partition=0).result(timeout=30)
        assert cluster.broker(leader).terminate(timeout=30) == 0  # SIGTERM: the graceful path
        # the leaderships moved while it still ran (not when its session closed at the end)
        assert "controlled shutdown" in cluster.broker(leader).stderr_tail(400)
        for part in led:
            state = cluster.partition_state("moving", part)
            assert state["leader"] not in (leader, -1) and leader not in state["isr"], state
        # writes go on at once on the new leaders, well within the 30 s session timeout
        assert p.send("moving", b"after", partition=0).result(timeout=15).offset >= 1


def test_only_a_failed_epoch_check_makes_the_controller_resign_not_a_lost_race_on_a_state_node(zookeeper):
    """A controller's write is [check /controller_epoch, write the state node]. When a leader
    changed the state node meanwhile, the write fails with every result an error, but the
    check's is RolledBackError: that is a retry, not fencing. (Taking it for fencing left a
    cluster with no acting controller.)"""
    from odradek.coordinator.active_controller import ActiveController

    zk = zookeeper.client("")
    root = f"/fencing-{os.getpid()}"
    try:
        zk.create(f"{root}/controller_epoch", b"1", makepath=True)
        zk.create(f"{root}/state", b"a")
        zk.set(f"{root}/state", b"b")  # a leader's ISR change: the state is at version 1 now
        resigned = []
        c = ActiveController(7, 1, 0, {"num.partitions": 1, "default.replication.factor": 1,
                                       "log.segment.bytes.min": 1024}, {}, "PLAINTEXT", zk, None, None,
                             lambda: resigned.append(True))

        lost_race = zk.transaction()
        lost_race.check(f"{root}/controller_epoch", 0)
        lost_race.set_data(f"{root}/state", b"c", version=0)
        result = c._fenced_commit(lost_race)
        assert result is not None and c.active  # still the controller: it re-reads and retries

        fenced = zk.transaction()
        fenced.check(f"{root}/controller_epoch", 5)  # another controller bumped the epoch
        fenced.set_data(f"{root}/state", b"c", version=1)
        assert c._fenced_commit(fenced) is None and not c.active and resigned == [True]
        assert zk.get(f"{root}/state")[0] == b"b"  # nothing written
    finally:
        zk.delete(root, recursive=True)
        zk.stop()
        zk.close()
