"""Cluster operations (issue 17): partition reassignment (KIP-455), replication factor changes,
cancellation, controller failover mid-move, CreatePartitions, on real ZooKeeper and brokers.

Each scenario runs an acks=all producer and a consumer group throughout (``Workload``) and
ends with the fault tests' checks (``finish``): every acknowledged record consumed at its
offset, no offset holding two values, the replicas byte-identical, a fresh reader agreeing.
The ZooKeeper state read is docs/REPLICATION.md's (the topic node's ``partitions``,
``adding_replicas``, ``removing_replicas``).
"""
from __future__ import annotations

import json
import os
import time

import pytest

from odradek import Admin, Consumer, Producer, TopicPartition
from odradek.errors import InvalidPartitionsError, InvalidReplicaAssignmentError, NoReassignmentInProgressError
from tests.cluster.test_faults import create_replicated_topic, finish, wait_healed
from odradek.actors.names import partition_dir
from odradek.actors.messages import Stats
from tests.cluster.verify import Workload, assert_replicas_identical

pytestmark = pytest.mark.slow

TOPIC = "moving"
PARTITIONS = 3


def wait_moved(cluster, topic: str, expected: dict[int, list[int]], timeout: float = 60.0) -> None:
    """Every partition's replicas are ``expected`` (as sets), with no move left in ZooKeeper,
    every replica in the ISR, and none listed by the controller (which lists a move until its
    end has reached every broker's metadata)."""
    def moved() -> bool:
        node = cluster._json(f"/brokers/topics/{topic}")
        if node.get("adding_replicas") or node.get("removing_replicas"):
            return False
        assignment = {int(p): r for p, r in node["partitions"].items()}
        return all(sorted(assignment[p]) == sorted(r) and sorted(cluster.isr(topic, p)) == sorted(r)
                   for p, r in expected.items())
    try:
        cluster.wait_for(moved, timeout, f"the move of {topic} to {expected}")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; topic node {cluster._json(f'/brokers/topics/{topic}')}, states "
                           f"{ {p: cluster.partition_state(topic, p) for p in expected} }") from None
    with Admin(cluster.bootstrap) as admin:
        cluster.wait_for(lambda: not any(tp.topic == topic for tp in admin.list_partition_reassignments()), 30,
                         f"the controller listing no move of {topic}")


def reassign(cluster, moves: dict) -> None:
    with Admin(cluster.bootstrap) as admin:
        errors = admin.alter_partition_reassignments({TopicPartition(TOPIC, p): r for p, r in moves.items()})
    assert all(e is None for e in errors.values()), errors


def test_move_every_partition_to_a_new_broker_under_load_then_change_the_replication_factor(make_cluster):
    cluster = make_cluster(3, log_stray_delete_delay_ms=3000)
    create_replicated_topic(cluster, TOPIC, PARTITIONS)
    with Workload(cluster.bootstrap, TOPIC) as load:
        load.wait_acked(200)
        assert cluster.add() == 4
        reassign(cluster, {p: [2, 3, 4] for p in range(PARTITIONS)})
        wait_moved(cluster, TOPIC, {p: [2, 3, 4] for p in range(PARTITIONS)})
        load.wait_acked(200)
        # broker 1 no longer hosts them: its replicas were stopped and deleted
        data_1 = cluster.broker(1).data_dir
        cluster.wait_for(lambda: not any(os.path.exists(partition_dir(data_1, TOPIC, p)) for p in range(PARTITIONS)),
                         30, "broker 1's replicas deleted")
        # replication factor 3 -> 2, then 2 -> 3 again (a new replica copies the whole log; 1 -> 3 below)
        reassign(cluster, {p: [4, 2] for p in range(PARTITIONS)})
        wait_moved(cluster, TOPIC, {p: [4, 2] for p in range(PARTITIONS)})
        assert all(cluster.leader(TOPIC, p) in (4, 2) for p in range(PARTITIONS))
        reassign(cluster, {p: [4, 2, 1] for p in range(PARTITIONS)})
        wait_moved(cluster, TOPIC, {p: [4, 2, 1] for p in range(PARTITIONS)})
        with Admin(cluster.bootstrap) as admin:
            assert admin.list_partition_reassignments() == {}
            assert admin.describe_topic(TOPIC).partitions[0].replicas == (4, 2, 1)
        finish(cluster, load, TOPIC, PARTITIONS)
    assert not load.acked.failed
    # broker 1 is down while its replicas move away: back, it finds them stray and removes them
    cluster.kill(1)
    reassign(cluster, {p: [4, 2, 3] for p in range(PARTITIONS)})
    wait_moved(cluster, TOPIC, {p: [4, 2, 3] for p in range(PARTITIONS)})
    cluster.restart(1)
    assert any(os.path.exists(partition_dir(data_1, TOPIC, p)) for p in range(PARTITIONS))
    cluster.wait_for(lambda: not any(os.path.exists(partition_dir(data_1, TOPIC, p)) for p in range(PARTITIONS)),
                     30, "broker 1's stray replicas removed")
    # replication factor 1 -> 3 (a topic without min.insync.replicas, written with acks=1)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("single", partitions=1, replication_factor=1)
    cluster.wait_for(lambda: cluster.leader("single", 0) is not None, 30, "a leader of single-0")
    with Producer(cluster.bootstrap, acks=1) as producer:
        for i in range(500):
            producer.send("single", f"r{i}".encode())
        producer.flush(30)
    only = cluster.topic_assignment("single")[0][0]
    replicas = [only] + [b for b in (1, 2, 3, 4) if b != only][:2]
    with Admin(cluster.bootstrap) as admin:
        assert admin.alter_partition_reassignments({TopicPartition("single", 0): replicas}) == {
            TopicPartition("single", 0): None}
    cluster.wait_for(lambda: sorted(cluster.isr("single", 0)) == sorted(replicas)
                     and cluster.topic_assignment("single")[0] == replicas, 60, "single-0 on three brokers")
    assert_replicas_identical(cluster, "single", [0])
    # a group coordinated by broker 3, which hosts none of the topic now, commits its offsets
    reassign(cluster, {p: [4, 2] for p in range(PARTITIONS)})
    wait_moved(cluster, TOPIC, {p: [4, 2] for p in range(PARTITIONS)})
    group = group_coordinated_by(cluster, 3)
    with Consumer(cluster.bootstrap, group_id=group) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        consumer.commit({TopicPartition(TOPIC, 0): 1})
        assert consumer.committed(TopicPartition(TOPIC, 0)) == 1


def group_coordinated_by(cluster, broker: int) -> str:
    """A group id whose coordinator is ``broker``."""
    from odradek.network.client import BrokerConnection
    from odradek.core.protocol import ApiKey
    b = cluster.broker(broker)
    conn = BrokerConnection(b.host, b.port, client_id="test")
    try:
        for i in range(500):
            body = conn.request(ApiKey.FIND_COORDINATOR, {"key": f"group-{i}"}).body
            if body.get("error_code") == 0 and body.get("node_id") == broker:
                return f"group-{i}"
    finally:
        conn.close()
    raise AssertionError(f"no group id of 500 is coordinated by broker {broker}")


def test_bad_reassignments_are_refused_with_kafkas_error_codes(make_cluster):
    cluster = make_cluster(3)
    create_replicated_topic(cluster, TOPIC, 1)
    with Admin(cluster.bootstrap) as admin:
        tp = TopicPartition(TOPIC, 0)
        errors = admin.alter_partition_reassignments({tp: [1, 2, 9]})
        assert isinstance(errors[tp], InvalidReplicaAssignmentError) and "9" in errors[tp].message
        errors = admin.alter_partition_reassignments({tp: [1, 1]})
        assert isinstance(errors[tp], InvalidReplicaAssignmentError)
        errors = admin.alter_partition_reassignments({tp: None})
        assert isinstance(errors[tp], NoReassignmentInProgressError)
        errors = admin.alter_partition_reassignments({TopicPartition(TOPIC, 5): [1]})
        assert errors[TopicPartition(TOPIC, 5)].code == 3  # UNKNOWN_TOPIC_OR_PARTITION
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions(TOPIC, 1)
        with pytest.raises(InvalidReplicaAssignmentError):
            admin.create_partitions(TOPIC, 2, assignments=[[1, 2]])  # the topic has 3 replicas per partition


def fetcher_stats(cluster, broker: int) -> dict:
    """The replica fetcher's own numbers, asked of it now (``_stats``)."""
    from odradek.actors.client import MailboxClient
    with MailboxClient(cluster.broker(broker).run_dir) as client:
        return client.request("replica_fetcher", Stats(), timeout=5.0).fields.stats


def reassign_cli(capsys, cluster, *args) -> str:
    from odradek.cli import main
    assert main(["reassign", "--bootstrap-server", cluster.bootstrap, *args]) == 0, capsys.readouterr()
    return capsys.readouterr().out


def throttle_measured(cluster, broker: int, seconds: float) -> float:
    """Bytes/s that ``broker``'s replica fetcher copied of its throttled partitions over
    ``seconds``, by its own clock."""
    first = fetcher_stats(cluster, broker)["throttle"]
    time.sleep(seconds)
    last = fetcher_stats(cluster, broker)["throttle"]
    return (last["bytes"] - first["bytes"]) / (last["at"] - first["at"])


def kill_actor(cluster, broker: int, name: str) -> None:
    """kill -9 one actor of ``broker`` and wait until its supervisor has it running again."""
    b = cluster.broker(broker)
    old = b.actor_process(name).pid
    os.kill(old, 9)

    def back() -> bool:
        a = b.actor(name)
        return a.get("pid") not in (None, 0, old) and a.get("state") == "running"
    cluster.wait_for(back, 30, f"broker {broker}'s {name} restarted")


def test_a_throttled_move_survives_the_controller_killed_and_keeps_to_its_rate(make_cluster, tmp_path, capsys):
    rate = 1_000_000
    # small replica fetches, so the rate is measured in steps much smaller than a second's worth
    cluster = make_cluster(3, replica_fetch_max_bytes=65536)
    create_replicated_topic(cluster, TOPIC, PARTITIONS)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(1000):  # ~10 MB: about ten seconds at the throttle
            producer.send(TOPIC, os.urandom(10_000), partition=i % PARTITIONS)
        producer.flush(60)
    assert cluster.add() == 4
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": p, "replicas": [2, 3, 4]} for p in range(PARTITIONS)]}))
    with Workload(cluster.bootstrap, TOPIC, rate=50) as load:
        out = reassign_cli(capsys, cluster, "--execute", "--reassignment-json-file", str(plan), "--throttle", str(rate))
        assert "Current partition replica assignment" in out and "Successfully started partition reassignments" in out
        cluster.wait_for(lambda: fetcher_stats(cluster, 4)["throttle"]["bytes"] > 200_000, 30, "the move under way")
        first = fetcher_stats(cluster, 4)["throttle"]  # timed by the fetcher's clock
        time.sleep(4)
        last = fetcher_stats(cluster, 4)["throttle"]
        measured = (last["bytes"] - first["bytes"]) / (last["at"] - first["at"])
        print(f"replication under a {rate} B/s throttle: {measured:.0f} B/s")
        assert 0.8 * rate <= measured <= 1.2 * rate, f"{measured:.0f} B/s under a {rate} B/s throttle"
        assert "still in progress" in reassign_cli(capsys, cluster, "--verify", "--reassignment-json-file", str(plan))
        controller = cluster.controller_id()
        cluster.kill(controller)
        cluster.wait_for(lambda: cluster.controller_id() not in (None, controller), 30, "another controller")
        cluster.restart(controller)  # it may be one of the move's targets
        wait_moved(cluster, TOPIC, {p: [2, 3, 4] for p in range(PARTITIONS)}, timeout=120)
        out = reassign_cli(capsys, cluster, "--verify", "--reassignment-json-file", str(plan))
        assert out.count("is completed") == PARTITIONS and "Clearing broker-level throttles" in out
        assert "Clearing topic-level throttles on topics moving" in out
        assert fetcher_stats(cluster, 4)["throttle"]["rate"] == 2 ** 63 - 1
        finish(cluster, load, TOPIC, PARTITIONS)


def test_a_move_cancelled_mid_flight_returns_to_its_replicas_and_its_leader_throttle_outlives_a_fetch_actor_kill(
        make_cluster, tmp_path, capsys):
    rate = 300_000  # per leader: the leaders' side alone holds the copy (the follower rate is lifted below)
    cluster = make_cluster(3, replica_fetch_max_bytes=32768, log_stray_delete_delay_ms=3000)
    create_replicated_topic(cluster, TOPIC, PARTITIONS)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(2000):  # ~20 MB: over twenty seconds at the leaders' throttles
            producer.send(TOPIC, os.urandom(10_000), partition=i % PARTITIONS)
        producer.flush(60)
    origin = cluster.topic_assignment(TOPIC)
    assert cluster.add() == 4
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": p, "replicas": [4] + origin[p][1:]} for p in range(PARTITIONS)]}))
    with Workload(cluster.bootstrap, TOPIC, rate=50) as load:
        reassign_cli(capsys, cluster, "--execute", "--reassignment-json-file", str(plan), "--throttle", str(rate))
        with Admin(cluster.bootstrap) as admin:
            # Kafka's lists, as its tool sets them: the current replicas serve, broker 4 is added
            configs = {c.name: c.value for c in admin.describe_configs(TOPIC)}
            assert sorted(configs["leader.replication.throttled.replicas"].split(",")) == sorted(
                f"{p}:{b}" for p in range(PARTITIONS) for b in origin[p])
            assert sorted(configs["follower.replication.throttled.replicas"].split(",")) == sorted(
                f"{p}:4" for p in range(PARTITIONS))
            admin.alter_configs("4", delete=["follower.replication.throttled.rate"], resource_type="broker")
        leaders = {cluster.leader(TOPIC, p) for p in range(PARTITIONS)}
        cluster.wait_for(lambda: fetcher_stats(cluster, 4)["throttle"]["bytes"] > 200_000, 30, "the move under way")
        held = len(leaders) * rate
        before = throttle_measured(cluster, 4, 3)
        print(f"the leaders' throttles ({len(leaders)} x {rate} B/s): {before:.0f} B/s")
        assert 0.8 * held <= before <= 1.2 * held, f"{before:.0f} B/s under {len(leaders)} x {rate} B/s"
        for b in leaders:  # each leader's fetch actor restarts knowing nothing: it must learn its list again
            kill_actor(cluster, b, "fetch")
        # Measured from the restarts on: the follower's fetches held by the killed actors fail and
        # it fetches again after its backoff; the restarted leaders' unused rate is saved up
        # meanwhile (at most BURST_SECONDS of it, after they start owing that much) and goes in
        # one burst when it does. Over any window from a restart on the leaders keep to their
        # rate; one that starts at the burst (as this one did before) sees up to a second's more.
        t0, first = time.monotonic(), fetcher_stats(cluster, 4)["throttle"]
        cluster.wait_for(lambda: fetcher_stats(cluster, 4)["throttle"]["bytes"] > first["bytes"] + 100_000, 60,
                         "the copy going on")
        resumed = time.monotonic()
        print(f"the copy went on {resumed - t0:.1f} s after the kills")
        time.sleep(max(t0 + 5.0, resumed + 3.0) - time.monotonic())
        last = fetcher_stats(cluster, 4)["throttle"]
        after = (last["bytes"] - first["bytes"]) / (last["at"] - first["at"])
        print(f"from the leaders' fetch actors' restarts on ({last['at'] - first['at']:.1f} s): {after:.0f} B/s")
        assert after <= 1.2 * held, f"{after:.0f} B/s after a fetch actor restart, under {len(leaders)} x {rate} B/s"
        assert all(4 not in cluster.isr(TOPIC, p) for p in range(PARTITIONS)), "the copy is not under way any more"
        out = reassign_cli(capsys, cluster, "--cancel", "--reassignment-json-file", str(plan))
        assert "Successfully cancelled partition reassignments" in out and "Clearing broker-level throttles" in out
        wait_moved(cluster, TOPIC, origin)  # the same replicas; their order is Kafka's (the target's kept first)
        data_4 = cluster.broker(4).data_dir
        cluster.wait_for(lambda: not any(os.path.exists(partition_dir(data_4, TOPIC, p)) for p in range(PARTITIONS)),
                         30, "broker 4's replicas removed")
        with Admin(cluster.bootstrap) as admin:
            assert admin.list_partition_reassignments() == {}
            configs = {c.name: c for c in admin.describe_configs(TOPIC)}
            assert configs["leader.replication.throttled.replicas"].source == "default"
            assert configs["follower.replication.throttled.replicas"].source == "default"
        finish(cluster, load, TOPIC, PARTITIONS)
    assert not load.acked.failed


def test_racks_then_decommission_under_load_then_new_partitions_reach_the_group(make_cluster, capsys):
    from odradek.cli import main
    racks = {b: f"rack-{'abc'[(b - 1) // 2]}" for b in range(1, 7)}  # 1,2: a; 3,4: b; 5,6: c
    cluster = make_cluster(6, broker_settings={b: {"broker.rack": r} for b, r in racks.items()})
    create_replicated_topic(cluster, TOPIC, 6)
    spread = lambda: all(len({racks[b] for b in r}) == 3 for r in cluster.topic_assignment(TOPIC).values())  # noqa: E731
    assert spread(), cluster.topic_assignment(TOPIC)
    assert main(["topics", "--describe", "--topic", TOPIC, "--bootstrap-server", cluster.bootstrap]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "Racks:" in line]
    assert len(lines) == 6 and all(len(set(line.split("Racks: ")[1].split(","))) == 3 for line in lines)
    with Workload(cluster.bootstrap, TOPIC, producer_settings={"metadata_max_age_ms": 2000}) as load:
        load.wait_acked(200)
        out = reassign_cli(capsys, cluster, "--decommission", "6", "--throttle", "20000000")
        assert "Successfully started partition reassignments" in out
        cluster.wait_for(lambda: all(6 not in r for r in cluster.topic_assignment(TOPIC).values()), 60,
                         "nothing left on broker 6")
        wait_healed(cluster, TOPIC, 6)
        assert spread(), cluster.topic_assignment(TOPIC)  # each replica of 6 went to rack c's other broker
        load.wait_acked(200)
        # CreatePartitions: placed on distinct racks; the group's members are given the new ones
        with Admin(cluster.bootstrap) as admin:
            admin.create_partitions(TOPIC, 8)
        wait_healed(cluster, TOPIC, 8)
        assert spread(), cluster.topic_assignment(TOPIC)
        cluster.wait_for(lambda: {6, 7} <= {p for p, _ in load.acked.snapshot()}, 60, "records in the new partitions")
        finish(cluster, load, TOPIC, 8)
    assert "Clearing broker-level throttles" in reassign_cli(capsys, cluster, "--verify")
