"""Real Kafka clients (confluent-kafka/librdkafka, kafka-python, kcat) against one broker."""
from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer as KafkaConsumer, KafkaError, Producer as KafkaProducer, TopicPartition
from confluent_kafka.admin import AdminClient

from odradek import Admin, Consumer, Producer
from odradek.actors.client import MailboxClient
from odradek import TopicPartition as OdradekTP
from odradek.producer import partition_for_key
from odradek.actors.messages import Stats


CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def kafka_consume(bootstrap: str, topic: str, partition: int, count: int, offset: int = 0, wait: float = 60) -> list:
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, offset)])
    out, deadline = [], time.monotonic() + wait
    try:
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                out.append(m)
    finally:
        c.close()
    return out


def kafka_produce(bootstrap: str, topic: str, rows: list, **config) -> list:
    p = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    reports = []
    for key, value, headers in rows:
        p.produce(topic, key=key, value=value, headers=headers, on_delivery=lambda e, m: reports.append((e, m)))
    assert p.flush(60) == 0
    return reports


def test_admin_client_and_kcat_list_the_broker_at_the_address_serve_printed(kafka_broker, bootstrap):
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    assert [(b.id, f"{b.host}:{b.port}") for b in md.brokers.values()] == [(0, bootstrap)]


def test_kcat_lists_produces_and_consumes(bootstrap, topic, kcat):
    subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-K", ":"], input=b"a:1\nb:2\n", check=True,
                   timeout=60)
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-J"],
                         capture_output=True, check=True, timeout=60)
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(m["key"], m["payload"], m["offset"]) for m in got] == [("a", "1", 0), ("b", "2", 1)]
    listing = subprocess.run(["kcat", "-L", "-b", bootstrap, "-J"], capture_output=True, check=True, timeout=60)
    assert topic in [t["topic"] for t in json.loads(listing.stdout)["topics"]]


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_keyed_records_with_headers_round_trip_under_every_codec(bootstrap, topic, codec):
    rows = [(b"key-%d" % i, b"value-%d" % i * (i % 7), [("n", b"%d" % i), ("codec", codec.encode())])
            for i in range(200)]
    reports = kafka_produce(bootstrap, topic, rows, **{"compression.type": codec, "acks": "all"})
    assert [e for e, _ in reports if e is not None] == []
    assert sorted(m.offset() for _, m in reports) == list(range(200))
    got = kafka_consume(bootstrap, topic, 0, 200)
    assert [(m.key(), m.value(), m.headers(), m.offset()) for m in got] == \
        [(k, v, h, i) for i, (k, v, h) in enumerate(rows)]


def test_kafka_python_produces_and_consumes_by_assignment(bootstrap, topic):
    import kafka
    # InitProducerId (idempotence) is not served yet: kafka-python 3 would turn it on by default.
    p = kafka.KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", acks="all", enable_idempotence=False)
    futures = [p.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"x")]) for i in range(50)]
    p.flush(60)
    assert sorted(f.get(30).offset for f in futures) == list(range(50))
    p.close()
    c = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=20000)
    c.assign([kafka.TopicPartition(topic, 0)])
    c.seek_to_beginning()
    got = []
    for m in c:
        got.append((m.key, m.value, m.headers, m.offset))
        if len(got) == 50:
            break
    c.close()
    assert got == [(b"k%d" % i, b"v%d" % i, [("h", b"x")], i) for i in range(50)]


def test_seeking_by_timestamp_finds_the_first_record_at_or_after_it(bootstrap, topic):
    p = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(10):
        p.produce(topic, value=b"%d" % i, timestamp=1_700_000_000_000 + i * 1000)
        p.flush(30)
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        found = c.offsets_for_times([TopicPartition(topic, 0, 1_700_000_004_500)], timeout=30)
        assert found[0].offset == 5
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        assert (lo, hi) == (0, 10)
        late = c.offsets_for_times([TopicPartition(topic, 0, 1_800_000_000_000)], timeout=30)
        assert late[0].offset in (-1, 10)  # no record that late: the end
    finally:
        c.close()


def test_the_bundled_producers_records_reach_a_kafka_consumer_converted_to_magic_2(bootstrap, topic):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic)
    with Producer(bootstrap, linger_ms=5) as p:
        handles = [p.send(topic, b"v%d" % i, key=b"k%d" % i, headers=[("h", b"%d" % i)], partition=0)
                   for i in range(100)]
        p.flush()
    assert [h.result().offset for h in handles] == list(range(100))
    got = kafka_consume(bootstrap, topic, 0, 100)
    assert [(m.key(), m.value(), m.headers(), m.offset()) for m in got] == \
        [(b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)], i) for i in range(100)]


def test_a_kafka_producers_records_reach_the_bundled_consumer(bootstrap, topic):
    rows = [(b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)]) for i in range(100)]
    kafka_produce(bootstrap, topic, rows, **{"compression.type": "zstd"})
    out = []
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign([OdradekTP(topic, 0)])
        deadline = time.monotonic() + 60
        while len(out) < 100 and time.monotonic() < deadline:
            out += c.poll(timeout_ms=200)
    assert [(r.key, r.value, [tuple(h) for h in r.headers], r.offset) for r in out] == \
        [(k, v, h, i) for i, (k, v, h) in enumerate(rows)]


def processor_counts(broker, name: str) -> int:
    """The sum of a processor counter over the broker's processors (asked now: a fetch's
    answer is counted before the client can have it)."""
    names = [a["name"] for a in broker.status()["actors"] if a["name"].rsplit("-", 1)[0] == "processor"]
    with MailboxClient(broker.run_dir) as client:
        return sum(client.request(n, Stats(), timeout=10).fields.stats.get(name, 0) for n in names)


def test_a_kafka_consumer_reads_a_partition_whose_batches_alternate_between_both_producers(
        kafka_broker, bootstrap, topic):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic)
    expected = []
    for r in range(4):
        rows = [(b"k%d-%d" % (r, i), b"v%d-%d" % (r, i)) for i in range(25)]
        if r % 2:
            kafka_produce(bootstrap, topic, [(k, v, None) for k, v in rows], **{"compression.type": "lz4"})
        else:
            with Producer(bootstrap, linger_ms=5) as p:
                for k, v in rows:
                    p.send(topic, v, key=k, partition=0)
        expected += rows
    copied = processor_counts(kafka_broker, "kafka_fetch_copied")
    got = kafka_consume(bootstrap, topic, 0, 100)
    assert [(m.key(), m.value(), m.offset()) for m in got] == [(k, v, i) for i, (k, v) in enumerate(expected)]
    later = kafka_consume(bootstrap, topic, 0, 40, offset=60)  # from inside a Kafka producer's batch
    assert [(m.key(), m.value(), m.offset()) for m in later] == [(k, v, 60 + i) for i, (k, v) in
                                                                  enumerate(expected[60:])]
    assert processor_counts(kafka_broker, "kafka_fetch_copied") > copied  # native batches: converted


def test_a_kafka_producers_batches_go_to_a_kafka_consumer_by_sendfile_each_partition_its_own(
        kafka_broker, bootstrap, topic):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=3)
    big = os.urandom(300_000)  # one batch over the consumer's fetch limits below: served whole (KIP-74)
    p = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "none"})
    for part in range(3):
        for i in range(30):
            p.produce(topic, key=b"%d-%d" % (part, i), value=b"v" * i, partition=part)
        p.flush(60)
    p.produce(topic, key=b"big", value=big, partition=1)
    assert p.flush(60) == 0
    sent = processor_counts(kafka_broker, "kafka_fetch_sendfile")
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                       "fetch.max.bytes": 1024, "max.partition.fetch.bytes": 1024, "message.max.bytes": 1000,
                       "receive.message.max.bytes": 1_000_000})
    c.assign([TopicPartition(topic, part, 0) for part in range(3)])
    got: dict[int, list] = {0: [], 1: [], 2: []}
    deadline = time.monotonic() + 60
    try:
        while sum(map(len, got.values())) < 91 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got[m.partition()].append((m.key(), m.value(), m.offset()))
    finally:
        c.close()
    for part in range(3):
        assert got[part][:30] == [(b"%d-%d" % (part, i), b"v" * i, i) for i in range(30)]
    assert got[1][30:] == [(b"big", big, 30)] and len(got[0]) == len(got[2]) == 30
    assert processor_counts(kafka_broker, "kafka_fetch_sendfile") > sent


def test_both_kinds_of_producer_put_a_key_on_the_same_partition(bootstrap, topic):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=6)
    keys = [b"user-%d" % i for i in range(30)]
    reports = kafka_produce(bootstrap, topic, [(k, b"x", None) for k in keys], partitioner="murmur2_random")
    placed = {m.key(): m.partition() for _, m in reports}
    assert placed == {k: partition_for_key(k, 6) for k in keys}


def test_a_batch_over_message_max_bytes_is_refused_with_message_too_large(bootstrap, topic):
    reports = kafka_produce(bootstrap, topic, [(None, os.urandom(2_000_000), None)],
                            **{"message.max.bytes": 10_000_000, "compression.type": "none"})
    assert reports[0][0] is not None and reports[0][0].code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_fuzzed_kafka_requests_leave_the_broker_serving(kafka_broker, bootstrap):
    rng = random.Random(11)
    host, port = bootstrap.split(":")
    for i in range(150):
        api, version = rng.choice([0, 1, 2, 3, 18, 23, rng.randrange(0, 100)]), rng.randrange(-1, 20)
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        client = b"fuzz"
        raw = struct.pack(">hhih", api, version, i, len(client)) + client + body
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(struct.pack(">i", len(raw)) + raw)
            s.settimeout(5)
            try:
                s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                pass
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    assert len(md.brokers) == 1
    status = kafka_broker.status()
    assert status  # the supervisor still answers; no actor restarted:
    restarts = {a.get("name"): a.get("restarts", 0) for a in status.get("actors", [])} \
        if isinstance(status.get("actors"), list) else {}
    assert not any(restarts.values()), restarts
