"""Where records go: keyed by a stable hash, keyless sticky per batch, explicit partitions."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from odradek import Producer, errors
from odradek.producer import murmur2, partition_for_key

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = [b"", b"a", b"customer-42", bytes(range(256)), "ключ".encode()]


def test_a_key_maps_to_the_same_partition_in_another_process_with_another_hash_seed():
    here = [partition_for_key(k, 7) for k in KEYS]
    code = ("import sys; from odradek.producer import partition_for_key; "
            f"print([partition_for_key(k, 7) for k in {KEYS!r}])")
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(here)


# Kafka's own murmur2 test vectors (Utils.murmur2 in the Java client), as signed 32-bit values.
MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
           b"a-little-bit-longer-string": -1486304829,
           b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}


def test_the_key_hash_is_kafkas_murmur2_so_kafka_producers_pick_the_same_partition():
    for key, signed in MURMUR2.items():
        assert murmur2(key) == signed & 0xFFFFFFFF
        assert partition_for_key(key, 5) == (signed & 0x7FFFFFFF) % 5


def test_records_of_one_key_land_in_one_partition(scripted):
    broker = scripted({"t": 4})
    with Producer(broker.bootstrap, linger_ms=1) as p:
        handles = [p.send("t", b"v%d" % i, key=b"user-%d" % (i % 3)) for i in range(60)]
        p.flush()
    by_key = {}
    for i, h in enumerate(handles):
        by_key.setdefault(i % 3, set()).add(h.result().partition)
    assert all(len(parts) == 1 for parts in by_key.values())
    assert by_key[0] == {partition_for_key(b"user-0", 4)}


def test_keyless_records_stick_to_one_partition_until_their_batch_closes(scripted):
    broker = scripted({"t": 8})
    with Producer(broker.bootstrap, linger_ms=60000, batch_size=1000) as p:
        handles = [p.send("t", b"x" * 92) for i in range(100)]  # 100 bytes counted each: 10 per batch
        p.flush()
    parts = [h.result().partition for h in handles]
    runs = [parts[i:i + 10] for i in range(0, 100, 10)]
    assert all(len(set(run)) == 1 for run in runs)
    assert len(set(parts)) > 1  # ten batches on eight partitions, never the same twice in a row
    assert all(a[0] != b[0] for a, b in zip(runs, runs[1:]))


def test_an_explicit_partition_outside_the_topic_is_refused_at_send(scripted):
    broker = scripted({"t": 2})
    with Producer(broker.bootstrap) as p:
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            p.send("t", b"v", partition=2)
        assert p.send("t", b"v", partition=1).result(10).partition == 1


def test_a_keyed_record_follows_the_partition_count_of_the_newest_metadata(scripted):
    """``send`` remembers each key's partition for its fast path; more partitions in a refreshed
    metadata must move the key at once, as Kafka's partitioner computes it per record."""
    broker = scripted({"t": 2})
    keys = [b"user-%d" % i for i in range(40)]
    moved = [k for k in keys if partition_for_key(k, 2) != partition_for_key(k, 7)]
    with Producer(broker.bootstrap, linger_ms=1, metadata_max_age_ms=100) as p:
        before = [p.send("t", b"v", key=k) for k in keys * 3]  # the first sends fill the memo
        p.flush()
        assert [h.result().partition for h in before] == [partition_for_key(k, 2) for k in keys * 3]
        with broker.lock:  # seven partitions now; partitions 0 and 1 keep their logs
            broker.topics["t"] = 7
            for i in range(2, 7):
                broker.logs[("t", i)], broker.end[("t", i)] = [], 0
                broker.cluster.leaders[("t", i)] = [broker.node_id, 0]
        deadline = time.monotonic() + 10
        while len(p.partitions_for("t")) != 7:  # the sender refreshes after metadata_max_age_ms
            assert time.monotonic() < deadline, "the producer never refreshed its metadata"
            time.sleep(0.05)
        after = [p.send("t", b"v", key=k) for k in moved]
        p.flush()
    assert moved and [h.result().partition for h in after] == [partition_for_key(k, 7) for k in moved]


def test_a_key_placed_by_a_partition_count_that_a_refresh_replaced_meanwhile_is_not_remembered(scripted):
    """The memo is dropped by a hook run after each metadata merge; a key whose partition was
    computed from the count read before a merge (on the sender's thread) must not be kept."""
    broker = scripted({"t": 2})
    with Producer(broker.bootstrap, linger_ms=1) as p:
        p.send("t", b"v", key=b"k0").result(10)
        assert b"k0" in p._key_slots["t"]
        p._partition_of_key("t", b"stale", 5)  # as if 5 were read, then a merge said 2
        assert "t" not in p._key_slots
        p.send("t", b"v", key=b"k1").result(10)
        assert p._key_counts["t"] == 2 and list(p._key_slots["t"]) == [b"k1"]
        p._cluster.refresh(["t"])  # a refresh that keeps the count keeps the keys
        assert list(p._key_slots["t"]) == [b"k1"]
