"""Lazy opening after a start (log/log_actor.py, "Opening lazily"): a broker killed -9 is ready
before its partitions are open; they open in the background, and any request touching one
that is not open yet opens it first, so nothing acknowledged is lost and nothing is refused.

``ODRADEK_LOG_OPEN_PER_TURN=0`` turns the background opening off, so a partition is opened
only by the first request that touches it: which request that is is then certain, not a
race with the background."""
from __future__ import annotations

import time

from odradek import Admin, Consumer, Producer, TopicPartition
from odradek.actors.client import MailboxClient
from odradek.actors.messages import GetBounds
from odradek.local import LocalBroker

PARTITIONS = 6
PER_PARTITION = 20
NO_BACKGROUND = {"ODRADEK_LOG_OPEN_PER_TURN": "0"}


def start(data_dir: str, env: dict | None = None) -> LocalBroker:
    return LocalBroker(data_dir, {"shutdown.timeout.ms": 10000}, env=env).start()


def fill(bootstrap: str, topic: str) -> dict:
    """PER_PARTITION records in each partition, acks=all; {(partition, offset): value}."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS)
    handles = []
    with Producer(bootstrap, acks=-1, linger_ms=1) as p:
        for partition in range(PARTITIONS):
            for i in range(PER_PARTITION):
                value = b"%s-%d-%d" % (topic.encode(), partition, i)
                handles.append((value, p.send(topic, value, partition=partition)))
        p.flush(timeout=60)
    acked = {}
    for value, h in handles:
        m = h.result(timeout=60)
        acked[(m.partition, m.offset)] = value
    assert len(acked) == PARTITIONS * PER_PARTITION
    return acked


def read(bootstrap: str, topic: str, partitions) -> dict:
    """Every record of ``partitions`` from offset 0: {(partition, offset): value}."""
    tps = [TopicPartition(topic, p) for p in partitions]
    out = {}
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        deadline = time.monotonic() + 60
        ends = None
        while time.monotonic() < deadline:
            for r in c.poll(timeout_ms=200):
                out[(r.partition, r.offset)] = r.value
            ends = ends or c.end_offsets(tps)
            if all(c.position(tp) >= ends[tp] for tp in tps):
                break
    return out


def opening(broker: LocalBroker) -> set:
    """The partitions the log actors have still to open (their ``get_bounds`` answers)."""
    names = [a["name"] for a in broker.status()["actors"] if a["role"] == "log"]
    out = set()
    with MailboxClient(broker.run_dir) as client:
        for name in names:
            out |= {tuple(k) for k in client.request(name, GetBounds(), timeout=30).fields.opening}
    return out


def wait_until_all_open(broker: LocalBroker) -> None:
    deadline = time.monotonic() + 120
    while opening(broker):
        assert time.monotonic() < deadline, f"still opening: {sorted(opening(broker))[:10]}"
        time.sleep(0.2)


def test_after_a_kill_9_partitions_first_touched_by_a_produce_a_fetch_or_a_list_offsets_are_opened_for_it(tmp_path):
    data = str(tmp_path / "data")
    first = start(data, NO_BACKGROUND)
    try:
        acked = fill(first.bootstrap, "lazy")
    finally:
        first.kill()
    broker = start(data, NO_BACKGROUND)
    try:
        # ready with the topic's partitions not open: nothing opens them but a request
        assert opening(broker) == {("lazy", p) for p in range(PARTITIONS)}
        with Producer(broker.bootstrap, acks=-1) as p:  # partition 0: first touched by a produce
            m = p.send("lazy", b"after", partition=0).result(timeout=60)
        assert (m.partition, m.offset) == (0, PER_PARTITION)
        acked[(0, PER_PARTITION)] = b"after"
        with Consumer(broker.bootstrap) as c:  # partition 1: first touched by a list-offsets
            assert c.end_offsets([TopicPartition("lazy", 1)]) == {TopicPartition("lazy", 1): PER_PARTITION}
        # partitions 2..: first touched by a fetch (the consumer seeks to 0, no list-offsets)
        got = read(broker.bootstrap, "lazy", range(PARTITIONS))
        missing = [k for k in acked if got.get(k) != acked[k]]
        assert not missing, f"{len(missing)} acknowledged records not read back, e.g. {missing[:5]}"
        assert len(got) == len(acked)
        assert not opening(broker)
    finally:
        broker.discard()


def test_after_a_kill_9_the_background_opens_every_partition_and_every_acknowledged_record_is_read(tmp_path):
    data = str(tmp_path / "data")
    first = start(data)
    try:
        acked = {("a", k): v for k, v in fill(first.bootstrap, "a").items()}
        acked.update({("b", k): v for k, v in fill(first.bootstrap, "b").items()})
    finally:
        first.kill()
    broker = start(data)
    try:
        wait_until_all_open(broker)
        got = {(t, *k): v for t in ("a", "b") for k, v in read(broker.bootstrap, t, range(PARTITIONS)).items()}
        acked = {(t, *k): v for (t, k), v in acked.items()}
        missing = [k for k in acked if got.get(k) != acked[k]]
        assert not missing, f"{len(missing)} acknowledged records not read back, e.g. {missing[:5]}"
    finally:
        broker.discard()
