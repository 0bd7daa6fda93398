"""The registry's state machine without a network: a write is planned, its records applied
(as the actor does after storing them), and a replay of the same records rebuilds the state."""
from __future__ import annotations

import json

import pytest

from odradek.coordinator.schema_registry import RegistryError, SchemaRegistry

V1 = json.dumps({"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]})
V2_OPTIONAL = json.dumps({"type": "record", "name": "User", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": ["null", "int"], "default": None}]})
V2_REQUIRED = json.dumps({"type": "record", "name": "User", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "int"}]})


class Store:
    """A registry with the records it would have written (the _schemas topic, as a list)."""

    def __init__(self):
        self.reg, self.log = SchemaRegistry(), []

    def write(self, plan):
        for key, value in plan.records:
            assert self.reg.apply(key, value) is None
            self.log.append((key, value))
        return plan.answer

    def replayed(self) -> SchemaRegistry:
        again = SchemaRegistry()
        for key, value in self.log:
            assert again.apply(key, value) is None
        return again


def code(fn, *args) -> int:
    with pytest.raises(RegistryError) as info:
        fn(*args)
    return info.value.code


def test_registering_the_same_schema_twice_answers_the_same_id_and_writes_nothing():
    s = Store()
    assert s.write(s.reg.register("u-value", {"schema": V1})) == {"id": 1}
    plan = s.reg.register("u-value", {"schema": V1})
    assert plan.answer == {"id": 1} and plan.records == []
    assert s.write(s.reg.register("other", {"schema": V1})) == {"id": 1}  # one id per distinct schema
    assert s.reg.versions("other") == [1]


def test_backward_evolution_takes_an_optional_field_and_refuses_a_required_one_with_409():
    s = Store()
    s.write(s.reg.register("u", {"schema": V1}))
    assert code(s.reg.register, "u", {"schema": V2_REQUIRED}) == 409
    assert s.write(s.reg.register("u", {"schema": V2_OPTIONAL})) == {"id": 2}
    assert s.reg.get("u", "latest").version == 2


def test_none_accepts_anything_and_forward_checks_the_other_way():
    s = Store()
    s.write(s.reg.register("u", {"schema": V1}))
    s.write(s.reg.set_level("u", {"compatibility": "NONE"}))
    assert s.write(s.reg.register("u", {"schema": V2_REQUIRED})) == {"id": 2}
    s.write(s.reg.set_level("u", {"compatibility": "FORWARD"}))
    # forward: the latest (v2, age required, as reader) must read the new one (no age): it cannot
    assert code(s.reg.register, "u", {"schema": V1.replace('"string"', '"bytes"')}) == 409
    assert s.reg.check("u", {"schema": V1}) != []
    assert s.reg.level("u") == "FORWARD" and s.reg.level() == "BACKWARD"


def test_transitive_checks_every_version_not_only_the_latest():
    s = Store()
    s.write(s.reg.set_level(None, {"compatibility": "NONE"}))
    s.write(s.reg.register("t", {"schema": '"int"'}))
    s.write(s.reg.register("t", {"schema": '"string"'}))
    s.write(s.reg.set_level(None, {"compatibility": "BACKWARD"}))
    assert s.reg.register("t", {"schema": '"bytes"'}).answer == {"id": 3}  # bytes reads string (latest)
    s.write(s.reg.set_level(None, {"compatibility": "BACKWARD_TRANSITIVE"}))
    assert code(s.reg.register, "t", {"schema": '"bytes"'}) == 409  # but not int (version 1)


def test_error_codes_of_reads():
    s = Store()
    assert code(s.reg.versions, "nope") == 40401
    s.write(s.reg.register("u", {"schema": V1}))
    assert code(s.reg.get, "u", 7) == 40402
    assert code(s.reg.get, "u", "x") == 42202
    assert s.reg.get("u", "-1").version == 1  # -1 is latest, as Confluent reads it
    assert code(s.reg.schema, 99) == 40403
    assert code(s.reg.register, "u", {"schema": '{"type": "nope"}'}) == 42201
    assert code(s.reg.register, "u", {"schema": V1, "schemaType": "XML"}) == 42201
    assert code(s.reg.register, "u", ["not", "an", "object"]) == 42201
    assert code(s.reg.set_level, None, {"compatibility": "SIDEWAYS"}) == 42203
    assert code(s.reg.set_mode, None, {"mode": "WRITEONLY"}) == 42204
    assert code(s.reg.lookup, "u", {"schema": V2_OPTIONAL}) == 40403
    assert s.reg.lookup("u", {"schema": V1})["version"] == 1


def test_soft_then_hard_delete_as_confluent_orders_them():
    s = Store()
    s.write(s.reg.register("u", {"schema": V1}))
    assert code(s.reg.delete_subject, "u", True) == 40405  # not soft-deleted first
    assert s.write(s.reg.delete_subject("u")) == [1]
    assert s.reg.subject_names() == [] and s.reg.subject_names(deleted=True) == ["u"]
    assert code(s.reg.delete_subject, "u") == 40404
    assert s.reg.schema(1)["schema"]  # the id still resolves (records written with it stay readable)
    assert s.write(s.reg.delete_subject("u", True)) == [1]
    assert s.reg.subject_names(deleted=True) == []
    assert s.write(s.reg.register("u", {"schema": V1})) == {"id": 1}


def test_readonly_refuses_writes_and_import_takes_the_given_id():
    s = Store()
    s.write(s.reg.set_mode(None, {"mode": "READONLY"}))
    assert code(s.reg.register, "u", {"schema": V1}) == 42205
    s.write(s.reg.set_mode(None, {"mode": "IMPORT"}))
    assert s.write(s.reg.register("u", {"schema": V1, "id": 42, "version": 3})) == {"id": 42}
    assert s.reg.get("u", 3).id == 42
    s.write(s.reg.set_mode(None, {"mode": "READWRITE"}))
    assert code(s.reg.register, "v", {"schema": V1, "id": 7}) == 42205
    assert s.write(s.reg.register("v", {"schema": V2_OPTIONAL})) == {"id": 43}


def test_references_resolve_to_a_registered_version():
    s = Store()
    address = json.dumps({"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]})
    person = json.dumps({"type": "record", "name": "Person", "fields": [{"name": "home", "type": "Address"}]})
    assert code(s.reg.register, "p", {"schema": person, "references": [
        {"name": "Address", "subject": "addr", "version": 1}]}) == 42201
    s.write(s.reg.register("addr", {"schema": address}))
    assert s.write(s.reg.register("p", {"schema": person, "references": [
        {"name": "Address", "subject": "addr", "version": 1}]})) == {"id": 2}
    assert s.reg.schema(2)["references"] == [{"name": "Address", "subject": "addr", "version": 1}]
    assert code(s.reg.delete_subject, "addr") == 42206  # still referenced by p
    assert code(s.reg.delete_version, "addr", 1) == 42206
    s.write(s.reg.delete_subject("p"))
    assert s.write(s.reg.delete_subject("addr")) == [1]


def test_a_replay_of_the_records_rebuilds_the_same_state_and_bad_records_are_reported():
    s = Store()
    s.write(s.reg.register("a", {"schema": V1}))
    s.write(s.reg.register("a", {"schema": V2_OPTIONAL}))
    s.write(s.reg.set_level("a", {"compatibility": "FULL"}))
    s.write(s.reg.delete_version("a", 1))
    again = s.replayed()
    assert again.subjects == s.reg.subjects and again.levels == s.reg.levels and again.by_id == s.reg.by_id
    assert again.apply(b"not json", b"{}") is not None
    assert again.apply(b'{"keytype": "SCHEMA", "subject": "x", "version": 1}', b'{"id": "nan"}') is not None
    assert again.apply(b'{"keytype": "WHAT"}', None) is not None
    assert again.subjects == s.reg.subjects
