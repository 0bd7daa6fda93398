"""The HTTP proxy judged with ``requests`` (what a person with curl sees) and confluent-kafka
reading what it produced: v3 produce of JSON, binary, string and registry-encoded (Avro, JSON
Schema) values, v2 consumer instances, and Confluent's error codes. One broker for the module
(no SASL: the proxy is open on loopback); tests keep apart by topic and group names."""
from __future__ import annotations

import base64
import json
import struct
import time
import uuid

import pytest
import requests

from odradek import Admin

pytest.importorskip("fastavro")
from confluent_kafka import Consumer  # noqa: E402
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer  # noqa: E402
from confluent_kafka.schema_registry.json_schema import JSONDeserializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

V2 = "application/vnd.kafka.v2+json"
USER = {"type": "record", "name": "User", "namespace": "test",
        "fields": [{"name": "name", "type": "string"}, {"name": "favorite", "type": "long"}]}


@pytest.fixture(scope="module")
def proxy(shared_broker) -> str:
    url = shared_broker.http_proxy_url
    assert url, "the broker printed no http proxy line"
    return url


@pytest.fixture(scope="module")
def cluster(proxy) -> str:
    answer = requests.get(f"{proxy}/v3/clusters", timeout=30).json()
    return answer["data"][0]["cluster_id"]


def new_topic(broker, partitions: int = 1) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions)
    return name


def produce(proxy: str, cluster: str, topic: str, body, **kw) -> requests.Response:
    return requests.post(f"{proxy}/v3/clusters/{cluster}/topics/{topic}/records", json=body, timeout=60, **kw)


def consume_all(broker, topic: str, count: int) -> list:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = []
    try:
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg)
    finally:
        consumer.close()
    return got


def test_the_cluster_and_its_topics_are_listed(shared_broker, proxy, cluster):
    topic = new_topic(shared_broker, partitions=3)
    listed = requests.get(f"{proxy}/v3/clusters", timeout=30)
    assert listed.status_code == 200 and listed.json()["kind"] == "KafkaClusterList"
    one = requests.get(f"{proxy}/v3/clusters/{cluster}/topics/{topic}", timeout=30).json()
    assert (one["topic_name"], one["partitions_count"], one["replication_factor"]) == (topic, 3, 1)
    names = [t["topic_name"] for t in requests.get(f"{proxy}/v3/clusters/{cluster}/topics", timeout=30).json()["data"]]
    assert topic in names
    assert topic in requests.get(f"{proxy}/topics", timeout=30).json()


def test_json_binary_and_string_records_are_read_back_by_confluent_kafka(shared_broker, proxy, cluster):
    topic = new_topic(shared_broker, partitions=2)
    answers = [
        produce(proxy, cluster, topic, {"key": {"type": "STRING", "data": "k1"},
                                        "value": {"type": "JSON", "data": {"n": 1, "s": "é"}}}),
        produce(proxy, cluster, topic, {"partition_id": 1, "value": {"type": "BINARY",
                                                                     "data": base64.b64encode(b"\0\xff").decode()},
                                        "headers": [{"name": "h", "value": base64.b64encode(b"hv").decode()}],
                                        "timestamp": "2026-11-28T12:00:00.250Z"}),
        produce(proxy, cluster, topic, {"value": {"type": "STRING", "data": "plain text"}}),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    first, second = answers[0].json(), answers[1].json()
    assert first["error_code"] == 200 and first["topic_name"] == topic and first["cluster_id"] == cluster
    assert first["key"] == {"type": "STRING", "size": 2} and first["value"]["type"] == "JSON"
    assert (second["partition_id"], second["key"]) == (1, None) and isinstance(second["offset"], int)
    assert second["timestamp"] == "2026-11-28T12:00:00.250Z"
    got = {m.value(): m for m in consume_all(shared_broker, topic, 3)}
    assert set(got) == {json.dumps({"n": 1, "s": "é"}, separators=(",", ":"), ensure_ascii=False).encode(), b"\0\xff", b"plain text"}
    binary = got[b"\0\xff"]
    assert binary.partition() == 1 and binary.headers() == [("h", b"hv")]
    assert binary.timestamp()[1] == 1795867200250
    assert got[b'{"n":1,"s":"\xc3\xa9"}'].key() == b"k1"


def test_avro_and_json_schema_values_are_encoded_with_the_registry(shared_broker, proxy, cluster):
    registry = SchemaRegistryClient({"url": shared_broker.schema_registry_url})
    topic = new_topic(shared_broker)
    avro_id = registry.register_schema(f"{topic}-value", Schema(json.dumps(USER), "AVRO"))
    json_schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    json_id = registry.register_schema(f"{topic}-json", Schema(json.dumps(json_schema), "JSON"))
    by_subject = produce(proxy, cluster, topic, {"value": {"type": "AVRO", "data": {"name": "ann", "favorite": 7}}})
    by_id = produce(proxy, cluster, topic, {"value": {"schema_id": avro_id, "data": {"name": "bo", "favorite": 8}}})
    as_json = produce(proxy, cluster, topic, {"value": {"type": "JSONSCHEMA", "subject": f"{topic}-json",
                                                        "data": {"n": 3}}})
    assert [a.status_code for a in (by_subject, by_id, as_json)] == [200, 200, 200], by_subject.text
    assert by_subject.json()["value"]["type"] == "AVRO" and as_json.json()["value"]["type"] == "JSONSCHEMA"
    avro = AvroDeserializer(registry)
    as_json_schema = JSONDeserializer(json.dumps(json_schema), schema_registry_client=registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = [m.value() for m in consume_all(shared_broker, topic, 3)]
    ids = [struct.unpack(">bI", v[:5]) for v in values]
    assert ids == [(0, avro_id), (0, avro_id), (0, json_id)]
    assert [avro(v, ctx) for v in values[:2]] == [{"name": "ann", "favorite": 7}, {"name": "bo", "favorite": 8}]
    assert as_json_schema(values[2], ctx) == {"n": 3}
    wrong = produce(proxy, cluster, topic, {"value": {"type": "AVRO", "data": {"name": "no favorite"}}})
    assert (wrong.status_code, wrong.json()["error_code"]) == (422, 42201), wrong.text
    invalid = produce(proxy, cluster, topic, {"value": {"type": "JSONSCHEMA", "subject": f"{topic}-json",
                                                        "data": {"n": "three"}}})
    assert (invalid.status_code, invalid.json()["error_code"]) == (422, 42201), invalid.text
    missing = produce(proxy, cluster, topic, {"value": {"type": "AVRO", "subject": "no-such-subject", "data": {}}})
    assert (missing.status_code, missing.json()["error_code"]) == (404, 40401), missing.text


def test_protobuf_values_are_encoded_with_the_registry(shared_broker, proxy, cluster):
    # A schema registered as confluent-kafka's serializer registers it (a serialized
    # descriptor) and one registered as .proto text: both encoded for ProtobufDeserializer.
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from tests.registry.test_registry_protobuf import V1, message_class
    registry = SchemaRegistryClient({"url": shared_broker.schema_registry_url})
    topic = new_topic(shared_broker)
    order = message_class(V1)
    ctx = SerializationContext(topic, MessageField.VALUE)
    ProtobufSerializer(order, registry, {"use.deprecated.format": False})(order(name="x", count=1), ctx)  # registers
    text_id = registry.register_schema(f"{topic}-text", Schema(
        'syntax = "proto3"; package shop; message Order { string name = 1; int64 count = 2; }', "PROTOBUF"))
    by_subject = produce(proxy, cluster, topic, {"value": {"type": "PROTOBUF", "data": {"name": "ann", "count": 7}}})
    as_text = produce(proxy, cluster, topic, {"value": {"schema_id": text_id, "data": {"name": "bo", "count": "8"}}})
    assert [a.status_code for a in (by_subject, as_text)] == [200, 200], by_subject.text + as_text.text
    assert by_subject.json()["value"]["type"] == "PROTOBUF"
    read = ProtobufDeserializer(order, {"use.deprecated.format": False})
    values = [m.value() for m in consume_all(shared_broker, topic, 2)]
    assert [read(v, ctx) for v in values] == [order(name="ann", count=7), order(name="bo", count=8)]
    wrong = produce(proxy, cluster, topic, {"value": {"type": "PROTOBUF", "data": {"nom": "ann"}}})
    assert (wrong.status_code, wrong.json()["error_code"]) == (422, 42201), wrong.text


def v2(proxy: str, method: str, path: str, body=None, accept: str = V2) -> requests.Response:
    return requests.request(method, proxy + path, data=None if body is None else json.dumps(body), timeout=60,
                            headers={"Content-Type": V2, "Accept": accept})


def poll_records(proxy: str, base: str, count: int, fmt: str) -> list:
    got: list = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        answer = v2(proxy, "GET", f"{base}/records?timeout=1000", accept=f"application/vnd.kafka.{fmt}.v2+json")
        assert answer.status_code == 200, answer.text
        got.extend(answer.json())
    return got


def test_a_v2_consumer_instance_reads_commits_and_is_deleted(shared_broker, proxy, cluster):
    topic = new_topic(shared_broker)
    for i in range(3):
        assert produce(proxy, cluster, topic, {"key": {"type": "JSON", "data": i},
                                               "value": {"type": "JSON", "data": {"i": i}}}).status_code == 200
    assert produce(proxy, cluster, topic, {"key": {"type": "STRING", "data": "text"},  # not JSON: as a string
                                           "value": {"type": "BINARY", "data": "/w=="}}).status_code == 200
    group = f"g-{uuid.uuid4().hex[:6]}"
    created = v2(proxy, "POST", f"/consumers/{group}", {"name": "one", "format": "json",
                                                        "auto.offset.reset": "earliest",
                                                        "auto.commit.enable": "false"})
    assert created.status_code == 200, created.text
    assert created.json()["instance_id"] == "one"
    assert created.json()["base_uri"].endswith(f"/consumers/{group}/instances/one")
    again = v2(proxy, "POST", f"/consumers/{group}", {"name": "one", "format": "json"})
    assert (again.status_code, again.json()["error_code"]) == (409, 40902)
    base = f"/consumers/{group}/instances/one"
    assert v2(proxy, "POST", f"{base}/subscription", {"topics": [topic]}).status_code == 204
    assert v2(proxy, "GET", f"{base}/subscription").json() == {"topics": [topic]}
    wrong_format = v2(proxy, "GET", f"{base}/records", accept="application/vnd.kafka.binary.v2+json")
    assert (wrong_format.status_code, wrong_format.json()["error_code"]) == (406, 40601)
    got = poll_records(proxy, base, 4, "json")
    assert [(r["key"], r["value"], r["offset"]) for r in got] == [(i, {"i": i}, i) for i in range(3)] + \
        [("text", "\ufffd", 3)]
    assert v2(proxy, "POST", f"{base}/offsets").status_code == 200
    checker = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": group})
    try:
        from confluent_kafka import TopicPartition as CTP
        assert [tp.offset for tp in checker.committed([CTP(topic, 0)], timeout=30)] == [4]
    finally:
        checker.close()
    assert v2(proxy, "DELETE", base).status_code == 204
    gone = v2(proxy, "GET", f"{base}/records")
    assert (gone.status_code, gone.json()["error_code"]) == (404, 40403)


def test_a_binary_consumer_hands_out_base64_and_max_bytes_splits_answers(shared_broker, proxy, cluster):
    topic = new_topic(shared_broker)
    payloads = [bytes([i]) * 100 for i in range(4)]
    for p in payloads:
        body = {"value": {"type": "BINARY", "data": base64.b64encode(p).decode()}}
        assert produce(proxy, cluster, topic, body).status_code == 200
    group = f"g-{uuid.uuid4().hex[:6]}"
    created = v2(proxy, "POST", f"/consumers/{group}", {"format": "binary", "auto.offset.reset": "earliest"})
    base = f"/consumers/{group}/instances/{created.json()['instance_id']}"
    assert v2(proxy, "POST", f"{base}/subscription", {"topics": [topic]}).status_code == 204
    got: list = []
    sizes = []
    deadline = time.monotonic() + 60
    while len(got) < 4 and time.monotonic() < deadline:
        answer = v2(proxy, "GET", f"{base}/records?timeout=1000&max_bytes=250",
                    accept="application/vnd.kafka.binary.v2+json").json()
        if answer:
            sizes.append(len(answer))
        got.extend(answer)
    assert [base64.b64decode(r["value"]) for r in got] == payloads
    assert max(sizes) <= 2  # 100-byte values, 250 bytes an answer
    assert v2(proxy, "DELETE", base).status_code == 204


def test_bad_requests_get_confluents_error_codes(shared_broker, proxy, cluster):
    topic = new_topic(shared_broker)
    url = f"{proxy}/v3/clusters/{cluster}/topics/{topic}/records"
    cases = {
        "not JSON": requests.post(url, data=b"{nope", headers={"Content-Type": "application/json"}, timeout=30),
        "two objects (streaming)": requests.post(url, data=b'{"value":{"type":"JSON","data":1}}'
                                                          b'{"value":{"type":"JSON","data":2}}', timeout=30),
        "bad base64": produce(proxy, cluster, topic, {"value": {"type": "BINARY", "data": "!!"}}),
        "unknown type": produce(proxy, cluster, topic, {"value": {"type": "XML", "data": "<a/>"}}),
        "bad timestamp": produce(proxy, cluster, topic, {"value": {"type": "JSON", "data": 1}, "timestamp": "soon"}),
        "protobuf": produce(proxy, cluster, topic, {"value": {"type": "PROTOBUF", "schema_id": 1, "data": {}}}),
        "unknown topic": produce(proxy, cluster, f"{topic}-missing", {"value": {"type": "JSON", "data": 1}}),
        "unknown partition": produce(proxy, cluster, topic, {"partition_id": 5, "value": {"type": "JSON", "data": 1}}),
        "unknown cluster": requests.get(f"{proxy}/v3/clusters/nope/topics", timeout=30),
        "unknown endpoint": requests.get(f"{proxy}/v3/nothing", timeout=30),
        "too large": requests.post(url, data=b" " * (4 * 1024 * 1024 + 1), timeout=60),
        "unknown instance": v2(proxy, "GET", "/consumers/nobody/instances/none/records"),
    }
    got = {what: (r.status_code, r.json()["error_code"] if r.content else r.text) for what, r in cases.items()}
    assert got == {"not JSON": (400, 40001), "two objects (streaming)": (400, 40001), "bad base64": (400, 40001),
                   "unknown type": (400, 40001), "bad timestamp": (400, 40001), "protobuf": (400, 40001),
                   "unknown topic": (404, 40401), "unknown partition": (404, 40402),
                   "unknown cluster": (404, 40401), "unknown endpoint": (404, 404), "too large": (413, 41301),
                   "unknown instance": (404, 40403)}
    for what, r in cases.items():
        if r.content:
            assert r.json()["message"], what
    with Admin(shared_broker.bootstrap) as admin:
        assert f"{topic}-missing" not in admin.list_topics()  # the proxy never creates a topic


def test_idle_consumer_instances_end_and_their_number_is_capped(shared_broker, monkeypatch):
    from odradek.observe import proxy_clients
    from odradek.observe.proxy_http import ProxyError
    now = [0.0]
    instances = proxy_clients.Instances(clock=lambda: now[0])
    everyone = proxy_clients.Principal("", shared_broker.bootstrap, {}, b"", 0.0)
    monkeypatch.setattr(proxy_clients, "INSTANCES_MAX", 2)
    try:
        instances.create(everyone, "g-idle", {"name": "a"})
        instances.create(everyone, "g-idle", {"name": "b"})
        with pytest.raises(ProxyError) as full:
            instances.create(everyone, "g-idle", {"name": "c"})
        assert (full.value.status, full.value.code) == (429, 42901)
        now[0] = proxy_clients.INSTANCE_IDLE - 1
        instances.get(everyone, "g-idle", "b")  # used: b stays
        now[0] = proxy_clients.INSTANCE_IDLE + 1
        instances.expire()
        with pytest.raises(ProxyError) as gone:
            instances.get(everyone, "g-idle", "a")
        assert (gone.value.status, gone.value.code) == (404, 40403)
        assert len(instances) == 1
        instances.create(everyone, "g-idle", {"name": "c"})  # a's place is free again
    finally:
        instances.close()


def test_a_slow_client_does_not_hold_up_the_others(proxy):
    import socket
    from urllib.parse import urlsplit
    where = urlsplit(proxy)
    slow = [socket.create_connection((where.hostname, where.port), timeout=10) for _ in range(20)]
    try:
        for s in slow:  # more half-sent requests than the proxy has worker threads
            s.sendall(b"POST /v3/clusters/odradek/topics/x/records HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        began = time.monotonic()
        assert requests.get(f"{proxy}/v3/clusters", timeout=10).status_code == 200
        assert time.monotonic() - began < 5
    finally:
        for s in slow:
            s.close()
