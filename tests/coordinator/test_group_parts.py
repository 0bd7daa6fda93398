"""The group coordinator's parts, each alone: the table, the leadership, the writer, the
purgatory and the APIs, driven through a recording ``Outbox`` and a fake ``Clock``; no broker,
no sockets. The whole actor is exercised by tests/coordinator/test_group_coordinator.py,
test_coordinator_ownership.py (its messages, in process) and the Kafka clients' suites."""
from __future__ import annotations

from odradek.actors.message import Message
from odradek.actors.messages import GroupRequest, OffsetsStored, Produce, Response, TxnOffsetsEnd
from odradek.coordinator.classic_group import ClassicConfig
from odradek.coordinator.group import GroupConfig
from odradek.coordinator.group_api_consumer import ConsumerApi
from odradek.coordinator.group_api_offsets import OffsetsApi
from odradek.coordinator.group_coordinator import GroupCoordinator
from odradek.coordinator.group_leadership import Leadership
from odradek.coordinator.group_purgatory import Purgatory
from odradek.coordinator.group_table import Clock, GroupTable, TopicView
from odradek.coordinator.group_writes import GroupWriter
from odradek.coordinator.offsets import Committed, OffsetsView, group_record, offset_record, partition_for
from odradek.core.protocol import OFFSETS_TOPIC, ApiKey, ErrorCode
from odradek import config as cfg
from tests.coordinator.outbox_recorder import Recorder


class Times:
    def __init__(self):
        self.mono, self.wall_ms = 0.0, 1_000_000

    def clock(self) -> Clock:
        return Clock(now=lambda: self.mono, wall=lambda: self.wall_ms)


def stored(partition: int = 0) -> Message:
    return Message("_reply", 1, None, Response({"topics": [{"partitions": [{"error_code": 0}]}]}))


def parts(times: Times, partitions: int = 1, led=(0,)):
    """The objects wired as the actor wires them, leading ``led`` of ``partitions``."""
    rec = Recorder()
    clock = times.clock()
    table = GroupTable(GroupConfig(session_timeout_ms=10_000), ClassicConfig())
    meta = TopicView(1)
    dropped = []

    def drop(partition, mine, why):
        dropped.append((partition, why))
        return table.drop(mine)
    leadership = Leadership(meta, "/nonexistent", 1, rec.outbox, lambda view, skip: table.install(
        view, clock.now(), clock.wall(), skip), drop)
    refreshed = []
    writer = GroupWriter(leadership, table, meta, rec.outbox, lambda: refreshed.append(True))
    purgatory = Purgatory(table, writer, meta, rec.outbox, clock)
    leadership.partitions = partitions
    leadership.leaders = [(1 if p in led else 2, 0) for p in range(partitions)]
    leadership.owned = {p: p + 1 for p in led}
    meta.topics = {"t": 2}
    return rec, table, meta, leadership, writer, purgatory, dropped, refreshed


def group_in(partition: int, partitions: int) -> str:
    return next(f"g{i}" for i in range(1000) if partition_for(f"g{i}", partitions) == partition)


# ---- the table ---------------------------------------------------------------------------------
def test_the_table_takes_a_replayed_partition_and_an_unreadable_group_starts_empty_with_its_offsets():
    view = OffsetsView()
    for offset, (key, value) in enumerate([offset_record("g", "t", 0, Committed(5)),
                                           group_record("g", {"group_epoch": "not a number"}, 12),
                                           offset_record("h", "t", 1, Committed(6))]):
        view.apply(key, value, offset)
    table = GroupTable(GroupConfig(), ClassicConfig())
    skipped = []
    table.install(view, 0.0, 777, lambda offset, why: skipped.append(offset))
    assert skipped == [1] and table.groups == {} and set(table.offsets) == {"g", "h"}
    assert table.empty_since == {"g": 777, "h": 777}  # empty since the load: retention counts from there
    assert table.drop(lambda gid: gid == "g") == ["g"] and table.known() == ["h"]


# ---- the leadership ----------------------------------------------------------------------------
def test_a_group_of_a_partition_being_loaded_or_led_elsewhere_is_refused_with_the_reason():
    times = Times()
    _rec, _table, _meta, leadership, *_ = parts(times, partitions=3, led=(0,))
    leadership.loading[1] = object()
    assert leadership.coordinator_error(group_in(0, 3)) is None
    assert leadership.coordinator_error(group_in(1, 3)).code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    elsewhere = leadership.coordinator_error(group_in(2, 3))
    assert elsewhere.code == ErrorCode.NOT_COORDINATOR and "led by broker 2" in elsewhere.message
    assert leadership.leader_of(group_in(2, 3)) == (2, 2)


def test_a_partition_led_elsewhere_now_is_unloaded_with_its_groups():
    times = Times()
    rec, table, meta, leadership, _writer, _purgatory, dropped, _ = parts(times, partitions=2, led=(0, 1))
    mine, other = group_in(0, 2), group_in(1, 2)
    table.offsets = {mine: {("t", 0): Committed(1)}, other: {("t", 0): Committed(2)}}
    snapshot = {"version": 5, "topics": {OFFSETS_TOPIC: {"partitions": 2, "state": [
        {"leader": 1, "leader_epoch": 0}, {"leader": 3, "leader_epoch": 4}]}}}
    meta.adopt(snapshot)
    leadership.follow(snapshot, starting=False)
    assert dropped == [(1, "broker 3 leads it now (leader epoch 4)")] and list(table.offsets) == [mine]
    assert leadership.owned == {0: 1} and rec.requests == []


# ---- the writer --------------------------------------------------------------------------------
def test_a_write_answered_after_the_partition_moved_fails_not_coordinator_and_a_lost_leader_asks_again():
    times = Times()
    rec, _table, _meta, leadership, writer, _p, _d, refreshed = parts(times)
    outcomes = []
    writer.append("g", [offset_record("g", "t", 0, Committed(1))], lambda code, why: outcomes.append(code))
    writer.append("g", [offset_record("g", "t", 0, Committed(2))], lambda code, why: outcomes.append(code))
    (to, _type, body, first), (_, _, _, second) = rec.requests
    assert (to, type(body), body.acks) == ("log-0", Produce, -1)
    second(Message("_reply", 2, None, Response({"topics": [{"partitions": [
        {"error_code": int(ErrorCode.NOT_LEADER_OR_FOLLOWER)}]}]})))
    assert outcomes == [ErrorCode.NOT_LEADER_OR_FOLLOWER] and refreshed == [True]
    leadership.owned[0] = 99  # unloaded and loaded again meanwhile: the first write's state is gone
    first(stored())
    assert outcomes[1] == ErrorCode.NOT_COORDINATOR
    leadership.partitions = 0
    writer.append("g", [], lambda code, why: outcomes.append(code))
    assert outcomes[2] == ErrorCode.COORDINATOR_NOT_AVAILABLE


# ---- the purgatory and the KIP-848 API -----------------------------------------------------------
def heartbeat(gid: str, member_id: str = "", epoch: int = 0, owned=None, wait_ms: int = 0) -> Message:
    body = {"group_id": gid, "member_id": member_id, "member_epoch": epoch, "subscribed_topic_names": ["t"],
            "wait_ms": wait_ms}
    if owned is not None:
        body["topic_partitions"] = owned
    return Message(GroupRequest.TYPE, 3, "processor-0", GroupRequest(ApiKey.CONSUMER_GROUP_HEARTBEAT, body))


def joined(times: Times):
    """A ``ConsumerApi`` over fresh parts, and a member that joined group g (not answered yet)."""
    rec, table, meta, _leadership, writer, purgatory, _d, _ = parts(times)
    api = ConsumerApi(table, purgatory, writer, meta, rec.outbox, times.clock())
    join = heartbeat("g")
    api.heartbeat(join, join.fields.body)
    return rec, table, meta, purgatory, api


def test_a_quiet_heartbeat_is_held_until_its_wait_and_a_moved_group_answers_it_not_coordinator():
    times = Times()
    rec, _table, _meta, purgatory, api = joined(times)
    rec.requests[-1][3](stored())  # the group's record
    (_, answer), = rec.replies
    member, epoch = answer.body["member_id"], answer.body["member_epoch"]
    owned = [{"topic": "t", "partitions": sorted(p for e in answer.body["assignment"] for p in e["partitions"])}]
    quiet = heartbeat("g", member, epoch, owned, wait_ms=5000)
    api.heartbeat(quiet, quiet.fields.body)
    assert ("g", member) in purgatory.held and rec.timers[-1].delay == 5.0 and len(rec.replies) == 1
    rec.timers[-1].callback()  # its wait is over: answered with what it has
    assert len(rec.replies) == 2 and rec.replies[1][1].body["error_code"] == 0 and purgatory.held == {}
    again = heartbeat("g", member, epoch, owned, wait_ms=5000)
    api.heartbeat(again, again.fields.body)
    purgatory.drop(lambda gid: gid == "g", "this broker no longer leads it")
    assert rec.errors == [(again, ErrorCode.NOT_COORDINATOR, "group 'g' moved: this broker no longer leads it")]
    assert api.heartbeats == 3


def test_a_member_that_stops_heartbeating_is_removed_by_the_session_timeout_of_the_clock_given():
    times = Times()
    _rec, table, meta, purgatory, _api = joined(times)
    g = table.groups["g"]
    assert g.members and g.next_deadline() == 10_000
    times.mono = 10_001
    assert [why for _m, why in g.expire(times.mono, meta.topics)]
    purgatory.changed(g)
    assert not g.members and table.empty_since == {"g": times.wall_ms}


# ---- the offsets API ---------------------------------------------------------------------------
def offsets_api(times: Times, create_topic=lambda: None):
    rec, table, meta, leadership, writer, *_ = parts(times)
    return rec, table, leadership, OffsetsApi(table, meta, leadership, writer, create_topic, rec.outbox,
                                              times.clock(), 60_000, 4096)


def test_offsets_of_an_empty_group_expire_by_the_wall_clock_given_and_leave_a_tombstone():
    times = Times()
    rec, table, _leadership, api = offsets_api(times)
    table.offsets = {"g": {("t", 0): Committed(5, commit_ms=times.wall_ms)}}
    table.empty_since = {"g": times.wall_ms}
    api.expire()
    assert rec.requests == [] and "g" in table.offsets
    times.wall_ms += 60_000
    api.expire()
    assert table.offsets == {} and table.empty_since == {}
    (to, _type, body, _cb), = rec.requests
    assert (to, type(body)) == ("log-0", Produce)


def test_a_transactions_offsets_before_the_topic_exists_ask_for_it_and_are_retried():
    times, created = Times(), []
    rec, table, leadership, api = offsets_api(times, lambda: created.append(True))
    leadership.partitions = 0
    end = Message(TxnOffsetsEnd.TYPE, 4, "txn_coordinator", TxnOffsetsEnd(7, {"g": [["t", 0, 5, -1, ""]]}, True))
    api.txn_offsets_end(end)
    assert created == [True] and rec.replies[0][1].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    leadership.partitions = 1
    api.txn_offsets_end(end)
    rec.requests[-1][3](stored())
    assert table.offsets["g"][("t", 0)].offset == 5 and rec.replies[-1][1] == OffsetsStored(0, "")
    assert api.commits == 1


# ---- the actor's assembly ----------------------------------------------------------------------
def test_the_actor_hands_every_part_the_same_table_view_and_objects(tmp_path):
    config = cfg.load(None, [f"log.dirs={tmp_path}", "num.log.threads=1", "broker.id=1"])
    c = GroupCoordinator("group_coordinator", str(tmp_path), {"config": config, "data_dir": str(tmp_path)})
    times = Times()
    c.assemble(config, GroupConfig(), ClassicConfig(), Recorder().outbox, times.clock())
    objects = (c.writer, c.purgatory, c.consumer, c.classic, c.offsets, c.admin)
    assert all(o.table is c.table for o in objects) and isinstance(c.table.classic, dict)
    assert all(o.meta is c.meta for o in (c.leadership, c.writer, c.purgatory, c.consumer, c.offsets, c.admin))
    assert c.admin.classic is c.classic and c.purgatory.writer is c.writer and c.writer.leadership is c.leadership
    assert c.consumer.clock is c.purgatory.clock is c.times
