"""kill -9 of each network role in turn: the supervisor restarts it; clients succeed again
after their retry; status shows the restart."""
from __future__ import annotations

import pytest

from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

from tests.network.helpers import actor, connect, kill9, raw_socket, read_responses, retrying, wait_until


def restarted(broker, name: str, old_pid: int) -> dict:
    """Wait until ``name`` runs again under a new pid; its status row."""
    return wait_until(lambda: (lambda a: a if a["state"] == "running" and a["pid"] != old_pid and
                               a["restarts"] >= 1 else None)(actor(broker, name)),
                      what=f"{name} to be restarted")


def test_a_killed_acceptor_is_restarted_on_the_same_port_and_new_clients_get_in(broker):
    with connect(broker) as before:
        before.request(ApiKey.PING, {})
        old = actor(broker, "acceptor")
        kill9(old["pid"])
        row = restarted(broker, "acceptor", old["pid"])
        assert row["restarts"] == 1
        # Connections already handed to processors never noticed.
        assert before.request(ApiKey.PING, {"x": 1}).body == {"x": 1}
    with connect(broker) as after:
        assert retrying(lambda: after.request(ApiKey.PING, {"y": 2})).body == {"y": 2}
        assert after.metadata()["brokers"][0]["port"] == broker.port


def test_a_killed_processor_drops_its_connections_and_clients_reconnect(start_broker):
    broker = start_broker(num_network_threads=1)
    conn = connect(broker)
    conn.request(ApiKey.PING, {})
    old = actor(broker, "processor-0")
    kill9(old["pid"])
    with pytest.raises(OdradekError) as err:
        conn.request(ApiKey.PING, {}, timeout=10)
    assert err.value.code == ErrorCode.NETWORK_EXCEPTION and err.value.retriable
    restarted(broker, "processor-0", old["pid"])
    assert retrying(lambda: conn.request(ApiKey.PING, {"back": True})).body == {"back": True}
    assert conn.reconnects >= 1
    conn.close()


def test_requests_in_flight_at_a_killed_handler_fail_at_once_with_a_retriable_error(start_broker):
    broker = start_broker(num_io_threads=1, request_timeout_ms=60000)
    with connect(broker) as conn:
        conn.request(ApiKey.PING, {})
        old = actor(broker, "handler-0")
        # Stop the handler so requests pile up at it, then kill it: they must fail long before
        # request.timeout.ms (60 s here; the receive timeout below is 20 s).
        import os
        import signal
        os.kill(old["pid"], signal.SIGSTOP)
        corrs = [conn.send(ApiKey.PING, {"i": i}) for i in range(5)]
        kill9(old["pid"])
        for corr in corrs:
            with pytest.raises(OdradekError) as err:
                conn.receive(corr, timeout=20)
            assert err.value.code == ErrorCode.NETWORK_EXCEPTION and "handler-0" in err.value.message
        restarted(broker, "handler-0", old["pid"])
        assert retrying(lambda: conn.request(ApiKey.PING, {"ok": 1})).body == {"ok": 1}


def test_a_killed_handler_is_replaced_and_its_connections_move_to_the_others(start_broker):
    broker = start_broker(num_io_threads=2)
    conns = [connect(broker) for _ in range(4)]
    try:
        for c in conns:
            c.request(ApiKey.PING, {})
        old = actor(broker, "handler-1")
        kill9(old["pid"])
        for c in conns:  # served by handler-0 while handler-1 restarts, or by the new handler-1
            assert retrying(lambda: c.request(ApiKey.PING, {"n": 1})).body == {"n": 1}
        restarted(broker, "handler-1", old["pid"])
        for c in conns:
            assert c.request(ApiKey.PING, {"n": 2}).body == {"n": 2}
    finally:
        for c in conns:
            c.close()


def test_per_ip_limits_survive_an_acceptor_restart(start_broker):
    broker = start_broker(max_connections_per_ip=3)
    conns = [connect(broker) for _ in range(3)]
    try:
        for c in conns:
            c.request(ApiKey.PING, {})
        old = actor(broker, "acceptor")
        kill9(old["pid"])
        restarted(broker, "acceptor", old["pid"])
        # The new acceptor asked the processors for their connections before accepting.
        sock = wait_until(lambda: raw_socket(broker), what="the listener to be back")
        _, closed = read_responses(sock, 1, timeout=10)
        sock.close()
        assert closed
        conns[0].close()
        with connect(broker) as again:
            assert retrying(lambda: again.request(ApiKey.PING, {"ok": 1})).body == {"ok": 1}
    finally:
        for c in conns:
            c.close()


def test_requests_in_flight_at_a_stopping_processor_fail_with_a_retriable_error(start_broker):
    """A broker stopped with SIGTERM while requests wait at a frozen handler: the processor
    answers them when its drain runs out, with a code the client retries elsewhere (the CI
    run of 2026-11-29 saw three produces fail for good with BROKER_NOT_AVAILABLE)."""
    import os
    import signal
    import threading
    broker = start_broker(num_io_threads=1, request_timeout_ms=60000)
    with connect(broker) as conn:
        conn.request(ApiKey.PING, {})
        handler = actor(broker, "handler-0")
        os.kill(handler["pid"], signal.SIGSTOP)
        try:
            corrs = [conn.send(ApiKey.PING, {"i": i}) for i in range(3)]
            stopper = threading.Thread(target=broker.terminate, kwargs={"timeout": 60})
            stopper.start()
            for corr in corrs:
                with pytest.raises(OdradekError) as err:
                    conn.receive(corr, timeout=30)
                assert err.value.retriable, (err.value.code, err.value.message)
                assert err.value.code == ErrorCode.NETWORK_EXCEPTION and "stopping" in err.value.message
        finally:
            os.kill(handler["pid"], signal.SIGCONT)
        stopper.join(60)
