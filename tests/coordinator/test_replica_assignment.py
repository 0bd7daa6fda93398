"""The controller's replica assignment (Kafka's rack-unaware rule), without brokers."""
from __future__ import annotations

import collections
import itertools

import pytest

from odradek.coordinator.reassignment import assign_replicas


@pytest.mark.parametrize("brokers,rf", [(3, 3), (3, 2), (5, 3), (6, 2), (4, 1)])
def test_every_partition_gets_distinct_replicas_and_leaders_are_balanced(brokers, rf):
    ids = list(range(1, brokers + 1))
    for start, shift in itertools.product(range(brokers), range(brokers)):
        out = assign_replicas(ids, 4 * brokers, rf, start, shift)
        assert all(len(r) == rf and len(set(r)) == rf and set(r) <= set(ids) for r in out)
        leaders = collections.Counter(r[0] for r in out)
        assert set(leaders.values()) == {4}  # round-robin: each broker prefers exactly 4 of the 4n


def test_replicas_of_all_partitions_spread_evenly_over_the_brokers():
    out = assign_replicas([1, 2, 3, 4, 5], 50, 3, 0, 0)
    load = collections.Counter(b for r in out for b in r)
    assert max(load.values()) - min(load.values()) <= 1


def test_followers_shift_when_the_leaders_wrap_around():
    out = assign_replicas([1, 2, 3], 6, 3, 0, 0)
    assert out[:3] == [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
    assert out[3:] == [[1, 3, 2], [2, 1, 3], [3, 2, 1]]  # a new round: followers one further on
