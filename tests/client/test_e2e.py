"""The client against real brokers (tests/conftest.py starts and always stops them). One
broker serves the module (``broker`` below): each test has topics of its own and none stops
it; the restart test starts brokers of its own."""
from __future__ import annotations

import collections
import threading
import time

import pytest

from odradek.core.protocol import ErrorCode
from odradek import Admin, Consumer, Producer, TopicPartition, errors
from odradek.cluster import Connection
from odradek.producer import encode_rows
from odradek.core.protocol import ApiKey


@pytest.fixture
def broker(shared_broker):
    return shared_broker


def consume_all(bootstrap: str, tps: list, expected: int, max_wait: float = 30.0) -> list:
    out = []
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign(tps)
        deadline = time.monotonic() + max_wait
        while len(out) < expected and time.monotonic() < deadline:
            out += c.poll(timeout_ms=200)
        out += c.poll(timeout_ms=200)  # anything beyond what was expected (duplicates) shows up too
    return out


def test_admin_creates_lists_describes_alters_and_deletes_a_topic(broker):
    with Admin(broker.bootstrap) as admin:
        made = admin.create_topic("orders", partitions=3, config={"retention.ms": "3600000"})
        assert made["num_partitions"] == 3
        assert "orders" in admin.list_topics()
        d = admin.describe_topic("orders")
        assert [p.partition for p in d.partitions] == [0, 1, 2] and all(p.leader >= 0 for p in d.partitions)
        assert d.configs["retention.ms"] == "3600000"
        admin.alter_configs("orders", set={"retention.ms": "7200000"})
        assert {c.name: c.value for c in admin.describe_configs("orders")}["retention.ms"] == "7200000"
        with pytest.raises(errors.TopicAlreadyExistsError, match="orders"):
            admin.create_topic("orders")
        admin.delete_topic("orders")
        assert "orders" not in admin.list_topics()
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.delete_topic("orders")


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad/name", "sp ace", "ü"])
def test_invalid_topic_names_are_refused_with_invalid_topic(broker, name):
    with Admin(broker.bootstrap) as admin:
        with pytest.raises(errors.InvalidTopicError):
            admin.create_topic(name)


def test_every_acknowledged_record_is_read_back_once_at_its_offset_in_order(broker):
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("t", partitions=3)
    with Producer(broker.bootstrap, linger_ms=2, batch_size=4096) as p:
        handles = [p.send("t", b"%06d" % i) for i in range(20000)]
        keyed = [p.send("t", b"k%d" % i, key=b"key-%d" % (i % 5)) for i in range(500)]
        p.flush()
    acked = {}
    for h in handles + keyed:
        m = h.result()
        acked[(m.partition, m.offset)] = m
    assert len(acked) == len(handles) + len(keyed)
    records = consume_all(broker.bootstrap, [TopicPartition("t", i) for i in range(3)], len(acked))
    seen = collections.Counter((r.partition, r.offset) for r in records)
    assert set(seen) == set(acked) and max(seen.values()) == 1
    for part in range(3):
        values = [r.value for r in records if r.partition == part and not r.value.startswith(b"k")]
        assert values == sorted(values)  # send order within a partition
    by_key = collections.defaultdict(set)
    for h, i in zip(keyed, range(500)):
        by_key[i % 5].add(h.result().partition)
    assert all(len(parts) == 1 for parts in by_key.values())


def test_a_long_poll_answers_when_a_record_arrives_not_at_max_wait(broker):
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("lp")
    tp = TopicPartition("lp", 0)
    with Consumer(broker.bootstrap, fetch_max_wait_ms=30000) as c, Producer(broker.bootstrap, linger_ms=0) as p:
        c.assign([tp])
        c.position(tp)
        assert c.poll(timeout_ms=300) == []  # the long poll is now parked at the broker
        started = time.monotonic()
        threading.Timer(0.2, lambda: p.send("lp", b"wake up")).start()
        got = []
        while not got and time.monotonic() - started < 25:
            got = c.poll(timeout_ms=1000)
        assert [r.value for r in got] == [b"wake up"]
        assert time.monotonic() - started < 25  # well before the 30 s max wait


def test_records_survive_a_broker_restart(start_broker, tmp_path):
    data = str(tmp_path / "data")
    b = start_broker(data_dir=data)
    with Admin(b.bootstrap) as admin:
        admin.create_topic("keep", partitions=2)
    with Producer(b.bootstrap, linger_ms=1) as p:
        handles = [p.send("keep", b"v%d" % i, key=b"%d" % i) for i in range(1000)]
    acked = {(h.result().partition, h.result().offset) for h in handles}
    b.terminate()
    b.stop()
    b2 = start_broker(data_dir=data)
    with Admin(b2.bootstrap) as admin:
        assert "keep" in admin.list_topics()
    records = consume_all(b2.bootstrap, [TopicPartition("keep", 0), TopicPartition("keep", 1)], len(acked))
    assert {(r.partition, r.offset) for r in records} == acked


def test_producing_to_an_unknown_topic_or_partition_fails_with_its_code(broker):
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("one")
    with Producer(broker.bootstrap, max_block_ms=500) as p:
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            p.send("missing", b"v")
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            p.send("one", b"v", partition=1)


def _raw_produce(broker, body: dict, frames: list) -> dict:
    host, port = broker.bootstrap.split(":")
    conn = Connection(host, int(port))
    try:
        return conn.request(ApiKey.PRODUCE, body, frames, timeout=10).header["body"]
    finally:
        conn.close()


def _partition_code(body: dict) -> int:
    return body["topics"][0]["partitions"][0]["error_code"]


def test_bad_produce_requests_get_the_right_error_code_and_write_nothing(broker):
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("bad", config={"max.message.bytes": "2000"})
    good = encode_rows([(0, 0, None, b"v", ())], 1, 1, "lz4")
    big = encode_rows([(0, 0, None, bytes(range(256)) * 40, ())], 1, 1, None)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF

    def req(acks, frame, partition=0, topic="bad"):
        return {"acks": acks, "timeout_ms": 5000,
                "topics": [{"name": topic, "partitions": [{"index": partition, "frame": 0}]}]}, [frame]

    with pytest.raises(errors.InvalidRequiredAcksError):
        _raw_produce(broker, *req(2, good))
    assert _partition_code(_raw_produce(broker, *req(1, bytes(corrupt)))) == ErrorCode.CORRUPT_MESSAGE
    assert _partition_code(_raw_produce(broker, *req(1, big))) == ErrorCode.MESSAGE_TOO_LARGE
    assert _partition_code(_raw_produce(broker, *req(1, good, partition=7))) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert _partition_code(_raw_produce(broker, *req(1, good, topic="nope"))) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with Consumer(broker.bootstrap) as c:
        assert c.end_offsets([TopicPartition("bad", 0)]) == {TopicPartition("bad", 0): 0}


def test_fetching_below_the_log_start_resets_per_policy_or_fails_with_out_of_range(broker):
    tp = TopicPartition("trim", 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("trim")
        with Producer(broker.bootstrap, linger_ms=0) as p:
            for i in range(10):
                p.send("trim", b"%d" % i).result(10)
        assert admin.delete_records({tp: 5}) == {tp: 5}
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        c.seek(tp, 2)
        got = []
        while len(got) < 5:
            got += c.poll(timeout_ms=500)
        assert got[0].offset == 5
    with Consumer(broker.bootstrap, auto_offset_reset="none") as c:
        c.assign([tp])
        c.seek(tp, 2)
        with pytest.raises(errors.OffsetOutOfRangeError):
            for _ in range(20):
                c.poll(timeout_ms=200)


def test_list_offsets_by_time_finds_the_first_record_at_or_after_it(broker):
    tp = TopicPartition("times", 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("times")
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for i, ts in enumerate([1000, 2000, 3000]):
            p.send("times", b"%d" % i, timestamp_ms=ts).result(10)
    with Consumer(broker.bootstrap) as c:
        assert c.offsets_for_times({tp: 1500}) == {tp: 1}
        assert c.offsets_for_times({tp: 9999}) == {tp: -1}
        assert c.beginning_offsets([tp]) == {tp: 0} and c.end_offsets([tp]) == {tp: 3}


def test_acks_all_and_acks_0_both_deliver(broker):
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("acks")
    with Producer(broker.bootstrap, acks="all", linger_ms=0) as p:
        assert p.send("acks", b"all").result(10).offset == 0
    with Producer(broker.bootstrap, acks=0, linger_ms=0) as p:
        assert p.send("acks", b"zero").result(10).offset == -1
    records = consume_all(broker.bootstrap, [TopicPartition("acks", 0)], 2)
    assert [r.value for r in records] == [b"all", b"zero"]


def test_negative_offsets_are_out_of_range_at_the_broker_and_refused_by_the_client(broker):
    tp = TopicPartition("neg", 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("neg")
        with pytest.raises(errors.OffsetOutOfRangeError):
            admin.delete_records({tp: -5})
    host, port = broker.bootstrap.split(":")
    conn = Connection(host, int(port))
    try:
        body = {"max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1000, "isolation_level": 0,
                "topics": [{"name": "neg", "partitions": [{"index": 0, "fetch_offset": -1,
                                                           "partition_max_bytes": 1000}]}]}
        answer = conn.request(ApiKey.FETCH, body, timeout=10).header["body"]
    finally:
        conn.close()
    assert _partition_code(answer) == ErrorCode.OFFSET_OUT_OF_RANGE
    with Consumer(broker.bootstrap) as c:
        c.assign([tp])
        with pytest.raises(ValueError):
            c.seek(tp, -1)


def test_keys_headers_tombstones_and_timestamps_round_trip(broker):
    tp = TopicPartition("shapes", 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("shapes")
    with Producer(broker.bootstrap, linger_ms=20) as p:
        sent = [p.send("shapes", b"plain"),
                p.send("shapes", b"keyed", key=b"k1"),
                p.send("shapes", None, key=b"k1"),
                p.send("shapes", b"h", headers=[("trace", b"abc"), ("empty", None)]),
                p.send("shapes", b"stamped", timestamp_ms=1234567)]
        p.flush()
    metas = [h.result() for h in sent]
    records = consume_all(broker.bootstrap, [tp], len(sent))
    assert [(r.key, r.value) for r in records] == [(None, b"plain"), (b"k1", b"keyed"), (b"k1", None),
                                                   (None, b"h"), (None, b"stamped")]
    assert [tuple(h) for h in records[3].headers] == [("trace", b"abc"), ("empty", None)]
    assert [r.timestamp for r in records] == [m.timestamp for m in metas] and records[4].timestamp == 1234567
