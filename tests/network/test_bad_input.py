"""Bad input and abuse: each gets an error reply or a disconnect, and a well-behaved client is
served throughout. Admission limits are enforced."""
from __future__ import annotations

import resource
import socket
import time

import pytest

from odradek.core.protocol import ApiKey, ErrorCode

from tests.network.helpers import (PingLoad, actor, connect, packed_header, raw_frame, raw_request, raw_socket,
                                   read_responses, wait_until)

GOOD_HEADER = dict(api=int(ApiKey.PING), v=0, client="raw", body={}, frames=[])


def closed_after(sock: socket.socket, expect: int = 0, timeout: float = 10.0):
    """The responses a misbehaving socket got before the broker closed it (must close)."""
    responses, closed = read_responses(sock, None, timeout)
    sock.close()
    assert closed
    return responses


@pytest.fixture(scope="module")
def abused(tmp_path_factory):
    """One broker for the abuse tests, with small limits, and a well-behaved client pinging it
    the whole time; the module fails if that client ever failed."""
    from tests.conftest import BrokerProcess
    broker = BrokerProcess(str(tmp_path_factory.mktemp("abused")),
                           {"socket.request.max.bytes": 65536, "connections.max.idle.ms": 500,
                            "max.connections.per.ip": 1000}).start()
    load = PingLoad(broker, threads=1, depth=2).__enter__()
    try:
        yield broker
        assert load.done > 0
    finally:
        load.stop()
        broker.discard()  # kill -9: its data is thrown away
    assert load.failures == []


def test_garbage_bytes_get_a_disconnect(abused):
    sock = raw_socket(abused)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: odradek\r\n\r\n")
    assert closed_after(sock) == []


def test_truncated_msgpack_in_a_header_gets_a_disconnect(abused):
    sock = raw_socket(abused)
    head = packed_header(corr=5, **GOOD_HEADER)
    sock.sendall(raw_frame(head[:-4]))
    assert closed_after(sock) == []


def test_a_header_of_the_wrong_shape_gets_an_error_with_its_corr_then_a_disconnect(abused):
    sock = raw_socket(abused)
    sock.sendall(raw_request(ApiKey.PING, 1) + raw_frame(packed_header(**{**GOOD_HEADER, "corr": 6, "api": "x"})))
    responses = closed_after(sock)
    assert [r.corr for r in responses] == [1, 6]
    assert responses[1].body["error_code"] == ErrorCode.INVALID_REQUEST and "'api'" in responses[1].body["error_message"]


def test_an_unknown_api_key_gets_an_error_reply_and_the_connection_stays(abused):
    sock = raw_socket(abused)
    sock.sendall(raw_request(31337, 1) + raw_request(ApiKey.PING, 2, {"ok": 1}))
    responses, closed = read_responses(sock, 2)
    sock.close()
    assert not closed
    assert responses[0].body["error_code"] == ErrorCode.INVALID_REQUEST and "31337" in responses[0].body["error_message"]
    assert responses[1].body == {"ok": 1}


def test_an_oversized_request_gets_message_too_large_with_its_corr_then_a_disconnect(abused):
    sock = raw_socket(abused)
    data = raw_request(ApiKey.PING, 9, {}, [b"x" * 200_000])
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the broker may close before we finish writing: what we sent is not buffered
    responses = closed_after(sock)
    assert [(r.corr, r.body["error_code"]) for r in responses] == [(9, ErrorCode.MESSAGE_TOO_LARGE)]
    assert "socket.request.max.bytes" in responses[0].body["error_message"]


def test_a_size_field_claiming_gigabytes_is_refused_without_waiting_for_them(abused):
    sock = raw_socket(abused)
    head = packed_header(corr=3, **GOOD_HEADER)
    sock.sendall((2 ** 31).to_bytes(4, "big") + len(head).to_bytes(4, "big") + head)
    responses = closed_after(sock)
    assert [(r.corr, r.body["error_code"]) for r in responses] == [(3, ErrorCode.MESSAGE_TOO_LARGE)]


def test_a_client_that_connects_and_never_speaks_is_closed_when_idle(abused):
    sock = raw_socket(abused)
    started = time.monotonic()
    assert closed_after(sock, timeout=30) == []
    assert time.monotonic() - started >= 0.4  # not before connections.max.idle.ms (500 ms)


def test_a_client_that_sends_half_a_request_and_stops_is_closed_when_idle(abused):
    sock = raw_socket(abused)
    sock.sendall(raw_request(ApiKey.PING, 1)[:11])
    assert closed_after(sock, timeout=30) == []


def test_a_client_that_hangs_up_mid_request_does_not_disturb_others(abused):
    for _ in range(20):
        sock = raw_socket(abused)
        sock.sendall(raw_request(ApiKey.PING, 1, {}, [b"y" * 5000])[:3000])
        sock.close()
    with connect(abused) as conn:
        assert conn.request(ApiKey.PING, {"fine": True}).body == {"fine": True}


def test_random_bytes_never_hurt_the_broker(abused):
    import random
    rng = random.Random(1234)
    for _ in range(30):
        sock = raw_socket(abused)
        try:
            sock.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300))))
        except OSError:
            pass
        sock.close()
    with connect(abused) as conn:
        assert conn.request(ApiKey.PING, {"fine": True}).body == {"fine": True}
    for name in ("acceptor", "processor-0", "processor-1", "handler-0", "handler-1"):
        assert actor(abused, name)["restarts"] == 0


def test_500_connections_at_once_are_all_served(abused):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    socks = [raw_socket(abused) for _ in range(500)]
    try:
        for i, s in enumerate(socks):
            s.sendall(raw_request(ApiKey.PING, i, {"i": i}))
        for i, s in enumerate(socks):
            responses, closed = read_responses(s, 1)
            assert not closed and responses[0].body == {"i": i}
    finally:
        for s in socks:
            s.close()


def unread_by_the_broker(sock: socket.socket) -> int:
    """Bytes the broker's end of ``sock`` has received and not yet read (its receive queue in
    /proc/net/tcp, Linux)."""
    local_port = sock.getsockname()[1]
    broker_port = sock.getpeername()[1]
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if int(local.split(":")[1], 16) == broker_port and int(remote.split(":")[1], 16) == local_port:
                return int(queues.split(":")[1], 16)
    return -1  # not found (yet): the broker has not accepted it


def test_at_the_connection_limit_a_new_connection_is_closed_when_none_is_idle(start_broker):
    broker = start_broker(max_connections=5)
    busy = [raw_socket(broker) for _ in range(5)]
    try:
        for s in busy:  # half a request each: none of them is idle
            s.sendall(raw_request(ApiKey.PING, 1)[:11])
        wait_until(lambda: actor(broker, "acceptor")["state"] == "running")
        # only once a processor has read the half requests are they not idle (else, on a
        # loaded machine, one of them was shed for the extra one and the extra one served)
        wait_until(lambda: all(unread_by_the_broker(s) == 0 for s in busy), what="the half requests to be read")
        extra = raw_socket(broker)
        extra.sendall(raw_request(ApiKey.PING, 1))
        assert closed_after(extra) == []
        busy.pop().close()
        with connect(broker) as again:  # a slot is free again once the processor reports the close
            wait_until(lambda: _ping_ok(again), what="a freed slot to be reusable")
    finally:
        for s in busy:
            s.close()


def test_at_the_connection_limit_the_least_recently_used_idle_connection_makes_room(start_broker):
    """Defect 10 of issue 16: at max.connections everyone else was locked out; as in Kafka, the
    least recently used idle connection is closed for the new one."""
    broker = start_broker(max_connections=5, num_network_threads=1)
    conns = [connect(broker) for _ in range(5)]
    try:
        for c in conns:
            c.request(ApiKey.PING, {})
        for c in conns[1:]:  # conns[0] is now the least recently used
            c.request(ApiKey.PING, {})
        with connect(broker) as newcomer:
            assert newcomer.request(ApiKey.PING, {"new": 1}, timeout=10).body == {"new": 1}
        assert not _ping_ok(conns[0])
        for c in conns[1:]:
            assert c.request(ApiKey.PING, {"still": 1}, timeout=10).body == {"still": 1}
    finally:
        for c in conns:
            c.close()


def test_one_address_cannot_take_every_connection_by_default():
    """Defect 10 of issue 16: one IP could take all max.connections."""
    from odradek import config as cfg
    defaults = cfg.load(None, [])
    assert defaults["max.connections.per.ip"] < defaults["max.connections"]


def test_the_per_ip_limit_closes_connections_over_it(start_broker):
    broker = start_broker(max_connections_per_ip=2)
    conns = [connect(broker) for _ in range(2)]
    try:
        for c in conns:
            c.request(ApiKey.PING, {})
        extra = raw_socket(broker)
        assert closed_after(extra) == []
    finally:
        for c in conns:
            c.close()


def _ping_ok(conn) -> bool:
    try:
        return conn.request(ApiKey.PING, {"p": 1}, timeout=5).body == {"p": 1}
    except Exception:
        conn.close()
        return False
