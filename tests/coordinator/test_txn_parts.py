"""The transaction coordinator's parts, each alone: the state log (leadership of
``__transaction_state``, records), the marker writer, the pipelined requests, the timeout
reaper and the producer ids, driven through a recording ``Outbox`` and a fake clock; no
broker, no sockets. The whole actor is exercised end to end by tests/kafka/test_transactions.py,
tests/client/test_txn_*.py and tests/cluster/test_transactions_cluster.py."""
from __future__ import annotations

import pytest

from odradek.actors.message import Message
from odradek.actors.messages import (Bounds, ErrorReply, GetBounds, GetMetadata, PartOutcomes, Produce, Response,
                                     TxnCheck, TxnMarker, TxnRequest, WriteMarkers)
from odradek.coordinator.transaction import TransactionManager, TxnState
from odradek.coordinator.txn_coordinator import TimeoutReaper, TxnCoordinator
from odradek.coordinator.txn_markers import MarkerWriter
from odradek.coordinator.txn_pipeline import PipelinedRequests
from odradek.coordinator.txn_producer_ids import ProducerIds
from odradek.coordinator.txn_state_log import COMPLETE_DEFER, TxnSite, TxnStateLog
from odradek.core.protocol import TXN_STATE_TOPIC, ApiKey, ErrorCode, OdradekError
from tests.coordinator.outbox_recorder import Recorder


class Clock:
    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


def snapshot(version: int, leaders: list[int], epoch: int = 3, **topics) -> dict:
    """A cluster snapshot: ``__transaction_state`` with ``leaders`` (one per partition)."""
    out = {"version": version, "topics": {TXN_STATE_TOPIC: {
        "partitions": len(leaders), "state": [{"leader": b, "leader_epoch": epoch} for b in leaders]}}}
    for name, parts in topics.items():
        out["topics"][name] = {"partitions": len(parts), "state": [{"leader": b, "leader_epoch": 0} for b in parts]}
    return out


def state_log(rec: Recorder, clock: Clock, cluster: bool = True, dropped=None, loaded=None):
    site = TxnSite(1, cluster, "/nonexistent", 1)
    txns = TransactionManager(iter(range(100, 200)).__next__)
    return TxnStateLog(site, rec.outbox, clock, txns, loaded or (lambda ts: None),
                       dropped or (lambda txn_id, why: None))


def owning_id(state: TxnStateLog, partition: int) -> str:
    return next(f"t{i}" for i in range(1000) if state.partition_of(f"t{i}") == partition)


# ---- the state log -----------------------------------------------------------------------------
def test_the_state_log_loads_the_partitions_this_broker_leads_and_refuses_the_ids_of_the_others():
    rec, clock = Recorder(), Clock()
    state = state_log(rec, clock)
    loads = []
    state.adopt(snapshot(1, [1, 2]), load=loads.append)
    assert loads == [0] and state.loading == {0: 3} and state.snapshot_ms == clock.now
    with pytest.raises(OdradekError) as loading:
        state.check_owner(owning_id(state, 0))
    assert loading.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    with pytest.raises(OdradekError) as elsewhere:
        state.check_owner(owning_id(state, 1))
    assert elsewhere.value.code == ErrorCode.NOT_COORDINATOR and "broker 2" in elsewhere.value.message
    state.adopt(snapshot(0, [2, 2]), load=loads.append)  # an older snapshot changes nothing
    assert state.loading == {0: 3}


def test_a_partition_lost_drops_its_ids_and_says_why():
    rec, clock = Recorder(), Clock()
    dropped = []
    state = state_log(rec, clock, dropped=lambda txn_id, why: dropped.append((txn_id, why)))
    state.adopt(snapshot(1, [1]), load=lambda p: None)
    state.owned[0] = state.loading.pop(0)
    t = state.txns.init_producer_id("t1", 60000, clock())
    assert state.current(t)
    state.adopt(snapshot(2, [2]))
    assert state.owned == {} and state.txns.txns == {} and not state.current(t)
    assert dropped == [("t1", f"broker 1 no longer coordinates it ({TXN_STATE_TOPIC}-0 moved); "
                               f"FindCoordinator and retry")]


def test_a_load_is_asked_again_until_the_log_actor_leads_the_partition():
    rec, clock = Recorder(), Clock()
    state = state_log(rec, clock)
    state.adopt(snapshot(1, [1]))
    (to, _type, body, answered), = rec.requests
    assert (to, body) == ("log-0", GetBounds())
    answered(Message("_reply", 1, None, Bounds([], [], "log-0")))  # not leading it yet
    assert len(rec.timers) == 1 and rec.timers[0].delay > 0
    state.adopt(snapshot(2, [2]))  # lost meanwhile: the retry asks nothing
    rec.timers[0].callback()
    assert len(rec.requests) == 1


def test_a_deferred_complete_record_is_replaced_by_the_ids_next_record():
    rec, clock = Recorder(), Clock()
    state = state_log(rec, clock, cluster=False)
    state.partitions, state.owned = 1, {0: 0}
    t = state.txns.init_producer_id("t1", 60000, clock())
    state.defer_complete(t)
    (timer,) = rec.timers
    assert timer.delay == COMPLETE_DEFER
    state.persist(t, lambda: None, lambda exc: None)
    assert timer.cancelled and state.complete_due == {}
    assert [(r[0], type(r[2])) for r in rec.requests] == [("log-0", Produce)]


def test_a_record_refused_by_a_partition_not_led_here_any_more_fails_not_coordinator():
    rec, clock = Recorder(), Clock()
    state = state_log(rec, clock, cluster=False)
    state.partitions, state.owned = 1, {0: 0}
    t = state.txns.init_producer_id("t1", 60000, clock())
    failed = []
    state.persist(t, lambda: None, failed.append)
    state.owned.clear()
    rec.requests[0][3](Message("_reply", 1, None, Response({"topics": [{"partitions": [
        {"error_code": int(ErrorCode.NOT_LEADER_OR_FOLLOWER), "error_message": "moved"}]}]})))
    assert [e.code for e in failed] == [ErrorCode.NOT_COORDINATOR] and rec.timers == []


# ---- the marker writer -------------------------------------------------------------------------
def marker_writer(clock: Clock, cluster: bool = True):
    rec = Recorder()
    state = state_log(rec, clock, cluster)
    state.adopt(snapshot(1, [1], t=[1, 2]), load=lambda p: None)
    state.owned[0] = state.loading.pop(0)
    released = []
    return rec, state, MarkerWriter(state.site, state, rec.outbox, clock, None, released.append), released


def prepared(state: TxnStateLog, clock: Clock, partitions, commit: bool = True):
    t = state.txns.init_producer_id("t1", 60000, clock())
    state.txns.add_partitions("t1", t.producer_id, t.epoch, partitions, clock())
    return state.txns.end_txn("t1", t.producer_id, t.epoch, commit, clock())


def test_markers_go_to_the_local_log_actor_or_the_partitions_leader_and_a_deleted_partition_needs_none():
    clock = Clock()
    rec, state, markers, _released = marker_writer(clock)
    t = prepared(state, clock, [("t", 0), ("t", 1), ("gone", 0)])
    local, remote, nothing, unrouted = markers.route(t, True)
    assert local == {"log-0": [TxnMarker("t", 0, t.producer_id, t.epoch, True, 3)]}
    assert remote == {2: {"markers": [TxnMarker("t", 1, t.producer_id, t.epoch, True, 3)], "offsets": {}}}
    assert nothing == [] and not unrouted  # "gone" is newer than the snapshot: asked again
    assert [type(r[2]) for r in rec.requests] == [GetMetadata]
    clock.now += 5000
    state.adopt({**state.snapshot, "version": 2})
    assert markers.route(t, True)[2] == [("gone", 0)]  # the snapshot is newer than the transaction: deleted


def test_markers_written_complete_the_transaction_answer_its_end_txn_and_release_its_requests():
    clock = Clock()
    rec, state, markers, released = marker_writer(clock, cluster=False)
    t = prepared(state, clock, [("t", 0)])
    end = Message(TxnRequest.TYPE, 7, "processor-0", TxnRequest(ApiKey.END_TXN, {}))
    markers.wait_end("t1", end)
    assert markers.write(t) and markers.in_flight == {"t1"}
    (to, type_, fields, answered), = rec.requests
    assert (to, type_, fields.markers) == ("log-0", WriteMarkers.TYPE,
                                              [TxnMarker("t", 0, t.producer_id, t.epoch, True, 3)])
    answered(Message("_reply", 1, None, PartOutcomes([["t", 0, 0, ""]])))
    assert t.state == TxnState.COMPLETE_COMMIT and markers.in_flight == set() and released == ["t1"]
    assert rec.replies == [(end, Response({"error_code": 0}))] and "t1" in state.complete_due


def test_markers_not_written_are_retried_and_the_end_txn_still_waits():
    clock = Clock()
    rec, state, markers, released = marker_writer(clock, cluster=False)
    t = prepared(state, clock, [("t", 0)])
    markers.wait_end("t1", Message(TxnRequest.TYPE, 7, "processor-0", TxnRequest(ApiKey.END_TXN, {})))
    markers.write(t)
    rec.requests[0][3](Message("_reply", 1, None, PartOutcomes([["t", 0, int(ErrorCode.REQUEST_TIMED_OUT), "slow"]])))
    assert t.state == TxnState.PREPARE_COMMIT and rec.replies == [] and released == ["t1"]
    (retry,) = rec.timers
    retry.callback()
    assert len(rec.requests) == 2 and markers.in_flight == {"t1"}


def test_markers_refused_by_an_error_answer_are_retried_and_the_end_txn_still_waits():
    """An ``_error`` answer to write_markers (the log actor's mailbox full, a timeout) counts as
    not written: the id's requests go on and the markers are retried."""
    clock = Clock()
    rec, state, markers, released = marker_writer(clock, cluster=False)
    t = prepared(state, clock, [("t", 0)])
    markers.wait_end("t1", Message(TxnRequest.TYPE, 7, "processor-0", TxnRequest(ApiKey.END_TXN, {})))
    markers.write(t)
    rec.requests[0][3](Message("_error", 1, None, ErrorReply(int(ErrorCode.REQUEST_TIMED_OUT), "no answer")))
    assert t.state == TxnState.PREPARE_COMMIT and rec.replies == [] and released == ["t1"]
    assert markers.in_flight == set() and len(rec.timers) == 1


def test_an_id_dropped_answers_its_waiting_end_txn_not_coordinator():
    clock = Clock()
    rec, state, markers, _released = marker_writer(clock)
    end = Message(TxnRequest.TYPE, 7, "processor-0", TxnRequest(ApiKey.END_TXN, {}))
    markers.wait_end("t1", end)
    markers.in_flight.add("t1")
    markers.drop("t1", "moved")
    assert markers.in_flight == set() and rec.errors == [(end, ErrorCode.NOT_COORDINATOR,
                                                          "transactional id 't1': moved")]


# ---- the pipelined requests --------------------------------------------------------------------
def request(api, txn_id: str) -> Message:
    return Message(TxnRequest.TYPE, 3, "processor-0", TxnRequest(api, {"transactional_id": txn_id}))


def pipeline(handled: list, in_flight: set, ended: list | None = None):
    rec, clock = Recorder(), Clock()
    state = state_log(rec, clock, cluster=False)
    handle = lambda msg: handled.append((msg.fields.api, msg.fields.body["transactional_id"]))  # noqa: E731
    end = lambda msg, txn_id, pid, epoch, committed: ended.append((txn_id, committed))  # noqa: E731
    return rec, state, PipelinedRequests(state, in_flight, rec.outbox, handle, end)


def test_the_next_transactions_add_partitions_waits_for_the_markers_in_flight_instead_of_being_refused():
    """The EndTxn answer chained to the markers can reach the client before the markers'
    answer reaches the coordinator: the next transaction's AddPartitionsToTxn (or
    AddOffsetsToTxn) for that id is parked until they land, not refused
    CONCURRENT_TRANSACTIONS; other ids' requests go on."""
    handled, in_flight = [], {"t1"}
    _rec, _state, p = pipeline(handled, in_flight)
    parked = [p.park(*msg.fields, msg) for msg in (
        request(ApiKey.ADD_PARTITIONS_TO_TXN, "t1"), request(ApiKey.ADD_PARTITIONS_TO_TXN, "t2"),
        request(ApiKey.ADD_OFFSETS_TO_TXN, "t1"), request(ApiKey.END_TXN, "t2"))]
    assert parked == [True, False, True, False] and len(p.parked["t1"]) == 2
    in_flight.discard("t1")
    p.release("t1")
    assert handled == [(ApiKey.ADD_PARTITIONS_TO_TXN, "t1"), (ApiKey.ADD_OFFSETS_TO_TXN, "t1")] and p.parked == {}


def test_an_end_txn_behind_a_parked_add_partitions_of_its_id_waits_behind_it():
    """The pipelined commit writes EndTxn right behind the transaction's AddPartitionsToTxn on
    one connection: if that one is parked (the previous transaction's markers in flight), the
    EndTxn must not overtake it (it would find the previous transaction complete and commit
    nothing): every later request of the id is parked behind it, and all go in order."""
    handled, in_flight = [], {"t1"}
    _rec, _state, p = pipeline(handled, in_flight)
    for api, txn_id in ((ApiKey.ADD_PARTITIONS_TO_TXN, "t1"), (ApiKey.END_TXN, "t1"), (ApiKey.END_TXN, "t2")):
        msg = request(api, txn_id)
        if not p.park(api, msg.fields.body, msg):
            handled.append((api, txn_id))
    assert handled == [(ApiKey.END_TXN, "t2")] and len(p.parked["t1"]) == 2
    in_flight.discard("t1")
    p.release("t1")
    assert handled == [(ApiKey.END_TXN, "t2"), (ApiKey.ADD_PARTITIONS_TO_TXN, "t1"), (ApiKey.END_TXN, "t1")]


def test_an_end_txn_whose_records_are_not_all_there_fails_concurrent_transactions_and_stays_open():
    handled, ended = [], []
    rec, state, p = pipeline(handled, set(), ended)
    t = state.txns.init_producer_id("t1", 60000, 0)
    state.txns.add_partitions("t1", t.producer_id, t.epoch, [("a", 0), ("b", 0)], 0)
    with pytest.raises(OdradekError) as outside:
        p.checks_for("t1", t.producer_id, t.epoch, [["c", 0, 4]])
    assert outside.value.code == ErrorCode.INVALID_TXN_STATE
    checks = p.checks_for("t1", t.producer_id, t.epoch, [["a", 0, 4], ["b", 0, 9]])
    assert checks == {"log-0": [TxnCheck("a", 0, t.producer_id, t.epoch, 4),
                                TxnCheck("b", 0, t.producer_id, t.epoch, 9)]}
    end = request(ApiKey.END_TXN, "t1")
    p.check_then_end(end, "t1", t.producer_id, t.epoch, checks)
    assert p.park(ApiKey.TXN_OFFSET_COMMIT, {"transactional_id": "t1"}, request(ApiKey.TXN_OFFSET_COMMIT, "t1"))
    rec.requests[0][3](Message("_reply", 1, None, PartOutcomes([["a", 0, 0, ""], ["b", 0, 7, "not there yet"]])))
    assert ended == [] and rec.errors[0][:2] == (end, ErrorCode.CONCURRENT_TRANSACTIONS)
    assert "not there yet" in rec.errors[0][2] and t.state == TxnState.ONGOING
    assert handled == [(ApiKey.TXN_OFFSET_COMMIT, "t1")] and p.checking == {}


def test_an_end_txn_whose_records_are_there_commits():
    handled, ended = [], []
    rec, state, p = pipeline(handled, set(), ended)
    t = state.txns.init_producer_id("t1", 60000, 0)
    state.txns.add_partitions("t1", t.producer_id, t.epoch, [("a", 0)], 0)
    p.check_then_end(request(ApiKey.END_TXN, "t1"), "t1", t.producer_id, t.epoch,
                     p.checks_for("t1", t.producer_id, t.epoch, [["a", 0, 4]]))
    rec.requests[0][3](Message("_reply", 1, None, PartOutcomes([["a", 0, 0, ""]])))
    assert ended == [("t1", True)] and rec.errors == []


# ---- the timeout reaper ------------------------------------------------------------------------
def test_the_reaper_aborts_a_transaction_once_its_timeout_passed_by_the_clock_it_was_given():
    clock = Clock(0)
    txns = TransactionManager(iter(range(100, 200)).__next__)
    t = txns.init_producer_id("t1", 1000, clock())
    txns.add_partitions("t1", t.producer_id, 0, [("a", 0)], clock())
    aborted = []
    reaper = TimeoutReaper(txns, clock, aborted.append)
    clock.now = 1000
    reaper.tick()
    assert aborted == [] and reaper.aborted == 0
    clock.now = 1001
    reaper.tick()
    assert aborted == [t] and reaper.aborted == 1 and t.state == TxnState.PREPARE_ABORT and t.epoch == 1


# ---- the producer ids --------------------------------------------------------------------------
def test_producer_ids_are_distinct_and_counted(tmp_path):
    ids = ProducerIds({}, str(tmp_path), 1, False)
    got = [ids.next() for _ in range(5)]
    assert len(set(got)) == 5 and ids.handed_out == 5
    again = ProducerIds({}, str(tmp_path), 1, False)  # a restart claims a block of its own
    assert again.next() not in got


# ---- the actor's assembly ----------------------------------------------------------------------
def test_the_actor_hands_its_parts_the_same_clock_outbox_and_state():
    c = TxnCoordinator("txn_coordinator", "/nonexistent")
    rec, clock = Recorder(), Clock()
    c.site = TxnSite(1, False, "/nonexistent", 1)
    c.assemble(rec.outbox, clock, ProducerIds.__new__(ProducerIds), None, 900000)
    assert c.markers.state is c.state and c.pipeline.state is c.state and c.reaper.txns is c.state.txns
    assert c.pipeline.in_flight is c.markers.in_flight
    assert c.state.clock is clock and c.markers.clock is clock and c.reaper.clock is clock


def test_write_txn_markers_reads_each_marker_by_name_and_refuses_one_that_is_not_a_marker():
    c = TxnCoordinator("txn_coordinator", "/nonexistent")
    rec, clock = Recorder(), Clock()
    c.site = TxnSite(1, False, "/nonexistent", 1)
    c.assemble(rec.outbox, clock, ProducerIds.__new__(ProducerIds), None, 900000)
    msg = request(ApiKey.WRITE_TXN_MARKERS, "")
    for bad in (["t", 0, 5, 0, False], ["t", 0, 5, 0, 0, 0], ("t", 0, 5, 0, False, 0), "t"):
        with pytest.raises(OdradekError) as refused:
            c.write_txn_markers(msg, {"broker_id": -1, "markers": [bad]})
        assert refused.value.code == ErrorCode.INVALID_REQUEST and "each marker must be" in refused.value.message
    with pytest.raises(OdradekError) as commit:  # an operator may abort only
        c.write_txn_markers(msg, {"broker_id": -1, "markers": [["t", 0, 5, 0, True, 0]]})
    assert commit.value.code == ErrorCode.INVALID_REQUEST and "only write abort markers" in commit.value.message
    c.write_txn_markers(msg, {"broker_id": -1, "producer_id": 5, "markers": [["t", 0, 5, 0, False, 0]]})
    (to, type_, fields, _callback), = rec.requests
    assert (to, type_) == ("log-0", WriteMarkers.TYPE) and fields.markers == [TxnMarker("t", 0, 5, 0, False, 0)]
