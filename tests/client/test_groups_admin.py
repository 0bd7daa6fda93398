"""GroupAdmin (what ``odradek groups`` uses) against a real broker: list, describe with lag,
reset offsets of an inactive group, delete."""
from __future__ import annotations

import pytest

from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek import Producer, TopicPartition
from odradek.group import GroupAdmin
from tests.coordinator.test_group_coordinator import commit, hb, join
from tests.network.helpers import connect


@pytest.fixture
def loaded(broker):
    with connect(broker) as c:
        c.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": "t", "num_partitions": 2}]})
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for i in range(20):
            p.send("t", value=b"%d" % i, partition=i % 2, timestamp_ms=1_000_000 + i * 1000)
        p.flush()
    return broker


def test_describe_shows_owner_committed_log_end_and_lag(loaded):
    with connect(loaded) as c, GroupAdmin(loaded.bootstrap) as admin:
        m = join(c)
        assert commit(c, {("t", 0): 4}, m)[("t", 0)][0] == 0
        d = admin.describe("g")
        assert d["group_state"] == "Stable" and len(d["members"]) == 1
        rows = {(r["topic"], r["partition"]): r for r in d["partitions"]}
        assert rows[("t", 0)]["committed"] == 4 and rows[("t", 0)]["log_end"] == 10 and rows[("t", 0)]["lag"] == 6
        assert rows[("t", 1)]["committed"] is None and rows[("t", 1)]["lag"] is None
        assert rows[("t", 1)]["member_id"] == m["member_id"] and rows[("t", 1)]["host"] == "127.0.0.1"
        assert [g["group_id"] for g in admin.list()] == ["g"]
        with pytest.raises(OdradekError) as e:
            admin.describe("nope")
        assert e.value.code == ErrorCode.GROUP_ID_NOT_FOUND


def test_offsets_are_reset_only_while_the_group_is_inactive(loaded):
    with connect(loaded) as c, GroupAdmin(loaded.bootstrap) as admin:
        m = join(c)
        commit(c, {("t", 0): 4, ("t", 1): 5}, m)
        with pytest.raises(OdradekError) as e:
            admin.reset_offsets("g", None, to="earliest", execute=True)
        assert e.value.code == ErrorCode.NON_EMPTY_GROUP
        hb(c, member_id=m["member_id"], member_epoch=-1)  # leave: the group is now inactive
        t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
        plan = admin.reset_offsets("g", None, to="earliest")  # a dry run changes nothing
        assert plan == {t0: (4, 0), t1: (5, 0)} and admin.committed("g") == {t0: 4, t1: 5}
        admin.reset_offsets("g", None, to="shift", value=-3, execute=True)
        assert admin.committed("g") == {t0: 1, t1: 2}
        admin.reset_offsets("g", None, to="shift", value=-30, execute=True)
        assert admin.committed("g") == {t0: 0, t1: 0}
        admin.reset_offsets("g", ["t"], to="latest", execute=True)
        assert admin.committed("g") == {t0: 10, t1: 10}
        # Records i are at 1_000_000 + i s; partition 0 has even i: 12 000 ms -> i = 12 -> offset 6.
        admin.reset_offsets("g", ["t"], to="datetime", value=1_000_000 + 12_000, execute=True)
        assert admin.committed("g") == {t0: 6, t1: 6}
        admin.delete("g")
        assert admin.list() == []
        with pytest.raises(OdradekError) as e:
            admin.delete("g")
        assert e.value.code == ErrorCode.GROUP_ID_NOT_FOUND


def test_to_offset_is_clamped_to_each_log_and_named_partitions_only_move(loaded):
    """Kafka's --to-offset N: above a log's end the new offset is the log end, below its start
    the log start; ``T:P`` resets partition P only (kafka-consumer-groups' --topic T:P)."""
    from odradek import Admin
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    with Admin(loaded.bootstrap) as a:
        a.delete_records({t1: 4})  # partition 1 now starts at 4 (10 records each)
    with connect(loaded) as c, GroupAdmin(loaded.bootstrap) as admin:
        m = join(c)
        commit(c, {("t", 0): 2, ("t", 1): 5}, m)
        hb(c, member_id=m["member_id"], member_epoch=-1)
        assert admin.reset_offsets("g", ["t"], to="offset", value=3) == {t0: (2, 3), t1: (5, 4)}  # 3 < start 4
        assert admin.reset_offsets("g", ["t"], to="offset", value=99) == {t0: (2, 10), t1: (5, 10)}  # past the end
        assert admin.reset_offsets("g", ["t:1"], to="offset", value=7, execute=True) == {t1: (5, 7)}
        assert admin.committed("g") == {t0: 2, t1: 7}
        admin.reset_offsets("g", ["t:0", "t:1"], to="offset", value=6, execute=True)
        assert admin.committed("g") == {t0: 6, t1: 6}
        with pytest.raises(OdradekError) as e:
            admin.reset_offsets("g", ["t:5"], to="offset", value=1)
        assert e.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and "no partition 5" in str(e.value)
        with pytest.raises(OdradekError) as e:
            admin.reset_offsets("g", ["t:x"], to="offset", value=1)
        assert e.value.code == ErrorCode.INVALID_REQUEST
