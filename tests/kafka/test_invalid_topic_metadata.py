"""Metadata for a topic name Kafka would never create, with automatic creation on, answers
INVALID_TOPIC_EXCEPTION, as Kafka does: it answered LEADER_NOT_AVAILABLE ("being
created"), which librdkafka retries until the messages time out (its regression test 0057,
invalid_topic: "Expected producer to be flushed, 4 messages remain")."""
from __future__ import annotations

import time

import pytest


@pytest.mark.parametrize("name", ["fuzz-invalid$#!", "a" * 250, ".."])
def test_a_producer_to_an_invalid_topic_name_fails_at_once(bootstrap, name):
    from confluent_kafka import KafkaError, Producer
    failed = []
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 60000})
    p.produce(name, value=b"bad", on_delivery=lambda err, msg: failed.append(err))
    began = time.monotonic()
    assert p.flush(15) == 0, "the message is still queued: the broker did not say the name is invalid"
    assert time.monotonic() - began < 15
    assert [e.code() for e in failed] == [KafkaError.TOPIC_EXCEPTION]
