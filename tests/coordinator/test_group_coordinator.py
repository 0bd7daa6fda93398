"""The group coordinator actor on a real broker, at the protocol level (no client library):
heartbeats, held heartbeats, commits and their fencing, bad input, kill -9 and restarts."""
from __future__ import annotations

import threading
import time

import pytest

from odradek.coordinator.group import tps_of
from odradek.coordinator.offsets import Committed, OffsetsView, expired, group_record, offset_record
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek import Producer
from odradek.actors.messages import Stats
from tests.network.helpers import actor, connect, kill9, wait_until


def hb(conn, group="g", **body):
    return conn.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, {"group_id": group, **body}).body


def join(conn, group="g", topics=("t",), **extra):
    r = hb(conn, group, member_epoch=0, subscribed_topic_names=list(topics), topic_partitions=[], **extra)
    # Settle: report what we were given until nothing changes.
    for _ in range(20):
        r2 = hb(conn, group, member_id=r["member_id"], member_epoch=r["member_epoch"],
                topic_partitions=r["assignment"])
        if r2["state"] == "stable" and r2["assignment"] == r["assignment"] and r2["member_epoch"] == r["member_epoch"]:
            return r2
        r = r2
    return r


def settle(pairs, rounds=10):
    """Heartbeat each (connection, last response) in turn, reporting what it was given."""
    pairs = list(pairs)
    for _ in range(rounds):
        pairs = [(c, hb(c, member_id=r["member_id"], member_epoch=r["member_epoch"], topic_partitions=r["assignment"]))
                 for c, r in pairs]
    return [r for _, r in pairs]


def commit(conn, offsets, member=None, group="g"):
    by_topic = {}
    for (t, p), off in offsets.items():
        by_topic.setdefault(t, []).append({"partition_index": p, "committed_offset": off})
    body = {"group_id": group, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
    if member is not None:
        body.update(member_id=member["member_id"], generation_id_or_member_epoch=member["member_epoch"])
    resp = conn.request(ApiKey.OFFSET_COMMIT, body).body
    return {(t["name"], p["partition_index"]): (p["error_code"], p.get("error_message", ""))
            for t in resp["topics"] for p in t["partitions"]}


def fetch_offsets(conn, group="g"):
    body = conn.request(ApiKey.OFFSET_FETCH, {"group_id": group}).body
    return {(t["name"], p["partition_index"]): p["committed_offset"] for t in body["topics"] for p in t["partitions"]}


def coordinator_stats(broker) -> dict:
    from odradek.actors.client import MailboxClient
    with MailboxClient(broker.run_dir) as client:
        return client.request("group_coordinator", Stats(), timeout=5.0).fields.stats


def describe(conn, group="g"):
    return conn.request(ApiKey.DESCRIBE_GROUPS, {"group_ids": [group]}).body["groups"][0]


@pytest.fixture
def gb(start_broker):
    b = start_broker(group_consumer_session_timeout_ms=30000)
    with connect(b) as c:
        c.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": "t", "num_partitions": 4}]})
    with Producer(b.bootstrap, linger_ms=0) as p:
        for i in range(40):
            p.send("t", value=b"v%d" % i, partition=i % 4)
        p.flush()
    return b


def test_a_member_joins_commits_and_reads_its_commits_back(gb):
    with connect(gb) as c:
        m = join(c)
        assert tps_of(m["assignment"]) == {("t", p) for p in range(4)}
        assert commit(c, {("t", 0): 3, ("t", 1): 10}, m) == {("t", 0): (0, ""), ("t", 1): (0, "")}
        assert fetch_offsets(c) == {("t", 0): 3, ("t", 1): 10}
        d = describe(c)
        assert d["group_state"] == "stable" and len(d["members"]) == 1
        assert c.request(ApiKey.FIND_COORDINATOR, {"key": "g"}).body["port"] == gb.port


def test_a_held_heartbeat_is_answered_as_soon_as_a_join_concerns_its_member(gb):
    with connect(gb) as a, connect(gb) as b:
        m = join(a)
        out = {}

        def held():
            t0 = time.monotonic()
            out["resp"] = hb(a, member_id=m["member_id"], member_epoch=m["member_epoch"],
                             topic_partitions=m["assignment"], wait_ms=30000)
            out["took"] = time.monotonic() - t0

        t = threading.Thread(target=held)
        t.start()
        wait_until(lambda: coordinator_stats(gb)["held"] == 1, what="the heartbeat to be held")
        hb(b, member_epoch=0, subscribed_topic_names=["t"], topic_partitions=[])
        t.join(40)
        # Answered long before its 30 s: the member is told to give two partitions up.
        assert out["took"] < 15, out
        assert out["resp"]["state"] == "unrevoked_partitions" and len(tps_of(out["resp"]["assignment"])) == 2


def test_bad_input_gets_clear_errors_and_leaves_the_group_as_it_was(gb):
    with connect(gb) as c, connect(gb) as c2:
        m = join(c, topics=["t"])
        other = join(c2, topics=["t"])
        m, other = settle([(c, m), (c2, other)])
        before = describe(c)
        assert before["group_state"] == "stable"
        mine, theirs = sorted(tps_of(m["assignment"])), sorted(tps_of(other["assignment"]))
        with pytest.raises(OdradekError) as e:
            hb(c, group="", member_epoch=0, subscribed_topic_names=["t"])
        assert e.value.code == ErrorCode.INVALID_GROUP_ID
        with pytest.raises(OdradekError) as e:
            hb(c, member_id=m["member_id"], member_epoch=m["member_epoch"] + 7, topic_partitions=m["assignment"])
        assert e.value.code == ErrorCode.FENCED_MEMBER_EPOCH and "rejoin" in e.value.message
        with pytest.raises(OdradekError) as e:
            hb(c, group="nope", member_id="x", member_epoch=3)
        assert e.value.code == ErrorCode.UNKNOWN_MEMBER_ID
        with pytest.raises(OdradekError) as e:
            hb(c, member_epoch=0, subscribed_topic_names="t")
        assert e.value.code == ErrorCode.INVALID_REQUEST and "subscribed_topic_names" in e.value.message
        with pytest.raises(OdradekError) as e:
            hb(c, member_epoch=0, subscribed_topic_names=["t"], session_timeout_ms=5)
        assert e.value.code == ErrorCode.INVALID_SESSION_TIMEOUT
        # Commits: a partition the member does not own; a stale epoch; bad offsets.
        res = commit(c, {mine[0]: 1, theirs[0]: 1}, m)
        assert res[mine[0]][0] == 0
        assert res[theirs[0]][0] == ErrorCode.STALE_MEMBER_EPOCH and "not assigned" in res[theirs[0]][1]
        stale = dict(m, member_epoch=m["member_epoch"] + 1)
        res = commit(c, {mine[0]: 2}, stale)
        assert res[mine[0]][0] == ErrorCode.STALE_MEMBER_EPOCH
        res = commit(c, {mine[0]: -5}, m)
        assert res[mine[0]][0] == ErrorCode.INVALID_REQUEST and "committed_offset" in res[mine[0]][1]
        res = commit(c, {mine[0]: 10_000}, m)
        assert res[mine[0]][0] == ErrorCode.OFFSET_OUT_OF_RANGE and "high watermark" in res[mine[0]][1]
        res = commit(c, {("nope", 0): 1}, m)
        assert res[("nope", 0)][0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        res = commit(c, {mine[0]: 1}, {"member_id": "ghost", "member_epoch": 1})
        assert res[mine[0]][0] == ErrorCode.UNKNOWN_MEMBER_ID
        res = commit(c, {mine[0]: 1})  # a simple commit to a group with members
        assert res[mine[0]][0] == ErrorCode.UNKNOWN_MEMBER_ID
        with pytest.raises(OdradekError) as e:
            c.request(ApiKey.OFFSET_COMMIT, {"group_id": "g", "topics": "x"})
        assert e.value.code == ErrorCode.INVALID_REQUEST
        # Admin errors.
        d = c.request(ApiKey.DESCRIBE_GROUPS, {"group_ids": ["nope"]}).body["groups"][0]
        assert d["error_code"] == ErrorCode.GROUP_ID_NOT_FOUND
        r = c.request(ApiKey.DELETE_GROUPS, {"groups_names": ["g", "nope"]}).body["results"]
        assert [x["error_code"] for x in r] == [ErrorCode.NON_EMPTY_GROUP, ErrorCode.GROUP_ID_NOT_FOUND]
        # Nothing above changed the group or its offsets.
        after = describe(c)
        assert after == before
        assert fetch_offsets(c) == {mine[0]: 1}


def test_commits_and_membership_survive_kill_9_of_the_coordinator(gb):
    with connect(gb) as c:
        m = join(c)
        assert commit(c, {("t", 0): 7, ("t", 3): 9}, m)[("t", 0)][0] == 0
        pid = actor(gb, "group_coordinator")["pid"]
        kill9(pid)
        wait_until(lambda: actor(gb, "group_coordinator")["pid"] != pid
                   and actor(gb, "group_coordinator")["state"] == "running", what="the coordinator to restart")
    with connect(gb) as c:
        assert fetch_offsets(c) == {("t", 0): 7, ("t", 3): 9}
        # The member carries on with the same epoch: nothing moved.
        r = hb(c, member_id=m["member_id"], member_epoch=m["member_epoch"], topic_partitions=m["assignment"])
        assert r["member_epoch"] == m["member_epoch"] and r["assignment"] == m["assignment"]
        assert commit(c, {("t", 0): 8}, m)[("t", 0)][0] == 0


def test_commits_survive_a_broker_restart_and_deleting_a_group_removes_them(start_broker, tmp_path):
    b = start_broker(data_dir=str(tmp_path))
    with connect(b) as c:
        c.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": "t", "num_partitions": 2}]})
    with Producer(b.bootstrap, linger_ms=0) as p:
        for i in range(10):
            p.send("t", value=b"x", partition=i % 2)
        p.flush()
    with connect(b) as c:
        assert commit(c, {("t", 0): 5, ("t", 1): 4}, group="standalone")[("t", 0)][0] == 0
    b.terminate()
    b.stop()
    b2 = start_broker(data_dir=str(tmp_path))
    with connect(b2) as c:
        assert fetch_offsets(c, "standalone") == {("t", 0): 5, ("t", 1): 4}
        groups = c.request(ApiKey.LIST_GROUPS, {}).body["groups"]
        assert [g["group_id"] for g in groups] == ["standalone"]
        r = c.request(ApiKey.DELETE_GROUPS, {"groups_names": ["standalone"]}).body["results"]
        assert r[0]["error_code"] == 0
        assert fetch_offsets(c, "standalone") == {}
    b2.terminate()
    b2.stop()
    b3 = start_broker(data_dir=str(tmp_path))
    with connect(b3) as c:
        assert fetch_offsets(c, "standalone") == {}
        assert c.request(ApiKey.LIST_GROUPS, {}).body["groups"] == []


def test_a_member_that_stops_heartbeating_is_removed_and_its_partitions_move(start_broker):
    b = start_broker(group_consumer_min_session_timeout_ms=100)
    with connect(b) as c:
        c.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": "t", "num_partitions": 4}]})
    with connect(b) as a, connect(b) as s:
        dead = join(s, session_timeout_ms=3000)
        alive = hb(a, member_epoch=0, subscribed_topic_names=["t"], topic_partitions=[], session_timeout_ms=30000)
        dead, alive = settle([(s, dead), (a, alive)])  # then s falls silent
        assert len(tps_of(dead["assignment"])) == 2

        def took_all():
            nonlocal alive
            alive = hb(a, member_id=alive["member_id"], member_epoch=alive["member_epoch"],
                       topic_partitions=alive["assignment"])
            return len(tps_of(alive["assignment"])) == 4

        wait_until(took_all, what="the silent member's partitions to move")
        assert len(describe(a)["members"]) == 1


def test_the_offsets_view_replays_commits_tombstones_and_group_records():
    view = OffsetsView()
    for key, value in [offset_record("g", "t", 0, Committed(5, commit_ms=1)),
                       offset_record("g", "t", 1, Committed(6)),
                       offset_record("g", "t", 0, Committed(7)),
                       offset_record("g", "t", 1, None),
                       group_record("g", {"group_epoch": 3}, 12),
                       group_record("h", {"group_epoch": 1}),
                       group_record("h", None),
                       (b"\xc1garbage", b"x")]:
        view.apply(key, value)
    assert view.offsets == {"g": {("t", 0): Committed(7)}}
    assert view.groups == {"g": {"group": {"group_epoch": 3}, "empty_since_ms": 12}}


def test_offsets_of_an_empty_group_expire_after_the_retention_from_the_later_of_commit_and_emptiness():
    committed = {("t", 0): Committed(1, commit_ms=1_000), ("t", 1): Committed(2, commit_ms=50_000)}
    # Empty since 10 s, retention 60 s: t-0 expires at 70 s (emptiness is later), t-1 at 110 s.
    assert expired(committed, 10_000, 60_000, 69_999) == []
    assert expired(committed, 10_000, 60_000, 70_000) == [("t", 0)]
    assert sorted(expired(committed, 10_000, 60_000, 110_000)) == [("t", 0), ("t", 1)]


def test_a_refusal_of_a_request_the_handler_edits_reaches_the_client_with_its_code(start_broker):
    """DescribeGroups with ``include_authorized_operations`` is answered through the handler
    (it adds each group's operations): the coordinator's refusal of a malformed one reaches
    the client as INVALID_REQUEST naming the field, not as a broken answer."""
    b = start_broker()
    with connect(b) as c:
        with pytest.raises(OdradekError) as e:
            c.request(ApiKey.DESCRIBE_GROUPS, {"include_authorized_operations": True})
        assert e.value.code == ErrorCode.INVALID_REQUEST and "group_ids" in e.value.message
        assert describe(c, "nope")["error_code"] == ErrorCode.GROUP_ID_NOT_FOUND  # the handler still serves
