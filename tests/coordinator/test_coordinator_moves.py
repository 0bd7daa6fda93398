"""A real single broker whose group coordinator is told, by a crafted ``metadata`` push in
the cluster format of docs/REPLICATION.md, that another broker now leads some
``__consumer_offsets`` partitions: their groups get NOT_COORDINATOR, FIND_COORDINATOR names
the other broker, held heartbeats are released, and leadership coming back reloads the
groups' offsets from the log."""
from __future__ import annotations

import threading
import time

import pytest

from odradek.actors.client import MailboxClient
from odradek.actors.messages import GetMetadata, Metadata, MetadataVersion
from odradek.coordinator.offsets import OFFSETS_TOPIC, partition_for
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek import Producer
from tests.coordinator.test_group_coordinator import commit, coordinator_stats, fetch_offsets, hb, join
from tests.network.helpers import connect, wait_until

OTHER = 7  # the broker that takes over


def cluster_view(broker, version: int, moved: dict[int, int]) -> dict:
    """The controller's snapshot, rewritten as a cluster controller would send it: this
    broker (id 0, port 0 as in single mode) leads everything but the ``moved`` partitions
    of ``__consumer_offsets`` (partition -> leader, -1: none)."""
    with MailboxClient(broker.run_dir) as client:
        snap = client.request("controller", GetMetadata()).fields.snapshot
    snap.update(version=version, broker_id=0, controller_id=0,
                brokers={"0": ["127.0.0.1", 0], str(OTHER): ["10.9.8.7", 19092]})
    for name, t in snap["topics"].items():
        leaders = [moved.get(p, 0) if name == OFFSETS_TOPIC else 0 for p in range(t["partitions"])]
        t["state"] = [{"leader": leader, "leader_epoch": 0 if leader == 0 else 1,
                       "isr": [leader] if leader >= 0 else [], "replicas": [0, OTHER]} for leader in leaders]
    return snap


def push(broker, snapshot: dict) -> dict:
    with MailboxClient(broker.run_dir) as client:
        return client.request("group_coordinator", Metadata(snapshot)).fields


@pytest.fixture
def b(start_broker):
    broker = start_broker(offsets_topic_num_partitions=4)
    with connect(broker) as c:
        c.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": "t", "num_partitions": 2}]})
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for i in range(20):
            p.send("t", value=b"v", partition=i % 2)
        p.flush()
    return broker


def test_groups_of_a_partition_another_broker_leads_move_there_and_come_back(b):
    staying = next(f"s{i}" for i in range(1000) if partition_for(f"s{i}", 4) == 0)
    moving = next(f"m{i}" for i in range(1000) if partition_for(f"m{i}", 4) == 1)
    with connect(b) as c, connect(b) as waiter:
        assert commit(c, {("t", 0): 4}, group=staying)[("t", 0)][0] == 0
        assert commit(c, {("t", 1): 6}, group=moving)[("t", 1)][0] == 0
        m = join(waiter, group=moving)
        assert m["member_epoch"] >= 1
        out = {}

        def held():
            t0 = time.monotonic()
            try:
                hb(waiter, group=moving, member_id=m["member_id"], member_epoch=m["member_epoch"],
                   topic_partitions=m["assignment"], wait_ms=25000)
            except OdradekError as exc:
                out["error"] = exc
            out["took"] = time.monotonic() - t0

        t = threading.Thread(target=held)
        t.start()
        wait_until(lambda: coordinator_stats(b)["held"] == 1, what="the heartbeat to be held")
        version = coordinator_stats(b)["metadata_version"] + 1000  # above anything the controller has
        assert push(b, cluster_view(b, version, moved={1: OTHER})) == MetadataVersion(version)
        t.join(30)
        assert out["took"] < 10 and out["error"].code == ErrorCode.NOT_COORDINATOR

        # The moved group: NOT_COORDINATOR naming the partition and its leader; found on broker 7.
        with pytest.raises(OdradekError) as e:
            fetch_offsets(c, moving)
        assert e.value.code == ErrorCode.NOT_COORDINATOR
        assert f"{OFFSETS_TOPIC}-1" in e.value.message and f"broker {OTHER}" in e.value.message
        with pytest.raises(OdradekError) as e:
            commit(c, {("t", 1): 7}, group=moving)
        assert e.value.code == ErrorCode.NOT_COORDINATOR
        found = c.request(ApiKey.FIND_COORDINATOR, {"key": moving}).body
        assert (found["node_id"], found["host"], found["port"]) == (OTHER, "10.9.8.7", 19092)
        # The other group stays here, at this broker's real address (its snapshot port is 0).
        found = c.request(ApiKey.FIND_COORDINATOR, {"key": staying}).body
        assert (found["node_id"], found["port"]) == (0, b.port)
        assert fetch_offsets(c, staying) == {("t", 0): 4}
        assert commit(c, {("t", 0): 5}, group=staying)[("t", 0)][0] == 0
        groups = [g["group_id"] for g in c.request(ApiKey.LIST_GROUPS, {}).body["groups"]]
        assert groups == [staying]

        # A leaderless partition: nobody to find.
        push(b, cluster_view(b, version + 1, moved={1: -1}))
        with pytest.raises(OdradekError) as e:
            c.request(ApiKey.FIND_COORDINATOR, {"key": moving})
        assert e.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE

        # Leadership comes back: the group is loaded again from the log, with its offsets and member.
        push(b, cluster_view(b, version + 2, moved={}))
        assert wait_until(lambda: fetch_offsets(c, moving) == {("t", 1): 6}, what="the partition to load again")
        r = hb(waiter, group=moving, member_id=m["member_id"], member_epoch=m["member_epoch"],
               topic_partitions=m["assignment"])
        assert r["error_code"] == 0 and r["member_epoch"] == m["member_epoch"]
        assert c.request(ApiKey.FIND_COORDINATOR, {"key": moving}).body["port"] == b.port
