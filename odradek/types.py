"""The client's value types: small immutable named tuples, safe to share between threads.

Pure (no I/O, no state). ``Record`` is built in bulk by the consumer's decoder (see
``odradek.consumer``); the others are built once per call or per batch.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence


class TopicPartition(NamedTuple):
    """A partition of a topic: what a consumer is assigned and a producer writes to."""

    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. ``offset`` is -1 for acks=0 (the broker does not
    answer). ``timestamp`` is the record's CreateTime, or the broker's LogAppendTime when the
    topic uses ``message.timestamp.type=LogAppendTime``."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class Record(NamedTuple):
    """One consumed record. ``headers`` is a sequence of ``(str, bytes)`` pairs (a tuple;
    empty when the record has none); ``key`` and ``value`` are bytes or None."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: Sequence


class BrokerMetadata(NamedTuple):
    node_id: int
    host: str
    port: int


class PartitionMetadata(NamedTuple):
    """One partition as the controller sees it. ``leader`` is -1 when there is none."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple
    isr: tuple
    error_code: int


class TopicDescription(NamedTuple):
    """``Admin.describe_topic``: partitions with leaders and replicas, and the topic's configs
    (name -> value, as strings, as the broker reports them)."""

    name: str
    is_internal: bool
    partitions: tuple  # of PartitionMetadata, by index
    configs: dict


class ConfigEntry(NamedTuple):
    """One config as DescribeConfigs reports it; ``source`` is e.g. "default", "topic",
    "static_broker", "dynamic_broker"."""

    name: str
    value: Optional[str]
    source: str
    read_only: bool
