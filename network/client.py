"""The client side of one broker connection: framing, correlation ids, pipelining, reconnect.

Runs in the client's process (the bundled Producer/Consumer/Admin, the command line, tests).
It owns one TCP socket to one broker. **Not thread-safe**: one ``BrokerConnection`` per
thread (or the caller's own lock); that keeps the hot path free of locks.

    conn = BrokerConnection("127.0.0.1", 9092, client_id="me")
    conn.request(ApiKey.METADATA, {}).body            # one round trip
    corrs = [conn.send(ApiKey.PING, {"i": i}) for i in range(8)]   # pipelining
    replies = [conn.receive(c) for c in corrs]

Responses are matched by correlation id. A response whose body carries a non-zero top-level
``error_code`` raises ``OdradekError`` with the broker's code and message. If the connection
drops, every request in flight on it fails with NETWORK_EXCEPTION (retriable: its outcome is
unknown); the next request reconnects, retrying with exponential backoff (from
``reconnect_backoff_ms`` up to ``reconnect_backoff_max_ms``) until its own timeout.
"""
from __future__ import annotations

import itertools
import socket
import time
from typing import Any, NamedTuple, Sequence

from odradek.network import codec
from odradek.network.clientauth import ClientSecurity
from odradek.network.protocol import ApiKey, ErrorCode, OdradekError

RECV_SIZE = 256 * 1024


class Response(NamedTuple):
    body: dict
    frames: list  # memoryviews of the received bytes


def parse_bootstrap(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` (or a list of such) -> ``[(host, port), ...]``."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise OdradekError(f"bootstrap server {item!r} is not host:port", ErrorCode.INVALID_CONFIG)
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise OdradekError("no bootstrap servers given", ErrorCode.INVALID_CONFIG)
    return out


bootstrap = parse_bootstrap


class BrokerConnection:
    def __init__(self, host: str, port: int, client_id: str = "odradek-client", request_timeout_ms: int = 30000,
                 connect_timeout_ms: int = 10000, reconnect_backoff_ms: int = 50,
                 reconnect_backoff_max_ms: int = 1000, max_response_bytes: int = 1 << 31,
                 security: ClientSecurity | None = None, **security_options):
        self.host, self.port = host, int(port)
        # TLS/SASL (network/clientauth.py): a ClientSecurity, or kafka-python's option names
        self.security = security or ClientSecurity.from_options(security_options)
        self.client_id = client_id
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.backoff_initial = reconnect_backoff_ms / 1000
        self.backoff_max = reconnect_backoff_max_ms / 1000
        self.max_response_bytes = max_response_bytes
        self.sock: socket.socket | None = None
        self._decoder: codec.Decoder | None = None
        self._corr = itertools.count(1)
        self._pending: set[int] = set()  # sent on the current socket, not yet answered
        self._ready: dict[int, codec.Frame] = {}  # answered, not yet collected
        self._failed: dict[int, OdradekError] = {}  # lost with a dropped connection
        self.reconnects = 0

    # ---- connection ------------------------------------------------------------------------
    def connect(self, timeout: float | None = None) -> None:
        """Connect now (``send`` does it on demand), retrying with backoff until ``timeout``."""
        deadline = time.monotonic() + (self.connect_timeout if timeout is None else timeout)
        backoff = self.backoff_initial
        while True:
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=max(0.01, deadline - time.monotonic()))
                break
            except OSError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OdradekError(f"cannot connect to {self.host}:{self.port}: {exc}",
                                       ErrorCode.NETWORK_EXCEPTION) from None
                time.sleep(min(backoff, left))
                backoff = min(backoff * 2, self.backoff_max)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.security is not None:
            sock = self.security.secure(sock, self.host, max(0.5, deadline - time.monotonic()))
        sock.setblocking(True)
        sock.settimeout(None)
        if self._decoder is not None:
            self.reconnects += 1
        self.sock = sock
        self._decoder = codec.Decoder(self.max_response_bytes, codec.RESPONSE_FIELDS)

    @property
    def connected(self) -> bool:
        return self.sock is not None

    def close(self) -> None:
        self._drop("connection closed by the client")

    def __enter__(self) -> "BrokerConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _drop(self, why: str) -> None:
        """Lose the socket: every request in flight on it fails with NETWORK_EXCEPTION."""
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        for corr in self._pending:
            self._failed[corr] = OdradekError(f"connection to {self.host}:{self.port} lost before the "
                                              f"response arrived ({why})", ErrorCode.NETWORK_EXCEPTION)
        self._pending.clear()

    # ---- requests ----------------------------------------------------------------------------
    def request(self, api: int, body: dict | None = None, frames: Sequence[Any] = (), timeout: float | None = None,
                version: int = 0) -> Response:
        """Send one request and wait for its response."""
        timeout = self.request_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        corr = self.send(api, body, frames, version, connect_timeout=min(timeout, self.connect_timeout))
        return self.receive(corr, max(0.0, deadline - time.monotonic()))

    def send(self, api: int, body: dict | None = None, frames: Sequence[Any] = (), version: int = 0,
             connect_timeout: float | None = None) -> int:
        """Send a request without waiting; returns its correlation id for ``receive``."""
        corr = next(self._corr)
        self._write(codec.encode_request(api, version, corr, self.client_id, body or {}, frames), connect_timeout)
        self._pending.add(corr)
        return corr

    def send_many(self, requests: Sequence[tuple[int, dict]], version: int = 0) -> list[int]:
        """Pipeline several frame-less requests in one write; returns their corrs."""
        corrs, bufs = [], []
        for api, body in requests:
            corr = next(self._corr)
            corrs.append(corr)
            bufs.extend(codec.encode_request(api, version, corr, self.client_id, body or {}))
        self._write([b"".join(bufs)], None)
        self._pending.update(corrs)
        return corrs

    def _write(self, bufs: list, connect_timeout: float | None) -> None:
        if self.sock is None:
            self.connect(connect_timeout)
        try:
            total = sum(len(b) if not isinstance(b, memoryview) else b.nbytes for b in bufs)
            sent = self.sock.sendmsg(bufs)
            if sent < total:
                self.sock.sendall(b"".join(bytes(b) for b in bufs)[sent:])
        except OSError as exc:
            self._drop(f"write failed: {exc}")
            raise OdradekError(f"connection to {self.host}:{self.port} lost while sending: {exc}",
                               ErrorCode.NETWORK_EXCEPTION) from None

    def receive(self, corr: int, timeout: float | None = None) -> Response:
        """Wait for the response to ``corr``. Raises OdradekError on an error body,
        NETWORK_EXCEPTION if the connection dropped, REQUEST_TIMED_OUT after ``timeout``."""
        frame = self._wait(corr, self.request_timeout if timeout is None else timeout)
        body = frame.header["body"]
        code = body.get("error_code")
        if code:
            raise OdradekError(body.get("error_message") or "", ErrorCode.of(code))
        return Response(body, frame.frames)

    def _wait(self, corr: int, timeout: float) -> codec.Frame:
        deadline = time.monotonic() + timeout
        while True:
            frame = self._ready.pop(corr, None)
            if frame is not None:
                return frame
            failed = self._failed.pop(corr, None)
            if failed is not None:
                raise failed
            if corr not in self._pending:
                raise OdradekError(f"no request with correlation id {corr} is waiting", ErrorCode.INVALID_REQUEST)
            left = deadline - time.monotonic()
            if left <= 0:
                self._pending.discard(corr)  # a late response to it is dropped
                raise OdradekError(f"no response from {self.host}:{self.port} within {timeout:g}s",
                                   ErrorCode.REQUEST_TIMED_OUT)
            self._read(left)

    def _read(self, timeout: float) -> None:
        sock = self.sock
        try:
            sock.settimeout(timeout)  # recv() then polls this one fd (no select(): fds > 1024 are fine)
            data = sock.recv(RECV_SIZE)
        except (socket.timeout, BlockingIOError):
            return
        except OSError as exc:
            self._drop(f"read failed: {exc}")
            return
        if not data:
            self._drop("closed by the broker")
            return
        self._decoder.feed(data)
        try:
            while (frame := self._decoder.next()) is not None:
                corr = frame.header["corr"]
                if corr in self._pending:
                    self._pending.discard(corr)
                    self._ready[corr] = frame
        except codec.FrameError as exc:
            self._drop(f"undecodable response: {exc.message}")

    # ---- conveniences ------------------------------------------------------------------------
    def api_versions(self) -> dict:
        return self.request(ApiKey.API_VERSIONS, {}).body

    def metadata(self, topics: list[str] | None = None) -> dict:
        return self.request(ApiKey.METADATA, {"topics": topics} if topics is not None else {}).body
