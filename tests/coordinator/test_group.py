"""The group state machine, driven by a fake clock: no processes, no network, no sleeping."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from odradek.coordinator.group import (EMPTY, STABLE_GROUP, UNRELEASED, UNREVOKED, ConsumerGroup,
                               GroupConfig, GroupError, HeartbeatRequest, tps_of)
from odradek.core.protocol import ErrorCode

TOPICS = {"t": 6}


def new_group(**cfg) -> ConsumerGroup:
    ids = (f"m{i}" for i in itertools.count())
    return ConsumerGroup("g", GroupConfig(**{"session_timeout_ms": 10_000, **cfg}), lambda: next(ids))


class Client:
    """A well-behaved member: reports what it owns, revokes what it is told to."""

    def __init__(self, group: ConsumerGroup, topics=("t",), instance_id=None, rebalance_timeout_ms=5_000):
        self.g, self.topics, self.instance_id = group, list(topics), instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.member_id, self.epoch, self.owned = "", 0, set()

    def beat(self, now, topics=TOPICS, revoke=True) -> dict:
        req = HeartbeatRequest(self.member_id, self.epoch, self.instance_id, self.rebalance_timeout_ms,
                               None, self.topics if self.epoch == 0 else None, None, None, sorted(self.owned))
        resp = self.g.heartbeat(req, now, topics)
        self.member_id, self.epoch = resp["member_id"], resp["member_epoch"]
        given = tps_of(resp["assignment"])
        if revoke:
            self.owned = given
        else:
            self.owned |= given
        return resp

    def leave(self, now, epoch=-1):
        self.g.heartbeat(HeartbeatRequest(self.member_id, epoch, self.instance_id), now, TOPICS)
        self.owned = set()


def settle(clients, now, rounds=5):
    for _ in range(rounds):
        for c in clients:
            c.beat(now)


def test_the_first_member_gets_every_partition():
    g = new_group()
    a = Client(g)
    a.beat(0)
    assert a.owned == {("t", p) for p in range(6)}
    assert a.epoch == g.group_epoch == 1 and g.state == STABLE_GROUP


def test_a_join_revokes_before_it_assigns_and_the_others_keep_consuming():
    g = new_group()
    a, b = Client(g), Client(g)
    a.beat(0)
    settle([a, b], 0)
    before_a, before_b = set(a.owned), set(b.owned)
    c = Client(g)
    c.beat(1)
    assert c.owned == set() and g.members[c.member_id].state == UNRELEASED  # nothing free yet
    a_resp = a.beat(2, revoke=False)  # a is told to give one partition up: its epoch stays
    assert g.members[a.member_id].state == UNREVOKED and a_resp["member_epoch"] < g.group_epoch
    c.beat(3)
    assert c.owned == set(), "a partition must not be assigned while its old owner still holds it"
    a.owned = tps_of(a_resp["assignment"])  # a revokes
    a.beat(4)
    b.beat(4)  # b is told to give one up; it does at once and says so next time
    b.beat(5)
    c.beat(5)
    assert len(c.owned) == 2 and not (c.owned & a.owned) and not (c.owned & b.owned)
    # Only what c took moved: a and b kept the rest.
    assert len(before_a - a.owned) + len(before_b - b.owned) == 2
    assert a.owned <= before_a and b.owned <= before_b
    settle([a, b, c], 6)
    assert g.state == STABLE_GROUP


def test_a_leave_gives_its_partitions_to_the_others():
    g = new_group()
    a, b = Client(g), Client(g)
    settle([a, b], 0)
    b.leave(1)
    assert b.member_id not in g.members
    a.beat(2)
    assert len(a.owned) == 6


def test_a_member_that_stops_heartbeating_is_removed_after_its_session_timeout():
    g = new_group(session_timeout_ms=10_000)
    a, b = Client(g), Client(g)
    settle([a, b], 0)
    assert g.expire(9_999, TOPICS) == []
    a.beat(9_000)
    gone = g.expire(10_000, TOPICS)
    assert [m for m, _ in gone] == [b.member_id] and "session timeout" in gone[0][1]
    a.beat(10_001)
    assert len(a.owned) == 6


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_removed():
    g = new_group(session_timeout_ms=60_000)
    a = Client(g, rebalance_timeout_ms=3_000)
    a.beat(0)
    b = Client(g)
    b.beat(1)
    a.beat(1, revoke=False)  # never gives anything up (a stuck poll loop)
    assert g.members[a.member_id].state == UNREVOKED
    b.beat(2_000)
    assert g.expire(2_000, TOPICS) == []
    gone = g.expire(3_001, TOPICS)
    assert gone and gone[0][0] == a.member_id and "rebalance timeout" in gone[0][1]
    b.beat(3_002)
    assert len(b.owned) == 6


def test_a_static_member_restarting_within_the_session_timeout_gets_its_partitions_back():
    g = new_group(session_timeout_ms=10_000)
    a, b = Client(g, instance_id="a"), Client(g, instance_id="b")
    settle([a, b], 0)
    epoch, a_parts = g.group_epoch, set(a.owned)
    a.leave(1_000, epoch=-2)  # a clean shutdown of a static member
    b.beat(2_000)
    a2 = Client(g, instance_id="a")
    a2.beat(5_000)
    assert a2.owned == a_parts and g.group_epoch == epoch, "nothing may move"
    b.beat(5_001)
    assert not (b.owned & a2.owned)


def test_a_static_member_killed_and_restarted_replaces_its_old_incarnation():
    g = new_group(session_timeout_ms=10_000)
    a, b = Client(g, instance_id="a"), Client(g, instance_id="b")
    settle([a, b], 0)
    epoch, a_parts, old_id = g.group_epoch, set(a.owned), a.member_id
    a2 = Client(g, instance_id="a")  # kill -9 and restart: no leave was sent
    a2.beat(3_000)
    assert a2.owned == a_parts and g.group_epoch == epoch
    with pytest.raises(GroupError) as e:
        a.beat(3_001)  # the zombie
    assert e.value.code == ErrorCode.FENCED_INSTANCE_ID
    with pytest.raises(GroupError) as e:
        g.check_commit(old_id, a.epoch, a_parts)
    assert e.value.code == ErrorCode.FENCED_INSTANCE_ID


def test_a_static_member_that_does_not_return_in_time_loses_its_partitions():
    g = new_group(session_timeout_ms=10_000)
    a, b = Client(g, instance_id="a"), Client(g, instance_id="b")
    settle([a, b], 0)
    a.leave(1_000, epoch=-2)
    b.beat(9_000)
    g.expire(11_001, TOPICS)
    b.beat(11_002)
    assert len(b.owned) == 6


def test_a_wrong_member_epoch_is_fenced():
    g = new_group()
    a = Client(g)
    a.beat(0)
    a.epoch += 5
    with pytest.raises(GroupError) as e:
        a.beat(1)
    assert e.value.code == ErrorCode.FENCED_MEMBER_EPOCH


def test_a_lost_response_is_tolerated_with_the_previous_epoch():
    g = new_group()
    a = Client(g)
    a.beat(0)
    old_epoch, old_owned = a.epoch, set(a.owned)
    b = Client(g)
    b.beat(1)
    resp = g.heartbeat(HeartbeatRequest(a.member_id, old_epoch, owned=sorted(old_owned)), 2, TOPICS)
    a.owned = tps_of(resp["assignment"])  # revoked
    resp = g.heartbeat(HeartbeatRequest(a.member_id, old_epoch, owned=sorted(a.owned)), 3, TOPICS)
    new_epoch = resp["member_epoch"]  # this answer is "lost"
    assert new_epoch > old_epoch
    resp = g.heartbeat(HeartbeatRequest(a.member_id, old_epoch, owned=sorted(a.owned)), 4, TOPICS)
    assert resp["member_epoch"] == new_epoch


def test_claiming_partitions_never_given_is_fenced():
    g = new_group()
    a, b = Client(g), Client(g)
    settle([a, b], 0)
    with pytest.raises(GroupError) as e:
        g.heartbeat(HeartbeatRequest(a.member_id, a.epoch, owned=sorted(a.owned | b.owned)), 1, TOPICS)
    assert e.value.code == ErrorCode.FENCED_MEMBER_EPOCH


def test_commits_are_fenced_by_member_epoch_and_ownership():
    g = new_group()
    a, b = Client(g), Client(g)
    settle([a, b], 0)
    mine, theirs = next(iter(a.owned)), next(iter(b.owned))
    assert g.check_commit(a.member_id, a.epoch, [mine]) == {}
    problems = g.check_commit(a.member_id, a.epoch, [theirs])
    assert problems[theirs].code == ErrorCode.STALE_MEMBER_EPOCH and "not assigned" in problems[theirs].message
    with pytest.raises(GroupError) as e:
        g.check_commit(a.member_id, a.epoch + 1, [mine])
    assert e.value.code == ErrorCode.STALE_MEMBER_EPOCH
    with pytest.raises(GroupError) as e:
        g.check_commit("nobody", 3, [mine])
    assert e.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    with pytest.raises(GroupError) as e:
        g.check_commit("", -1, [mine])  # a simple commit to an active group
    assert e.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    # A partition newly assigned at epoch E cannot be committed with an epoch before E.
    b.leave(1)
    a.beat(2)
    assert theirs in a.owned
    problems = g.check_commit(a.member_id, a.epoch - 1, [theirs])
    assert problems[theirs].code == ErrorCode.STALE_MEMBER_EPOCH


def test_a_member_may_commit_what_it_is_revoking():
    g = new_group()
    a = Client(g)
    a.beat(0)
    b = Client(g)
    b.beat(1)
    resp = a.beat(2, revoke=False)
    revoking = a.owned - tps_of(resp["assignment"])
    assert revoking
    assert g.check_commit(a.member_id, a.epoch, revoking) == {}


def test_a_new_partition_of_a_subscribed_topic_triggers_a_rebalance():
    g = new_group()
    a, b = Client(g), Client(g)
    settle([a, b], 0)
    epoch = g.group_epoch
    bigger = {"t": 8}
    for _ in range(3):
        a.beat(1, bigger)
        b.beat(1, bigger)
    assert g.group_epoch == epoch + 1 and len(a.owned | b.owned) == 8


def test_regex_subscription_and_unknown_assignor():
    g = new_group()
    resp = g.heartbeat(HeartbeatRequest("", 0, subscribed_topic_regex="t.*"), 0, {"t1": 2, "t2": 1, "__x": 3})
    assert tps_of(resp["assignment"]) == {("t1", 0), ("t1", 1), ("t2", 0)}
    with pytest.raises(GroupError) as e:
        g.heartbeat(HeartbeatRequest("", 0, subscribed_topic_names=["t"], server_assignor="magic"), 0, TOPICS)
    assert e.value.code == ErrorCode.UNSUPPORTED_ASSIGNOR


def test_a_catastrophic_backtracking_regex_matches_in_linear_time():
    """Issue 16, defect 8: "(a+)+" against a topic "a"*40 + "X" spun the coordinator at 100% CPU
    (Python's backtracking re: about 2^40 steps, holding the GIL) and every group API timed out.
    With a backtracking engine this test hangs until pytest's timeout fails it."""
    g = new_group()
    topics = {"a" * 40 + "X": 1, "aaa": 1}
    resp = g.heartbeat(HeartbeatRequest("", 0, subscribed_topic_regex="(a+)+"), 0, topics)
    assert tps_of(resp["assignment"]) == {("aaa", 0)}
    with pytest.raises(GroupError) as e:
        g.heartbeat(HeartbeatRequest("", 0, subscribed_topic_regex="(a"), 0, topics)
    assert e.value.code == ErrorCode.INVALID_REQUEST and "does not compile" in e.value.message


def test_group_max_size_and_bad_session_timeouts_are_refused():
    g = new_group(max_size=1)
    Client(g).beat(0)
    with pytest.raises(GroupError) as e:
        Client(g).beat(0)
    assert e.value.code == ErrorCode.GROUP_MAX_SIZE_REACHED
    g = new_group()
    with pytest.raises(GroupError) as e:
        g.heartbeat(HeartbeatRequest("", 0, subscribed_topic_names=["t"], session_timeout_ms=1), 0, TOPICS)
    assert e.value.code == ErrorCode.INVALID_SESSION_TIMEOUT
    assert not g.members


def test_the_group_survives_a_round_trip_through_its_record():
    g = new_group()
    a, b = Client(g, instance_id="a"), Client(g)
    settle([a, b], 0)
    c = Client(g)
    c.beat(1)
    a.beat(1, revoke=False)  # mid-rebalance
    g2 = ConsumerGroup.from_record("g", g.to_record(), 100, g.config)
    assert g2.describe() == g.describe()
    for cl in (a, b, c):
        cl.g = g2
    settle([a, b, c], 200)
    assert g2.state == STABLE_GROUP
    assert len(a.owned | b.owned | c.owned) == 6


def test_an_empty_group_reports_empty():
    g = new_group()
    a = Client(g)
    a.beat(0)
    a.leave(1)
    assert g.state == EMPTY and not g.owners


# ---- a random walk: joins, leaves, crashes, stuck members, time ----------------------------------
class GroupMachine(RuleBasedStateMachine):
    """Random clients against one group. Invariant: no two current members' clients own the
    same partition, ever; after a quiet period every partition is owned."""

    def __init__(self):
        super().__init__()
        self.g = new_group(session_timeout_ms=1_000)
        self.now = 0
        self.clients: list[Client] = []
        self.n = 0

    @rule(static=st.booleans())
    def join(self, static):
        self.n += 1
        c = Client(self.g, instance_id=f"i{self.n % 4}" if static else None, rebalance_timeout_ms=800)
        if static:  # a restart of a static member: its old incarnation is a zombie now
            for old in self.clients:
                if old.instance_id == c.instance_id:
                    self.clients.remove(old)
                    break
        try:
            c.beat(self.now)
        except GroupError as e:
            assert e.code == ErrorCode.GROUP_MAX_SIZE_REACHED
            return
        self.clients.append(c)

    @rule(i=st.integers(0, 20), revoke=st.booleans())
    def heartbeat(self, i, revoke):
        if not self.clients:
            return
        c = self.clients[i % len(self.clients)]
        try:
            c.beat(self.now, revoke=revoke)
        except GroupError as e:
            assert e.code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH,
                              ErrorCode.FENCED_INSTANCE_ID)
            self.clients.remove(c)  # it gives everything up (and may rejoin as a new client)

    @rule(i=st.integers(0, 20))
    def leave(self, i):
        if self.clients:
            c = self.clients.pop(i % len(self.clients))
            try:
                c.leave(self.now, epoch=-2 if c.instance_id else -1)
            except GroupError:
                pass

    @rule(i=st.integers(0, 20))
    def crash(self, i):
        if self.clients:
            self.clients.pop(i % len(self.clients))  # kill -9: no leave

    @rule(ms=st.integers(1, 700))
    def tick(self, ms):
        self.now += ms
        self.g.expire(self.now, TOPICS)

    @invariant()
    def no_partition_has_two_owners(self):
        seen = {}
        for c in self.clients:
            if c.member_id not in self.g.members:
                continue
            for tp in c.owned:
                assert tp not in seen, f"{tp} owned by {seen[tp]} and {c.member_id}"
                seen[tp] = c.member_id
        for tp, m in self.g.owners.items():
            assert m in self.g.members

    def teardown(self):
        live = [c for c in self.clients if c.member_id in self.g.members]
        for _ in range(6):
            for c in live:
                c.beat(self.now)
        self.g.expire(self.now, TOPICS)
        live = [c for c in live if c.member_id in self.g.members]
        if live and all(not self.g.members[c.member_id].left_static for c in live) and \
                len(live) == len(self.g.members):
            assert set().union(*(c.owned for c in live)) == {("t", p) for p in range(6)}
            assert self.g.state == STABLE_GROUP


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
