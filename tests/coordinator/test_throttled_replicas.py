"""The per-topic throttled replica lists (Kafka's ``leader/follower.replication.throttled.replicas``):
their format as topic configs, how a broker reads them, and what ``odradek reassign --execute
--throttle`` puts in them for a plan (Kafka's tool: current replicas lead, added ones follow)."""
from __future__ import annotations

import pytest

from odradek.coordinator.throttles import throttled_replicas as parse
from odradek.core.config import LogConfig
from odradek.core.errors import InvalidConfigError
from odradek.reassign import throttled_replicas
from odradek.types import TopicPartition as TP


def test_the_lists_accept_kafkas_format_and_refuse_anything_else_naming_the_key():
    for good in ("", "*", "0:1", "0:1,0:2,3:14", " 0:1 , 1:2 "):
        LogConfig.from_properties({"leader.replication.throttled.replicas": good})
    for bad in ("0", "0:", "a:1", "*,0:1", "0:1;1:2", "0:1,"):
        with pytest.raises(InvalidConfigError) as err:
            LogConfig.from_properties({"follower.replication.throttled.replicas": bad})
        assert "follower.replication.throttled.replicas" in str(err.value) and "partition:broker" in str(err.value)


def test_a_broker_reads_a_list_as_partition_broker_pairs_and_a_star_as_every_replica():
    assert parse("0:1,0:2,3:14") == {(0, 1), (0, 2), (3, 14)}
    assert parse("") == set() and parse(None) == set()
    assert parse("*") is None


def test_a_plan_throttles_the_current_replicas_as_leaders_and_the_added_ones_as_followers():
    current = {TP("t", 0): [1, 2, 3], TP("t", 1): [2, 3, 1], TP("u", 0): [1, 2]}
    plan = {TP("t", 0): [2, 3, 4], TP("t", 1): [3, 1, 2], TP("u", 0): [5, 6]}  # t-1 only reordered
    assert throttled_replicas(plan, current) == {
        "t": {"leader.replication.throttled.replicas": "0:1,0:2,0:3",
              "follower.replication.throttled.replicas": "0:4"},
        "u": {"leader.replication.throttled.replicas": "0:1,0:2",
              "follower.replication.throttled.replicas": "0:5,0:6"}}
