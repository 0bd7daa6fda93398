"""The schema registry's listener once the broker has SASL users: HTTP Basic checked against
the SCRAM credentials (401/40101 with WWW-Authenticate otherwise), and with ``authorizer``
on, the documented ACL mapping (docs/SCHEMAS.md): reads for any authenticated user, a
registration under <topic>-value with Write on the topic, other writes with Alter on the
cluster (403/40301). Judged by raw HTTP and by confluent-kafka's SchemaRegistryClient."""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from odradek.local import LocalBroker
from odradek.network import authorizer as az
from odradek.network import secstore

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402

USERS = {"alice": "alice-pw", "bob": "bob-pw", "admin": "admin-pw"}
AVRO = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]})


@pytest.fixture(scope="module")
def secured(tmp_path_factory) -> str:
    data = str(tmp_path_factory.mktemp("registry-auth"))
    users = secstore.Users(data)
    for name, password in USERS.items():
        users.add(name, password, iterations=4096)
    secstore.Acls(data).add([list(az.Acl.make("User:alice", "Topic", "orders", "Write"))])
    broker = LocalBroker(data, {"authorizer": True, "super.users": "User:admin", "shutdown.timeout.ms": 10000,
                                "failed.authentication.delay.ms": 50}).start()
    try:
        yield broker.schema_registry_url
    finally:
        broker.discard()


def call(url: str, method: str, path: str, user: str | None = None, password: str | None = None, body=None):
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


def test_no_or_wrong_credentials_are_401_with_a_challenge(secured):
    for user, password in ((None, None), ("alice", "wrong"), ("nobody", "alice-pw")):
        status, answer, headers = call(secured, "GET", "/subjects", user, password)
        assert status == 401 and answer["error_code"] == 40101, (user, answer)
        assert headers["WWW-Authenticate"].startswith("Basic realm=")
        assert "alice-pw" not in json.dumps(answer) and "wrong" not in json.dumps(answer)
    # before the body is read or the path known: a stranger learns nothing of the endpoints
    assert call(secured, "POST", "/no/such/thing", body={})[0] == 401


def test_reads_for_any_user_writes_as_the_acls_say(secured):
    status, _, _ = call(secured, "GET", "/subjects", "bob", "bob-pw")
    assert status == 200
    schema = {"schema": AVRO}
    # bob has no ACL: no registration, no level change
    status, answer, _ = call(secured, "POST", "/subjects/orders-value/versions", "bob", "bob-pw", schema)
    assert (status, answer["error_code"]) == (403, 40301), answer
    # alice may Write on 'orders': she registers under orders-value, not under payments-value
    status, answer, _ = call(secured, "POST", "/subjects/orders-value/versions", "alice", "alice-pw", schema)
    assert status == 200 and answer["id"] >= 1, answer
    status, answer, _ = call(secured, "POST", "/subjects/payments-value/versions", "alice", "alice-pw", schema)
    assert (status, answer["error_code"]) == (403, 40301)
    status, answer, _ = call(secured, "PUT", "/config/orders-value", "alice", "alice-pw", {"compatibility": "NONE"})
    assert (status, answer["error_code"]) == (403, 40301), answer
    # a lookup and a compatibility check are reads
    assert call(secured, "POST", "/subjects/orders-value", "bob", "bob-pw", schema)[0] == 200
    assert call(secured, "POST", "/compatibility/subjects/orders-value/versions/latest", "bob", "bob-pw",
                schema)[1] == {"is_compatible": True}
    # the super user may do everything
    assert call(secured, "PUT", "/config/orders-value", "admin", "admin-pw", {"compatibility": "NONE"})[0] == 200
    assert call(secured, "DELETE", "/subjects/orders-value", "bob", "bob-pw")[0] == 403
    assert call(secured, "DELETE", "/subjects/orders-value", "admin", "admin-pw")[0] == 200


def test_confluent_client_with_basic_auth(secured):
    client = SchemaRegistryClient({"url": secured, "basic.auth.user.info": "alice:alice-pw"})
    sid = client.register_schema("orders-key", Schema(AVRO, "AVRO"))
    assert json.loads(client.get_schema(sid).schema_str) == json.loads(AVRO)
    with pytest.raises(SchemaRegistryError) as err:
        SchemaRegistryClient({"url": secured, "basic.auth.user.info": "alice:nope"}).get_subjects()
    assert err.value.http_status_code == 401 and err.value.error_code == 40101
