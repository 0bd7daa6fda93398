"""Cluster operations (issue 17): partition reassignment (KIP-455), replication factor changes,
cancellation, controller failover mid-move, CreatePartitions, on real ZooKeeper and brokers.

Each scenario runs an acks=all producer and a consumer group throughout (``Workload``) and
ends with the fault tests' checks (``finish``): every acknowledged record consumed at its
offset, no offset holding two values, the replicas byte-identical, a fresh reader agreeing.
The ZooKeeper state read is docs/REPLICATION.md's (the topic node's ``partitions``,
``adding_replicas``, ``removing_replicas``).
"""
from __future__ import annotations

import os

import pytest

from odradek import Admin, TopicPartition
from odradek.errors import InvalidPartitionsError, InvalidReplicaAssignmentError, NoReassignmentInProgressError
from tests.cluster.test_faults import create_replicated_topic, finish, wait_healed
from tests.cluster.verify import Workload, partition_dir

pytestmark = pytest.mark.slow

TOPIC = "moving"
PARTITIONS = 3


def wait_moved(cluster, topic: str, expected: dict[int, list[int]], timeout: float = 60.0) -> None:
    """Every partition's replicas are ``expected`` (as sets), with no move left in ZooKeeper,
    and every replica in the ISR."""
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


def reassign(cluster, moves: dict) -> None:
    with Admin(cluster.bootstrap) as admin:
        errors = admin.alter_partition_reassignments({TopicPartition(TOPIC, p): r for p, r in moves.items()})
    assert all(e is None for e in errors.values()), errors


def test_move_every_partition_to_a_new_broker_under_load_then_change_the_replication_factor(make_cluster):
    cluster = make_cluster(3)
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
        # replication factor 3 -> 2, then 2 -> 3 again (a new replica copies the whole log)
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
