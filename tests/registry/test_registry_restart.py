"""Schemas survive a restart: the registry replays _schemas before it serves; a record it
cannot read there is logged and skipped (one broker)."""
from __future__ import annotations

import json

from odradek.actors.names import partition_dir
from odradek.core.protocol import SCHEMAS_TOPIC
from tests.coordinator.test_replay_poison import _append_poison
from tests.registry.client import http

V1 = {"type": "record", "name": "Event", "fields": [{"name": "at", "type": "long"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}


def test_a_restart_keeps_subjects_ids_settings_and_deletes_and_skips_unreadable_records(broker):
    url = broker.schema_registry_url
    first = http(url, "POST", "/subjects/events-value/versions", {"schema": json.dumps(V1)})[1]["id"]
    second = http(url, "POST", "/subjects/events-value/versions", {"schema": json.dumps(V2)})[1]["id"]
    other = http(url, "POST", "/subjects/gone-value/versions", {"schema": '"string"'})[1]["id"]
    assert http(url, "DELETE", "/subjects/gone-value")[0] == 200
    assert http(url, "PUT", "/config/events-value", {"compatibility": "FULL_TRANSITIVE"})[0] == 200
    assert broker.terminate() == 0
    broker.start()
    url = broker.schema_registry_url
    assert http(url, "GET", "/subjects")[1] == ["events-value"]
    assert http(url, "GET", "/subjects?deleted=true")[1] == ["events-value", "gone-value"]
    assert http(url, "GET", "/subjects/events-value/versions")[1] == [1, 2]
    assert http(url, "GET", "/subjects/events-value/versions/latest")[1]["id"] == second
    assert json.loads(http(url, "GET", f"/schemas/ids/{first}")[1]["schema"]) == V1
    assert http(url, "GET", f"/schemas/ids/{other}")[0] == 200
    assert http(url, "GET", "/config/events-value")[1] == {"compatibilityLevel": "FULL_TRANSITIVE"}
    third = http(url, "POST", "/subjects/new-value/versions", {"schema": '"bytes"'})[1]["id"]
    assert third not in (first, second, other)  # ids are never handed out twice
    assert broker.terminate() == 0

    # Poison: records the log accepts but the registry cannot read (no client can write them)
    _append_poison(partition_dir(broker.data_dir, SCHEMAS_TOPIC, 0), [
        (b"not json", b"{}"),
        (b'{"keytype":"SCHEMA","subject":"events-value","version":9,"magic":1}', b'{"id": "nan"}'),
        (b'{"keytype":"CONFIG","subject":null,"magic":0}', b'{"compatibilityLevel": "SIDEWAYS"}')])
    broker.start()
    url = broker.schema_registry_url
    assert http(url, "GET", "/subjects/events-value/versions")[1] == [1, 2]
    assert http(url, "GET", "/config")[1] == {"compatibilityLevel": "BACKWARD"}
    assert http(url, "GET", f"/schemas/ids/{third}")[0] == 200
    assert broker.stderr_tail(200).count(f"{SCHEMAS_TOPIC}-0: offset") >= 3, broker.stderr_tail(60)
