"""aiokafka (the asyncio Kafka client, with protocol code of its own) against one broker:
keyed produce with headers under every codec it supports, consume by assignment and seek,
and its admin client. (Group consumption by every client is tests elsewhere.)"""
from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidPartitionsError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

WAIT = 60
CODECS = [None, "gzip", "snappy", "lz4", "zstd"]  # every codec aiokafka supports


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, WAIT * 2))


async def consume(bootstrap: str, tp: TopicPartition, count: int, seek: int | None = None) -> list:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        if seek is not None:
            consumer.seek(tp, seek)
        out = []
        async with asyncio.timeout(WAIT):
            while len(out) < count:
                batch = await consumer.getmany(tp, timeout_ms=500)
                out.extend(batch.get(tp, []))
        return out
    finally:
        await consumer.stop()


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c or "none")
def test_aiokafka_produces_keyed_records_with_headers_and_reads_them_back(bootstrap, topic, codec):
    async def go():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, acks=1, linger_ms=5)
        await producer.start()
        try:
            futures = [await producer.send(topic, key=b"k%d" % (i % 3), value=b"value-%d" % i,
                                           headers=[("n", str(i).encode()), ("codec", (codec or "none").encode())])
                       for i in range(30)]
            metas = [await f for f in futures]
        finally:
            await producer.stop()
        partitions = {m.partition for m in metas}
        got = []
        for p in sorted(partitions):
            got += await consume(bootstrap, TopicPartition(topic, p), sum(1 for m in metas if m.partition == p))
        return metas, got

    metas, got = run(go())
    assert len(got) == 30
    by_value = {r.value: r for r in got}
    for i in range(30):
        r = by_value[b"value-%d" % i]
        assert r.key == b"k%d" % (i % 3)
        assert list(r.headers) == [("n", str(i).encode()), ("codec", (codec or "none").encode())]


def test_aiokafka_consumer_by_assignment_seeks_to_an_offset(bootstrap, topic):
    async def go():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait(topic, value=b"%d" % i, partition=0)
        finally:
            await producer.stop()
        tp = TopicPartition(topic, 0)
        from_seek = await consume(bootstrap, tp, 5, seek=15)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([tp])
            ends = await consumer.end_offsets([tp])
            begins = await consumer.beginning_offsets([tp])
            await consumer.seek_to_beginning(tp)
            first = await consumer.getone()
        finally:
            await consumer.stop()
        return from_seek, ends[tp], begins[tp], first

    from_seek, end, begin, first = run(go())
    assert [(r.offset, r.value) for r in from_seek] == [(o, b"%d" % o) for o in range(15, 20)]
    assert (begin, end) == (0, 20)
    assert (first.offset, first.value) == (0, b"0")


def test_aiokafka_admin_creates_describes_and_deletes_topics(bootstrap):
    name = f"aio-{uuid.uuid4().hex[:10]}"

    async def go():
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=WAIT * 1000)
        await admin.start()
        try:
            created = await admin.create_topics([NewTopic(name, 3, 1, topic_configs={"retention.ms": "600000"})])
            again = await admin.create_topics([NewTopic(name, 3, 1), NewTopic(f"{name}-x", 0, 1)])
            listed = await admin.list_topics()
            described = await admin.describe_topics([name])
            configs = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, {"segment.ms": "700000"})])
            altered = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
            cluster = await admin.describe_cluster()
            await admin.delete_topics([name])
            after = await admin.list_topics()
            gone = await admin.delete_topics([name])
            return created, again, listed, described, configs, altered, cluster, after, gone
        finally:
            await admin.close()

    created, again, listed, described, configs, altered, cluster, after, gone = run(go())
    assert [(t[0], t[1]) for t in created.topic_errors] == [(name, 0)]
    assert [(t[0], t[1]) for t in again.topic_errors] == [(name, TopicAlreadyExistsError.errno),
                                                         (f"{name}-x", InvalidPartitionsError.errno)]
    assert [(t[0], t[1]) for t in gone.topic_error_codes] == [(name, UnknownTopicOrPartitionError.errno)]
    assert name in listed and name not in after
    assert [len(t["partitions"]) for t in described if t["topic"] == name] == [3]
    [resource] = configs[0].resources
    entries = {c[0]: c[1] for c in resource[4]}
    assert entries["retention.ms"] == "600000"
    [resource] = altered[0].resources
    entries = {c[0]: c[1] for c in resource[4]}
    assert entries["segment.ms"] == "700000"
    assert entries["retention.ms"] == "604800000"  # AlterConfigs replaces: what it left out is back to default
    assert cluster["controller_id"] == 0 and [b["node_id"] for b in cluster["brokers"]] == [0]
