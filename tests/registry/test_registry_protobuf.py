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
