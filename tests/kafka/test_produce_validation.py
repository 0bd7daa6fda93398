"""A produced magic-2 batch is validated as Kafka's LogValidator does, judged by a real client
(confluent-kafka, librdkafka's test 0011 case) and by raw Produce requests whose answers are
read field by field (error code, error_message, KIP-467 record_errors)."""
from __future__ import annotations

import socket
import struct
import time

import pytest
from confluent_kafka import KafkaError, Producer as KafkaProducer

from odradek import Admin, Consumer, TopicPartition
from odradek.core.kafka import schema
from odradek.core.protocol import ApiKey, ErrorCode
from tests.kafka.test_clients import kafka_consume
from tests.log.test_batch_validation import GOOD, SECOND, TAIL, batch, bomb, record


def raw_produce(bootstrap: str, topic: str, records: bytes, version: int = 8) -> dict:
    """One Produce (acks=1) of ``records`` to partition 0 over a plain socket; the partition's answer."""
    body = schema.encode_request(ApiKey.PRODUCE, version, {
        "transactional_id": None, "acks": 1, "timeout": 30000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
    client = b"raw"
    flexible = version >= 9  # request header v2 and response header v1: tagged fields (none here)
    head = struct.pack(">hhih", ApiKey.PRODUCE, version, 7, len(client)) + client + (b"\x00" if flexible else b"")
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(struct.pack(">i", len(head) + len(body)) + head + body)
        size = struct.unpack(">i", _exactly(s, 4))[0]
        answer = _exactly(s, size)
    response = schema.decode_response(ApiKey.PRODUCE, version, answer[5 if flexible else 4:])  # after the header
    return response["responses"][0]["partition_responses"][0]


def _exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "the broker closed the connection"
        out += chunk
    return out


def end_offset(bootstrap: str, topic: str) -> int:
    with Consumer(bootstrap) as c:
        return c.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]


def make_topic(bootstrap: str, topic: str, **config) -> None:
    with Admin(bootstrap) as a:
        a.create_topic(topic, 1, config=config)


def test_keyless_records_on_a_compacted_topic_fail_alone_as_librdkafka_expects(bootstrap, topic):
    """librdkafka's 0011 (test_message_single_partition_record_fail, variation 1): in one batch,
    the keyless records fail with INVALID_RECORD (listed by index), their keyed neighbours with
    _INVALID_DIFFERENT_RECORD; nothing is appended."""
    make_topic(bootstrap, topic, **{"cleanup.policy": "compact"})
    p = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 200, "batch.num.messages": 100})
    reports = []
    for i in range(10):
        p.produce(topic, key=None if i % 3 == 0 else b"k%d" % i, value=b"v", partition=0,
                  on_delivery=lambda e, m: reports.append((e, m)))
    assert p.flush(60) == 0
    codes = {m.key(): e.code() if e else None for e, m in reports}
    assert codes[None] == KafkaError.INVALID_RECORD
    assert {c for k, c in codes.items() if k is not None} == {KafkaError._INVALID_DIFFERENT_RECORD}, codes
    assert end_offset(bootstrap, topic) == 0
    # the keyed records alone are taken
    p.produce(topic, key=b"k", value=b"v", partition=0)
    assert p.flush(60) == 0
    assert end_offset(bootstrap, topic) == 1


def test_per_record_errors_name_each_keyless_record_on_the_wire(bootstrap, topic):
    make_topic(bootstrap, topic, **{"cleanup.policy": "compact"})
    body = b"".join(record(None if i in (1, 4) else b"k", b"v", i) for i in range(6))
    part = raw_produce(bootstrap, topic, bytes(batch(body, 6, "gzip")))
    assert part["error_code"] == ErrorCode.INVALID_RECORD
    assert [e["batch_index"] for e in part["record_errors"]] == [1, 4]
    assert all("without a key" in e["batch_index_error_message"] for e in part["record_errors"])
    assert "records 1, 4" in part["error_message"]
    assert raw_produce(bootstrap, topic, bytes(batch(body, 6)), version=7)["error_code"] == ErrorCode.INVALID_RECORD


def test_a_batch_claiming_two_billion_records_is_refused_and_offsets_do_not_jump(bootstrap, topic):
    make_topic(bootstrap, topic)
    part = raw_produce(bootstrap, topic, bytes(batch(record(None, b"x"), 2**31 - 1)))
    assert part["error_code"] == ErrorCode.INVALID_RECORD, part
    assert "2147483647" in part["error_message"]
    assert raw_produce(bootstrap, topic, bytes(batch(record(None, b"x"), 1)))["error_code"] == 0
    assert end_offset(bootstrap, topic) == 1


@pytest.mark.parametrize("bad, code", [
    (batch(b"\xff\xff\xff\xff\x7f" + b"\x00" * 8, 1), ErrorCode.INVALID_RECORD),  # varint overflow
    (batch(record(None, b"x") + record(None, b"y", 1), 1), ErrorCode.INVALID_RECORD),  # more records than counted
    (batch(record(None, b"plain"), 1, "zstd", compress=False), ErrorCode.CORRUPT_MESSAGE),  # codec bits, raw bytes
])
def test_malformed_records_are_refused_with_kafkas_codes(bootstrap, topic, bad, code):
    make_topic(bootstrap, topic)
    part = raw_produce(bootstrap, topic, bytes(bad))
    assert part["error_code"] == code, part
    assert end_offset(bootstrap, topic) == 0


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_a_compression_bomb_is_refused_at_produce_naming_the_bound(kafka_broker, bootstrap, topic, codec):
    make_topic(bootstrap, topic)
    handlers = [kafka_broker.actor_process(a["name"]) for a in kafka_broker.status()["actors"]
                if a["name"].startswith("handler")]
    assert handlers
    before = sum(p.memory_info().rss for p in handlers)
    started = time.monotonic()
    records = bytes(bomb(codec))
    assert len(records) < 1 << 20  # within the broker's message.max.bytes: only its inflated size is wrong
    part = raw_produce(bootstrap, topic, records)
    assert part["error_code"] == ErrorCode.MESSAGE_TOO_LARGE, part
    assert f"beyond {64 << 20} bytes" in part["error_message"] and f"{topic}-0" in part["error_message"]
    assert time.monotonic() - started < 20
    grown = sum(p.memory_info().rss for p in handlers) - before
    assert grown < 100 << 20, f"the handlers grew by {grown >> 20} MiB"
    assert end_offset(bootstrap, topic) == 0


BROKEN_SECOND = {  # behind a good CRC, on a topic that is not compacted (issue 27 item 4)
    "a broken inner varint": SECOND["an offsetDelta varint longer than 5 bytes"],
    "a header with a negative key length": SECOND["a header with a negative key length"],
    "a record that ends early": SECOND["a record that ends early (its length holds two more bytes)"],
}


@pytest.mark.parametrize("version", [3, 9])
@pytest.mark.parametrize("case", list(BROKEN_SECOND))
def test_a_malformed_record_on_a_plain_topic_is_refused_and_readers_go_on(bootstrap, topic, case, version):
    """Kafka parses every record of a produced batch (DefaultRecord.readFrom) on every topic:
    the second record's fields are broken behind a good CRC, so the batch is refused with
    INVALID_RECORD naming the record and nothing is stored; a consumer then reads what comes
    next instead of stopping at a batch it cannot decode."""
    make_topic(bootstrap, topic)
    part = raw_produce(bootstrap, topic, bytes(batch(GOOD + BROKEN_SECOND[case] + TAIL, 3)), version)
    assert part["error_code"] == ErrorCode.INVALID_RECORD, part
    if version >= 8:  # error_message came in v8
        assert f"{topic}-0" in part["error_message"] and "record 1" in part["error_message"], part
    assert end_offset(bootstrap, topic) == 0
    fine = batch(GOOD + record(b"k1", b"v", 1), 2)
    assert raw_produce(bootstrap, topic, bytes(fine), version)["error_code"] == 0
    assert [m.key() for m in kafka_consume(bootstrap, topic, 0, 2)] == [b"k0", b"k1"]
