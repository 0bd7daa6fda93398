"""The bundled client (native protocol) on secure listeners: Producer and Consumer over
SASL_SSL with SCRAM and over SSL with a client certificate; a native request before
authentication is refused with ILLEGAL_SASL_STATE and the connection closed."""
from __future__ import annotations

import socket
import uuid

import pytest

from odradek import Admin, Consumer, Producer
from odradek.core import codec
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.types import TopicPartition
from tests.security.fixtures import USERS


def _addr(broker, name: str) -> str:
    host, port, _ = broker.listeners[name]
    return f"{host}:{port}"


@pytest.mark.parametrize("listener,security", [
    ("SASL_SSL", {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_plain_username": "alice", "sasl_plain_password": USERS["alice"]}),
    ("SASL_PLAINTEXT", {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                        "sasl_plain_username": "bob", "sasl_plain_password": USERS["bob"]}),
    ("SSL", {"security_protocol": "SSL"}),
])
def test_the_bundled_producer_and_consumer_work_over_each_secure_listener(secure_broker, certs, listener, security):
    if "SSL" in listener:
        security = {**security, "ssl_cafile": certs["ca"] + ".pem"}
    if listener == "SSL":
        security.update(ssl_certfile=certs["alice"] + ".pem", ssl_keyfile=certs["alice"] + ".key")
    bootstrap, topic = _addr(secure_broker, listener), f"bundled-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap, **security) as admin:
        admin.create_topic(topic)
    with Producer(bootstrap, linger_ms=0, **security) as p:
        offsets = [p.send(topic, b"r%d" % i).get(15).offset for i in range(50)]
    assert offsets == list(range(50))
    with Consumer(bootstrap, auto_offset_reset="earliest", **security) as c:
        c.assign([TopicPartition(topic, 0)])
        got = []
        for _ in range(40):
            got += [r.value for r in c.poll(250)]
            if len(got) >= 50:
                break
    assert got == [b"r%d" % i for i in range(50)]


def test_the_bundled_client_refuses_a_broker_signed_by_another_ca(secure_broker, certs):
    host, port, _ = secure_broker.listeners["SASL_SSL"]
    with pytest.raises(OdradekError):
        BrokerConnection(host, int(port), security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                         sasl_plain_username="alice", sasl_plain_password=USERS["alice"],
                         ssl_cafile=certs["otherca"] + ".pem").connect(timeout=5)


def test_a_native_request_before_authentication_is_answered_illegal_sasl_state_and_closed(secure_broker):
    host, port, _ = secure_broker.listeners["SASL_PLAINTEXT"]
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"".join(codec.encode_request(ApiKey.METADATA, 0, 1, "early", {})))
        decoder, frame = codec.Decoder(1 << 20, codec.RESPONSE_FIELDS), None
        while frame is None:
            data = s.recv(65536)
            assert data
            decoder.feed(data)
            frame = decoder.next()
        assert frame.header["body"]["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
        assert s.recv(100) == b""


def test_security_options_are_checked_and_the_password_is_not_shown():
    from odradek.network.clientauth import ClientSecurity
    sec = ClientSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                         sasl_plain_username="u", sasl_plain_password="hunter2")
    assert "hunter2" not in repr(sec)
    with pytest.raises(OdradekError):
        ClientSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="GSSAPI", sasl_plain_username="u",
                       sasl_plain_password="p")
    with pytest.raises(TypeError):
        ClientSecurity.from_options({"sasl_password": "p"})
