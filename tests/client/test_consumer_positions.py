"""Consumer positions, seeks and resets (scripted broker: exact fetch answers)."""
from __future__ import annotations

import pytest

from odradek import Consumer, Producer, TopicPartition, errors

TP = TopicPartition("t", 0)


def fill(broker, n: int, batch_size: int = 500) -> None:
    with Producer(broker.bootstrap, linger_ms=0, batch_size=batch_size) as p:
        for i in range(n):
            p.send("t", b"%04d" % i, partition=0)


def poll_until(consumer: Consumer, n: int, max_records: int | None = None) -> list:
    out = []
    for _ in range(200):
        out += consumer.poll(50, max_records=max_records)
        if len(out) >= n:
            break
    return out


def test_poll_returns_records_in_offset_order_and_advances_the_position(scripted):
    broker = scripted({"t": 1})
    fill(broker, 300)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TP])
        assert c.position(TP) == 0
        got = poll_until(c, 300, max_records=7)
        assert [r.offset for r in got] == list(range(300))
        assert [r.value for r in got[:2]] == [b"0000", b"0001"]
        assert c.position(TP) == 300


def test_max_records_caps_each_poll(scripted):
    broker = scripted({"t": 1})
    fill(broker, 50, batch_size=100000)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TP])
        first = []
        while not first:
            first = c.poll(100, max_records=10)
        assert [r.offset for r in first] == list(range(10))
        assert c.position(TP) == 10


def test_latest_starts_after_what_is_already_there(scripted):
    broker = scripted({"t": 1})
    fill(broker, 5)
    with Consumer(broker.bootstrap) as c:
        c.assign([TP])
        assert c.position(TP) == 5
        assert c.poll(50) == []


def test_seek_into_the_middle_of_a_batch_skips_the_records_before_it(scripted):
    broker = scripted({"t": 1})
    fill(broker, 20, batch_size=100000)
    with Consumer(broker.bootstrap) as c:
        c.assign([TP])
        c.seek(TP, 13)
        assert [r.offset for r in poll_until(c, 7)] == list(range(13, 20))
        c.seek_to_beginning(TP)
        assert poll_until(c, 20)[0].offset == 0
        c.seek_to_end(TP)
        assert c.position(TP) == 20


def test_an_offset_past_the_end_resets_per_auto_offset_reset(scripted):
    broker = scripted({"t": 1})
    fill(broker, 3)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TP])
        c.seek(TP, 1000)
        assert [r.offset for r in poll_until(c, 3)] == [0, 1, 2]
    with Consumer(broker.bootstrap, auto_offset_reset="none") as c:
        c.assign([TP])
        with pytest.raises(errors.OffsetOutOfRangeError, match="seek"):
            c.poll(100)
        c.seek(TP, 1000)
        with pytest.raises(errors.OffsetOutOfRangeError):
            for _ in range(20):
                c.poll(50)


def test_negative_offsets_and_unassigned_partitions_are_refused(scripted):
    broker = scripted({"t": 1})
    with Consumer(broker.bootstrap) as c:
        c.assign([TP])
        with pytest.raises(ValueError):
            c.seek(TP, -1)
        with pytest.raises(ValueError, match="not assigned"):
            c.position(TopicPartition("t", 5))


def test_assigning_an_unknown_topic_or_partition_raises_its_error_code(scripted):
    broker = scripted({"t": 1})
    with Consumer(broker.bootstrap) as c:
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            c.assign([TopicPartition("nope", 0)])
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="1 partitions"):
            c.assign([TopicPartition("t", 1)])


def test_iteration_yields_records_and_stops_after_consumer_timeout(scripted):
    broker = scripted({"t": 1})
    fill(broker, 4)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=300) as c:
        c.assign([TP])
        assert [r.value for r in c] == [b"0000", b"0001", b"0002", b"0003"]
