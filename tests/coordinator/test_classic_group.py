"""The classic group state machine (coordinator/classic_group.py), with a fake clock: no
network, no sleeping."""
from __future__ import annotations

import itertools

import pytest

from odradek.coordinator.classic_group import (COMPLETING, EMPTY, PREPARING, STABLE, ClassicConfig, ClassicGroup,
                                               JoinRequest)
from odradek.coordinator.group import GroupError
from odradek.core.protocol import ErrorCode

RANGE = ("range", b"r-meta")
RR = ("roundrobin", b"rr-meta")


def group(delay: int = 0) -> ClassicGroup:
    ids = itertools.count(1)
    return ClassicGroup("g", ClassicConfig(initial_rebalance_delay_ms=delay, join_wait_cap_ms=20000),
                        new_member_id=lambda prefix: f"{prefix}-{next(ids)}")


def req(member_id: str = "", protocols=(RANGE,), instance: str | None = None, session: int = 10000,
        client: str = "c") -> JoinRequest:
    return JoinRequest(member_id=member_id, instance_id=instance, session_timeout_ms=session,
                       rebalance_timeout_ms=15000, protocols=list(protocols), client_id=client)


def joined(g: ClassicGroup, now: float, protocols=(RANGE,), instance=None, client="c") -> str:
    """A member's two-step join (MEMBER_ID_REQUIRED, then with the id); returns its id."""
    mid, body = g.join(req(protocols=protocols, instance=instance, client=client), now)
    if instance is None:
        assert body["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
        mid2, body = g.join(req(mid, protocols=protocols, instance=instance, client=client), now)
        assert mid2 == mid
    assert body is None
    return mid


def answers(g: ClassicGroup, kind: str) -> dict:
    return {mid: body for k, mid, body in g.take_outbox() if k == kind}


def test_a_first_join_without_a_member_id_is_answered_member_id_required_with_one():
    g = group()
    mid, body = g.join(req(), 0)
    assert body["error_code"] == ErrorCode.MEMBER_ID_REQUIRED and body["member_id"] == mid
    assert g.members == {} and mid in g.pending


def test_a_join_before_v4_joins_at_once_without_member_id_required():
    g = group()
    r = req()
    r.require_known_member_id = False
    mid, body = g.join(r, 0)
    assert body is None and mid in g.members
    assert answers(g, "join")[mid]["generation_id"] == 1


def test_one_member_becomes_leader_and_gets_its_own_metadata_then_its_assignment():
    g = group()
    a = joined(g, 0)
    j = answers(g, "join")[a]
    assert (j["generation_id"], j["leader"], j["protocol_name"]) == (1, a, "range")
    assert j["members"] == [{"member_id": a, "group_instance_id": None, "metadata": b"r-meta"}]
    assert g.state == COMPLETING
    assert g.sync(a, 1, None, {a: b"assign-a"}, 1) is None
    assert answers(g, "sync")[a]["assignment"] == b"assign-a"
    assert g.state == STABLE and g.changed


def test_the_initial_rebalance_delay_gathers_members_that_join_within_it():
    g = group(delay=3000)
    a = joined(g, 0)
    assert g.take_outbox() == [] and g.state == PREPARING
    b = joined(g, 1000)
    g.expire(3999)
    assert g.take_outbox() == []  # b extended the delay to 4000
    g.expire(4000)
    js = answers(g, "join")
    assert set(js) == {a, b} and js[a]["leader"] == a and len(js[a]["members"]) == 2 and js[b]["members"] == []


def test_a_new_member_rebalances_a_stable_group_and_heartbeats_say_rebalance_in_progress():
    g = group()
    a = joined(g, 0)
    g.take_outbox()
    g.sync(a, 1, None, {a: b"x"}, 0)
    g.take_outbox()
    b = joined(g, 10)
    assert g.state == PREPARING
    with pytest.raises(GroupError) as e:
        g.heartbeat(a, 1, None, 20)
    assert e.value.code == ErrorCode.REBALANCE_IN_PROGRESS
    assert g.join(req(a), 30) == (a, None)  # a rejoins: everyone is in
    js = answers(g, "join")
    assert js[a]["generation_id"] == js[b]["generation_id"] == 2
    g.sync(b, 2, None, None, 40)
    assert g.take_outbox() == []  # held until the leader's assignments
    g.sync(a, 2, None, {a: b"pa", b: b"pb"}, 50)
    ss = answers(g, "sync")
    assert (ss[a]["assignment"], ss[b]["assignment"]) == (b"pa", b"pb")
    g.heartbeat(b, 2, None, 60)
    with pytest.raises(GroupError) as e:
        g.heartbeat(b, 1, None, 60)
    assert e.value.code == ErrorCode.ILLEGAL_GENERATION


def test_a_member_that_does_not_rejoin_by_the_deadline_is_removed():
    g = group()
    a = joined(g, 0)
    g.sync(a, 1, None, {a: b""}, 0)
    b = joined(g, 100)  # a never rejoins
    g.take_outbox()
    g.expire(100 + 15000)
    js = answers(g, "join")
    assert set(js) == {b} and js[b]["leader"] == b and a not in g.members


def test_a_silent_member_is_removed_after_its_session_timeout_and_the_group_rebalances():
    g = group(delay=100)
    a = joined(g, 0)
    b = joined(g, 0)
    g.expire(100)
    g.take_outbox()
    g.sync(a, 1, None, {a: b"1", b: b"2"}, 0)
    g.sync(b, 1, None, None, 0)
    g.take_outbox()
    g.heartbeat(a, 1, None, 9000)
    assert g.expire(10000) == [(b, "no heartbeat within its session timeout (10000 ms)")]
    assert g.state == PREPARING
    with pytest.raises(GroupError) as e:
        g.heartbeat(b, 1, None, 10001)
    assert e.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    g.join(req(a), 10002)
    assert answers(g, "join")[a]["generation_id"] == 2


def test_the_protocol_every_member_supports_wins_by_votes():
    g = group(delay=100)
    a = joined(g, 0, protocols=(RR, RANGE))
    b = joined(g, 0, protocols=(RANGE, RR))
    c = joined(g, 0, protocols=(RANGE,))
    g.expire(100)
    js = answers(g, "join")
    assert {js[m]["protocol_name"] for m in (a, b, c)} == {"range"}


def test_a_member_without_a_common_protocol_is_refused_inconsistent_group_protocol():
    g = group()
    joined(g, 0, protocols=(RANGE,))
    with pytest.raises(GroupError) as e:
        g.join(req(protocols=(RR,)), 1)
    assert e.value.code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_a_session_timeout_outside_the_brokers_range_is_refused():
    with pytest.raises(GroupError) as e:
        group().join(req(session=100), 0)
    assert e.value.code == ErrorCode.INVALID_SESSION_TIMEOUT


def test_huge_member_metadata_is_refused_before_it_is_stored():
    g = group()
    with pytest.raises(GroupError) as e:
        g.join(req(protocols=(("range", b"x" * (2 << 20)),)), 0)
    assert e.value.code == ErrorCode.INVALID_REQUEST and not g.members and not g.pending


def test_a_static_member_rejoining_unchanged_replaces_the_old_one_without_a_rebalance():
    g = group(delay=100)
    a = joined(g, 0, instance="i1")
    b = joined(g, 0, instance="i2")
    g.expire(100)
    g.take_outbox()
    g.sync(a, 1, "i1", {a: b"pa", b: b"pb"}, 0)
    g.sync(b, 1, "i2", None, 0)
    g.take_outbox()
    new, body = g.join(req(instance="i2"), 100)  # b restarted
    assert body["generation_id"] == 1 and new != b and g.state == STABLE
    assert g.sync(new, 1, "i2", None, 110)["assignment"] == b"pb"
    for call in (lambda: g.heartbeat(b, 1, "i2", 120), lambda: g.sync(b, 1, "i2", None, 120)):
        with pytest.raises(GroupError) as e:
            call()
        assert e.value.code == ErrorCode.FENCED_INSTANCE_ID
    g.heartbeat(a, 1, "i1", 130)  # the other member saw nothing


def test_a_static_member_rejoining_with_other_protocols_triggers_a_rebalance():
    g = group()
    a = joined(g, 0, instance="i1")
    g.sync(a, 1, "i1", {a: b""}, 0)
    g.take_outbox()
    new, body = g.join(req(instance="i1", protocols=(RANGE, RR)), 10)
    assert body is None
    assert answers(g, "join")[new]["generation_id"] == 2


def test_leaving_rebalances_and_the_last_one_leaving_empties_the_group():
    g = group(delay=100)
    a = joined(g, 0)
    b = joined(g, 0)
    g.expire(100)
    g.take_outbox()
    g.sync(a, 1, None, {}, 0)
    g.take_outbox()
    g.leave(b, None, 10)
    assert g.state == PREPARING
    g.join(req(a), 20)
    assert answers(g, "join")[a]["generation_id"] == 2
    g.leave(a, None, 30)
    assert g.state == EMPTY and g.generation_id == 3
    with pytest.raises(GroupError) as e:
        g.heartbeat(a, 2, None, 40)
    assert e.value.code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_sync_during_a_new_rebalance_is_answered_rebalance_in_progress():
    g = group(delay=100)
    joined(g, 0)
    b = joined(g, 0)
    g.expire(100)
    g.take_outbox()
    g.sync(b, 1, None, None, 0)  # held: the leader has not synced
    c = joined(g, 5)  # a third member: the generation is abandoned
    assert answers(g, "sync")[b]["error_code"] == ErrorCode.REBALANCE_IN_PROGRESS
    assert c in g.members and g.state == PREPARING


def test_commits_are_fenced_by_member_and_generation():
    g = group()
    g.check_commit("", -1, None)  # a simple commit to an empty group
    a = joined(g, 0)
    g.take_outbox()
    cases = [("", -1, ErrorCode.UNKNOWN_MEMBER_ID), ("nobody", 1, ErrorCode.UNKNOWN_MEMBER_ID),
             (a, 1, ErrorCode.REBALANCE_IN_PROGRESS)]
    g.sync(a, 1, None, None, 0)  # a follower-like sync that waits: CompletingRebalance
    for member, gen, code in cases:
        with pytest.raises(GroupError) as e:
            g.check_commit(member, gen, None)
        assert e.value.code == code
    g.sync(a, 1, None, {a: b""}, 0)
    g.check_commit(a, 1, None)
    with pytest.raises(GroupError) as e:
        g.check_commit(a, 0, None)
    assert e.value.code == ErrorCode.ILLEGAL_GENERATION


def test_a_stable_group_survives_its_record_and_a_member_resumes_with_its_generation():
    g = group()
    a = joined(g, 0, instance="i1")
    g.take_outbox()
    g.sync(a, 1, "i1", {a: b"pa"}, 0)
    back = ClassicGroup.from_record("g", g.to_record(), 1000, g.config)
    assert back.state == STABLE and back.generation_id == 1 and back.leader_id == a
    back.heartbeat(a, 1, "i1", 1001)
    assert back.sync(a, 1, "i1", None, 1002)["assignment"] == b"pa"
    back.expire(1002 + 10000)  # silent for its session timeout: gone, and the group is empty
    assert not back.members and back.state == EMPTY and back.generation_id == 2


def test_a_pending_member_id_expires_after_the_session_timeout():
    g = group()
    mid, _ = g.join(req(), 0)
    g.expire(10000)
    assert mid not in g.pending
    with pytest.raises(GroupError) as e:
        g.join(req(mid), 10001)
    assert e.value.code == ErrorCode.UNKNOWN_MEMBER_ID
