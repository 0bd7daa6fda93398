"""The one client connection class (network/connection.py) and the clients built on it: the
blocking ``network.client.BrokerConnection`` and ``odradek.cluster.Connection``, against a real
broker (and, for silence, a socket that never answers)."""
from __future__ import annotations

import socket

import pytest

from odradek import errors
from odradek.cluster import Connection as ClusterConnection
from odradek.network import client, connection
from odradek.network.client import BrokerConnection
from odradek.network.connection import Connection, parse_bootstrap, wait_any
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError


@pytest.fixture
def silent_server():
    """A listening socket that accepts and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv.getsockname()
    srv.close()


def test_pipelined_requests_are_answered_each_to_its_own_callback(shared_broker):
    conn = Connection(shared_broker.host, shared_broker.port, client_id="test")
    answers: dict[int, dict] = {}
    try:
        for i in range(50):
            conn.send(ApiKey.PING, {"i": i}, (), lambda frame, err, i=i: answers.__setitem__(i, (frame, err)))
        assert conn.in_flight == 50
        for _ in range(200):
            if len(answers) == 50:
                break
            conn.poll(1.0)
        assert sorted(answers) == list(range(50))
        assert all(err is None and frame.header["body"] == {"i": i} for i, (frame, err) in answers.items())
        assert conn.in_flight == 0
    finally:
        conn.close()


def test_a_request_whose_last_frame_is_empty_is_written_whole(shared_broker):
    """Before, the connection popped written buffers only while bytes were left to account for,
    so an empty last frame stayed queued and ``flush`` spun on it for ever."""
    conn = Connection(shared_broker.host, shared_broker.port, client_id="test")
    try:
        frame = conn.request(ApiKey.PING, {"x": 1}, [b"a", b"bc", b""], timeout=15)
        assert [bytes(f) for f in frame.frames] == [b"a", b"bc", b""]
        assert not conn.wants_write
    finally:
        conn.close()


def test_closing_a_connection_fails_every_request_in_flight_with_network_exception(silent_server):
    conn = Connection(*silent_server, client_id="test")
    outcomes = []
    for i in range(3):
        conn.send(ApiKey.PING, {"i": i}, (), lambda frame, err: outcomes.append((frame, err)))
    conn.close("test")
    assert len(outcomes) == 3
    assert all(frame is None and err.code == ErrorCode.NETWORK_EXCEPTION for frame, err in outcomes)


def test_the_bundled_clients_connection_raises_the_error_class_of_each_code(silent_server):
    conn = ClusterConnection(*silent_server, client_id="test")
    with pytest.raises(errors.RequestTimedOutError):
        conn.request(ApiKey.PING, {}, timeout=0.2)
    assert not conn.connected  # a silent broker's connection is given up, as Kafka's client does


def test_a_blocking_receive_that_times_out_gives_up_on_that_request_alone(silent_server):
    conn = BrokerConnection(*silent_server, client_id="test")
    try:
        first = conn.send(ApiKey.PING, {})
        second = conn.send(ApiKey.PING, {})
        with pytest.raises(OdradekError) as info:
            conn.receive(first, timeout=0.2)
        assert info.value.code == ErrorCode.REQUEST_TIMED_OUT and conn.connected
        with pytest.raises(OdradekError) as info:
            conn.receive(first, timeout=0.2)  # given up on: nothing waits for it any more
        assert info.value.code == ErrorCode.INVALID_REQUEST
        conn.close()
        with pytest.raises(OdradekError) as info:
            conn.receive(second, timeout=5)
        assert info.value.code == ErrorCode.NETWORK_EXCEPTION
    finally:
        conn.close()


def test_the_blocking_client_reconnects_after_a_drop_and_pipelines_on_the_new_socket(shared_broker):
    with BrokerConnection(shared_broker.host, shared_broker.port, client_id="test") as conn:
        assert conn.request(ApiKey.PING, {"n": 0}).body == {"n": 0}
        conn.close()
        corrs = conn.send_many([(ApiKey.PING, {"n": n}) for n in range(1, 6)])
        assert [conn.receive(c).body["n"] for c in reversed(corrs)] == [5, 4, 3, 2, 1]
        assert conn.reconnects == 1


def test_wait_any_reports_the_wake_pipe_and_reads_the_answers_of_every_connection(shared_broker):
    import os
    r, w = os.pipe()
    conns = [Connection(shared_broker.host, shared_broker.port, client_id="test") for _ in range(2)]
    got = []
    try:
        for i, c in enumerate(conns):
            c.send(ApiKey.PING, {"c": i}, (), lambda frame, err: got.append(frame.header["body"]["c"]))
        for _ in range(100):
            if len(got) == 2:
                break
            assert not wait_any(conns, 1.0, r)
        assert sorted(got) == [0, 1]
        os.write(w, b"x")
        assert wait_any(conns, 5.0, r)
    finally:
        for c in conns:
            c.close()
        os.close(r)
        os.close(w)


def test_there_is_one_bootstrap_parser_and_it_names_a_bad_item():
    assert client.parse_bootstrap is parse_bootstrap is connection.parse_bootstrap
    from odradek import cluster
    assert cluster.parse_bootstrap is parse_bootstrap
    assert parse_bootstrap("PLAINTEXT://a:1, b:2,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]
    with pytest.raises(ValueError, match="'a' is not host:port") as info:
        parse_bootstrap("a")
    assert info.value.code == ErrorCode.INVALID_CONFIG
    with pytest.raises(OdradekError, match="no bootstrap servers given"):
        parse_bootstrap(" , ")
