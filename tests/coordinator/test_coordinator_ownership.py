"""The group coordinator in cluster mode: which groups it serves follows the leadership of
``__consumer_offsets`` partitions in the metadata snapshot.

Pure tests of the ownership derivation and the write-error mapping, then the real
``GroupCoordinator`` actor on a thread, talking to fake ``controller``, ``log-0`` and
``fetch`` actors (also threads) that play a cluster: broker 1 (us) and broker 2, offsets
partitions led by either or by nobody, a log actor that fails writes on demand or holds
``get_bounds`` (a slow load), a controller that is not the active one. The same against a
real single broker is in test_coordinator_moves.py.
"""
from __future__ import annotations

import os
import threading
import time

from typing import NamedTuple

import pytest

from odradek.actors.client import MailboxClient
from odradek.actors.runtime import Actor
from odradek.coordinator.group_coordinator import GroupCoordinator
from odradek.coordinator.group_writes import commit_error, group_write_error
from odradek.coordinator.offsets import OFFSETS_TOPIC, led_partitions, offsets_leaders, partition_for
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek import config as cfg
from odradek.actors.messages import Bounds, Done, GroupRequest, Metadata, MetadataVersion, Response, Stats, message
from tests.network.helpers import wait_until

N = 4  # offsets partitions


def state(*leaders, epoch=5):
    return [{"leader": leader, "leader_epoch": epoch, "isr": [leader], "replicas": [1, 2]} for leader in leaders]


def cluster_snapshot(version, leaders=(1, 2, 1, -1), offsets=True):
    topics = {"t": {"id": "t-id", "partitions": 2, "replication_factor": 2, "configs": {}, "state": state(1, 2)}}
    if offsets:
        topics[OFFSETS_TOPIC] = {"id": "o-id", "partitions": N, "replication_factor": 2, "configs": {},
                                 "state": state(*leaders)}
    return {"version": version, "defaults": {}, "broker_id": 1, "controller_id": 2,
            "brokers": {"1": ["127.0.0.1", 9001], "2": ["10.0.0.2", 9002]}, "topics": topics}


def group_on(partition: int, n: int = N) -> str:
    return next(f"g{i}" for i in range(10_000) if partition_for(f"g{i}", n) == partition)


# ---- pure --------------------------------------------------------------------------------------
def test_ownership_comes_from_the_state_of_the_offsets_partitions():
    snap = cluster_snapshot(1, leaders=(1, 2, 1, -1))
    assert offsets_leaders(snap, 1) == [(1, 5), (2, 5), (1, 5), (-1, 5)]
    assert led_partitions(snap, 1) == {0: 5, 2: 5}
    assert led_partitions(snap, 2) == {1: 5}
    assert led_partitions(snap, 3) == {}
    # A state list shorter than the partitions, or a malformed entry: no leader there.
    snap["topics"][OFFSETS_TOPIC]["state"] = [{"leader": 1, "leader_epoch": 0}, "junk"]
    assert offsets_leaders(snap, 1) == [(1, 0), (-1, -1), (-1, -1), (-1, -1)]


def test_a_snapshot_without_state_means_this_broker_leads_every_partition():
    single = {"version": 3, "topics": {OFFSETS_TOPIC: {"id": "x", "partitions": 3}}, "defaults": {}}
    assert led_partitions(single, 0) == {0: 0, 1: 0, 2: 0}
    assert led_partitions(single, 7) == {0: 0, 1: 0, 2: 0}
    assert led_partitions({"version": 1, "topics": {}}, 0) == {}  # no offsets topic yet: nothing led


def test_write_errors_map_to_retriable_coordinator_errors_as_in_kafka():
    assert commit_error(ErrorCode.NOT_LEADER_OR_FOLLOWER) == ErrorCode.NOT_COORDINATOR
    assert commit_error(ErrorCode.FENCED_LEADER_EPOCH) == ErrorCode.NOT_COORDINATOR
    assert commit_error(ErrorCode.NOT_ENOUGH_REPLICAS) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert commit_error(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert commit_error(ErrorCode.REQUEST_TIMED_OUT) == ErrorCode.REQUEST_TIMED_OUT
    assert commit_error(ErrorCode.MESSAGE_TOO_LARGE) == ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    assert commit_error(ErrorCode.BROKER_NOT_AVAILABLE) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert group_write_error(ErrorCode.NOT_LEADER_OR_FOLLOWER) == ErrorCode.NOT_COORDINATOR
    assert group_write_error(ErrorCode.REQUEST_TIMED_OUT) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert group_write_error(ErrorCode.NOT_ENOUGH_REPLICAS) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    for code in ErrorCode:
        if code:
            assert commit_error(code).retriable or code in (ErrorCode.MESSAGE_TOO_LARGE,
                                                            ErrorCode.RECORD_LIST_TOO_LARGE)
            assert group_write_error(code).retriable


# ---- fakes -------------------------------------------------------------------------------------
@message("configure", reply=Done)
class Configure(NamedTuple):
    """The test to its fake log actor: what to change (None: leave it)."""

    hold_bounds: bool | None = None
    produce_error: int | None = None
    following: list | None = None


class FakeController(Actor):
    def on_start(self):
        self.snapshot = self.args["snapshot"]
        self.creates = []

    def on_get_metadata(self, msg):
        self.reply(msg, Metadata(self.snapshot))

    def on_create_topics(self, msg):
        self.creates.append(msg.fields.body)
        self.reply_error(msg, ErrorCode.NOT_CONTROLLER, "broker 2 is the active controller")


class FakeLog(Actor):
    """Hosts every offsets partition, empty; leads those the test says."""

    def on_start(self):
        self.hold_bounds, self.held, self.produce_error, self.produced = False, [], 0, []
        self.following, self.bounds_asked = set(), 0  # partitions hosted as a follower

    def on_configure(self, msg):
        change = msg.fields
        self.hold_bounds = self.hold_bounds if change.hold_bounds is None else change.hold_bounds
        self.produce_error = self.produce_error if change.produce_error is None else change.produce_error
        self.following = self.following if change.following is None else set(change.following)
        if not self.hold_bounds:
            for m in self.held:
                self.on_get_bounds(m)
            self.held = []
        self.reply(msg, Done())

    def on_get_bounds(self, msg):
        if self.hold_bounds:
            self.held.append(msg)
            return
        self.bounds_asked += 1
        self.reply(msg, Bounds([[OFFSETS_TOPIC, p, 0, 0, 0, 0, 0, 0, 5, p not in self.following]
                                for p in range(N)], [], self.name))

    def on_produce(self, msg):
        self.produced.append(msg.fields)
        out = []
        for topic, p, _frame in msg.fields.parts:
            entry = {"index": p, "error_code": self.produce_error, "base_offset": 0 if not self.produce_error else -1}
            if self.produce_error:
                entry["error_message"] = "fake"
            out.append({"name": topic, "partitions": [entry]})
        self.reply(msg, Response({"topics": out}))


class FakeFetch(Actor):
    def on_list_offsets(self, msg):
        topics = [{"name": t["name"], "partitions": [{"index": p["index"], "error_code": 0, "offset": 1000}
                                                       for p in t["partitions"]]} for t in msg.fields.body["topics"]]
        self.reply(msg, Response({"topics": topics}))


class Cluster:
    def __init__(self, tmp_path, snapshot):
        self.config = cfg.load(None, [f"log.dirs={tmp_path}", "num.log.threads=1", "broker.id=1",
                                      f"offsets.topic.num.partitions={N}", "zookeeper.connect=127.0.0.1:1",
                                      "offsets.topic.replication.factor=3"])
        self.run_dir = cfg.run_dir(self.config)
        os.makedirs(self.run_dir, exist_ok=True)
        args = {"config": self.config, "data_dir": str(tmp_path), "log_hosts": 1, "snapshot": snapshot}
        self.controller = FakeController("controller", self.run_dir, args)
        self.log = FakeLog("log-0", self.run_dir, args)
        self.fetch = FakeFetch("fetch", self.run_dir, args)
        self.coordinator = GroupCoordinator("group_coordinator", self.run_dir, args)
        self.threads = []
        for a in (self.controller, self.log, self.fetch, self.coordinator):
            ready = threading.Event()
            t = threading.Thread(target=a.run, kwargs={"ready": ready.set}, daemon=True)
            t.start()
            self.threads.append(t)
            assert ready.wait(30), f"{a.name} did not start"
        self.client = MailboxClient(self.run_dir)

    def close(self):
        self.client.close()
        for a in (self.coordinator, self.fetch, self.log, self.controller):
            a.stop()
        for t in self.threads:
            t.join(10)

    def group(self, api, body, timeout=5.0):
        return self.client.request("group_coordinator", GroupRequest(int(api), body, "test", "127.0.0.1:1", 0),
                                   timeout=timeout).fields.body

    def push(self, snapshot):
        return self.client.request("group_coordinator", Metadata(snapshot)).fields

    def commit(self, gid, offset=1):
        body = self.group(ApiKey.OFFSET_COMMIT, {"group_id": gid, "topics": [
            {"name": "t", "partitions": [{"partition_index": 0, "committed_offset": offset}]}]})
        p = body["topics"][0]["partitions"][0]
        return p["error_code"], p.get("error_message", "")

    def error_of(self, api, body):
        with pytest.raises(OdradekError) as e:
            self.group(api, body)
        return e.value


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, cluster_snapshot(10))
    try:
        yield c
    finally:
        c.close()


# ---- the actor ---------------------------------------------------------------------------------
def test_groups_on_partitions_led_elsewhere_get_not_coordinator_and_find_coordinator_names_the_leader(cluster):
    mine, theirs, orphan = group_on(0), group_on(1), group_on(3)
    assert cluster.commit(mine) == (0, "")
    write = cluster.log.produced[-1]
    assert write.acks == -1 and write.timeout_ms == 5000 and write.parts == [[OFFSETS_TOPIC, 0, 0]]
    assert cluster.group(ApiKey.OFFSET_FETCH, {"group_id": mine})["topics"][0]["partitions"][0]["committed_offset"] == 1

    for api, body in [(ApiKey.OFFSET_COMMIT, {"group_id": theirs, "topics": []}),
                      (ApiKey.OFFSET_FETCH, {"group_id": theirs}),
                      (ApiKey.CONSUMER_GROUP_HEARTBEAT, {"group_id": theirs, "member_epoch": 0,
                                                         "subscribed_topic_names": ["t"]})]:
        err = cluster.error_of(api, body)
        assert err.code == ErrorCode.NOT_COORDINATOR
        assert f"{OFFSETS_TOPIC}-1" in err.message and "broker 2" in err.message
    d = cluster.group(ApiKey.DESCRIBE_GROUPS, {"group_ids": [theirs]})["groups"][0]
    assert d["error_code"] == ErrorCode.NOT_COORDINATOR

    found = cluster.group(ApiKey.FIND_COORDINATOR, {"key": theirs})
    assert (found["node_id"], found["host"], found["port"]) == (2, "10.0.0.2", 9002)
    found = cluster.group(ApiKey.FIND_COORDINATOR, {"key": mine})
    assert (found["node_id"], found["host"], found["port"]) == (1, "127.0.0.1", 9001)
    err = cluster.error_of(ApiKey.FIND_COORDINATOR, {"key": orphan})
    assert err.code == ErrorCode.COORDINATOR_NOT_AVAILABLE and f"{OFFSETS_TOPIC}-3" in err.message
    assert cluster.error_of(ApiKey.OFFSET_FETCH, {"group_id": orphan}).code == ErrorCode.NOT_COORDINATOR


def test_failed_replicated_writes_fail_commits_and_heartbeats_with_retriable_codes(cluster):
    gid = group_on(2)
    for produce_error, expected in [(ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.COORDINATOR_NOT_AVAILABLE),
                                    (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.REQUEST_TIMED_OUT),
                                    (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_COORDINATOR)]:
        cluster.client.request("log-0", Configure(produce_error=int(produce_error)))
        code, message = cluster.commit(gid, 7)
        assert code == expected and produce_error.name in message
    cluster.client.request("log-0", Configure(produce_error=int(ErrorCode.NOT_LEADER_OR_FOLLOWER)))
    err = cluster.error_of(ApiKey.CONSUMER_GROUP_HEARTBEAT, {"group_id": gid, "member_epoch": 0,
                                                             "subscribed_topic_names": ["t"]})
    assert err.code == ErrorCode.NOT_COORDINATOR
    # Nothing failed was cached: the offset is unknown, and once writes work the join works.
    cluster.client.request("log-0", Configure(produce_error=0))
    assert cluster.group(ApiKey.OFFSET_FETCH, {"group_id": gid})["topics"] == []
    r = cluster.group(ApiKey.CONSUMER_GROUP_HEARTBEAT, {"group_id": gid, "member_epoch": 0,
                                                        "subscribed_topic_names": ["t"]})
    assert r["error_code"] == 0 and r["member_epoch"] >= 1


def test_leadership_moves_load_and_unload_partitions_without_blocking_the_others(cluster):
    mine, gained = group_on(0), group_on(1)
    assert cluster.commit(mine) == (0, "")
    # Broker 1 gains partition 1, but its log actor is slow to answer get_bounds.
    cluster.client.request("log-0", Configure(hold_bounds=True))
    assert cluster.push(cluster_snapshot(11, leaders=(1, 1, 1, -1))) == MetadataVersion(11)
    err = cluster.error_of(ApiKey.OFFSET_FETCH, {"group_id": gained})
    assert err.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and f"{OFFSETS_TOPIC}-1" in err.message
    assert cluster.commit(mine, 2) == (0, "")  # the other partitions are served meanwhile
    # The log actor answers, but hosts partition 1 as a follower still: the coordinator asks again.
    cluster.client.request("log-0", Configure(hold_bounds=False, following=[1]))
    asked = cluster.log.bounds_asked
    wait_until(lambda: cluster.log.bounds_asked > asked + 2, what="get_bounds to be asked again")
    assert cluster.error_of(ApiKey.OFFSET_FETCH, {"group_id": gained}).code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    cluster.client.request("log-0", Configure(following=[]))  # its LEADER_AND_ISR arrived
    wait_until(lambda: cluster.commit(gained)[0] == 0, what="partition 1 to load")

    # A member of a group on partition 0 waits in a held heartbeat; partition 0 moves to broker 2.
    r = cluster.group(ApiKey.CONSUMER_GROUP_HEARTBEAT, {"group_id": mine, "member_epoch": 0,
                                                        "subscribed_topic_names": ["t"], "topic_partitions": []})
    for _ in range(5):
        r = cluster.group(ApiKey.CONSUMER_GROUP_HEARTBEAT, {"group_id": mine, "member_id": r["member_id"],
                                                            "member_epoch": r["member_epoch"],
                                                            "topic_partitions": r["assignment"]})
    out = {}

    def held():
        t0 = time.monotonic()
        try:
            cluster2 = MailboxClient(cluster.run_dir)
            try:
                cluster2.request("group_coordinator", GroupRequest(
                    int(ApiKey.CONSUMER_GROUP_HEARTBEAT),
                    {"group_id": mine, "member_id": r["member_id"], "member_epoch": r["member_epoch"],
                     "topic_partitions": r["assignment"], "wait_ms": 20000}, "test", "127.0.0.1:1"), timeout=30)
            finally:
                cluster2.close()
        except OdradekError as exc:
            out["error"] = exc
        out["took"] = time.monotonic() - t0

    t = threading.Thread(target=held)
    t.start()
    wait_until(lambda: cluster.client.request("group_coordinator", Stats()).fields.stats["held"] == 1,
               what="the heartbeat to be held")
    assert cluster.push(cluster_snapshot(12, leaders=(2, 1, 1, -1))) == MetadataVersion(12)
    t.join(30)
    assert out["took"] < 10 and out["error"].code == ErrorCode.NOT_COORDINATOR
    assert f"{OFFSETS_TOPIC}-0" in out["error"].message
    assert cluster.error_of(ApiKey.OFFSET_FETCH, {"group_id": mine}).code == ErrorCode.NOT_COORDINATOR
    stats = cluster.client.request("group_coordinator", Stats()).fields.stats
    assert stats["partitions_led"] == 2 and stats["groups"] == 0  # the moved group left memory
    # An older snapshot (a slow poll) changes nothing.
    assert cluster.push(cluster_snapshot(11, leaders=(1, 1, 1, -1))) == MetadataVersion(12)
    assert cluster.error_of(ApiKey.OFFSET_FETCH, {"group_id": mine}).code == ErrorCode.NOT_COORDINATOR


def test_creating_the_offsets_topic_through_a_controller_that_is_not_active_is_retried_later(tmp_path):
    c = Cluster(tmp_path, cluster_snapshot(3, offsets=False))
    try:
        err = c.error_of(ApiKey.FIND_COORDINATOR, {"key": "g"})
        assert err.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        wait_until(lambda: c.controller.creates, what="a create_topics")
        err = c.error_of(ApiKey.CONSUMER_GROUP_HEARTBEAT, {"group_id": "g", "member_epoch": 0,
                                                           "subscribed_topic_names": ["t"]})
        assert err.code == ErrorCode.COORDINATOR_NOT_AVAILABLE and "controller" in err.message
        wait_until(lambda: len(c.controller.creates) >= 2 or c.error_of(
            ApiKey.OFFSET_COMMIT, {"group_id": "g", "topics": []}).code != ErrorCode.COORDINATOR_NOT_AVAILABLE,
            what="a later request to ask again")  # each request asks again
        topic = c.controller.creates[0]["topics"][0]
        assert topic["name"] == OFFSETS_TOPIC and topic["num_partitions"] == N and topic["replication_factor"] == 3
        # The active controller created it meanwhile: the pushed snapshot makes this broker serve.
        c.push(cluster_snapshot(4))
        wait_until(lambda: c.commit(group_on(0)) == (0, ""), what="partition 0 to load")
        assert c.group(ApiKey.FIND_COORDINATOR, {"key": group_on(1)})["node_id"] == 2
    finally:
        c.close()
