"""Cluster mode under faults (issue 7): three brokers, a topic with replication factor 3 and
min.insync.replicas=2, acks=all producers and a consumer group running throughout.

Each scenario injects one fault, heals it, and then checks:
- every acknowledged record is consumed, at the offset it was acknowledged with;
- no offset holds two different records (for the group's consumers and for a fresh reader);
- the replicas of every partition are byte-identical up to the high watermark (batches
  compared by offset and CRC, read from each broker's segment files).
And with one live replica, acks=all is refused (NOT_ENOUGH_REPLICAS), not acknowledged and lost.
The scenarios share one cluster (``shared_cluster``: healed and checked whole after each),
each on a topic and group of its own.

The ZooKeeper paths read here are docs/REPLICATION.md's (``/controller``,
``/brokers/topics/<t>/partitions/<p>/state``).
"""
from __future__ import annotations

import os
import time

import pytest

from odradek.core.records import CorruptRecordError, iter_batches
from odradek.log.segment import SEGMENT_RE
from odradek import Admin, Producer
from odradek.errors import NotEnoughReplicasError, OdradekError, TopicAlreadyExistsError
from odradek.actors.names import partition_dir
from tests.cluster.verify import AckedLog, Workload, assert_replicas_identical, check_logs, read_all
from tests.observability.test_metrics import scrape, value as sample

pytestmark = pytest.mark.slow

TOPIC = "events"
PARTITIONS = 3


def create_replicated_topic(cluster, topic: str = TOPIC, partitions: int = PARTITIONS) -> None:
    """Create the topic (retrying retriable answers such as NOT_CONTROLLER while the new
    cluster's metadata spreads) and wait for a leader and a full ISR everywhere."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with Admin(cluster.bootstrap) as admin:
                admin.create_topic(topic, partitions=partitions, replication_factor=3,
                                   config={"min.insync.replicas": 2})
            break
        except TopicAlreadyExistsError:
            break  # an earlier attempt went through after all
        except OdradekError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    wait_healed(cluster, topic, partitions, timeout=30)


def wait_healed(cluster, topic: str = TOPIC, partitions: int = PARTITIONS, timeout: float = 60.0) -> None:
    """Every broker registered; every partition led, with all its replicas in the ISR."""
    def healed() -> bool:
        if cluster.registered_brokers() != cluster.ids:
            return False
        assignment = cluster.topic_assignment(topic) or {}
        if len(assignment) != partitions:
            return False
        for p, replicas in assignment.items():
            state = cluster.partition_state(topic, p)
            if state is None or state["leader"] < 0 or sorted(state["isr"]) != sorted(replicas):
                return False
        return True

    try:
        cluster.wait_for(healed, timeout, f"every replica of {topic} back in the ISR")
    except TimeoutError as exc:  # say where it stands, for whoever reads the failure
        states = {p: cluster.partition_state(topic, p) for p in range(partitions)}
        stats = {}
        for b in cluster.ids:
            try:
                stats[b] = {a["name"]: a.get("stats") for a in cluster.broker(b).status()["actors"]
                            if a["name"] in ("controller", "replica_fetcher", "log-0", "log-1")}
            except Exception as why:  # noqa: BLE001
                stats[b] = repr(why)
        raise TimeoutError(f"{exc}; registered {cluster.registered_brokers()}, controller "
                           f"{cluster.controller_id()}, states {states}, actor stats {stats}") from None


def new_leader(cluster, topic: str, partition: int, old_leader: int, old_epoch: int, timeout: float = 30.0) -> dict:
    """Wait until another broker leads the partition in a newer leader epoch; its state."""
    def moved():
        s = cluster.partition_state(topic, partition)
        return s if s and s["leader"] not in (-1, old_leader) and s["leader_epoch"] > old_epoch else None

    return cluster.wait_for(moved, timeout, f"a new leader of {topic}-{partition} (not {old_leader})")


def a_follower(cluster, topic: str = TOPIC, partition: int = 0) -> tuple[int, dict]:
    state = cluster.partition_state(topic, partition)
    return next(b for b in state["isr"] if b != state["leader"]), state


def finish(cluster, load: Workload, topic: str = TOPIC, partitions: int = PARTITIONS) -> None:
    """After the fault is healed: stop producing, then the issue's three checks."""
    load.wait_acked(100)  # still flowing after the fault
    load.stop_producers()
    assert len(load.acked) > 0
    load.wait_consumed(timeout=30)  # every acknowledged record consumed; no offset holds two values
    wait_healed(cluster, topic, partitions)
    assert_replicas_identical(cluster, topic, range(partitions), timeout=60)
    fresh = read_all(cluster.bootstrap, topic, range(partitions))
    problems = check_logs(load.acked, fresh)
    assert not problems, "a fresh reader disagrees:\n  " + "\n  ".join(problems)


def test_kill_leader(shared_cluster):
    cluster, topic = shared_cluster, "kill-leader"
    create_replicated_topic(cluster, topic)
    with Workload(cluster.bootstrap, topic, group=topic) as load:
        load.wait_acked(200)
        state = cluster.partition_state(topic, 0)
        cluster.kill(state["leader"])
        new_leader(cluster, topic, 0, state["leader"], state["leader_epoch"])
        load.wait_acked(200)  # the new leaders take acks=all writes with two in-sync replicas
        cluster.restart(state["leader"])
        wait_healed(cluster, topic)
        finish(cluster, load, topic)


def test_kill_controller(shared_cluster):
    cluster, topic = shared_cluster, "kill-controller"
    create_replicated_topic(cluster, topic)
    with Workload(cluster.bootstrap, topic, group=topic) as load:
        load.wait_acked(200)
        controller = cluster.wait_for(cluster.controller_id, 10, "a controller")
        cluster.kill(controller)
        cluster.wait_for(lambda: cluster.controller_id() not in (None, controller), 30, "another controller")
        # the partitions it led move too
        cluster.wait_for(lambda: all(cluster.leader(topic, p) not in (None, controller) for p in range(PARTITIONS)),
                         30, f"no partition led by the dead controller {controller}")
        load.wait_acked(200)
        cluster.restart(controller)
        wait_healed(cluster, topic)
        finish(cluster, load, topic)


def test_paused_leader_is_fenced(shared_cluster):
    """SIGSTOP the leader of partition 0 past the session timeout: ZooKeeper expires it, another
    replica leads. Requests sent to it while it was stopped run when it resumes: they must be
    refused or end up committed, and its log must rejoin the new leader's (truncated if needed)."""
    cluster, topic = shared_cluster, "paused-leader"
    create_replicated_topic(cluster, topic)
    state = cluster.partition_state(topic, 0)
    old = cluster.broker(state["leader"])
    late = AckedLog()
    # a producer that knows the old leader: its writes to partition 0 queue up on the stopped broker
    with Workload(cluster.bootstrap, topic, group=topic) as load, \
            Producer(old.bootstrap, acks="all", request_timeout_ms=10000, delivery_timeout_ms=60000) as stale:
        stale.send(topic, b"warm-up", partition=0).result(timeout=30)
        load.wait_acked(200)
        cluster.pause(state["leader"])
        for i in range(20):
            value = b"late-%d" % i
            late.track(stale.send(topic, value, partition=0), value)
        new_leader(cluster, topic, 0, state["leader"], state["leader_epoch"], timeout=30)
        load.wait_acked(200)
        cluster.resume(state["leader"])
        stale.flush(timeout=90)
        wait_healed(cluster, topic)
        finish(cluster, load, topic)
        # whatever the stale producer got acknowledged is in the log at that offset
        fresh = read_all(cluster.bootstrap, topic, range(PARTITIONS))
        problems = check_logs(late, fresh)
        assert not problems, "writes to the deposed leader:\n  " + "\n  ".join(problems)


def tear_tail(data_dir: str, topic: str, partition: int) -> int:
    """What a crash loses of data never flushed: the active segment's last whole batch goes,
    and the one before it is torn half-way. Returns bytes cut (0 if the segment is too short)."""
    directory = partition_dir(data_dir, topic, partition)
    bases = sorted(int(m.group(1)) for m in map(SEGMENT_RE.fullmatch, os.listdir(directory))
                   if m and m.group(2) == "log" and not m.group(3))
    if not bases:
        return 0
    path = os.path.join(directory, f"{bases[-1]:020d}.log")
    with open(path, "rb") as f:
        buf = f.read()
    batches = []
    try:
        batches = [(pos, h.size) for pos, h in iter_batches(buf)]
    except CorruptRecordError:
        pass
    if len(batches) < 2:
        return 0
    pos, size = batches[-2]
    cut = pos + size // 2
    os.truncate(path, cut)
    return len(buf) - cut


def test_restart_follower_that_lost_unflushed_data(shared_cluster):
    cluster, topic = shared_cluster, "torn-follower"
    create_replicated_topic(cluster, topic)
    with Workload(cluster.bootstrap, topic, group=topic) as load:
        load.wait_acked(300)
        follower, state = a_follower(cluster, topic)
        cluster.kill(follower)
        lost = sum(tear_tail(cluster.broker(follower).data_dir, topic, p) for p in range(PARTITIONS))
        assert lost > 0
        cluster.wait_for(lambda: follower not in cluster.isr(topic, 0), 30, f"dead follower {follower} out of the ISR")
        load.wait_acked(200)
        cluster.restart(follower)  # recovers its torn log, truncates by leader epoch, catches up
        wait_healed(cluster, topic)
        finish(cluster, load, topic)


def test_cut_off_follower_leaves_and_rejoins_the_isr(shared_cluster):
    """The follower stays alive and registered, but its replica fetcher is stopped: after
    replica.lag.time.max.ms its leader drops it from the ISR; acks=all goes on with two."""
    cluster, topic = shared_cluster, "cut-off-follower"
    create_replicated_topic(cluster, topic)
    with Workload(cluster.bootstrap, topic, group=topic) as load:
        load.wait_acked(200)
        follower, state = a_follower(cluster, topic)
        fetcher = cluster.broker(follower).actor_process("replica_fetcher")
        fetcher.suspend()
        try:
            cluster.wait_for(lambda: follower not in cluster.isr(topic, 0), 20,
                             f"cut-off follower {follower} out of the ISR")
            assert follower in cluster.registered_brokers()  # out of the ISR by lag, not dead
            load.wait_acked(200)
        finally:
            fetcher.resume()
        wait_healed(cluster, topic)
        finish(cluster, load, topic)


def test_acks_all_refused_with_one_live_replica(shared_cluster):
    cluster, topic = shared_cluster, "one-live-replica"
    create_replicated_topic(cluster, topic)
    acked = AckedLog()
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(300):
            value = b"before-%d" % i
            acked.track(producer.send(topic, value, partition=i % PARTITIONS), value)
        producer.flush(timeout=30)
    assert len(acked) == 300 and not acked.failed

    survivor = cluster.leader(topic, 0)
    for b in cluster.ids:
        if b != survivor:
            cluster.kill(b)
    cluster.wait_for(lambda: all(cluster.isr(topic, p) == [survivor] for p in range(PARTITIONS)), 30,
                     f"broker {survivor} alone in every ISR")
    # ZooKeeper says so first; the leader learns it from the controller a moment later, and a
    # produce in between is written then answered NOT_ENOUGH_REPLICAS_AFTER_APPEND (as Kafka's)
    leader = cluster.broker(survivor)
    cluster.wait_for(lambda: sample(scrape(leader), "odradek_topic_under_min_isr_partitions", topic=topic)
                     == PARTITIONS, 30, f"broker {survivor} knows every partition is under min ISR")

    address = leader.bootstrap
    with Producer(address, acks="all", retries=0, request_timeout_ms=10000) as producer:
        refused = [producer.send(topic, b"refused-%d" % i, partition=i % PARTITIONS) for i in range(30)]
        producer.flush(timeout=30)
    for f in refused:
        assert isinstance(f.exception(timeout=30), NotEnoughReplicasError), f.exception(timeout=0)
    with Producer(address, acks=1, retries=0) as producer:  # the partitions are online: acks=1 still works
        one = b"acks-1"
        acked.track(producer.send(topic, one, partition=0), one)
        producer.flush(timeout=30)
    assert len(acked) == 301, acked.failed

    for b in cluster.ids:
        if b != survivor:
            cluster.restart(b)
    wait_healed(cluster, topic)
    fresh = read_all(cluster.bootstrap, topic, range(PARTITIONS))
    problems = check_logs(acked, fresh)
    assert not problems, "\n  ".join(problems)
    assert not [v for v in fresh.snapshot().values() if v.startswith(b"refused-")]  # refused: never written
    assert_replicas_identical(cluster, topic, range(PARTITIONS), timeout=60)
