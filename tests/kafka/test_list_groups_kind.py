"""Group semantics as Kafka has them, found by librdkafka's regression suite (0081, 0099):
an Empty group that had consumers is listed as a consumer group; a commit beyond the log's
end is taken."""
from __future__ import annotations

import time
import uuid


def test_a_group_whose_consumers_left_is_listed_as_a_consumer_group(bootstrap, topic):
    """ListGroups named it a simple group (protocol type ''): librdkafka's 0081,
    ListConsumerGroups, "expected a normal group, got a simple group"."""
    from confluent_kafka import Consumer, ConsumerGroupState, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, value=b"x")
    assert p.flush(30) == 0
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and not m.error():
            break
    c.commit(asynchronous=False)
    c.close()  # the last member leaves: the group is Empty

    listed = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = admin.list_consumer_groups().result(30)
        listed = {g.group_id: g for g in result.valid}
        if group in listed and listed[group].state == ConsumerGroupState.EMPTY:
            break
        time.sleep(0.5)
    assert listed[group].state == ConsumerGroupState.EMPTY
    assert not listed[group].is_simple_consumer_group


def test_a_kafka_client_commits_an_offset_beyond_the_log_end(bootstrap, topic):
    """Kafka takes any offset >= 0 in OffsetCommit (the consumer resets when it fetches
    there): librdkafka's regression tests 0099 and 0081 (AlterConsumerGroupOffsets,
    ListConsumerGroupOffsets, DeleteConsumerGroupOffsets) commit 10..40 on empty topics.
    The native protocol's commit keeps its high-watermark check."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 40)], asynchronous=False)
        got = c.committed([TopicPartition(topic, 0)], timeout=30)
        assert got[0].offset == 40 and not got[0].error
    finally:
        c.close()
