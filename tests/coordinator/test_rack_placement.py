"""Kafka's rack-aware replica assignment and the reassignment tool's plans, without brokers."""
from __future__ import annotations

import collections
import itertools
import random

import pytest

from odradek.coordinator.reassignment import assign_replicas_rack_aware, rack_alternated
from odradek.reassign import decommission, generate, parse_plan, plan_json
from odradek.core.protocol import OdradekError
from odradek.types import TopicPartition

SIX = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}


def test_the_broker_list_alternates_racks():
    assert rack_alternated(SIX) == [1, 3, 5, 2, 4, 6]
    assert rack_alternated({1: "x", 2: "x", 3: "y"}) == [1, 3, 2]


@pytest.mark.parametrize("rf", [1, 2, 3])
def test_with_three_racks_and_six_brokers_no_partition_has_two_replicas_on_one_rack(rf):
    for start, shift in itertools.product(range(6), range(6)):
        out = assign_replicas_rack_aware(SIX, 24, rf, start, shift)
        for replicas in out:
            assert len(set(replicas)) == rf and len({SIX[b] for b in replicas}) == rf
        leaders = collections.Counter(r[0] for r in out)
        assert set(leaders.values()) == {4}  # leaders round-robin over all six brokers
        load = collections.Counter(b for r in out for b in r)
        assert max(load.values()) - min(load.values()) <= 1


def test_more_replicas_than_racks_still_uses_every_rack_and_distinct_brokers():
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    for replicas in assign_replicas_rack_aware(racks, 8, 3, 1, 2):
        assert len(set(replicas)) == 3 and {racks[b] for b in replicas} == {"a", "b"}


def test_generate_keeps_partitions_and_changes_the_replication_factor_on_request():
    current = {TopicPartition("t", p): [1, 2, 3] for p in range(4)}
    plan = generate(current, [2, 3, 4], {}, rng=random.Random(1))
    assert sorted(plan) == sorted(current) and all(sorted(r) == [2, 3, 4] for r in plan.values())
    plan = generate(current, [2, 3, 4], {}, rf=2, rng=random.Random(1))
    assert all(len(set(r)) == 2 and set(r) <= {2, 3, 4} for r in plan.values())
    with pytest.raises(OdradekError, match="needs at least 4 brokers"):
        generate(current, [2, 3, 4], {}, rf=4)


def test_generate_is_rack_aware_when_every_broker_has_a_rack():
    current = {TopicPartition("t", p): [1, 2, 3] for p in range(12)}
    for replicas in generate(current, list(SIX), SIX).values():
        assert len({SIX[b] for b in replicas}) == 3


def test_decommission_moves_only_the_brokers_replicas_to_the_least_loaded_on_another_rack():
    current = {TopicPartition("t", 0): [1, 3, 5], TopicPartition("t", 1): [3, 5, 2], TopicPartition("t", 2): [4, 6, 2]}
    plan = decommission(current, 1, list(SIX), SIX)
    assert plan == {TopicPartition("t", 0): [3, 5, 2]}  # broker 2: rack a again, and least loaded there
    plan = decommission(current, 5, [1, 2, 3, 4, 5, 6], {})
    assert set(plan) == {TopicPartition("t", 0), TopicPartition("t", 1)}
    assert all(5 not in r and len(set(r)) == 3 for r in plan.values())


def test_a_plan_round_trips_through_kafkas_json_and_bad_json_says_what_is_expected():
    plan = {TopicPartition("t", 0): [2, 3, 4], TopicPartition("u", 1): [4]}
    assert parse_plan(plan_json(plan)) == plan
    with pytest.raises(OdradekError, match="partitions"):
        parse_plan('{"version": 1}')


def test_a_directory_is_stray_when_the_metadata_gives_this_broker_no_replica_of_it():
    from odradek.coordinator.stray_logs import stray_dirs
    topics = {"t": {"state": [{"replicas": [1, 2]}, {"replicas": [2, 3]}]}}
    names = ["t-0", "t-1", "t-2", "gone-0", "meta", "t-0.abc-delete", "__consumer_offsets-3"]
    assert stray_dirs(names, topics, set(), 1) == [("t", 1), ("t", 2), ("gone", 0), ("__consumer_offsets", 3)]
    assert stray_dirs(names, topics, {("t", 1)}, 1) == [("t", 2), ("gone", 0), ("__consumer_offsets", 3)]
