"""A flood of connections from one address past ``max.connections.per.ip`` leaves clients
from other addresses served (127.0.0.1 floods, 127.0.0.2 is the other client: both are
loopback on Linux)."""
from __future__ import annotations

import socket
import time

import pytest

from odradek.local import LocalBroker
from odradek.core import codec
from odradek.core.protocol import ApiKey
from odradek.actors.messages import Stats


@pytest.fixture(scope="module")
def limited_broker(tmp_path_factory):
    broker = LocalBroker(str(tmp_path_factory.mktemp("flood-broker")),
                         {"listeners": "PLAINTEXT://127.0.0.1:0", "max.connections.per.ip": 20,
                          "max.connections": 100}, start_timeout=240).start()
    try:
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


def api_versions_from(source: str, port: int) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
        s.sendall(b"".join(codec.encode_request(ApiKey.API_VERSIONS, 0, 1, "other", {})))
        decoder = codec.Decoder(1 << 20, codec.RESPONSE_FIELDS)
        while (frame := decoder.next()) is None:
            data = s.recv(65536)
            assert data, "closed without an answer"
            decoder.feed(data)
        return frame.header["body"]


def test_a_flood_from_one_address_past_its_limit_leaves_other_addresses_served(limited_broker):
    port = limited_broker.port
    flood = []
    try:
        for _ in range(200):
            s = socket.socket()
            s.settimeout(2)
            s.connect(("127.0.0.1", port))
            flood.append(s)
        time.sleep(0.5)
        alive = 0
        for s in flood:  # the ones past the limit were closed by the acceptor at once
            s.setblocking(False)
            try:
                alive += s.recv(1) != b""
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        assert alive <= 20, alive
        assert api_versions_from("127.0.0.2", port)["error_code"] == 0  # another address is admitted and answered
    finally:
        for s in flood:
            s.close()


@pytest.fixture(scope="module")
def rate_limited_broker(tmp_path_factory):
    broker = LocalBroker(str(tmp_path_factory.mktemp("rate-broker")), {"max.connection.creation.rate": 10},
                         start_timeout=240).start()
    try:
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


def test_connections_past_the_creation_rate_wait_in_the_backlog_and_are_all_served(rate_limited_broker):
    port = rate_limited_broker.port
    time.sleep(1.2)  # a full bucket: 10 connections at once, then 10 a second
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(30)]
    try:
        for s in socks:
            s.sendall(b"".join(codec.encode_request(ApiKey.API_VERSIONS, 0, 1, "rate", {})))
        for s in socks:
            decoder = codec.Decoder(1 << 20, codec.RESPONSE_FIELDS)
            while (frame := decoder.next()) is None:
                data = s.recv(65536)
                assert data, "a connection past the rate was closed instead of waiting"
                decoder.feed(data)
            assert frame.header["body"]["error_code"] == 0
    finally:
        for s in socks:
            s.close()
    from odradek.actors.client import MailboxClient
    with MailboxClient(rate_limited_broker.run_dir) as client:  # 20 past the burst waited for tokens
        assert client.request("acceptor", Stats(), timeout=10).fields.stats.get("creation_rate_throttled", 0) > 0
