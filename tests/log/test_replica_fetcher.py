"""The replica fetcher: its decision logic as pure functions (no I/O), then the actor itself
against a scripted leader (tests/log/leader_stub.py) and an in-memory stand-in for the log
actor, both real: TCP to the leader, ZeroMQ to the log actor."""
from __future__ import annotations

import threading
import time

import pytest

from odradek.actors.client import MailboxClient
from odradek.actors.runtime import Actor
from odradek.actors.names import placement
from odradek.core import records as fmt
from odradek.log import replica_fetcher as rf
from odradek.core.protocol import ApiKey, ErrorCode
from odradek.actors.messages import (Done, Follow, FollowerStatePart, FollowerStates, FollowPart, Fsynced, FsyncedEnd,
                                     Ping, ReplicaEnd, ReplicaEnds, Stats, Stop, TruncatePart, Unfollow)
from tests.log.leader_stub import LeaderStub


def batch(base: int, n: int = 2, epoch: int = 0) -> bytes:
    return fmt.encode_batch([(None, b"v%d" % (base + i)) for i in range(n)], base_offset=base,
                            partition_leader_epoch=epoch)


def data(records=b"", code=0, hw=-1, lso=-1, message="") -> rf.PartitionData:
    return rf.PartitionData(int(code), message, hw, lso, memoryview(records))


# ---- request building --------------------------------------------------------------------------
def test_fetch_body_carries_the_replica_id_its_broker_epoch_the_replica_settings_and_each_partitions_epoch():
    config = {"replica.fetch.wait.max.ms": 250, "replica.fetch.min.bytes": 7, "replica.fetch.max.bytes": 4096,
              "replica.fetch.response.max.bytes": 65536}
    body = rf.fetch_body(3, config, [("a", 0, 10, 5, 10), ("b", 2, 0, 1, 0), ("a", 1, 4, 5, 3)], broker_epoch=77)
    assert body == {"replica_id": 3, "broker_epoch": 77, "max_wait_ms": 250, "min_bytes": 7, "max_bytes": 65536, "topics": [
        {"name": "a", "partitions": [
            {"index": 0, "fetch_offset": 10, "partition_max_bytes": 4096, "current_leader_epoch": 5,
             "fsynced_offset": 10},
            {"index": 1, "fetch_offset": 4, "partition_max_bytes": 4096, "current_leader_epoch": 5,
             "fsynced_offset": 3}]},
        {"name": "b", "partitions": [
            {"index": 2, "fetch_offset": 0, "partition_max_bytes": 4096, "current_leader_epoch": 1,
             "fsynced_offset": 0}]}]}


def test_fetch_body_falls_back_to_kafkas_defaults():
    body = rf.fetch_body(1, {}, [("a", 0, 0, 0, 0)])
    assert (body["max_wait_ms"], body["min_bytes"], body["max_bytes"]) == (500, 1, 10485760)
    assert body["topics"][0]["partitions"][0]["partition_max_bytes"] == 1048576


def test_epoch_request_and_answer():
    body = rf.epoch_body(2, [("a", 0, 7, 6), ("a", 1, 7, 3)])
    assert body == {"replica_id": 2, "topics": [{"name": "a", "partitions": [
        {"index": 0, "current_leader_epoch": 7, "leader_epoch": 6},
        {"index": 1, "current_leader_epoch": 7, "leader_epoch": 3}]}]}
    answers = rf.epoch_answers({"topics": [{"name": "a", "partitions": [
        {"index": 0, "error_code": 0, "leader_epoch": 6, "end_offset": 120},
        {"index": 1, "error_code": 74, "leader_epoch": -1, "end_offset": -1}]}]})
    assert answers == {("a", 0): (0, 6, 120), ("a", 1): (74, -1, -1)}


def test_truncation_decisions():
    # an empty epoch cache: no question to the leader, the log actor decides (-1, -1)
    assert rf.truncate_entry("a", 0, -1, None) == ("truncate", TruncatePart("a", 0, -1, -1))
    # the leader's answer is passed on as is: the log actor takes min(end, its own end of that epoch)
    assert rf.truncate_entry("a", 0, 6, (0, 5, 90)) == ("truncate", TruncatePart("a", 0, 5, 90))
    # the leader knows no epoch <= ours (UNDEFINED): still passed on, the log actor falls back
    assert rf.truncate_entry("a", 0, 6, (0, -1, -1)) == ("truncate", TruncatePart("a", 0, -1, -1))
    assert rf.truncate_entry("a", 0, 6, (74, -1, -1)) == ("error", 74)
    assert rf.truncate_entry("a", 0, 6, None)[0] == "error"  # the leader left it out


def test_group_by_host_uses_the_brokers_placement():
    items = [("t", p, "x") for p in range(6)]
    groups = rf.group_by_host(items, 3)
    assert sorted(sum(groups.values(), [])) == sorted(items)
    for host, group in groups.items():
        assert all(host == f"log-{placement(t, p, 3)}" for t, p, _ in group)


# ---- reading a fetch answer ----------------------------------------------------------------------
def test_payload_slices_within_one_frame_without_copying_and_across_frames_by_joining():
    a, b = bytearray(b"0123456789"), b"abcdef"
    payload = rf.Payload([a, b])
    view = payload.slice(2, 6)
    assert bytes(view) == b"2345" and view.obj is a  # zero copy
    assert bytes(payload.slice(8, 12)) == b"89ab"
    assert bytes(payload.slice(14, 99)) == b"ef" and bytes(payload.slice(16, 20)) == b""


def test_split_fetch_answer_cuts_each_partitions_records_in_order():
    b0, b1, b2 = batch(0), batch(2, 3), batch(7)
    body = {"error_code": 0, "topics": [
        {"name": "a", "partitions": [
            {"index": 0, "error_code": 0, "high_watermark": 5, "log_start_offset": 0, "records_size": len(b0 + b1)},
            {"index": 1, "error_code": 6, "error_message": "not here", "high_watermark": -1,
             "log_start_offset": -1, "records_size": 0}]},
        {"name": "b", "partitions": [
            {"index": 0, "error_code": 0, "high_watermark": 9, "log_start_offset": 3, "records_size": len(b2)}]}]}
    # regions as the processor sends them: one per segment slice, here cut mid-batch
    whole = b0 + b1 + b2
    out = rf.split_fetch_answer(body, [whole[:30], whole[30:len(b0 + b1)], whole[len(b0 + b1):]])
    assert bytes(out[("a", 0)].records) == b0 + b1 and out[("a", 0)].high_watermark == 5
    assert out[("a", 1)] == rf.PartitionData(6, "not here", -1, -1, out[("a", 1)].records)
    assert bytes(out[("b", 0)].records) == b2 and out[("b", 0)].log_start_offset == 3


def test_whole_batches_stop_at_a_torn_or_padded_tail_and_report_a_bad_header():
    b0, b1 = batch(0), batch(2, 3)
    assert rf.whole_batches(b0 + b1) == rf.Batches(len(b0 + b1), 2, 5, None)
    assert rf.whole_batches(b0 + b1[:-1]) == rf.Batches(len(b0), 1, 2, "partial batch")
    assert rf.whole_batches(b0 + b1[:20]) == rf.Batches(len(b0), 1, 2, "partial header")
    assert rf.whole_batches(b0 + bytes(100)) == rf.Batches(len(b0), 1, 2, "zero padding")
    bad = bytearray(b1)
    bad[fmt.OFFSET_MAGIC] = 3  # no format of ours (2 is Kafka's, valid here)
    found = rf.whole_batches(b0 + bytes(bad))
    assert found[:3] == (len(b0), 1, 2) and found.problem.startswith("corrupt") and "magic" in found.problem


# ---- what each answer means ----------------------------------------------------------------------
def test_data_is_appended_as_whole_batches_only():
    b0, b1 = batch(10), batch(12)
    action = rf.decide(10, 5, 0, data(b0 + b1[:-3], hw=14, lso=0))
    assert action.kind == rf.APPEND and bytes(action.records) == b0 and action.batches == 1


def test_no_data_sends_watermarks_only_when_the_leaders_moved():
    assert rf.decide(10, 8, 0, data(hw=8, lso=0)).kind == rf.NOTHING
    assert rf.decide(10, 8, 0, data(hw=10, lso=0)).kind == rf.WATERMARKS
    assert rf.decide(10, 10, 0, data(hw=10, lso=4)).kind == rf.WATERMARKS  # log start moved (delete records)
    assert rf.decide(10, -1, -1, data(hw=10, lso=0)).kind == rf.WATERMARKS  # first answer after truncation


@pytest.mark.parametrize("code, kind", [
    (ErrorCode.FENCED_LEADER_EPOCH, rf.STOP),
    (ErrorCode.UNKNOWN_LEADER_EPOCH, rf.BACKOFF),  # the leader has not heard of its election yet
    (ErrorCode.NOT_LEADER_OR_FOLLOWER, rf.BACKOFF),  # likewise, or leadership moved: the controller tells us
    (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, rf.BACKOFF),
    (ErrorCode.KAFKA_STORAGE_ERROR, rf.BACKOFF),
    (ErrorCode.CORRUPT_MESSAGE, rf.CORRUPT),
])
def test_partition_errors(code, kind):
    action = rf.decide(10, 8, 0, data(code=code, message="because"))
    assert action.kind == kind and code.name in action.why and "because" in action.why


def test_out_of_range_below_the_leaders_log_start_starts_empty_there_else_truncates_again():
    below = rf.decide(3, 8, 0, data(code=ErrorCode.OFFSET_OUT_OF_RANGE, hw=50, lso=20))
    assert below.kind == rf.TRUNCATE_FULLY and below.offset == 20
    above = rf.decide(60, 8, 0, data(code=ErrorCode.OFFSET_OUT_OF_RANGE, hw=50, lso=20))
    assert above.kind == rf.RETRUNCATE
    unknown_start = rf.decide(3, 8, 0, data(code=ErrorCode.OFFSET_OUT_OF_RANGE))
    assert unknown_start.kind == rf.RETRUNCATE


def test_bytes_without_a_single_whole_batch_are_corrupt_and_refetched():
    b0 = bytearray(batch(10))
    b0[fmt.OFFSET_MAGIC] = 9
    action = rf.decide(10, 8, 0, data(bytes(b0), hw=12))
    assert action.kind == rf.CORRUPT and "magic" in action.why
    assert rf.decide(10, 8, 0, data(bytes(40), hw=12)).kind == rf.CORRUPT  # all zeros (a torn region)


# ---- the actor, against a scripted leader and a stand-in log actor --------------------------------

CONFIG = {"replica.fetch.wait.max.ms": 20, "replica.fetch.min.bytes": 1, "replica.fetch.max.bytes": 4096,
          "replica.fetch.response.max.bytes": 65536, "replica.fetch.backoff.ms": 50}


class FollowerLog:
    """One partition as a follower's log actor keeps it: batches as the leader sent them."""

    def __init__(self, epoch: int, batches=()):
        self.epoch = epoch  # the leader epoch this follower was told (become)
        self.batches = list(batches)  # bytes, offsets as in their headers
        self.start = self.batches and fmt.BatchHeader.read(self.batches[0]).base_offset or 0
        self.hw = 0
        self.unsynced = 0  # records at the end not fsynced yet, as this log actor answers

    @property
    def end(self) -> int:
        return fmt.BatchHeader.read(self.batches[-1]).next_offset if self.batches else self.start

    def epochs(self) -> list:  # [(epoch, start offset)]
        out = []
        for b in self.batches:
            h = fmt.BatchHeader.read(b)
            if not out or out[-1][0] != h.partition_leader_epoch:
                out.append((h.partition_leader_epoch, h.base_offset))
        return out

    def end_for_epoch(self, wanted: int) -> tuple[int, int]:
        starts = self.epochs()
        found = [i for i, (e, _) in enumerate(starts) if e <= wanted]
        if not found:
            return -1, -1
        i = found[-1]
        return starts[i][0], starts[i + 1][1] if i + 1 < len(starts) else self.end

    def truncate_to(self, offset: int) -> None:
        self.batches = [b for b in self.batches if fmt.BatchHeader.read(b).base_offset < offset]
        self.hw = min(self.hw, self.end)


class StandInLog(Actor):
    """``log-0`` with the follower side of the log actor's contract, in memory. The test
    reads ``logs`` and ``seen`` (message types in order) under ``lock``."""

    def on_start(self):
        self.logs: dict = self.args["logs"]
        self.lock: threading.Lock = self.args["lock"]
        self.seen: list = self.args["seen"]

    def _each(self, msg, fn):
        out = []
        with self.lock:
            self.seen.append(msg.type)
            for topic, partition, *args in msg.fields.parts:
                p = self.logs.get((topic, partition))
                if p is None:
                    out.append(ReplicaEnd(topic, partition, int(ErrorCode.NOT_LEADER_OR_FOLLOWER), -1, -1))
                    continue
                code = fn(p, *args) or 0
                out.append(ReplicaEnd(topic, partition, int(code), p.end if not code else -1,
                                      p.end - p.unsynced if not code else -1))
        self.reply(msg, ReplicaEnds(out))

    def on_follower_state(self, msg):
        with self.lock:
            self.seen.append(msg.type)
            out = []
            for t, q in msg.fields.parts:
                p = self.logs[(t, q)]
                out.append(FollowerStatePart(t, q, 0, p.epochs()[-1][0] if p.batches else -1, p.end))
        self.reply(msg, FollowerStates(out))

    def on_truncate(self, msg):
        def truncate(p, epoch, end):
            if epoch < 0 or end < 0:
                target = p.hw
            else:
                own_epoch, own_end = p.end_for_epoch(epoch)
                target = end if own_epoch < 0 else min(end, own_end)
            if target < p.end:
                p.truncate_to(target)
        self._each(msg, truncate)

    def on_truncate_fully(self, msg):
        def truncate(p, offset):
            p.batches, p.start, p.hw = [], offset, offset
        self._each(msg, truncate)

    def on_replicate(self, msg):
        def replicate(p, frame, epoch, hw, log_start):
            if epoch != p.epoch:
                return ErrorCode.FENCED_LEADER_EPOCH if epoch < p.epoch else ErrorCode.UNKNOWN_LEADER_EPOCH
            if frame >= 0:
                buf = bytes(msg.frames[frame])
                for pos, h in fmt.iter_batches(buf):
                    if h.base_offset != p.end:
                        return ErrorCode.INVALID_RECORD
                    fmt.validate_batch(buf[pos:pos + h.size])
                    p.batches.append(buf[pos:pos + h.size])
            p.hw = min(hw, p.end)
        self._each(msg, replicate)


class Cluster:
    """A replica fetcher (broker 2) and a stand-in log-0, on threads of this process, following
    partitions led by a LeaderStub (broker 1)."""

    def __init__(self, run_dir, leader: LeaderStub, logs: dict, config: dict | None = None):
        self.leader, self.logs, self.lock, self.seen = leader, logs, threading.Lock(), []
        self.brokers = {"1": ["127.0.0.1", leader.port], "2": ["127.0.0.1", 1]}
        self.log_actor = StandInLog("log-0", run_dir, {"logs": logs, "lock": self.lock, "seen": self.seen})
        self.fetcher = rf.ReplicaFetcher("replica_fetcher", run_dir, {"config": config or CONFIG, "broker_id": 2,
                                                                      "log_hosts": 1, "data_dir": run_dir})
        self.threads = [threading.Thread(target=a.run) for a in (self.log_actor, self.fetcher)]
        for t in self.threads:
            t.start()
        self.client = MailboxClient(run_dir)
        self.client.request("log-0", Ping())
        self.client.request("replica_fetcher", Ping())

    def follow(self, parts, leader=1):
        return self.client.request("replica_fetcher", Follow([FollowPart(t, p, leader, e) for t, p, e in parts],
                                                             self.brokers)).fields

    def stats(self):
        return self.client.request("replica_fetcher", Stats()).fields.stats

    def wait_for(self, pred, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if pred():
                    return True
            time.sleep(0.01)
        with self.lock:
            return pred()

    def stop(self):
        for name in ("replica_fetcher", "log-0"):
            try:
                self.client.request(name, Stop(), timeout=5)
            except Exception:
                pass
        for t in self.threads:
            t.join(10)
        self.client.close()
        self.leader.close()


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(leader, logs, config=None):
        c = Cluster(str(tmp_path), leader, logs, config)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("replica-fetcher-")]


def offsets(p: FollowerLog) -> list:
    return [(h.base_offset, h.partition_leader_epoch) for h in map(fmt.BatchHeader.read, p.batches)]


def leader_offsets(leader: LeaderStub, tp) -> list:
    with leader.lock:
        return [(base, fmt.BatchHeader.read(d).partition_leader_epoch) for base, d in leader.logs[tp]]


def test_an_empty_follower_copies_the_leader_keeping_offsets_and_epochs_and_follows_its_high_watermark(cluster):
    leader = LeaderStub({"t": 2}, epoch=4)
    for _ in range(3):
        leader.append("t", 0, 3)
    leader.append("t", 1, 1)
    logs = {("t", 0): FollowerLog(4), ("t", 1): FollowerLog(4)}
    c = cluster(leader, logs)
    assert c.follow([("t", 0, 4), ("t", 1, 4)]) == Done()
    assert c.wait_for(lambda: logs[("t", 0)].end == 9 and logs[("t", 1)].end == 1)
    assert offsets(logs[("t", 0)]) == leader_offsets(leader, ("t", 0)) == [(0, 4), (3, 4), (6, 4)]
    # an empty epoch cache: no question to the leader, truncate (-1, -1), then fetch
    assert c.seen[:3] == ["follower_state", "truncate", "replicate"]
    assert all(api != 23 for api, _ in leader.requests)
    # more at the leader follows; the high watermark follows the leader's
    leader.append("t", 1, 2)
    assert c.wait_for(lambda: logs[("t", 1)].end == 3 and logs[("t", 1)].hw == 3)
    assert c.wait_for(lambda: logs[("t", 0)].hw == 9)
    with leader.lock:
        fetches = list(leader.fetches)
    assert {(rid, epoch) for *_, epoch, rid in fetches} == {(2, 4)}
    # every fetch offset was the follower's log end when sent: never ahead of what was appended
    assert all(off in (0, 1, 3) for t, p, off, *_ in fetches if p == 1)
    stats = c.stats()
    assert stats["partitions"] == 2 and stats["partition_states"] == {"fetching": 2}
    assert stats["replicated_batches"] == 5 and stats["replicated_bytes"] > 0
    assert stats["leaders"]["1"]["partitions"] == 2 and stats["leaders"]["1"]["connected"]


def test_a_diverged_follower_truncates_to_where_the_leader_says_its_epoch_ended(cluster):
    leader = LeaderStub({"t": 1}, epoch=0)
    leader.append("t", 0, 2)  # epoch 0: offsets 0-1
    leader.append("t", 0, 2)  # epoch 0: offsets 2-3
    leader.set_epoch("t", 0, 2)
    leader.append("t", 0, 3)  # epoch 2: offsets 4-6
    # the follower also got 0-3 at epoch 0, then led epoch 1 itself and wrote 4-7 nobody else has
    mine = [batch(0, 2, 0), batch(2, 2, 0), batch(4, 2, 1), batch(6, 2, 1)]
    logs = {("t", 0): FollowerLog(2, mine)}
    logs[("t", 0)].hw = 4
    c = cluster(leader, logs)
    c.follow([("t", 0, 2)])
    assert c.wait_for(lambda: logs[("t", 0)].end == 7)
    assert offsets(logs[("t", 0)]) == leader_offsets(leader, ("t", 0)) == [(0, 0), (2, 0), (4, 2)]
    (api, body), = [(a, b) for a, b in leader.requests if a == 23]
    assert body == {"replica_id": 2, "topics": [{"name": "t", "partitions": [
        {"index": 0, "current_leader_epoch": 2, "leader_epoch": 1}]}]}
    assert c.seen[:3] == ["follower_state", "truncate", "replicate"]


def test_a_fenced_partition_stops_until_the_next_follow_and_other_errors_back_off(cluster):
    leader = LeaderStub({"t": 2}, epoch=5)
    leader.append("t", 0, 2)
    leader.append("t", 1, 2)
    logs = {("t", 0): FollowerLog(4), ("t", 1): FollowerLog(5)}
    leader.fail_next("t", 1, ErrorCode.NOT_LEADER_OR_FOLLOWER)  # a leader not yet told: retried
    c = cluster(leader, logs)
    c.follow([("t", 0, 4), ("t", 1, 5)])  # we were told epoch 4 for t-0: the leader is at 5
    assert c.wait_for(lambda: logs[("t", 1)].end == 2)
    assert c.wait_for(lambda: c.stats()["partition_states"] == {"stopped": 1, "fetching": 1})
    assert logs[("t", 0)].end == 0
    with leader.lock:
        asked = len([f for f in leader.fetches if f[:2] == ("t", 0)])
    time.sleep(0.3)
    with leader.lock:
        assert len([f for f in leader.fetches if f[:2] == ("t", 0)]) == asked  # stopped: not asked again
    with c.lock:
        logs[("t", 0)].epoch = 5  # the controller's become, then its follow
    c.follow([("t", 0, 5)])
    assert c.wait_for(lambda: logs[("t", 0)].end == 2)


def test_out_of_range_below_the_leaders_log_start_starts_the_follower_empty_there(cluster):
    leader = LeaderStub({"t": 1}, epoch=1)
    for _ in range(4):
        leader.append("t", 0, 2)
    leader.delete_before("t", 0, 4)
    logs = {("t", 0): FollowerLog(1, [batch(0, 2, 1)])}
    logs[("t", 0)].hw = 2
    c = cluster(leader, logs)
    c.follow([("t", 0, 1)])
    assert c.wait_for(lambda: logs[("t", 0)].end == 8)
    assert offsets(logs[("t", 0)]) == [(4, 1), (6, 1)] and logs[("t", 0)].start == 4
    assert "truncate_fully" in c.seen


def test_a_dead_leader_backs_off_and_the_fetcher_stops_promptly(cluster):
    leader = LeaderStub({"t": 1}, epoch=0)
    leader.append("t", 0, 1)
    logs = {("t", 0): FollowerLog(0)}
    c = cluster(leader, logs)
    c.follow([("t", 0, 0)])
    assert c.wait_for(lambda: logs[("t", 0)].end == 1)
    leader.close()  # the leader dies: connection refused from now on
    assert c.wait_for(lambda: c.stats()["leaders"]["1"]["errors"] > 0, timeout=10)
    assert c.stats()["leaders"]["1"]["connected"] is False
    c.client.request("replica_fetcher", Unfollow([["t", 0]]))
    assert c.wait_for(lambda: c.stats()["leaders"] == {} and c.stats()["partitions"] == 0)
    started = time.monotonic()
    c.stop()
    assert time.monotonic() - started < 5


def test_a_new_leader_takes_over_and_the_old_session_goes(cluster):
    old = LeaderStub({"t": 1}, epoch=0)
    old.append("t", 0, 2)
    logs = {("t", 0): FollowerLog(0)}
    c = cluster(old, logs)
    c.follow([("t", 0, 0)])
    assert c.wait_for(lambda: logs[("t", 0)].end == 2)
    new = LeaderStub({"t": 1}, epoch=0)  # broker 3: had offsets 0-1 too, then was elected at epoch 1
    try:
        new.append("t", 0, 2)
        new.set_epoch("t", 0, 1)
        new.append("t", 0, 3)
        c.brokers["3"] = ["127.0.0.1", new.port]
        with c.lock:
            logs[("t", 0)].epoch = 1
        c.follow([("t", 0, 1)], leader=3)
        assert c.wait_for(lambda: logs[("t", 0)].end == 5)
        assert offsets(logs[("t", 0)]) == [(0, 0), (2, 1)]
        assert c.wait_for(lambda: list(c.stats()["leaders"]) == ["3"])
        (api, body), = [(a, b) for a, b in new.requests if a == 23]
        assert body["topics"][0]["partitions"] == [{"index": 0, "current_leader_epoch": 1, "leader_epoch": 0}]
    finally:
        c.stop()
        new.close()


def test_a_leader_that_keeps_refusing_truncation_is_asked_less_and_less_often_and_a_new_epoch_asks_at_once(cluster):
    """A deposed leader answers NOT_LEADER_OR_FOLLOWER until the controller's word reaches the
    follower; the chaos runs saw followers ask it 5 times a second for a minute. Each refusal in
    a row doubles the wait (backoff 50 ms here, at most 8 backoffs): about 6 questions in 1.5 s,
    where a fixed backoff asked ~30. A new leader epoch asks again at once."""
    leader = LeaderStub({"t": 1}, epoch=3)
    leader.append("t", 0, 2)
    leader.refuse_epochs[("t", 0)] = ErrorCode.NOT_LEADER_OR_FOLLOWER
    logs = {("t", 0): FollowerLog(3, [batch(0, 2, 3)])}

    def asked() -> int:
        with leader.lock:
            return sum(1 for api, _ in leader.requests if api == ApiKey.OFFSET_FOR_LEADER_EPOCH)
    c = cluster(leader, logs)
    c.follow([("t", 0, 3)])
    assert c.wait_for(lambda: asked() >= 1)
    time.sleep(1.5)
    assert 2 <= asked() <= 8, asked()

    with leader.lock:
        del leader.refuse_epochs[("t", 0)]
        leader.epoch[("t", 0)] = 4
    with c.lock:
        logs[("t", 0)].epoch = 4
    before = asked()
    c.follow([("t", 0, 4)])
    assert c.wait_for(lambda: asked() > before, timeout=1.0)  # at once, not after the grown wait
    leader.append("t", 0, 2)
    assert c.wait_for(lambda: logs[("t", 0)].end == 4)


def test_each_fetch_tells_the_leader_how_much_of_its_log_end_the_follower_has_fsynced(cluster):
    """The leader counts a follower towards the high watermark only up to what it has on its
    disk (log.flush.before.ack): the log actor's answer says it (``fsynced_offset``), and the
    next FETCH carries it beside ``fetch_offset``, per partition."""
    leader = LeaderStub({"t": 1}, epoch=1)
    leader.append("t", 0, 4)
    follower = FollowerLog(1)
    follower.unsynced = 1  # this log actor answers with its last record not yet on the disk
    c = cluster(leader, {("t", 0): follower})
    c.follow([("t", 0, 1)])
    assert c.wait_for(lambda: follower.end == 4)
    leader.append("t", 0, 3)
    assert c.wait_for(lambda: follower.end == 7)
    assert c.wait_for(lambda: any(off == 7 for _, _, off, _ in list(leader.fsynced)))
    with leader.lock:
        said = [(off, synced) for _, _, off, synced in leader.fsynced]
    assert (4, 3) in said and (7, 6) in said, said
    assert all(synced is not None and synced <= off for off, synced in said), said


def test_a_group_commit_that_ends_while_the_fetch_waits_at_the_leader_is_reported_at_once(cluster):
    """The log actor answers ``replicate`` before its fsync, so the next FETCH goes out with
    the fsynced offset behind its fetch offset and, with no new data, waits at the leader up
    to its max wait (400 ms here: this stub serves its connections on one thread, and the
    report's connection must be set up within the fetcher's 1 s). When the fsync ends (``fsynced`` from the log actor), a
    progress report (a FETCH with ``progress_only``, on a second connection) tells the leader
    at once: the high watermark does not wait for new data or that max wait."""
    leader = LeaderStub({"t": 1}, epoch=1)
    leader.park_ms = 400
    leader.append("t", 0, 4)
    follower = FollowerLog(1)
    follower.unsynced = 4  # the log actor answers before its fsync: nothing on the disk yet
    c = cluster(leader, {("t", 0): follower}, {**CONFIG, "replica.fetch.wait.max.ms": 400})
    c.follow([("t", 0, 1)])
    assert c.wait_for(lambda: (("t", 0, 4, 0) in leader.fsynced))  # the next FETCH, parked at the leader
    assert not leader.reports
    with c.lock:
        follower.unsynced = 0
    c.client.send("replica_fetcher", Fsynced([FsyncedEnd("t", 0, 4)]))
    assert c.wait_for(lambda: leader.reports == [("t", 0, 4, 4)], timeout=5), leader.reports
    assert c.stats()["progress_reports"] == 1
    c.client.send("replica_fetcher", Fsynced([FsyncedEnd("t", 0, 4)]))  # nothing new: no report
    c.client.send("replica_fetcher", Fsynced([FsyncedEnd("t", 0, 9)]))  # past the log end: capped
    time.sleep(0.2)
    assert leader.reports == [("t", 0, 4, 4)]
