"""Every file the broker reads at start, damaged (issue 27, "Beyond the list"): a restart
either comes up serving every record it acknowledged, or refuses to start with one line that
names the file and says what to do. Never does it throw acknowledged records away.

(What each file does when empty, garbage or torn in half is tabled in docs/RELIABILITY.md,
"Third wave (issue 27): fuzzing every API and the files read at start".)
"""
from __future__ import annotations

import os

import pytest

RECORDS = 20


def _seed(start_broker, data_dir: str) -> None:
    """A topic 't' with RECORDS records acknowledged, the broker stopped gracefully."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    b = start_broker(data_dir)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(30)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i in range(RECORDS):
        p.produce("t", value=b"v%d" % i)
    assert p.flush(30) == 0
    del p, admin
    b.stop()


def _read_all(bootstrap: str) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("t", 0, 0)])
        got = []
        for _ in range(60):
            for m in c.consume(RECORDS, 0.5):
                if not m.error():
                    got.append(m.value())
            if len(got) >= RECORDS:
                break
        return got
    finally:
        c.close()


def test_a_torn_partition_metadata_keeps_the_partitions_records(start_broker, tmp_path):
    """partition.metadata cut in half (a torn write) held a prefix of the topic id: the log
    actor took it for a deleted topic's directory and removed it, records and all."""
    data = str(tmp_path / "data")
    _seed(start_broker, data)
    path = os.path.join(data, "t-0", "partition.metadata")
    whole = open(path).read()
    with open(path, "w") as f:
        f.write(whole[:len(whole) // 2 + 4])
    b = start_broker(data)
    assert _read_all(b.bootstrap) == [b"v%d" % i for i in range(RECORDS)]
    assert open(path).read() == whole  # rewritten with the topic's id
    assert "not a topic id: rewritten" in open(b.stderr_path, errors="replace").read()


@pytest.mark.parametrize("damage", ["empty", "garbage"])
def test_an_unreadable_partition_metadata_keeps_the_records(start_broker, tmp_path, damage):
    data = str(tmp_path / "data")
    _seed(start_broker, data)
    with open(os.path.join(data, "t-0", "partition.metadata"), "wb") as f:
        f.write(b"" if damage == "empty" else bytes(range(256)))
    b = start_broker(data)
    assert _read_all(b.bootstrap) == [b"v%d" % i for i in range(RECORDS)]


@pytest.mark.parametrize("name,damage,says", [
    ("meta/topics.json", b"", "topics.json is unreadable"),
    ("meta/topics.json", b'{"t": {"partitions": ', "topics.json is unreadable"),
    ("meta/producer-id.key", b"short", "not a 32-byte key"),
])
def test_a_damaged_registry_or_key_stops_the_start_with_its_name(start_broker, tmp_path, name, damage, says):
    """The topic registry and the producer-id key cannot be guessed: the broker refuses to
    start, and its last words name the file (it never starts with no topics, or new keys,
    over acknowledged data)."""
    data = str(tmp_path / "data")
    _seed(start_broker, data)
    with open(os.path.join(data, name), "wb") as f:
        f.write(damage)
    with pytest.raises(RuntimeError) as failed:
        start_broker(data)
    assert says in str(failed.value)
