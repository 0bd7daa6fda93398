"""The console and the schema registry, in headless chromium: the message browser decodes
records confluent-kafka's Avro, JSON and Protobuf serializers wrote (schema id, subject and
version shown, then the content), the hex format still shows the bytes, and the schemas page
lists subjects with their versions, types and compatibility levels and shows each version's
text."""
from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from selenium.webdriver.common.by import By

from odradek.observe.console_schemas import framed
from tests.observability.browser import headless_chromium
from tests.registry.test_registry_clients import USER_V1
from tests.registry.test_registry_protobuf import V1, message_class

JSON_SCHEMA = json.dumps({"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}})


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def produced(shared_broker) -> dict:
    """One topic per format, two records each, written by confluent-kafka's serializers."""
    client = SchemaRegistryClient({"url": shared_broker.schema_registry_url})
    tag = uuid.uuid4().hex[:6]
    order = message_class(V1)
    topics = {"avro": (f"cs-avro-{tag}", AvroSerializer(client, json.dumps(USER_V1)),
                       [{"name": "ada", "favorite": 7}, {"name": "bob", "favorite": 8}]),
              "json": (f"cs-json-{tag}", JSONSerializer(JSON_SCHEMA, client), [{"sku": "X-1", "qty": 3}]),
              "protobuf": (f"cs-pb-{tag}", ProtobufSerializer(order, client, {"use.deprecated.format": False}),
                           [order(name="widget", count=42)])}
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap})
    for topic, serialize, values in topics.values():
        for v in values:
            producer.produce(topic, value=serialize(v, SerializationContext(topic, MessageField.VALUE)))
    assert producer.flush(30) == 0
    return {k: t for k, (t, _s, _v) in topics.items()} | {"client": client}


def values_shown(browser, url: str) -> list[str]:
    browser.get(url)
    return [tr.find_elements(By.TAG_NAME, "td")[4].text for tr in browser.find_elements(By.CSS_SELECTOR, "#records tr")[1:]]


def test_the_browser_decodes_avro_json_and_protobuf_records(shared_broker, produced, browser):
    base = shared_broker.console_url
    avro = values_shown(browser, f"{base}topics/{produced['avro']}/messages?order=oldest")
    sid = produced["client"].get_latest_version(f"{produced['avro']}-value").schema_id
    assert avro[0].startswith(f"[schema id {sid}, AVRO, {produced['avro']}-value v1]"), avro
    assert json.loads(avro[0].partition("\n")[2]) == {"name": "ada", "favorite": 7}
    assert json.loads(avro[1].partition("\n")[2]) == {"name": "bob", "favorite": 8}
    shown = values_shown(browser, f"{base}topics/{produced['json']}/messages")
    assert ", JSON, " in shown[0] and json.loads(shown[0].partition("\n")[2]) == {"sku": "X-1", "qty": 3}
    shown = values_shown(browser, f"{base}topics/{produced['protobuf']}/messages")
    assert ", PROTOBUF, " in shown[0], shown
    name, _, body = shown[0].partition("\n")[2].partition(" ")
    assert name == "shop.Order" and json.loads(body) == {"name": "widget", "count": "42"}
    # the hex format shows the bytes as they are: the magic byte and the id first
    raw = values_shown(browser, f"{base}topics/{produced['avro']}/messages?order=oldest&format=hex")
    assert raw[0].startswith("00 " + " ".join(f"{b:02x}" for b in sid.to_bytes(4, "big")))


def test_the_schemas_page_lists_subjects_and_shows_versions(shared_broker, produced, browser):
    base = shared_broker.console_url
    browser.get(base + "schemas")
    assert browser.find_element(By.ID, "global-level").text == "BACKWARD"
    rows = {r.find_elements(By.TAG_NAME, "td")[0].text: [td.text for td in r.find_elements(By.TAG_NAME, "td")]
            for r in browser.find_elements(By.CSS_SELECTOR, "#subjects tr")[1:]}
    avro = f"{produced['avro']}-value"
    assert rows[avro][1:] == ["1", str(produced["client"].get_latest_version(avro).schema_id), "AVRO", "BACKWARD"]
    assert rows[f"{produced['protobuf']}-value"][3] == "PROTOBUF"
    produced["client"].set_compatibility(avro, "FULL")
    browser.get(base + "schemas")
    browser.find_element(By.LINK_TEXT, avro).click()
    assert browser.find_element(By.ID, "level").text == "FULL"
    text = browser.find_element(By.CSS_SELECTOR, "#version-1 pre").text
    assert json.loads(text) == USER_V1


def test_framed():
    assert framed(b"\x00\x00\x00\x00\x07abc") == (7, b"abc")
    assert framed(b"\x01\x00\x00\x00\x07abc") is None and framed(b"\x00\x00") is None and framed(None) is None


def test_a_signed_in_user_sees_the_schemas_page_on_a_broker_with_users_but_no_sasl_listener(tmp_path):
    """The console asks the registry as the signed-in user (HTTP Basic). Its user's password
    used to be kept only by its SASL clients, which a broker with users but only a PLAINTEXT
    listener does not make: the page then asked anonymously and the registry answered 401."""
    import base64
    import urllib.request

    from odradek.network import secstore
    from tests.conftest import BrokerProcess
    from tests.observability.test_console_signin import Http

    secstore.Users(str(tmp_path)).add("admin", "admin-secret", iterations=4096)
    broker = BrokerProcess(str(tmp_path), {"listeners": "PLAINTEXT://127.0.0.1:0"}).start()
    try:
        request = urllib.request.Request(
            broker.schema_registry_url.rstrip("/") + "/subjects/plain-orders-value/versions", method="POST",
            data=json.dumps({"schema": json.dumps(USER_V1)}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json",
                     "Authorization": "Basic " + base64.b64encode(b"admin:admin-secret").decode()})
        with urllib.request.urlopen(request, timeout=30) as r:
            assert json.loads(r.read())["id"] > 0
        client = Http(broker.console_url)
        status, _, body = client.sign_in("admin", "admin-secret")
        assert status == 303 and client.cookie, body
        status, _, body = client.call("GET", "/schemas")
        assert status == 200 and "plain-orders-value" in body, (status, body[:2000])
    finally:
        broker.discard()
