"""confluent-kafka's ProtobufSerializer and ProtobufDeserializer through the broker and its
registry (one broker for the module). Their message classes are built at test time from a
FileDescriptorProto (google.protobuf's descriptor_pool and message_factory; no protoc), one
pool per version, as two applications compiled from two .proto versions would have them.
The serializer registers the base64 serialized descriptor; the deserializer asks for it back
with ?format=serialized."""
from __future__ import annotations

import uuid

import pytest

pytest.importorskip("google.protobuf")
from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

from tests.registry.client import http  # noqa: E402
from tests.registry.test_registry_clients import roundtrip  # noqa: E402

F = descriptor_pb2.FieldDescriptorProto
V1 = [("name", 1, F.TYPE_STRING), ("count", 2, F.TYPE_INT64)]
V2 = V1 + [("email", 3, F.TYPE_STRING)]  # a field added: every level accepts it
V3 = [("name", 1, F.TYPE_STRING), ("count", 2, F.TYPE_STRING)]  # field 2's wire type changed


def message_class(fields: list, name: str = "Order", package: str = "shop"):
    """A generated message class, as protoc's output would define it, from a descriptor."""
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{package}/{name.lower()}.proto", package=package, syntax="proto3")
    message = fdp.message_type.add(name=name)
    for field, number, kind in fields:
        message.field.add(name=field, number=number, type=kind, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))


@pytest.fixture(scope="module")
def registry(shared_broker) -> str:
    assert shared_broker.schema_registry_url
    return shared_broker.schema_registry_url


def test_protobuf_serializer_and_deserializer_through_the_broker(shared_broker, registry):
    client = SchemaRegistryClient({"url": registry})
    order = message_class(V1)
    name = f"pb-{uuid.uuid4().hex[:8]}"
    values = [order(name=f"o{i}", count=i) for i in range(4)]
    got = roundtrip(shared_broker, name, ProtobufSerializer(order, client, {"use.deprecated.format": False}),
                    ProtobufDeserializer(order, {"use.deprecated.format": False}, client), values)
    assert got == values
    latest = client.get_latest_version(f"{name}-value")
    assert latest.version == 1 and latest.schema.schema_type == "PROTOBUF"
    # the registered form is the serialized descriptor: asked back as such, it is the class's own
    status, answer, _ = http(registry, "GET", f"/schemas/ids/{latest.schema_id}?format=serialized")
    assert status == 200 and answer["schemaType"] == "PROTOBUF"
    import base64
    assert descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(answer["schema"])) == \
        descriptor_pb2.FileDescriptorProto.FromString(order.DESCRIPTOR.file.serialized_pb)


def test_protobuf_evolution_accepted_and_refused_as_the_level_says(shared_broker, registry):
    client = SchemaRegistryClient({"url": registry})
    name = f"pb-{uuid.uuid4().hex[:8]}"
    ctx = SerializationContext(name, MessageField.VALUE)
    conf = {"use.deprecated.format": False}
    v1, v2, v3 = message_class(V1), message_class(V2), message_class(V3)
    ProtobufSerializer(v1, client, conf)(v1(name="a", count=1), ctx)
    # BACKWARD (the default): a new field is accepted, a field whose wire type changed is refused
    wire = ProtobufSerializer(v2, client, conf)(v2(name="b", count=2, email="b@example.com"), ctx)
    with pytest.raises(SchemaRegistryError) as refused:
        ProtobufSerializer(v3, client, conf)(v3(name="c", count="three"), ctx)
    assert refused.value.http_status_code == 409 and "field 2 changed from int64 to string" in refused.value.error_message
    assert [v for v in client.get_versions(f"{name}-value")] == [1, 2]
    # the v1 application reads what v2 wrote (the new field is an unknown one to it)
    old = ProtobufDeserializer(v1, conf, client)(wire, ctx)
    assert (old.name, old.count) == ("b", 2)
    # NONE: the same change is accepted and gets a version of its own
    client.set_compatibility(f"{name}-value", "NONE")
    ProtobufSerializer(v3, client, conf)(v3(name="c", count="three"), ctx)
    assert client.get_versions(f"{name}-value") == [1, 2, 3]


def test_a_base64_that_is_not_a_descriptor_is_42201(registry):
    status, answer, _ = http(registry, "POST", f"/subjects/pb-{uuid.uuid4().hex[:8]}/versions",
                             {"schema": "AAAA////", "schemaType": "PROTOBUF"})
    assert (status, answer["error_code"]) == (422, 42201), answer


PROTO_TEXT = """syntax = "proto3";
package shop;
message Order {
  string name = 1;
  int64 count = 2;
  repeated Line lines = 3;
  map<string, int32> tags = 4;
  Status status = 5;
  message Line { string sku = 1; int32 qty = 2; }
  enum Status { NEW = 0; PAID = 1; }
}
"""


def test_a_schema_registered_as_proto_text_is_answered_as_a_descriptor_to_the_deserializer(shared_broker, registry):
    """Java's KafkaProtobufSerializer registers .proto text; confluent-kafka's deserializer asks
    for the writer's schema with ?format=serialized and builds its descriptor pool from that:
    a record framed as the Java serializer frames it is read back through the broker."""
    from confluent_kafka import Producer

    name = f"pb-{uuid.uuid4().hex[:8]}"
    status, answer, _ = http(registry, "POST", f"/subjects/{name}-value/versions",
                             {"schema": PROTO_TEXT, "schemaType": "PROTOBUF"})
    assert status == 200, answer
    sid = answer["id"]
    # the text stays the text; serialized, it is a descriptor of the same messages
    assert "message Order" in http(registry, "GET", f"/schemas/ids/{sid}")[1]["schema"]
    import base64
    served = http(registry, "GET", f"/schemas/ids/{sid}?format=serialized")[1]["schema"]
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(served))
    assert fdp.package == "shop" and [m.name for m in fdp.message_type] == ["Order"]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    order = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    value = order(name="java", count=9, tags={"x": 1}, status=1)
    value.lines.add(sku="s-1", qty=2)
    framed = b"\x00" + sid.to_bytes(4, "big") + b"\x00" + value.SerializeToString()  # message index [0]
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap})
    producer.produce(name, value=framed)
    assert producer.flush(30) == 0
    client = SchemaRegistryClient({"url": registry})
    got = _consume_one(shared_broker, name, ProtobufDeserializer(order, {"use.deprecated.format": False}, client))
    assert got == value
    # the subject's version answered serialized too (the serializer's use.latest.version asks for it)
    latest = http(registry, "GET", f"/subjects/{name}-value/versions/latest?format=serialized")[1]
    assert descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(latest["schema"])) == fdp


def _consume_one(broker, topic: str, deserializer):
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                return deserializer(msg.value(), SerializationContext(topic, MessageField.VALUE))
    finally:
        consumer.close()
    raise AssertionError(f"nothing consumed from {topic}")
