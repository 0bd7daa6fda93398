"""A Fetch naming a topic twice, apart (A, B, A), as librdkafka sends when a subscription
grows (its regression test 0050, subscribe_adds): every partition gets its own records.
The fetch actor grouped its answer by topic (A: p0, p1; B: p0) while the file regions went
in the request's order (A0, B0, A1): the regions did not add up to a partition's size, and
the answer was UNKNOWN_SERVER_ERROR ("file regions of N bytes for a partition's M")."""
from __future__ import annotations

import time
import uuid

from odradek.core.kafka import schema
from odradek.core.protocol import ApiKey
from tests.kafka.test_fuzz_apis import exchange, request_bytes, unknown_server_errors


def test_a_fetch_naming_a_topic_twice_gets_each_partitions_records(bootstrap):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    a, b = f"order-a-{uuid.uuid4().hex[:6]}", f"order-b-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(a, 2, 1), NewTopic(b, 1, 1)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for topic, partition, n in ((a, 0, 3), (b, 0, 5), (a, 1, 7)):
        for i in range(n):
            p.produce(topic, value=b"%s-%d-%d" % (topic.encode(), partition, i), partition=partition)
        p.flush(30)
    assert p.flush(30) == 0
    topic_ids = {t: admin.list_topics(t, timeout=30).topics[t] for t in (a, b)}
    assert all(not t.error for t in topic_ids.values())

    def part(i):
        return {"partition": i, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}
    body = schema.encode_request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 24, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": a, "partitions": [part(0)]}, {"topic": b, "partitions": [part(0)]},
                   {"topic": a, "partitions": [part(1)]}], "forgotten_topics_data": []})
    frames, alive = exchange(bootstrap, request_bytes(ApiKey.FETCH, 12, 1, body))
    assert alive
    raw = [f for c, f in frames if c == 1][0]
    answer = schema.decode_response(ApiKey.FETCH, 12, raw[1:])  # after the header's tagged fields
    assert not unknown_server_errors(answer), answer
    counts = {}
    for t in answer["responses"]:
        for q in t["partitions"]:
            assert q["error_code"] == 0, q
            counts[(t["topic"], q["partition_index"])] = q["records"].count(b"%s-%d-" % (t["topic"].encode(),
                                                                                      q["partition_index"]))
    assert counts == {(a, 0): 3, (b, 0): 5, (a, 1): 7}


def test_a_fetch_answer_stays_within_fetch_max_bytes(bootstrap):
    """KIP-74: only the answer's first batch may pass fetch.max.bytes. A second partition's
    900 KiB batch was added past the 1 MB bound (1,843,824 bytes), and librdkafka, whose
    receive.message.max.bytes was the bound plus 512, dropped the connection each time and
    read nothing (its regression test 0082, fetch_max_bytes)."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    topic = f"maxbytes-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for partition in (0, 1):
        for i in range(3):
            p.produce(topic, value=bytes([i]) * (900 * 1024), partition=partition)
            p.flush(30)
    assert p.flush(30) == 0
    def part(i):
        return {"partition": i, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 20000000}
    body = schema.encode_request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1000000, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": topic, "partitions": [part(0), part(1)]}], "forgotten_topics_data": []})
    frames, alive = exchange(bootstrap, request_bytes(ApiKey.FETCH, 12, 1, body))
    raw = [f for c, f in frames if c == 1][0]
    answer = schema.decode_response(ApiKey.FETCH, 12, raw[1:])
    sizes = [len(q["records"] or b"") for t in answer["responses"] for q in t["partitions"]]
    assert 900 * 1024 < sum(sizes) <= 1000000, sizes  # one batch (the first may pass the bound alone)

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest",
                  "max.partition.fetch.bytes": 20000000, "fetch.max.bytes": 1000000,
                  "receive.message.max.bytes": 1000512})
    try:
        c.subscribe([topic])
        got, deadline = 0, time.monotonic() + 30
        while got < 6 and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and not m.error():
                got += 1
        assert got == 6
    finally:
        c.close()
