"""The client side of one broker connection: framing, correlation ids, pipelining, callbacks.

Runs in the client's process (the bundled clients through ``odradek.cluster``, the command
line, the broker's own connections through ``network.client.BrokerConnection``, tests).
``Connection`` owns one TCP socket to one broker, owned in turn by one thread: requests are
written without waiting, many in flight, each with an optional callback that ``poll()`` /
``read()`` calls with ``(frame, error)``; ``fileno()`` lets its owner wait on several
connections and a wake-up pipe (``wait_any``); ``request`` is the blocking one-request
convenience. ``parse_bootstrap`` turns ``"host:port,..."`` into addresses.
Invariants: nothing here starts a thread; a lost connection fails every request in flight with
NETWORK_EXCEPTION, and ``check_timeouts`` closes a connection whose oldest request waited past
``request_timeout_ms`` the same way; a non-zero top-level ``error_code`` reaches the callback as
an error from the connection's ``error`` factory (a plain ``OdradekError`` by default: this
layer does not import the top one).
"""
from __future__ import annotations

import collections
import itertools
import select
import socket
import time
from typing import Any, Callable, Optional, Sequence

from odradek.core import codec
from odradek.network.clientauth import ClientSecurity
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

RECV_SIZE = 1 << 20
Callback = Callable[[Optional[codec.Frame], Optional[OdradekError]], None]
ErrorFactory = Callable[[int, Optional[str]], OdradekError]


def plain_error(code: int, message: str | None = None) -> OdradekError:
    """An ``OdradekError`` for a code (the default ``error`` factory of a ``Connection``)."""
    member = ErrorCode.of(code)
    return OdradekError(message or member.meaning, member)


def parse_bootstrap(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` (or a list of such) -> ``[(host, port), ...]``; INVALID_CONFIG
    (an ``OdradekError``, also a ``ValueError``) when an item is not ``host:port``."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = []
    for item in items:
        item = item.strip()
        if "://" in item:
            item = item.split("://", 1)[1]
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise BootstrapError(f"bootstrap server {item!r} is not host:port", ErrorCode.INVALID_CONFIG)
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise BootstrapError("no bootstrap servers given (expected 'host:port[,host:port...]')",
                             ErrorCode.INVALID_CONFIG)
    return out


class BootstrapError(OdradekError, ValueError):
    """A bootstrap list that is not ``host:port[,host:port...]``: INVALID_CONFIG, and a
    ``ValueError`` (the caller's mistake) for the clients that raised that before."""


class Connection:
    """A pipelined connection to one broker. Not thread-safe: one owner thread."""

    def __init__(self, host: str, port: int, client_id: str = "odradek-client",
                 request_timeout_ms: int = 30000, connect_timeout_ms: int = 10000,
                 max_response_bytes: int = 1 << 31, security: ClientSecurity | None = None,
                 error: ErrorFactory = plain_error):
        self.host, self.port = host, int(port)
        self.security = security  # TLS/SASL: network/clientauth.py
        self.client_id = client_id
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.max_response_bytes = max_response_bytes
        self.error = error
        self.sock: socket.socket | None = None
        self._decoder: codec.Decoder | None = None
        self._corr = itertools.count(1)
        self._pending: dict[int, tuple[Callback, float]] = {}  # corr -> (callback, sent_at); in order
        self._out: collections.deque = collections.deque()  # buffers not yet written
        self._on_written: collections.deque = collections.deque()  # (bytes_total_at_end, callback)
        self._queued_total = 0
        self._written_total = 0
        self.reconnects = 0  # connections opened after the first

    def __repr__(self) -> str:
        return f"Connection({self.host}:{self.port}, in_flight={len(self._pending)})"

    # ---- state ----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self.sock is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def connect(self, timeout: float | None = None, backoff: float | None = None,
                backoff_max: float = 1.0) -> None:
        """Connect (blocking); raises NETWORK_EXCEPTION if the broker is down. One attempt,
        or with ``backoff`` (seconds) attempts that double it up to ``backoff_max`` until
        ``timeout`` has passed (a broker restarting its listener is waited for)."""
        if self.sock is not None:
            return
        timeout = self.connect_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=max(0.01, deadline - time.monotonic()))
                break
            except OSError as exc:
                left = deadline - time.monotonic()
                if backoff is None or left <= 0:
                    raise self.error(ErrorCode.NETWORK_EXCEPTION,
                                     f"cannot connect to {self.host}:{self.port}: {exc}") from None
                time.sleep(min(backoff, left))
                backoff = min(backoff * 2, backoff_max)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.security is not None:
            sock = self.security.secure(sock, self.host, max(0.5, deadline - time.monotonic()) if backoff
                                        is not None else timeout)
        sock.setblocking(False)
        if self._decoder is not None:
            self.reconnects += 1
        self.sock = sock
        self._decoder = codec.Decoder(self.max_response_bytes, codec.RESPONSE_FIELDS)

    def close(self, why: str = "connection closed by the client") -> None:
        """Drop the socket; every request in flight fails with NETWORK_EXCEPTION."""
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        pending, self._pending = self._pending, {}
        self._out.clear()
        written, self._on_written = self._on_written, collections.deque()
        self._queued_total = self._written_total = 0
        err = f"connection to {self.host}:{self.port} lost before the response arrived ({why})"
        for callback, _ in pending.values():
            callback(None, self.error(ErrorCode.NETWORK_EXCEPTION, err))
        for _, callback in written:
            callback(None, self.error(ErrorCode.NETWORK_EXCEPTION, err))

    def forget(self, corr: int) -> None:
        """Stop waiting for ``corr`` (its caller gave up): a late answer is dropped."""
        self._pending.pop(corr, None)

    # ---- writing ----------------------------------------------------------------------------
    def send(self, api: int, body: dict, frames: Sequence[Any] = (), callback: Callback | None = None,
             expect_response: bool = True, version: int = 0, flush: bool = True,
             connect_timeout: float | None = None) -> int:
        """Queue a request and write what the socket takes now (``flush=False``: not yet).
        ``callback(frame, error)`` runs when the response arrives, or, with
        ``expect_response=False`` (acks=0), once the request's last byte is handed to the
        kernel. Connects on demand."""
        if self.sock is None:
            self.connect(connect_timeout)
        corr = next(self._corr)
        bufs = codec.encode_request(api, version, corr, self.client_id, body, frames)
        for b in bufs:
            self._out.append(b)
            self._queued_total += len(b) if not isinstance(b, memoryview) else b.nbytes
        if expect_response:
            self._pending[corr] = (callback or _ignore, time.monotonic())
        elif callback is not None:
            self._on_written.append((self._queued_total, callback))
        if flush:
            self.flush()
        return corr

    def flush(self) -> None:
        """Write as much of the queued bytes as the socket accepts without blocking."""
        out = self._out
        while out and self.sock is not None:
            try:
                sent = self.sock.sendmsg(list(itertools.islice(out, 64)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self.close(f"write failed: {exc}")
                return
            self._written_total += sent
            while out:  # drop what was written, empty buffers included (an empty last frame)
                head = out[0]
                n = len(head) if not isinstance(head, memoryview) else head.nbytes
                if sent >= n:
                    out.popleft()
                    sent -= n
                else:
                    if sent:
                        out[0] = memoryview(head)[sent:]
                    break
        while self._on_written and self._on_written[0][0] <= self._written_total:
            self._on_written.popleft()[1](None, None)

    # ---- reading ----------------------------------------------------------------------------
    def read(self) -> int:
        """Read what has arrived (non-blocking) and run the callbacks of complete responses;
        returns how many responses completed."""
        if self.sock is None:
            return 0
        done = 0
        while True:
            try:
                data = self.sock.recv(RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return done
            except OSError as exc:
                self.close(f"read failed: {exc}")
                return done
            if not data:
                self.close("closed by the broker")
                return done
            self._decoder.feed(data)
            try:
                while (frame := self._decoder.next()) is not None:
                    entry = self._pending.pop(frame.header["corr"], None)
                    if entry is not None:
                        done += 1
                        self._complete(entry[0], frame)
            except codec.FrameError as exc:
                self.close(f"undecodable response: {exc.message}")
                return done
            if len(data) < RECV_SIZE:
                return done

    def _complete(self, callback: Callback, frame: codec.Frame) -> None:
        body = frame.header["body"]
        code = body.get("error_code") if isinstance(body, dict) else None
        if code:
            callback(frame, self.error(code, body.get("error_message")))
        else:
            callback(frame, None)

    def check_timeouts(self, now: float) -> None:
        """Close the connection if its oldest request has waited past the request timeout."""
        if self._pending:
            oldest = next(iter(self._pending.values()))[1]
            if now - oldest > self.request_timeout:
                self.close(f"no response within {self.request_timeout:g}s (request.timeout.ms)")

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for this connection alone, write what is queued and
        read what arrives; returns how many responses completed. No request timeout here."""
        if self.sock is None:
            return 0
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | (select.POLLOUT if self._out else 0))
        try:
            events = poller.poll(max(0, int(timeout * 1000 + 0.999)))
        except InterruptedError:
            events = []
        if events and events[0][1] & select.POLLOUT:
            self.flush()
        return self.read() if events else 0

    def poll(self, timeout: float) -> int:
        """``wait``, then close the connection if a request is overdue (``check_timeouts``)."""
        done = self.wait(timeout)
        self.check_timeouts(time.monotonic())
        return done

    # ---- blocking convenience ---------------------------------------------------------------
    def request(self, api: int, body: dict, frames: Sequence[Any] = (), timeout: float | None = None) -> codec.Frame:
        """Send one request and wait for its answer (raising the broker's error, if any)."""
        result: list = []
        self.send(api, body, frames, lambda frame, err: result.append((frame, err)))
        deadline = time.monotonic() + (self.request_timeout if timeout is None else timeout)
        while not result:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close("request timed out")
                raise self.error(ErrorCode.REQUEST_TIMED_OUT, f"no response from {self.host}:{self.port} "
                                 f"to {ApiKey(api).name} within {timeout or self.request_timeout:g}s")
            self.poll(min(left, 1.0))
        frame, err = result[0]
        if err is not None:
            raise err
        return frame


def _ignore(frame, err) -> None:
    pass


def wait_any(conns, timeout: float, wake_fd: int | None = None) -> bool:
    """Wait on several connections (and a wake-up pipe) at once; flush the writable, read
    the readable, enforce request timeouts. Returns True if the wake pipe fired."""
    poller = select.poll()
    by_fd = {}
    for c in conns:
        if c.sock is not None:
            fd = c.sock.fileno()
            by_fd[fd] = c
            poller.register(fd, select.POLLIN | (select.POLLOUT if c._out else 0))
    if wake_fd is not None:
        poller.register(wake_fd, select.POLLIN)
    woke = False
    try:
        events = poller.poll(max(0, int(timeout * 1000 + 0.999)))
    except InterruptedError:
        events = []
    for fd, ev in events:
        if fd == wake_fd:
            woke = True
            continue
        c = by_fd[fd]
        if ev & select.POLLOUT:
            c.flush()
        if ev & (select.POLLIN | select.POLLERR | select.POLLHUP):
            c.read()
    now = time.monotonic()
    for c in by_fd.values():
        c.check_timeouts(now)
    return woke
