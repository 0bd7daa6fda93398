"""The replica fetcher: its decision logic as pure functions (no I/O), then the actor itself
against a scripted leader (tests/log/leader_stub.py) and an in-memory stand-in for the log
actor, both real: TCP to the leader, ZeroMQ to the log actor."""
from __future__ import annotations

import pytest

from coordinator.topics import placement
from log import records as fmt
from log import replica_fetcher as rf
from network.protocol import ErrorCode


def batch(base: int, n: int = 2, epoch: int = 0) -> bytes:
    return fmt.encode_batch([(None, b"v%d" % (base + i)) for i in range(n)], base_offset=base,
                            partition_leader_epoch=epoch)


def data(records=b"", code=0, hw=-1, lso=-1, message="") -> rf.PartitionData:
    return rf.PartitionData(int(code), message, hw, lso, memoryview(records))


# ---- request building --------------------------------------------------------------------------
def test_fetch_body_carries_the_replica_id_the_replica_settings_and_each_partitions_epoch():
    config = {"replica.fetch.wait.max.ms": 250, "replica.fetch.min.bytes": 7, "replica.fetch.max.bytes": 4096,
              "replica.fetch.response.max.bytes": 65536}
    body = rf.fetch_body(3, config, [("a", 0, 10, 5), ("b", 2, 0, 1), ("a", 1, 4, 5)])
    assert body == {"replica_id": 3, "max_wait_ms": 250, "min_bytes": 7, "max_bytes": 65536, "topics": [
        {"name": "a", "partitions": [
            {"index": 0, "fetch_offset": 10, "partition_max_bytes": 4096, "current_leader_epoch": 5},
            {"index": 1, "fetch_offset": 4, "partition_max_bytes": 4096, "current_leader_epoch": 5}]},
        {"name": "b", "partitions": [
            {"index": 2, "fetch_offset": 0, "partition_max_bytes": 4096, "current_leader_epoch": 1}]}]}


def test_fetch_body_falls_back_to_kafkas_defaults():
    body = rf.fetch_body(1, {}, [("a", 0, 0, 0)])
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
    assert rf.truncate_entry("a", 0, -1, None) == ("truncate", ["a", 0, -1, -1])
    # the leader's answer is passed on as is: the log actor takes min(end, its own end of that epoch)
    assert rf.truncate_entry("a", 0, 6, (0, 5, 90)) == ("truncate", ["a", 0, 5, 90])
    # the leader knows no epoch <= ours (UNDEFINED): still passed on, the log actor falls back
    assert rf.truncate_entry("a", 0, 6, (0, -1, -1)) == ("truncate", ["a", 0, -1, -1])
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
    bad[fmt.OFFSET_MAGIC] = 2
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
