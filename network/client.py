"""The blocking request/answer client of one broker connection: send, then wait for the answer.

Runs in the client's process (the command line, tools, pipeline sinks, tests, and the broker's
own connections to other brokers: the replica fetcher, the controller's channels, the
transaction coordinator's markers). A thin wrapper over ``network.connection.Connection``
adding connect retries with backoff (``reconnect_backoff_ms`` up to
``reconnect_backoff_max_ms``) and answers kept until their caller collects them.

    conn = BrokerConnection("127.0.0.1", 9092, client_id="me")
    conn.request(ApiKey.METADATA, {}).body            # one round trip
    corrs = [conn.send(ApiKey.PING, {"i": i}) for i in range(8)]   # pipelining
    replies = [conn.receive(c) for c in corrs]

Invariants: not thread-safe (one ``BrokerConnection`` per thread); a non-zero top-level
``error_code`` raises ``OdradekError``; a dropped connection fails every request in flight on it
with NETWORK_EXCEPTION; a ``receive`` that times out (REQUEST_TIMED_OUT) gives up on that
request alone, and a late answer to it is dropped.
"""
from __future__ import annotations

import time
from typing import Any, NamedTuple, Sequence

from odradek.core import codec
from odradek.network.clientauth import ClientSecurity
from odradek.network.connection import Connection, parse_bootstrap
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

__all__ = ["BrokerConnection", "Response", "parse_bootstrap", "bootstrap"]


class Response(NamedTuple):
    body: dict
    frames: list  # memoryviews of the received bytes


bootstrap = parse_bootstrap


class BrokerConnection:
    def __init__(self, host: str, port: int, client_id: str = "odradek-client", request_timeout_ms: int = 30000,
                 connect_timeout_ms: int = 10000, reconnect_backoff_ms: int = 50,
                 reconnect_backoff_max_ms: int = 1000, max_response_bytes: int = 1 << 31,
                 security: ClientSecurity | None = None, **security_options):
        # TLS/SASL (network/clientauth.py): a ClientSecurity, or kafka-python's option names
        security = security or ClientSecurity.from_options(security_options)
        self.conn = Connection(host, port, client_id, request_timeout_ms, connect_timeout_ms, max_response_bytes,
                               security)
        self.host, self.port = self.conn.host, self.conn.port
        self.security = security
        self.client_id = client_id
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.backoff_initial = reconnect_backoff_ms / 1000
        self.backoff_max = reconnect_backoff_max_ms / 1000
        self._waiting: set[int] = set()  # sent, not yet answered nor given up on
        self._ready: dict[int, codec.Frame] = {}  # answered, not yet collected
        self._failed: dict[int, OdradekError] = {}  # lost with a dropped connection

    # ---- connection ------------------------------------------------------------------------
    def connect(self, timeout: float | None = None) -> None:
        """Connect now (``send`` does it on demand), retrying with backoff until ``timeout``."""
        self.conn.connect(self.connect_timeout if timeout is None else timeout, self.backoff_initial,
                          self.backoff_max)

    @property
    def sock(self):
        return self.conn.sock

    @property
    def connected(self) -> bool:
        return self.conn.sock is not None

    @property
    def reconnects(self) -> int:
        return self.conn.reconnects

    def close(self) -> None:
        self.conn.close("connection closed by the client")

    def __enter__(self) -> "BrokerConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
        self._ensure_connected(connect_timeout)
        corr = self.conn.send(api, body or {}, frames, self._answered, version=version, flush=False)
        self._waiting.add(corr)
        self.conn.flush()
        self._written(corr)
        return corr

    def send_many(self, requests: Sequence[tuple[int, dict]], version: int = 0) -> list[int]:
        """Pipeline several frame-less requests in one write; returns their corrs."""
        self._ensure_connected(None)
        corrs = [self.conn.send(api, body or {}, (), self._answered, version=version, flush=False)
                 for api, body in requests]
        self._waiting.update(corrs)
        self.conn.flush()
        for corr in corrs:
            self._written(corr)
        return corrs

    def _ensure_connected(self, connect_timeout: float | None) -> None:
        if self.conn.sock is None:
            self.connect(connect_timeout)

    def _answered(self, frame: codec.Frame | None, err: OdradekError | None) -> None:
        """The connection's callback: keep the answer (or the loss) until ``receive``."""
        if frame is None:  # the connection dropped: ``err`` is NETWORK_EXCEPTION
            for corr in self._waiting:
                self._failed.setdefault(corr, err)
            self._waiting.clear()
            return
        corr = frame.header["corr"]
        if corr in self._waiting:
            self._waiting.discard(corr)
            self._ready[corr] = frame

    def _written(self, corr: int) -> None:
        """Block until the request's bytes are all handed to the kernel (as a blocking socket
        would); a write that fails raises NETWORK_EXCEPTION here."""
        while self.conn.wants_write and self.conn.sock is not None:
            self.conn.wait(self.request_timeout)
        failed = self._failed.pop(corr, None)
        if failed is not None:
            raise OdradekError(f"connection to {self.host}:{self.port} lost while sending: {failed.message}",
                               ErrorCode.NETWORK_EXCEPTION)

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
            if corr not in self._waiting:
                raise OdradekError(f"no request with correlation id {corr} is waiting", ErrorCode.INVALID_REQUEST)
            left = deadline - time.monotonic()
            if left <= 0:
                self._waiting.discard(corr)  # a late response to it is dropped
                self.conn.forget(corr)
                raise OdradekError(f"no response from {self.host}:{self.port} within {timeout:g}s",
                                   ErrorCode.REQUEST_TIMED_OUT)
            self.conn.wait(left)

    # ---- conveniences ------------------------------------------------------------------------
    def api_versions(self) -> dict:
        return self.request(ApiKey.API_VERSIONS, {}).body

    def metadata(self, topics: list[str] | None = None) -> dict:
        return self.request(ApiKey.METADATA, {"topics": topics} if topics is not None else {}).body
