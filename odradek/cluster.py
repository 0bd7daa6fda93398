"""Client plumbing: a pipelined non-blocking broker connection and the metadata cache.

Runs in the client's process. Nothing here starts a thread.

- ``Connection``: one TCP socket to one broker, **owned by one thread** (the producer's
  sender thread, the consumer's caller, ...). Requests are written without waiting; each
  may carry a callback that ``poll()``/``read()`` calls with ``(response, error)`` when the
  answer arrives. It exposes ``fileno()`` so its owner can wait on several connections and
  a wake-up pipe at once with one ``select.poll``. Written on ``network.codec`` (the framing
  shared with the broker); ``network.client.BrokerConnection`` is the blocking
  one-request-at-a-time sibling, which cannot hand back responses without a blocking wait.
- ``Cluster``: brokers and topic metadata (partitions, leaders), refreshed on demand with a
  METADATA request. **Thread-safe**: ``refresh`` and ``request`` serialize on a lock and use
  a private connection; the snapshot attributes (``brokers``, ``topics``) are replaced whole,
  so readers in other threads see either the old or the new map, never a half-built one.

Errors: a lost connection fails every request in flight on it with NETWORK_EXCEPTION
(retriable: the outcome is unknown); a request unanswered after ``request_timeout_ms``
closes the connection the same way (as Kafka does). A top-level error body becomes the
``OdradekError`` subclass for its code.
"""
from __future__ import annotations

import collections
import itertools
import select
import socket
import threading
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

from odradek.network import codec
from odradek.network.clientauth import ClientSecurity
from odradek.network.protocol import ApiKey, ErrorCode, OdradekError
from odradek.errors import error_for
from odradek.types import BrokerMetadata, PartitionMetadata

RECV_SIZE = 1 << 20
Callback = Callable[[Optional[codec.Frame], Optional[OdradekError]], None]


def parse_bootstrap(servers) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` or a list of such -> ``[(host, port), ...]``."""
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
            raise ValueError(f"bootstrap server {item!r} is not host:port")
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise ValueError("no bootstrap servers given (expected 'host:port[,host:port...]')")
    return out


class Connection:
    """A pipelined connection to one broker. Not thread-safe: one owner thread."""

    def __init__(self, host: str, port: int, client_id: str = "odradek-client",
                 request_timeout_ms: int = 30000, connect_timeout_ms: int = 10000,
                 max_response_bytes: int = 1 << 31, security: ClientSecurity | None = None):
        self.host, self.port = host, int(port)
        self.security = security  # TLS/SASL: network/clientauth.py
        self.client_id = client_id
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.max_response_bytes = max_response_bytes
        self.sock: socket.socket | None = None
        self._decoder: codec.Decoder | None = None
        self._corr = itertools.count(1)
        self._pending: dict[int, tuple[Callback, float]] = {}  # corr -> (callback, sent_at); in order
        self._out: collections.deque = collections.deque()  # buffers not yet written
        self._on_written: collections.deque = collections.deque()  # (bytes_total_at_end, callback)
        self._queued_total = 0
        self._written_total = 0

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

    def connect(self, timeout: float | None = None) -> None:
        """Connect (blocking, one attempt); raises NETWORK_EXCEPTION if the broker is down."""
        if self.sock is not None:
            return
        try:
            sock = socket.create_connection((self.host, self.port),
                                            timeout=self.connect_timeout if timeout is None else timeout)
        except OSError as exc:
            raise error_for(ErrorCode.NETWORK_EXCEPTION, f"cannot connect to {self.host}:{self.port}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.security is not None:
            sock = self.security.secure(sock, self.host, self.connect_timeout if timeout is None else timeout)
        sock.setblocking(False)
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
            callback(None, error_for(ErrorCode.NETWORK_EXCEPTION, err))
        for _, callback in written:
            callback(None, error_for(ErrorCode.NETWORK_EXCEPTION, err))

    # ---- writing ----------------------------------------------------------------------------
    def send(self, api: int, body: dict, frames: Sequence[Any] = (), callback: Callback | None = None,
             expect_response: bool = True) -> int:
        """Queue a request and write what the socket takes now. ``callback(frame, error)`` runs
        when the response arrives, or, with ``expect_response=False`` (acks=0), once the
        request's last byte is handed to the kernel. Connects on demand."""
        if self.sock is None:
            self.connect()
        corr = next(self._corr)
        bufs = codec.encode_request(api, 0, corr, self.client_id, body, frames)
        for b in bufs:
            self._out.append(b)
            self._queued_total += len(b) if not isinstance(b, memoryview) else b.nbytes
        if expect_response:
            self._pending[corr] = (callback or _ignore, time.monotonic())
        elif callback is not None:
            self._on_written.append((self._queued_total, callback))
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
            while sent:
                head = out[0]
                n = len(head) if not isinstance(head, memoryview) else head.nbytes
                if sent >= n:
                    out.popleft()
                    sent -= n
                else:
                    out[0] = memoryview(head)[sent:]
                    sent = 0
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
                        _complete(entry[0], frame)
            except codec.FrameError as exc:
                self.close(f"undecodable response: {exc.message}")
                return done
            if len(data) < RECV_SIZE:
                return done

    def check_timeouts(self, now: float) -> None:
        """Close the connection if its oldest request has waited past the request timeout."""
        if self._pending:
            oldest = next(iter(self._pending.values()))[1]
            if now - oldest > self.request_timeout:
                self.close(f"no response within {self.request_timeout:g}s (request.timeout.ms)")

    def poll(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for this connection alone, then read."""
        if self.sock is None:
            return 0
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | (select.POLLOUT if self._out else 0))
        events = poller.poll(max(0, int(timeout * 1000 + 0.999)))
        if events and events[0][1] & select.POLLOUT:
            self.flush()
        done = self.read() if events else 0
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
                raise error_for(ErrorCode.REQUEST_TIMED_OUT, f"no response from {self.host}:{self.port} "
                                f"to {ApiKey(api).name} within {timeout or self.request_timeout:g}s")
            self.poll(min(left, 1.0))
        frame, err = result[0]
        if err is not None:
            raise err
        return frame


def _ignore(frame, err) -> None:
    pass


def _complete(callback: Callback, frame: codec.Frame) -> None:
    body = frame.header["body"]
    code = body.get("error_code") if isinstance(body, dict) else None
    if code:
        callback(frame, error_for(code, body.get("error_message")))
    else:
        callback(frame, None)


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


class TopicMetadata(NamedTuple):
    name: str
    error_code: int
    error_message: str | None
    is_internal: bool
    partitions: tuple  # PartitionMetadata by index
    topic_id: str | None = None


NETWORK_ERRORS = (ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT)
# A partition error that means the metadata is stale: refresh before retrying.
STALE_METADATA = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
                            ErrorCode.NETWORK_EXCEPTION, ErrorCode.REPLICA_NOT_AVAILABLE,
                            ErrorCode.KAFKA_STORAGE_ERROR})
FAILED_NODE_PENALTY = 5.0  # seconds a broker that failed is tried after the others


class Cluster:
    """Brokers and topic metadata, refreshed on demand. Thread-safe (see module doc).

    Metadata comes from any broker: the one that answered last, then every broker of the
    latest metadata, then the bootstrap list, then every broker ever learned; a broker that
    failed recently (``node_failed``) goes last. A partition's metadata never moves back to an
    older leader epoch (a broker that has not heard of an election yet answers with stale
    leaders; KIP-320). ``refresh_due``/``maybe_refresh`` keep refreshes ``retry_backoff_ms``
    apart, and ``stale`` says when ``metadata_max_age_ms`` has passed."""

    def __init__(self, bootstrap_servers, client_id: str = "odradek-client", request_timeout_ms: int = 30000,
                 retry_backoff_ms: int = 100, metadata_max_age_ms: int = 300000,
                 security: ClientSecurity | None = None):
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.security = security  # passed to every Connection this client opens
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff = retry_backoff_ms / 1000
        self.metadata_max_age = metadata_max_age_ms / 1000
        self.brokers: dict[int, BrokerMetadata] = {}
        self.topics: dict[str, TopicMetadata] = {}
        self.cluster_id: str | None = None
        self.controller_id: int | None = None
        self.updated_at = 0.0
        self.refresh_attempted_at = 0.0  # the last refresh, answered or not (for the backoff)
        self._known: dict[tuple, None] = {}  # every broker address ever learned, in order
        self._failed: dict[tuple, float] = {}  # address -> when it last failed (monotonic)
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._conns: dict[tuple, Connection] = {}  # address -> connection, for request_at

    # ---- reads of the snapshot ------------------------------------------------------------------
    def partitions(self, topic: str) -> tuple | None:
        t = self.topics.get(topic)
        return t.partitions if t is not None and not t.error_code else None

    def leader(self, topic: str, partition: int) -> int:
        """The leader's node id, or -1 if unknown."""
        t = self.topics.get(topic)
        if t is None or partition >= len(t.partitions):
            return -1
        return t.partitions[partition].leader

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch the metadata names for a partition, or -1 if unknown."""
        t = self.topics.get(topic)
        if t is None or partition >= len(t.partitions):
            return -1
        return t.partitions[partition].leader_epoch

    def broker(self, node_id: int) -> BrokerMetadata | None:
        return self.brokers.get(node_id)

    def address(self, node_id: int) -> tuple[str, int] | None:
        b = self.brokers.get(node_id)
        return (b.host, b.port) if b is not None else None

    # ---- broker health ----------------------------------------------------------------------------
    def node_failed(self, node_or_address) -> None:
        """A connection to this broker (node id or ``(host, port)``) failed: ask the others
        first for a while."""
        address = self.address(node_or_address) if isinstance(node_or_address, int) else tuple(node_or_address)
        if address is not None:
            self._failed[address] = time.monotonic()

    def node_ok(self, address) -> None:
        self._failed.pop(tuple(address), None)

    # ---- refresh ---------------------------------------------------------------------------------
    def refresh(self, topics: Sequence[str] | None = None, timeout: float | None = None) -> dict:
        """Ask a broker for metadata (``topics=None``: all topics) and merge it into the cache.
        Returns the raw response body. Raises NETWORK_EXCEPTION if no broker answers."""
        self.refresh_attempted_at = time.monotonic()
        body = self.request(ApiKey.METADATA, {"topics": list(topics) if topics is not None else None},
                            timeout=timeout).header["body"]
        self._merge(body, full=topics is None)
        return body

    def refresh_due(self, now: float | None = None) -> float:
        """Seconds until a refresh is allowed (0: now): refreshes are ``retry_backoff_ms`` apart."""
        now = time.monotonic() if now is None else now
        return max(0.0, self.refresh_attempted_at + self.retry_backoff - now)

    def stale(self, now: float | None = None) -> bool:
        """True once ``metadata_max_age_ms`` has passed since the last successful refresh."""
        now = time.monotonic() if now is None else now
        return now - self.updated_at > self.metadata_max_age

    def maybe_refresh(self, topics: Sequence[str] | None = None, timeout: float | None = None) -> bool:
        """Refresh unless one was attempted less than ``retry_backoff_ms`` ago; True if it did
        and an answer came. Never raises for a network failure (logged; the caller retries)."""
        if self.refresh_due():
            return False
        try:
            self.refresh(topics, timeout)
            return True
        except OdradekError as exc:
            if exc.code not in NETWORK_ERRORS:
                raise
            return False

    def _merge(self, body: dict, full: bool) -> None:
        old = self.topics
        self.cluster_id = body.get("cluster_id")
        controller = body.get("controller_id")
        self.controller_id = controller if controller is not None and controller >= 0 else None
        brokers = {b["node_id"]: BrokerMetadata(b["node_id"], b["host"], b["port"])
                   for b in body.get("brokers", [])}
        for b in brokers.values():
            self._known[(b.host, b.port)] = None
        self.brokers = brokers
        topics = {} if full else dict(old)
        for t in body.get("topics", []):
            parts = sorted((PartitionMetadata(t["name"], p["index"], p.get("leader", -1),
                                              p.get("leader_epoch", -1), tuple(p.get("replicas", ())),
                                              tuple(p.get("isr", ())), p.get("error_code", 0))
                            for p in t.get("partitions", [])), key=lambda p: p.partition)
            was = old.get(t["name"])
            topic_id = t.get("topic_id")
            if was is not None and was.topic_id == topic_id and not t.get("error_code"):
                # Never go back to an older leader epoch: that broker has not heard of the election.
                for i, p in enumerate(parts):
                    if p.partition < len(was.partitions):
                        prev = was.partitions[p.partition]
                        if prev.leader_epoch > p.leader_epoch >= 0:
                            parts[i] = prev
            topics[t["name"]] = TopicMetadata(t["name"], t.get("error_code", 0), t.get("error_message"),
                                              bool(t.get("is_internal", False)), tuple(parts), topic_id)
        self.topics = topics
        self.updated_at = time.monotonic()

    def request(self, api: int, body: dict, frames: Sequence[Any] = (), timeout: float | None = None) -> codec.Frame:
        """One blocking request to any live broker (the last one that answered first).
        A network error moves on to the next known broker, and once all were tried, waits
        ``retry_backoff_ms`` (doubling, at most 1 s) and goes round again until ``timeout``
        (default ``request_timeout_ms``): a broker restarting its listener is waited for.
        Errors the broker answers with are raised at once."""
        timeout = self.request_timeout_ms / 1000 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        backoff = self.retry_backoff
        with self._lock:
            while True:
                last = self._try_candidates(api, body, frames, deadline)
                if isinstance(last, codec.Frame):
                    return last
                if time.monotonic() + backoff >= deadline:
                    raise last
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _try_candidates(self, api: int, body: dict, frames, deadline: float):
        """The answer of the first broker that gives one, else the last network error."""
        last: OdradekError = error_for(ErrorCode.NETWORK_EXCEPTION, "no broker to ask")
        for host, port in self._candidates():
            if time.monotonic() >= deadline:
                break
            conn = self._conn
            if conn is None or (conn.host, conn.port) != (host, port):
                if conn is not None:
                    conn.close()
                conn = self._conn = Connection(host, port, self.client_id, self.request_timeout_ms,
                                               security=self.security)
            try:
                frame = conn.request(api, body, frames, max(0.05, deadline - time.monotonic()))
                self._failed.pop((host, port), None)
                return frame
            except OdradekError as exc:
                if exc.code not in NETWORK_ERRORS:
                    raise
                conn.close()
                self._conn = None
                self._failed[(host, port)] = time.monotonic()
                last = exc
        return last

    def _candidates(self) -> list[tuple[str, int]]:
        out = []
        if self._conn is not None:
            out.append((self._conn.host, self._conn.port))
        out += [(b.host, b.port) for b in self.brokers.values()]
        out += self.bootstrap
        out += list(self._known)
        seen, uniq = set(), []
        for hp in out:
            if hp not in seen:
                seen.add(hp)
                uniq.append(hp)
        now = time.monotonic()
        failed = self._failed
        # Healthy ones first (in the order above); recently failed ones last, oldest failure first.
        return sorted(uniq, key=lambda hp: (0, 0.0) if now - failed.get(hp, -1e9) > FAILED_NODE_PENALTY
                      else (1, failed[hp]))

    def request_at(self, address: tuple[str, int], api: int, body: dict, frames: Sequence[Any] = (),
                   timeout: float | None = None) -> codec.Frame:
        """One blocking request to the broker at ``address`` (a pooled connection). A network
        failure marks the broker failed and raises NETWORK_EXCEPTION; the broker's errors
        are raised as they are."""
        timeout = self.request_timeout_ms / 1000 if timeout is None else timeout
        address = (address[0], int(address[1]))
        with self._lock:
            conn = self._conns.get(address)
            if conn is None:
                conn = self._conns[address] = Connection(*address, self.client_id, self.request_timeout_ms,
                                                         security=self.security)
            try:
                frame = conn.request(api, body, frames, timeout)
            except OdradekError as exc:
                if exc.code in NETWORK_ERRORS:
                    conn.close()
                    self._conns.pop(address, None)
                    self._failed[address] = time.monotonic()
                raise
            self._failed.pop(address, None)
            return frame

    def request_node(self, node_id: int, api: int, body: dict, frames: Sequence[Any] = (),
                     timeout: float | None = None) -> codec.Frame:
        """``request_at`` the broker ``node_id`` of the metadata (NETWORK_EXCEPTION if unknown)."""
        address = self.address(node_id)
        if address is None:
            raise error_for(ErrorCode.NETWORK_EXCEPTION, f"broker {node_id} is not in the metadata")
        return self.request_at(address, api, body, frames, timeout)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()
