"""The schema registry judged by confluent-kafka's SchemaRegistryClient and its Avro and JSON
serializers, producing and consuming through the same broker, and by raw HTTP for the error
codes (one broker for the module)."""
from __future__ import annotations

import json
import uuid

import pytest

from tests.registry.client import CONTENT_TYPE, http

pytest.importorskip("fastavro")
from confluent_kafka import Consumer, KafkaException, Producer  # noqa: E402
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

USER_V1 = {"type": "record", "name": "User", "namespace": "test",
           "fields": [{"name": "name", "type": "string"}, {"name": "favorite", "type": "long"}]}
USER_V2 = {**USER_V1, "fields": USER_V1["fields"] + [{"name": "email", "type": ["null", "string"], "default": None}]}
USER_BAD = {**USER_V1, "fields": USER_V1["fields"] + [{"name": "age", "type": "int"}]}  # no default


@pytest.fixture(scope="module")
def registry(shared_broker) -> str:
    url = shared_broker.schema_registry_url
    assert url, "the broker printed no schema registry line"
    return url


def topic() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def roundtrip(broker, name: str, serializer, deserializer, values: list) -> list:
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for v in values:
        producer.produce(name, value=serializer(v, SerializationContext(name, MessageField.VALUE)))
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": name, "auto.offset.reset": "earliest"})
    consumer.subscribe([name])
    got = []
    try:
        for _ in range(120):
            if len(got) == len(values):
                break
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got.append(deserializer(msg.value(), SerializationContext(name, MessageField.VALUE)))
    finally:
        consumer.close()
    return got


def test_avro_serializer_and_deserializer_through_the_broker(shared_broker, registry):
    client = SchemaRegistryClient({"url": registry})
    name = topic()
    values = [{"name": f"user{i}", "favorite": i} for i in range(5)]
    got = roundtrip(shared_broker, name, AvroSerializer(client, json.dumps(USER_V1)),
                    AvroDeserializer(client), values)
    assert got == values
    assert f"{name}-value" in client.get_subjects()
    latest = client.get_latest_version(f"{name}-value")
    assert latest.version == 1 and json.loads(latest.schema.schema_str) == USER_V1


def test_evolution_is_accepted_or_refused_with_409_as_the_compatibility_level_says(registry):
    client = SchemaRegistryClient({"url": registry})
    subject = f"{topic()}-value"
    first = client.register_schema(subject, Schema(json.dumps(USER_V1), "AVRO"))
    assert client.register_schema(subject, Schema(json.dumps(USER_V2), "AVRO")) != first
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(USER_BAD), "AVRO"))
    assert refused.value.http_status_code == 409 and refused.value.error_code == 409
    assert not client.test_compatibility(subject, Schema(json.dumps(USER_BAD), "AVRO"))
    assert client.set_compatibility(subject, "NONE") == {"compatibility": "NONE"}
    assert client.get_compatibility(subject) == "NONE"
    client.register_schema(subject, Schema(json.dumps(USER_BAD), "AVRO"))
    assert client.get_versions(subject) == [1, 2, 3]


def test_json_schema_serializer_through_the_broker(shared_broker, registry):
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    client = SchemaRegistryClient({"url": registry})
    schema = json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
                         "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
                         "required": ["id"]})
    values = [{"id": i, "item": f"thing {i}"} for i in range(3)]
    got = roundtrip(shared_broker, topic(), JSONSerializer(schema, client), JSONDeserializer(schema, schema_registry_client=client), values)
    assert got == values


def test_error_codes_as_confluent_answers_them(registry):
    status, answer, ctype = http(registry, "GET", "/subjects/no-such-subject/versions")
    assert (status, answer["error_code"]) == (404, 40401) and ctype == CONTENT_TYPE
    status, answer, _ = http(registry, "POST", "/subjects/bad/versions", {"schema": '{"type": "nope"}'})
    assert (status, answer["error_code"]) == (422, 42201) and "nope" in answer["message"]
    status, answer, _ = http(registry, "POST", "/subjects/bad/versions", raw=b"{not json")
    assert status == 400 and "not JSON" in answer["message"]
    status, answer, _ = http(registry, "GET", "/schemas/ids/987654")
    assert (status, answer["error_code"]) == (404, 40403)
    subject = f"{topic()}-value"
    assert http(registry, "POST", f"/subjects/{subject}/versions", {"schema": json.dumps(USER_V1)})[0] == 200
    assert http(registry, "GET", f"/subjects/{subject}/versions/9")[1]["error_code"] == 40402
    assert http(registry, "GET", f"/subjects/{subject}/versions/zero")[1]["error_code"] == 42202



def test_a_body_over_the_bound_is_refused_from_its_headers_and_the_registry_keeps_serving(registry):
    """waitress answers 413 on a Content-Length over MAX_BODY before reading the body."""
    import socket
    from urllib.parse import urlsplit

    from odradek.coordinator.registry_http import MAX_BODY
    where = urlsplit(registry)
    with socket.create_connection((where.hostname, where.port), timeout=30) as s:
        s.sendall(b"POST /subjects/big/versions HTTP/1.1\r\nHost: x\r\nContent-Type: " + CONTENT_TYPE.encode()
                  + b"\r\nContent-Length: %d\r\n\r\n{\"schema\": \"xxxx" % (MAX_BODY + 1))
        assert s.recv(4096).startswith(b"HTTP/1.1 413 ")
    assert http(registry, "GET", "/subjects")[0] == 200


def test_lookup_ids_deletes_config_and_mode_over_raw_http(registry):
    subject = f"{topic()}-value"
    schema_id = http(registry, "POST", f"/subjects/{subject}/versions", {"schema": json.dumps(USER_V1)})[1]["id"]
    found = http(registry, "POST", f"/subjects/{subject}", {"schema": json.dumps(USER_V1)})[1]
    assert (found["id"], found["version"], found["subject"]) == (schema_id, 1, subject)
    assert {"subject": subject, "version": 1} in http(registry, "GET", f"/schemas/ids/{schema_id}/versions")[1]
    assert http(registry, "GET", "/config")[1] == {"compatibilityLevel": "BACKWARD"}
    assert http(registry, "PUT", f"/config/{subject}", {"compatibility": "FULL"})[1] == {"compatibility": "FULL"}
    assert http(registry, "GET", f"/config/{subject}")[1] == {"compatibilityLevel": "FULL"}
    assert http(registry, "PUT", "/config", {"compatibility": "BOGUS"})[1]["error_code"] == 42203
    assert http(registry, "GET", "/mode")[1] == {"mode": "READWRITE"}
    check = http(registry, "POST", f"/compatibility/subjects/{subject}/versions/latest?verbose=true",
                 {"schema": json.dumps(USER_BAD)})[1]
    assert check["is_compatible"] is False and check["messages"]
    assert http(registry, "DELETE", f"/subjects/{subject}?permanent=true")[1]["error_code"] == 40405
    assert http(registry, "DELETE", f"/subjects/{subject}")[1] == [1]
    assert http(registry, "GET", f"/subjects/{subject}/versions")[1]["error_code"] == 40401
    assert subject in http(registry, "GET", "/subjects?deleted=true")[1]
    assert http(registry, "DELETE", f"/subjects/{subject}?permanent=true")[1] == [1]
    assert subject not in http(registry, "GET", "/subjects?deleted=true")[1]


def test_clients_cannot_write_the_schemas_topic(shared_broker, registry):
    http(registry, "POST", f"/subjects/{topic()}/versions", {"schema": '"string"'})  # _schemas exists now
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap, "message.send.max.retries": 0})
    errors = []
    producer.produce("_schemas", key=b'{"keytype":"SCHEMA"}', value=b"{}",
                     on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert errors and errors[0] is not None, "a client wrote the registry's topic"


def test_protobuf_and_json_schema_registration_and_evolution_over_raw_http(registry):
    subject = f"{topic()}-value"
    v1 = 'syntax = "proto3";\npackage demo;\nmessage Order { int64 id = 1; string item = 2; }\n'
    v2 = v1.replace("string item = 2;", "string item = 2; int32 count = 3;")
    bad = v1.replace("string item = 2;", "double item = 2;")
    assert http(registry, "POST", f"/subjects/{subject}/versions", {"schema": v1, "schemaType": "PROTOBUF"})[0] == 200
    assert http(registry, "POST", f"/subjects/{subject}/versions", {"schema": v2, "schemaType": "PROTOBUF"})[0] == 200
    status, answer, _ = http(registry, "POST", f"/subjects/{subject}/versions", {"schema": bad, "schemaType": "PROTOBUF"})
    assert (status, answer["error_code"]) == (409, 409) and "field 2" in answer["message"]
    status, answer, _ = http(registry, "POST", f"/subjects/{subject}/versions",
                             {"schema": "message {", "schemaType": "PROTOBUF"})
    assert (status, answer["error_code"]) == (422, 42201)
    got = http(registry, "GET", f"/subjects/{subject}/versions/latest")[1]
    assert got["schemaType"] == "PROTOBUF" and "count = 3" in got["schema"]

    subject = f"{topic()}-value"
    closed = {"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": False}
    wider = {**closed, "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}}
    required = {**wider, "required": ["note"]}
    for schema, status in ((closed, 200), (wider, 200), (required, 409)):
        assert http(registry, "POST", f"/subjects/{subject}/versions",
                    {"schema": json.dumps(schema), "schemaType": "JSON"})[0] == status, schema


def test_concurrent_registrations_get_one_id_per_schema_and_never_one_id_twice(registry):
    """Writes run one at a time on the actor's loop: 24 requests at once, 8 distinct schemas
    (each sent three times, under three subjects)."""
    from concurrent.futures import ThreadPoolExecutor
    base = topic()
    schemas = [json.dumps({"type": "record", "name": f"C{i}", "fields": [{"name": "x", "type": "int"}]})
               for i in range(8)]
    jobs = [(f"{base}-{copy}-value", i) for i in range(8) for copy in range(3)]

    def register(job):
        subject, i = job
        status, answer, _ = http(registry, "POST", f"/subjects/{subject}-{i}/versions", {"schema": schemas[i]})
        assert status == 200, answer
        return i, answer["id"]

    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(register, jobs))
    ids = {}
    for i, schema_id in got:
        ids.setdefault(i, set()).add(schema_id)
    assert all(len(v) == 1 for v in ids.values()), ids  # one id per schema, whichever subject
    assert len({next(iter(v)) for v in ids.values()}) == 8  # and no id shared by two schemas
