"""The console of a broker without PLAINTEXT or SASL_PLAINTEXT listeners: one real broker with
an SSL and a SASL_SSL listener that both require client certificates (made here with the
helpers of tests/security), ACLs on, the broker certificate's subject a super user. Without
users the console is open and reaches the broker over SSL with the broker's own certificate;
once a user exists, a signed-in user's requests go over SASL_SSL as that user."""
from __future__ import annotations

import os
import time

import pytest

from odradek import Admin, Producer
from odradek.network import secstore
from odradek.network.authorizer import Acl
from tests.conftest import BrokerProcess
from tests.observability.test_console_signin import Http
from tests.security.fixtures import listeners_of

BROKER_PRINCIPAL = "User:O=odradek,CN=127.0.0.1"  # the subject of the certificate tests/security makes


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory, certs):
    data = os.path.abspath(str(tmp_path_factory.mktemp("console-tls")))
    secstore.Acls(data).add([Acl.make("User:alice", "Topic", "alice-", op, pattern="Prefixed").as_list()
                             for op in ("Describe", "Read")])
    broker = BrokerProcess(data, {
        "listeners": "SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "ssl.certfile": certs["broker"] + ".pem", "ssl.keyfile": certs["broker"] + ".key",
        "ssl.cafile": certs["ca"] + ".pem", "ssl.client.auth": "required",
        "authorizer": True, "super.users": BROKER_PRINCIPAL, "sasl.enabled.mechanisms": "SCRAM-SHA-256"})
    broker.start()
    try:
        host, port, _ = listeners_of(broker)["SSL"]
        broker.ssl_bootstrap = f"{host}:{port}"
        broker.ssl_options = {"security_protocol": "SSL", "ssl_cafile": certs["ca"] + ".pem",
                              "ssl_certfile": certs["broker"] + ".pem", "ssl_keyfile": certs["broker"] + ".key"}
        with Admin(broker.ssl_bootstrap, **broker.ssl_options) as admin:
            for topic in ("tls-orders", "alice-tls"):
                admin.create_topic(topic)
        with Producer(broker.ssl_bootstrap, **broker.ssl_options) as p:
            p.send("tls-orders", b"sent-over-tls", key=b"k1")
            p.send("alice-tls", b"for-alice-over-sasl-ssl", key=b"k2")
            p.flush(30)
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


def test_on_an_ssl_only_broker_the_console_lists_topics_and_browses_a_record_over_tls(tls_broker):
    console = Http(tls_broker.console_url)
    status, _, body = console.call("GET", "/topics")
    assert status == 200, body
    assert "tls-orders" in body and "alice-tls" in body
    status, _, body = console.call("GET", "/topics/tls-orders/messages?partition=0")
    assert status == 200 and "sent-over-tls" in body, body
    status, _, body = console.call("GET", "/groups")
    assert status == 200, body


def test_a_signed_in_user_reaches_an_ssl_only_broker_over_sasl_ssl_as_itself(tls_broker):
    secstore.Users(tls_broker.data_dir).add("alice", "alice-secret", iterations=4096)
    alice = Http(tls_broker.console_url)
    deadline = time.monotonic() + 30  # the console re-reads the users file when it changes (a stat every 0.2 s)
    while alice.call("GET", "/topics")[0] != 303:
        assert time.monotonic() < deadline, "a user exists now: the console should ask for a sign-in"
        time.sleep(0.2)
    status, headers, body = alice.sign_in("alice", "alice-secret")
    assert status == 303 and alice.cookie, body
    status, _, body = alice.call("GET", "/topics")
    assert status == 200 and "alice-tls" in body and "tls-orders" not in body, body
    status, _, body = alice.call("GET", "/topics/alice-tls/messages?partition=0")
    assert status == 200 and "for-alice-over-sasl-ssl" in body, body
    with open(tls_broker.stderr_path, errors="replace") as f:
        log = f.read()
    assert "authenticated as User:alice" in log and "on listener SASL_SSL" in log
