"""Authorization reads every version of every Kafka API the broker serves: for each API and
version of the Kafka table (``core.kafka.apis.REGISTRY``), a request built from Kafka's
schema (kio) with every string field set to a marker naming it and one element in every
array is encoded, decoded and translated to its internal body as a client's would be, and
``authorizer.requirements`` must name the resources the request is about (the group, topic
and transactional id fields it carries), never a missing one ('None'). Issue 27 item 7:
OffsetFetch v8+ carries its group in ``groups[].group_id``, and the authorizer read the
absent top-level ``group_id``, so librdkafka's consumer was refused ``Describe on Group 'None'``."""
from __future__ import annotations

import dataclasses
import typing
import uuid

import pytest

from odradek.network import authorizer as az
from odradek.core.kafka import apis, schema
from odradek.core.protocol import ApiKey

# The resource types each API's requirements must name, at every version served.
EXPECTED = {
    ApiKey.PRODUCE: {"Topic"}, ApiKey.FETCH: {"Topic"}, ApiKey.LIST_OFFSETS: {"Topic"},
    ApiKey.OFFSET_FOR_LEADER_EPOCH: {"Topic"},
    ApiKey.OFFSET_COMMIT: {"Group", "Topic"}, ApiKey.OFFSET_FETCH: {"Group", "Topic"},
    ApiKey.FIND_COORDINATOR: {"Group"}, ApiKey.JOIN_GROUP: {"Group"}, ApiKey.SYNC_GROUP: {"Group"},
    ApiKey.HEARTBEAT: {"Group"}, ApiKey.LEAVE_GROUP: {"Group"}, ApiKey.DESCRIBE_GROUPS: {"Group"},
    ApiKey.DELETE_GROUPS: {"Group"}, ApiKey.CONSUMER_GROUP_HEARTBEAT: {"Group"},
    ApiKey.CONSUMER_GROUP_DESCRIBE: {"Group"},
    ApiKey.INIT_PRODUCER_ID: {"TransactionalId"}, ApiKey.END_TXN: {"TransactionalId"},
    ApiKey.ADD_PARTITIONS_TO_TXN: {"TransactionalId", "Topic"},
    ApiKey.ADD_OFFSETS_TO_TXN: {"TransactionalId", "Group"},
    ApiKey.TXN_OFFSET_COMMIT: {"TransactionalId", "Group", "Topic"},
    ApiKey.DESCRIBE_TRANSACTIONS: {"TransactionalId"}, ApiKey.DESCRIBE_PRODUCERS: {"Topic"},
    ApiKey.CREATE_TOPICS: {"Topic"}, ApiKey.DELETE_TOPICS: {"Topic"}, ApiKey.DELETE_RECORDS: {"Topic"},
    ApiKey.CREATE_PARTITIONS: {"Topic"},
}


def _sample(hint, kafka_type, name: str):
    """A value of a kio field: strings name their field, arrays hold one element (but
    CreateTopics' explicit assignments, which would conflict with its counts), numbers are -1
    (a consumer's replica id; FindCoordinator's key type then means a group)."""
    if name == "assignments":
        return []
    args = typing.get_args(hint)
    if type(None) in args:
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return [_sample(typing.get_args(hint)[0], kafka_type, name)]
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return {f.name: _sample(hints[f.name], f.metadata.get("kafka_type"), f.name) for f in dataclasses.fields(hint)}
    if hint is str or kafka_type == "string":
        return f"s-{name}"
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if hint is bool or kafka_type == "bool":
        return False
    if kafka_type == "float64":
        return 0.0
    return -1 if kafka_type in ("int8", "int16", "int32", "int64") else 0


def _strings(value) -> set:
    if isinstance(value, dict):
        return set().union(*map(_strings, value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*map(_strings, value)) if value else set()
    return {value} if isinstance(value, str) else set()


CASES = [(key, version) for key, api in sorted(apis.REGISTRY.items()) if api.to_internal and key in EXPECTED
         for version in range(api.min_version, api.max_version + 1) if schema.known(key, version)]


@pytest.mark.parametrize("key,version", CASES, ids=[f"{ApiKey(k).name}-v{v}" for k, v in CASES])
def test_requirements_name_what_each_version_of_each_api_carries(key, version):
    cls = schema.request_class(key, version)
    hints = typing.get_type_hints(cls)
    sample = {f.name: _sample(hints[f.name], f.metadata.get("kafka_type"), f.name) for f in dataclasses.fields(cls)}
    wire = (b"\x00" if cls.__flexible__ else b"") + schema.encode_request(key, version, sample)
    request = schema.decode_request(key, version, memoryview(wire))  # what the processor hands on
    api = apis.REGISTRY[key]
    body, _frames = api.to_internal(version, request)
    needs = az.requirements(api.internal or key, body)
    sent = _strings(request)
    for operation, resource, name in needs:
        assert name in sent or (resource, name) == ("Cluster", az.CLUSTER), \
            f"{ApiKey(key).name} v{version}: {operation} on {resource} '{name}', a name the request does not carry"
    assert {resource for _o, resource, _n in needs} >= EXPECTED[key], \
        f"{ApiKey(key).name} v{version} needs {needs}, nothing on {EXPECTED[key]}"


def test_describe_cluster_is_free_as_in_kafka():
    assert az.requirements(ApiKey.DESCRIBE_CLUSTER, {"include_cluster_authorized_operations": False}) == []


@pytest.mark.parametrize("version", [v for v in range(apis.REGISTRY[ApiKey.PRODUCE].min_version,
                                                     apis.REGISTRY[ApiKey.PRODUCE].max_version + 1)])
def test_a_transactional_produce_needs_write_on_its_transactional_id_at_every_version(version):
    """Issue 27: the Produce's ``transactional_id`` (v3+) reaches the internal body, and a
    request whose batches are transactional needs Write on it, before any topic."""
    from odradek.core import kafka_batch
    from odradek.core.records import Record
    batch = kafka_batch.encode([Record(0, 1, None, b"v", [])], base_offset=0, first_timestamp=1, max_timestamp=1,
                               attributes=kafka_batch.TRANSACTIONAL_BIT, producer_id=7, producer_epoch=0,
                               base_sequence=0)
    request = {"transactional_id": "s-transactional_id", "acks": -1, "timeout": 1000,
               "topic_data": [{"name": "s-name", "partition_data": [{"index": 0, "records": batch}]}]}
    wire = (b"\x00" if version >= 9 else b"") + schema.encode_request(ApiKey.PRODUCE, version, request)
    body, frames = apis.REGISTRY[ApiKey.PRODUCE].to_internal(version, apis.decode_produce(version, memoryview(wire)))
    assert az.has_transactional_batch(frames)
    assert az.requirements(ApiKey.PRODUCE, body, transactional=True) == [
        ("Write", "TransactionalId", "s-transactional_id"), ("Write", "Topic", "s-name")]
    plain = kafka_batch.encode([Record(0, 1, None, b"v", [])], base_offset=0, first_timestamp=1, max_timestamp=1)
    assert not az.has_transactional_batch([plain, plain + batch[:20]])  # a torn tail is left to validation
    assert az.has_transactional_batch([plain + batch])  # a transactional batch after a plain one counts
