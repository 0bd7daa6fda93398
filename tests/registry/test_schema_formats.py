"""Compatibility per format, without a network: Avro's schema-resolution cases from the Avro
specification ("Schema Resolution"), the common JSON Schema rules, Protobuf's field rules."""
from __future__ import annotations

import json

import pytest

from odradek.coordinator.schema_formats import AVRO, JSON, PROTOBUF, InvalidSchema, incompatibilities, parse


def avro(schema) -> object:
    return parse(AVRO, json.dumps(schema))


def can_read(reader, writer) -> bool:
    return not incompatibilities(avro(reader), avro(writer))


def record(*fields, name="R"):
    return {"type": "record", "name": name, "fields": list(fields)}


# ---- Avro: the specification's cases ---------------------------------------------------------
@pytest.mark.parametrize("writer,reader", [("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"),
                                           ("long", "double"), ("float", "double"), ("string", "bytes"),
                                           ("bytes", "string")])
def test_avro_promotions_the_spec_lists_are_readable_and_not_the_other_way(writer, reader):
    assert can_read(reader, writer)
    if (reader, writer) not in (("string", "bytes"), ("bytes", "string")):
        assert not can_read(writer, reader)


def test_avro_a_reader_field_missing_from_the_writer_needs_a_default():
    old = record({"name": "a", "type": "int"})
    assert not can_read(record({"name": "a", "type": "int"}, {"name": "b", "type": "string"}), old)
    assert can_read(record({"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": ""}), old)


def test_avro_a_writer_field_the_reader_lacks_is_ignored():
    assert can_read(record({"name": "a", "type": "int"}), record({"name": "a", "type": "int"}, {"name": "z", "type": "long"}))


def test_avro_a_field_type_must_resolve_recursively():
    assert not can_read(record({"name": "a", "type": "int"}), record({"name": "a", "type": "string"}))
    assert can_read(record({"name": "a", "type": {"type": "array", "items": "long"}}),
                    record({"name": "a", "type": {"type": "array", "items": "int"}}))


def test_avro_record_names_must_match_unless_aliased():
    assert not can_read(record({"name": "a", "type": "int"}, name="S"), record({"name": "a", "type": "int"}))
    aliased = {"type": "record", "name": "S", "aliases": ["R"], "fields": [{"name": "a", "type": "int"}]}
    assert can_read(aliased, record({"name": "a", "type": "int"}))


def test_avro_enum_symbols_the_reader_lacks_need_its_default():
    w = {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}
    assert not can_read({"type": "enum", "name": "E", "symbols": ["A", "B"]}, w)
    assert can_read({"type": "enum", "name": "E", "symbols": ["A", "B", "X"], "default": "X"}, w)
    assert can_read({"type": "enum", "name": "E", "symbols": ["A", "B", "C", "D"]}, w)


def test_avro_unions_every_writer_branch_must_be_readable():
    assert can_read(["null", "string", "int"], ["null", "string"])
    assert not can_read(["null", "string"], ["null", "string", "int"])
    assert can_read(["null", "long"], "int")  # a non-union writer matches some branch (with promotion)
    assert not can_read("string", ["null", "string"])


def test_avro_fixed_size_and_map_values():
    assert not can_read({"type": "fixed", "name": "F", "size": 8}, {"type": "fixed", "name": "F", "size": 4})
    assert can_read({"type": "map", "values": "double"}, {"type": "map", "values": "float"})


def test_avro_recursive_types_resolve_without_looping():
    node = record({"name": "v", "type": "int"}, {"name": "next", "type": ["null", "R"]})
    assert can_read(node, node)


def test_avro_invalid_schemas_are_refused_with_the_reason():
    for bad in ('{"type": "record", "name": "R"}', '{"type": "nope"}', "not json", '{"type":"enum","name":"E","symbols":[1]}'):
        with pytest.raises(InvalidSchema):
            parse(AVRO, bad)


def test_avro_references_are_named_types_of_other_schemas():
    ref = json.dumps({"type": "record", "name": "Address", "namespace": "x", "fields": [{"name": "city", "type": "string"}]})
    main = json.dumps(record({"name": "home", "type": "x.Address"}, name="Person"))
    with pytest.raises(InvalidSchema):
        parse(AVRO, main)
    assert parse(AVRO, main, [ref]).kind == AVRO


# ---- JSON Schema ------------------------------------------------------------------------------
def js(doc) -> object:
    return parse(JSON, json.dumps(doc))


def test_json_schema_must_be_valid_for_its_draft():
    with pytest.raises(InvalidSchema):
        js({"type": 12})
    with pytest.raises(InvalidSchema):
        parse(JSON, "[1, 2]")


def test_json_adding_a_required_property_or_narrowing_a_type_is_refused():
    old = js({"type": "object", "properties": {"a": {"type": "number"}}, "additionalProperties": False})
    assert incompatibilities(js({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "string"}},
                                 "required": ["b"], "additionalProperties": False}), old)
    assert incompatibilities(js({"type": "object", "properties": {"a": {"type": "integer"}},
                                 "additionalProperties": False}), old)
    assert not incompatibilities(js({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "string"}},
                                     "additionalProperties": False}), old)  # optional, closed model: fine


def test_json_a_property_added_to_an_open_content_model_is_refused():
    assert incompatibilities(js({"type": "object", "properties": {"b": {"type": "string"}}}), js({"type": "object"}))


def test_json_widening_is_compatible():
    assert not incompatibilities(js({"type": ["string", "null"], "maxLength": 20}), js({"type": "string", "maxLength": 10}))
    assert incompatibilities(js({"type": "string", "maxLength": 5}), js({"type": "string", "maxLength": 10}))


# ---- Protobuf ---------------------------------------------------------------------------------
def test_protobuf_a_syntax_error_is_invalid():
    with pytest.raises(InvalidSchema, match="line 1"):
        parse(PROTOBUF, "message { bad")


def test_protobuf_field_kinds_and_removed_messages():
    old = parse(PROTOBUF, 'syntax = "proto3"; message A { int32 a = 1; string s = 2; }')
    assert not incompatibilities(parse(PROTOBUF, 'syntax = "proto3"; message A { int64 a = 1; bytes s = 2; int32 n = 3; }'), old)
    assert incompatibilities(parse(PROTOBUF, 'syntax = "proto3"; message A { string a = 1; }'), old)
    assert incompatibilities(parse(PROTOBUF, 'syntax = "proto3"; message B { int32 a = 1; }'), old)


def test_protobuf_descriptor_of_proto_text_resolves_types_by_scope():
    import base64

    from google.protobuf import descriptor_pb2

    from odradek.coordinator.schema_formats import protobuf_descriptor
    text = """syntax = "proto3"; package a.b; import "google/protobuf/timestamp.proto";
    message Outer { message Inner { Kind kind = 1; } enum Kind { K0 = 0; } Inner inner = 1;
      google.protobuf.Timestamp at = 2; map<string, Inner> by_name = 3; oneof x { string s = 4; int32 i = 5; } }"""
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(protobuf_descriptor(text)))
    outer = fdp.message_type[0]
    fields = {f.name: f for f in outer.field}
    assert fields["inner"].type_name == ".a.b.Outer.Inner" and fields["at"].type_name == ".google.protobuf.Timestamp"
    assert outer.nested_type[0].field[0].type_name == ".a.b.Outer.Kind"  # found in the enclosing scope
    entry = next(n for n in outer.nested_type if n.name == "ByNameEntry")
    assert entry.options.map_entry and fields["by_name"].label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    assert fields["s"].oneof_index == fields["i"].oneof_index == 0 and outer.oneof_decl[0].name == "x"
    assert list(fdp.dependency) == ["google/protobuf/timestamp.proto"]
    # a type from another subject's file cannot be resolved here: no descriptor (the text is answered)
    assert protobuf_descriptor('syntax = "proto3"; import "other.proto"; message M { other.T t = 1; }') is None
    assert protobuf_descriptor(base64.b64encode(fdp.SerializeToString()).decode()) is None  # already one
