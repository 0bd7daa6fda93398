"""The fault tests' checkers on data they can be sure of: logs written by the storage library
(identical, diverging, torn) and a single broker under the background load."""
from __future__ import annotations

import os
import types

import pytest

from odradek.core.config import LogConfig
from odradek.log.log import Log
from odradek.core.records import encode_batch
from odradek import Admin
from tests.cluster.verify import (AckedLog, ConsumedLog, Workload, check_logs, read_all, replica_batches,
                                  replica_problems)


def write_log(directory: str, values: list[bytes], per_batch: int = 3, segment_bytes: int = 1024) -> None:
    os.makedirs(directory, exist_ok=True)
    log = Log(directory, LogConfig(segment_bytes=segment_bytes))
    try:
        for i in range(0, len(values), per_batch):
            log.append(encode_batch([(None, v) for v in values[i:i + per_batch]], timestamp_ms=1_700_000_000_000))
        log.flush()
    finally:
        log.close()


def test_replica_batches_walks_every_segment(tmp_path):
    write_log(str(tmp_path / "t-0"), [b"x" * 100 + b"%d" % i for i in range(60)])
    assert len([n for n in os.listdir(tmp_path / "t-0") if n.endswith(".log")]) > 1  # several segments
    batches = replica_batches(str(tmp_path), "t", 0)
    assert [b[0] for b in batches] == list(range(0, 60, 3))
    assert all(last == base + 2 for base, last, *_ in batches)
    assert replica_batches(str(tmp_path), "t", 0, upto=30) == batches[:10]
    assert replica_batches(str(tmp_path), "t", 1) == []  # no such partition here


def test_identical_replicas_and_the_differences_found(tmp_path):
    values = [b"v%d" % i for i in range(30)]
    for b in (1, 2, 3):
        write_log(str(tmp_path / f"b{b}" / "t-0"), values)
    views = {b: replica_batches(str(tmp_path / f"b{b}"), "t", 0, upto=30) for b in (1, 2, 3)}
    assert views[1] == views[2] == views[3]
    assert replica_problems(views, reference=1, upto=30) == []

    # replica 2 diverged at offset 15 (another record there), replica 3 is behind
    write_log(str(tmp_path / "d2" / "t-0"), values[:15] + [b"other"] + values[16:])
    write_log(str(tmp_path / "d3" / "t-0"), values[:21])
    views[2] = replica_batches(str(tmp_path / "d2"), "t", 0, upto=30)
    views[3] = replica_batches(str(tmp_path / "d3"), "t", 0, upto=30)
    problems = replica_problems(views, reference=1, upto=30)
    assert any("replica 2 differs" in p and "(15, 17" in p for p in problems), problems
    assert any("replica 3 ends at offset 21" in p for p in problems), problems


def test_torn_tail_ends_the_walk(tmp_path):
    write_log(str(tmp_path / "t-0"), [b"v%d" % i for i in range(9)], segment_bytes=1 << 20)
    path = tmp_path / "t-0" / ("0" * 20 + ".log")
    whole = replica_batches(str(tmp_path), "t", 0)
    with open(path, "ab") as f:
        f.write(b"\0" * 200)  # zero-filled tail (preallocated, or lost page cache)
    assert replica_batches(str(tmp_path), "t", 0) == whole
    size = os.path.getsize(path) - 200
    os.truncate(path, size - 10)  # the last batch torn
    assert replica_batches(str(tmp_path), "t", 0) == whole[:-1]


def _done(partition, offset, exc=None):
    md = types.SimpleNamespace(partition=partition, offset=offset)
    return types.SimpleNamespace(add_done_callback=lambda fn: fn(types.SimpleNamespace(
        exception=lambda _t: exc, result=lambda _t: md)))


def test_checker_finds_lost_and_overwritten_records():
    acked, consumed = AckedLog(), ConsumedLog()
    acked.track(_done(0, 0), b"a")
    acked.track(_done(0, 1), b"b")
    acked.track(_done(0, 2, exc=TimeoutError()), b"never-acked")  # failed: not expected anywhere
    consumed.add(0, 0, b"a")
    consumed.add(0, 1, b"b")
    consumed.add(0, 0, b"a")  # delivered again after a rebalance: fine
    assert check_logs(acked, consumed) == [] and len(acked.failed) == 1

    acked.track(_done(1, 5), b"c")  # acknowledged, never consumed
    consumed.add(0, 1, b"z")  # another record at an offset already consumed
    acked.track(_done(0, 0), b"other")  # a second acknowledgement of offset 0
    problems = check_logs(acked, consumed)
    assert any("acknowledged b'c' at 1:5" in p for p in problems), problems
    assert any("0:1 consumed with two values" in p for p in problems), problems
    assert any("0:0 acknowledged with two values" in p for p in problems), problems


@pytest.mark.timeout(120)
def test_workload_on_one_broker(broker):
    """The background load and the checks, where nothing is lost: a single broker."""
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("load", partitions=3)
    with Workload(broker.bootstrap, "load", rate=300) as load:
        load.wait_acked(300)
        load.stop_producers()
        assert load.acked.failed == [] and len(load.acked) == load.acked.sent
        load.wait_consumed()
    assert not check_logs(load.acked, read_all(broker.bootstrap, "load", range(3)))
    partitions = {p for p, _ in load.acked.records}
    assert partitions == {0, 1, 2}
    # the files hold every acknowledged offset, batch after batch
    for p in range(3):
        batches = replica_batches(broker.data_dir, "load", p)
        assert batches[0][0] == 0
        assert max(o for q, o in load.acked.records if q == p) == batches[-1][1]
