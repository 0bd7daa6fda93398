"""Small helpers for the network edge's end-to-end tests."""
from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time

import msgpack

from odradek.core import codec
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, OdradekError


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after a generous timeout."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the broker may be mid-restart
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


def retrying(fn, attempts: int = 100, pause: float = 0.1):
    """Call ``fn`` until it succeeds, retrying retriable OdradekErrors (a client's retry loop)."""
    for i in range(attempts):
        try:
            return fn()
        except OdradekError as exc:
            if not exc.retriable or i == attempts - 1:
                raise
            time.sleep(pause)


def actor(broker, name: str) -> dict:
    return next(a for a in broker.status()["actors"] if a["name"] == name)


def actors_of(broker, role: str) -> list[dict]:
    return [a for a in broker.status()["actors"] if a["role"] == role]


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def connect(broker, **kw) -> BrokerConnection:
    return BrokerConnection(broker.host, broker.port, client_id="test", request_timeout_ms=15000, **kw)


def raw_socket(broker, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection((broker.host, broker.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def raw_request(api, corr: int, body: dict | None = None, frames=(), version: int = 0) -> bytes:
    return b"".join(bytes(b) for b in codec.encode_request(api, version, corr, "raw", body or {}, frames))


def raw_frame(header: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(payload), len(header)) + header + payload


def packed_header(**fields) -> bytes:
    return msgpack.packb(fields)


def read_responses(sock: socket.socket, count: int | None = None, timeout: float = 10.0):
    """Read responses until ``count`` arrived or the peer closed. Returns (frames, closed)."""
    dec = codec.Decoder(fields=codec.RESPONSE_FIELDS)
    out = []
    sock.settimeout(timeout)
    while count is None or len(out) < count:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out, True
        if not data:
            return out, True
        dec.feed(data)
        while (f := dec.next()) is not None:
            out.append(f)
    return out, False


class PingLoad:
    """Client threads, each with its own connection, pipelining PINGs until stopped.
    Every failure is recorded: the tests that use it require none."""

    def __init__(self, broker, threads: int = 3, depth: int = 8):
        self.broker = broker
        self.depth = depth
        self.done = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> "PingLoad":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self, i: int) -> None:
        conn = connect(self.broker)
        n = 0
        try:
            while not self._stop.is_set():
                corrs = [conn.send(ApiKey.PING, {"t": i, "n": n + k}) for k in range(self.depth)]
                for k, corr in enumerate(corrs):
                    try:
                        body = conn.receive(corr).body
                        if body != {"t": i, "n": n + k}:
                            self._fail(f"thread {i}: wrong answer {body} for {n + k}")
                    except OdradekError as exc:
                        self._fail(f"thread {i}: {exc}")
                n += self.depth
                with self._lock:
                    self.done += self.depth
        except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
            self._fail(f"thread {i}: {type(exc).__name__}: {exc}")
        finally:
            conn.close()

    def _fail(self, what: str) -> None:
        with self._lock:
            self.failures.append(what)
