"""Several listeners with Kafka's security protocols, judged by real Kafka clients
(confluent-kafka and kafka-python) against a real broker: TLS with certificates made by the
test, mutual TLS, SASL PLAIN and SCRAM-SHA-256/512 over SASL_PLAINTEXT and SASL_SSL."""
from __future__ import annotations

import socket
import ssl
import time
import uuid

import confluent_kafka
import kafka
import kafka.errors
import pytest

from odradek import Admin

from tests.security.fixtures import USERS


def _addr(broker, name: str) -> str:
    host, port, _proto = broker.listeners[name]
    return f"{host}:{port}"


def _confluent(broker, listener: str, certs, **extra) -> dict:
    conf = {"bootstrap.servers": _addr(broker, listener), "security.protocol": listener,
            "socket.timeout.ms": 10000, "message.timeout.ms": 15000}
    if "SSL" in listener.split("_")[-1:] or listener == "SSL":
        conf["ssl.ca.location"] = certs["ca"] + ".pem"
    conf.update(extra)
    return conf


def _produce_one(conf: dict, topic: str, value: bytes) -> tuple:
    out = []
    producer = confluent_kafka.Producer(conf)
    producer.produce(topic, value, on_delivery=lambda err, msg: out.append((err, msg)))
    producer.flush(20)
    assert out, "no delivery report"
    return out[0]


def test_serve_prints_every_listener_with_its_security_protocol(secure_broker):
    assert {n: p for n, (_h, _port, p) in secure_broker.listeners.items()} == {
        "PLAINTEXT": "PLAINTEXT", "SSL": "SSL", "SASL_PLAINTEXT": "SASL_PLAINTEXT", "SASL_SSL": "SASL_SSL"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_confluent_kafka_with_the_right_password_produces_and_consumes(secure_broker, certs, listener, mechanism):
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    conf = _confluent(secure_broker, listener, certs, **{"sasl.mechanism": mechanism, "sasl.username": "alice",
                                                         "sasl.password": USERS["alice"]})
    err, msg = _produce_one(conf, topic, b"over " + listener.encode())
    assert err is None, err
    consumer = confluent_kafka.Consumer({**{k: v for k, v in conf.items() if k != "message.timeout.ms"},
                                         "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        deadline, got = time.monotonic() + 30, None
        while got is None and time.monotonic() < deadline:
            m = consumer.poll(1.0)
            if m is not None and m.error() is None:
                got = m.value()
        assert got == b"over " + listener.encode()
    finally:
        consumer.close()


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("nobody", "whatever")])
def test_confluent_kafka_with_a_wrong_password_or_unknown_user_is_refused(secure_broker, certs, user, password):
    errors = []
    conf = _confluent(secure_broker, "SASL_SSL", certs, **{
        "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": password,
        "error_cb": lambda e: errors.append(e)})
    producer = confluent_kafka.Producer(conf)
    with pytest.raises(confluent_kafka.KafkaException):
        producer.list_topics(timeout=2)  # never answered: librdkafka retries the sign-in until the timeout

    def refused() -> bool:
        return any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors)
    deadline = time.monotonic() + 30
    while not refused() and time.monotonic() < deadline:
        producer.poll(0.2)  # error_cb runs in poll
    assert refused(), errors


def test_kafka_python_authenticates_with_scram_over_sasl_ssl(secure_broker, certs):
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    common = dict(bootstrap_servers=_addr(secure_broker, "SASL_SSL"), security_protocol="SASL_SSL",
                  sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="bob", sasl_plain_password=USERS["bob"],
                  ssl_cafile=certs["ca"] + ".pem")
    producer = kafka.KafkaProducer(enable_idempotence=False, **common)
    try:
        md = producer.send(topic, b"from kafka-python").get(timeout=30)
    finally:
        producer.close()
    assert md.offset == 0
    consumer = kafka.KafkaConsumer(auto_offset_reset="earliest", consumer_timeout_ms=15000,
                                   enable_auto_commit=False, **common)
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        first = next(consumer, None)  # not list(consumer): that waits out consumer_timeout_ms after the record
        assert first is not None and first.value == b"from kafka-python"
    finally:
        consumer.close()


def test_kafka_python_with_a_wrong_password_is_refused(secure_broker):
    with pytest.raises(kafka.errors.KafkaError):  # it cannot bootstrap: every attempt is refused and closed
        producer = kafka.KafkaProducer(bootstrap_servers=_addr(secure_broker, "SASL_PLAINTEXT"),
                                       security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                       sasl_plain_username="alice", sasl_plain_password="wrong", max_block_ms=4000,
                                       request_timeout_ms=5000, enable_idempotence=False,
                                       bootstrap_timeout_ms=5000)  # its 30 s default was this test's whole time
        try:
            producer.send(f"sec-{uuid.uuid4().hex[:8]}", b"x").get(10)
        finally:
            producer.close(timeout=5)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_kafka_python_speaking_kafka_0_10_signs_in_with_raw_tokens_after_sasl_handshake_v0(secure_broker, mechanism):
    """``api_version=(0, 10, 2)``: SaslHandshake v0, then the SASL tokens unframed (no
    SaslAuthenticate), as Kafka's pre-1.0 clients do; then Metadata as the user."""
    topic = f"sec-v0-{uuid.uuid4().hex[:8]}"
    common = dict(bootstrap_servers=_addr(secure_broker, "SASL_PLAINTEXT"), security_protocol="SASL_PLAINTEXT",
                  sasl_mechanism=mechanism, sasl_plain_username="alice", api_version=(0, 10, 2),
                  request_timeout_ms=20000)
    with Admin(_addr(secure_broker, "PLAINTEXT")) as admin:
        admin.create_topic(topic)
    producer = kafka.KafkaProducer(sasl_plain_password=USERS["alice"], max_block_ms=60000, **common)
    try:
        assert producer.partitions_for(topic) == {0}  # Metadata, answered once signed in (bounded wait)
    finally:
        producer.close(timeout=5)
    if mechanism != "PLAIN":
        return
    with pytest.raises(kafka.errors.KafkaError):  # a wrong password: refused and closed, so no metadata
        wrong = kafka.KafkaProducer(sasl_plain_password="wrong", max_block_ms=4000, **common)
        try:
            wrong.send(topic, b"x").get(10)
        finally:
            wrong.close(timeout=5)


def test_a_kafka_request_before_authentication_closes_the_connection(secure_broker):
    host, port, _ = secure_broker.listeners["SASL_PLAINTEXT"]
    # Metadata v1 (api 3), correlation id 7, client "x", topics null
    body = b"\x00\x03\x00\x01\x00\x00\x00\x07\x00\x01x\xff\xff\xff\xff"
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(len(body).to_bytes(4, "big") + body)
        assert s.recv(100) == b""  # closed, nothing served


def test_mutual_tls_gives_the_certificate_subject_as_principal_and_serves_the_client(secure_broker, certs):
    conf = _confluent(secure_broker, "SSL", certs, **{"ssl.certificate.location": certs["alice"] + ".pem",
                                                      "ssl.key.location": certs["alice"] + ".key"})
    err, _msg = _produce_one(conf, f"sec-{uuid.uuid4().hex[:8]}", b"mtls")
    assert err is None, err
    with open(secure_broker.stderr_path, errors="replace") as f:
        assert "authenticated as User:CN=alice,O=example (TLS client certificate)" in f.read()


def test_a_client_certificate_from_another_ca_is_refused(secure_broker, certs):
    host, port, _ = secure_broker.listeners["SSL"]
    ctx = ssl.create_default_context(cafile=certs["ca"] + ".pem")
    ctx.load_cert_chain(certs["mallory"] + ".pem", certs["mallory"] + ".key")
    with socket.create_connection((host, port), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"\x00\x00\x00\x0a" + b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")
                if s.recv(100) == b"":
                    raise ConnectionResetError("closed")


def test_a_client_that_trusts_another_ca_refuses_the_broker(secure_broker, certs):
    host, port, _ = secure_broker.listeners["SASL_SSL"]
    ctx = ssl.create_default_context(cafile=certs["otherca"] + ".pem")
    with socket.create_connection((host, port), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def test_plaintext_still_serves_anonymous_clients_beside_the_secure_listeners(secure_broker, certs):
    err, _ = _produce_one({"bootstrap.servers": _addr(secure_broker, "PLAINTEXT"), "message.timeout.ms": 15000},
                          f"sec-{uuid.uuid4().hex[:8]}", b"plain")
    assert err is None
