"""Per-listener connection limits and creation rates, and the per-address creation rate
(Kafka's ``listener.name.<name>.max.connections``, ``...max.connection.creation.rate`` and
the ``connection_creation_rate`` quota of ``--entity-type ips``, KIP-612): a flood on one
listener, or from one address, leaves the other listener and other clients served.
127.0.0.3 floods where an address floods: any 127/8 address is loopback on Linux."""
from __future__ import annotations

import select
import socket
import subprocess
import sys
import time

import pytest

from odradek.actors.client import MailboxClient
from odradek.local import LocalBroker
from odradek.core import codec
from odradek.core.protocol import ApiKey
from odradek.actors.messages import Connections, Stats
from tests.security.fixtures import listeners_of

LISTENER_MAX = 5
LISTENER_RATE = 5


@pytest.fixture(scope="module")
def limits_broker(tmp_path_factory):
    broker = LocalBroker(str(tmp_path_factory.mktemp("limits-broker")), {
        "listeners": "PLAINTEXT://127.0.0.1:0,FLOOD://127.0.0.1:0,RATED://127.0.0.1:0",
        "listener.security.protocol.map": "FLOOD:PLAINTEXT,RATED:PLAINTEXT",
        "listener.name.flood.max.connections": LISTENER_MAX,
        "listener.name.rated.max.connection.creation.rate": LISTENER_RATE}, start_timeout=240).start()
    broker.listeners = listeners_of(broker)
    try:
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


def _ask(sock: socket.socket, corr: int = 1) -> None:
    sock.sendall(b"".join(codec.encode_request(ApiKey.API_VERSIONS, 0, corr, "limits", {})))


def _answer(sock: socket.socket, timeout: float) -> dict | None:
    """The ApiVersions answer, or None if the broker closed the connection (or is silent)."""
    sock.settimeout(timeout)
    decoder = codec.Decoder(1 << 20, codec.RESPONSE_FIELDS)
    try:
        while (frame := decoder.next()) is None:
            data = sock.recv(65536)
            if not data:
                return None
            decoder.feed(data)
    except (ConnectionResetError, socket.timeout):
        return None
    return frame.header["body"]


def _served(port: int, source: str = "127.0.0.1") -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        _ask(s)
        body = _answer(s, 30)
    return body is not None and body["error_code"] == 0


def _readable(socks: list, timeout: float) -> list:
    return select.select(socks, [], [], timeout)[0] if socks else []


def _open_on(broker, listener: str) -> int:
    """Connections the processors hold on ``listener`` now (their ``connections`` message)."""
    with MailboxClient(broker.run_dir) as client:
        return sum(client.request(name, Connections(), timeout=10).fields.listeners.get(listener, 0)
                   for name in ("processor-0", "processor-1"))


def _acceptor_stats(broker) -> dict:
    with MailboxClient(broker.run_dir) as client:
        return client.request("acceptor", Stats(), timeout=10).fields.stats


def test_a_flood_on_a_listener_past_its_max_connections_waits_and_leaves_the_other_listener_served(limits_broker):
    _h, port, _p = limits_broker.listeners["FLOOD"]
    flood = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4 * LISTENER_MAX)]
    try:
        for s in flood:
            _ask(s)
        answered: list = []
        deadline = time.monotonic() + 60
        while len(answered) < LISTENER_MAX and time.monotonic() < deadline:
            for s in _readable([s for s in flood if s not in answered], 1):
                assert _answer(s, 10) is not None, "a connection on the listener was closed"
                answered.append(s)
        assert len(answered) == LISTENER_MAX
        assert _served(limits_broker.port), "the other listener was not served"
        assert _readable([s for s in flood if s not in answered], 0.5) == []  # the rest wait, unread
        assert _open_on(limits_broker, "FLOOD") == LISTENER_MAX
        # each closed connection lets a waiting one in: all are served in the end, none refused
        for s in answered:
            s.close()
        waiting = [s for s in flood if s not in answered]
        deadline = time.monotonic() + 90
        while waiting and time.monotonic() < deadline:
            for s in _readable(waiting, 1):
                assert _answer(s, 10) is not None, "a waiting connection was closed instead of served"
                waiting.remove(s)
                s.close()
        assert waiting == []
    finally:
        for s in flood:
            s.close()


def test_connections_past_a_listeners_creation_rate_wait_and_are_all_served(limits_broker):
    _h, port, _p = limits_broker.listeners["RATED"]
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(3 * LISTENER_RATE)]
    try:
        for s in socks:
            _ask(s)
        assert _served(limits_broker.port), "the other listener was not served"
        for s in socks:
            body = _answer(s, 60)
            assert body is not None and body["error_code"] == 0, "a connection past the rate was not served"
    finally:
        for s in socks:
            s.close()
    assert _acceptor_stats(limits_broker).get("listener_creation_rate_throttled", 0) > 0  # they did wait


def _set_ip_rate(broker, ip: str, rate: int) -> None:
    out = subprocess.run([sys.executable, "-m", "odradek", "configs", "--set", f"log.dirs={broker.data_dir}",
                          "--entity-type", "ips", "--entity-name", ip, "--alter",
                          "--add-config", f"connection_creation_rate={rate}"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


def test_connections_from_an_address_past_its_creation_rate_are_closed_and_others_are_served(limits_broker):
    """KIP-612: over its address's rate a connection is held for the throttle time, then closed."""
    _set_ip_rate(limits_broker, "127.0.0.3", 5)
    try:
        time.sleep(0.5)  # the acceptor re-reads the quotas within 0.2 s
        flood = [socket.create_connection(("127.0.0.1", limits_broker.port), timeout=10,
                                          source_address=("127.0.0.3", 0)) for _ in range(20)]
        try:
            for s in flood:
                try:
                    _ask(s)
                except OSError:
                    pass
            assert _served(limits_broker.port, "127.0.0.2"), "another address was not served"
            answers = [_answer(s, 30) for s in flood]
        finally:
            for s in flood:
                s.close()
        closed = sum(a is None for a in answers)
        assert _acceptor_stats(limits_broker).get("refused_ip_creation_rate", 0) == closed
        assert 0 < closed < 20, f"{closed} of 20 closed"  # the first ones (a second's worth) are served
        assert all(a["error_code"] == 0 for a in answers if a is not None)
    finally:
        _set_ip_rate(limits_broker, "127.0.0.3", 0)
