"""Kafka's idempotent producers against the broker: confluent-kafka (librdkafka) with
``enable.idempotence=true``, kafka-python 3 with its default (idempotence on), and a Kafka
magic-2 batch retried with the same sequence (issue 12)."""
from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time

import pytest
from confluent_kafka import Consumer as KafkaConsumer, Producer as KafkaProducer, TopicPartition

from odradek import Admin
from odradek.cluster import Connection
from odradek.core import kafka_batch
from odradek.core.records import Record
from odradek.core.protocol import ApiKey, ErrorCode


def consume_all(bootstrap: str, topic: str, partitions: int, wait: float = 60) -> dict[int, list]:
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                       "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[int, list] = collections.defaultdict(list)
    done: set = set()
    deadline = time.monotonic() + wait
    try:
        while len(done) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == -191:  # _PARTITION_EOF
                    done.add(m.partition())
                    continue
                raise AssertionError(m.error())
            out[m.partition()].append(m.value())
    finally:
        c.close()
    return out


def test_confluent_kafka_idempotent_producer_stores_each_record_once_in_order(bootstrap, topic):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=3)
    p = KafkaProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    errors = []
    for i in range(3000):
        p.produce(topic, value=b"%06d" % i, partition=i % 3,
                  on_delivery=lambda e, m: errors.append(e) if e is not None else None)
        p.poll(0)
    assert p.flush(60) == 0 and not errors, errors[:3]
    got = consume_all(bootstrap, topic, 3)
    for part in range(3):
        assert got[part] == [b"%06d" % i for i in range(part, 3000, 3)]


def test_kafka_python_with_its_default_idempotence_produces(bootstrap, topic):
    import kafka
    p = kafka.KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    futures = [p.send(topic, value=b"v%d" % i) for i in range(200)]
    p.flush(60)
    assert sorted(f.get(30).offset for f in futures) == list(range(200))
    p.close()
    assert consume_all(bootstrap, topic, 1)[0] == [b"v%d" % i for i in range(200)]


def test_a_retried_kafka_batch_is_recognised_by_its_sequence(bootstrap, topic):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    host, port = bootstrap.rsplit(":", 1)
    c = Connection(host, int(port))
    c.connect()
    try:
        body = c.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                                   "producer_id": -1, "producer_epoch": -1}).header["body"]
        pid = body["producer_id"]

        def kbatch(seq: int) -> bytes:
            recs = [Record(i, 1_700_000_000_000, None, b"k%d" % (seq + i), []) for i in range(3)]
            return kafka_batch.encode(recs, base_offset=0, first_timestamp=1_700_000_000_000,
                                      max_timestamp=1_700_000_000_000, producer_id=pid, producer_epoch=0,
                                      base_sequence=seq, compression="zstd")

        def produce(batch: bytes) -> dict:
            req = {"acks": -1, "timeout_ms": 5000, "topics": [{"name": topic, "partitions": [{"index": 0, "frame": 0}]}]}
            return c.request(ApiKey.PRODUCE, req, [batch]).header["body"]["topics"][0]["partitions"][0]

        assert produce(kbatch(0))["base_offset"] == 0
        again = produce(kbatch(0))
        assert again["error_code"] == 0 and again["base_offset"] == 0
        assert produce(kbatch(3))["base_offset"] == 3
        assert produce(kbatch(9))["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    finally:
        c.close()
    assert consume_all(bootstrap, topic, 1)[0] == [b"k%d" % i for i in range(6)]


@pytest.mark.slow
def test_confluent_kafka_idempotent_producer_through_kill_9_of_actors_stores_no_duplicate(start_broker):
    broker = start_broker(supervisor_max_restarts=10000)
    topic = "confluent-faults"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=3)
    stop, killed = threading.Event(), []

    def killer() -> None:
        rnd = random.Random(7)
        until = time.monotonic() + 6
        while not stop.wait(rnd.uniform(0.3, 0.6)) and time.monotonic() < until:
            try:
                actors = [a for a in broker.status()["actors"] if a.get("pid") and a["state"] == "running"
                          and a["name"].rsplit("-", 1)[0] in ("processor", "handler", "log")]
            except Exception:
                continue
            if actors:
                victim = rnd.choice(actors)
                try:
                    os.kill(victim["pid"], signal.SIGKILL)
                    killed.append(victim["name"])
                except ProcessLookupError:
                    pass

    t = threading.Thread(target=killer)
    t.start()
    n, errors = 15000, []
    p = KafkaProducer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 2,
                       "batch.size": 4096, "message.timeout.ms": 120000, "retry.backoff.ms": 50})
    try:
        start = time.monotonic()
        for i in range(n):
            while True:
                try:
                    p.produce(topic, value=b"%06d" % i, partition=i % 3,
                              on_delivery=lambda e, m: errors.append(e) if e is not None else None)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 250 == 0:
                p.poll(0)
                ahead = start + 6 * i / n - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        assert p.flush(150) == 0
    finally:
        stop.set()
        t.join(30)
    assert killed and not errors, errors[:3]
    got = consume_all(broker.bootstrap, topic, 3)
    for part in range(3):
        values = got[part]
        dups = sum(c - 1 for c in collections.Counter(values).values() if c > 1)
        assert dups == 0, f"partition {part}: {dups} duplicates (killed {killed})"
        assert values == [b"%06d" % i for i in range(part, n, 3)]
