"""Client plumbing: the bundled clients' broker connections and the metadata cache.

Runs in the client's process. Nothing here starts a thread.

- ``Connection``: ``network.connection.Connection`` (the one pipelined connection class:
  one socket to one broker, owned by one thread, answers to callbacks, ``wait_any`` over
  several) whose errors are ``odradek.errors`` classes (``error_for``), so a caller can catch
  ``NetworkExceptionError`` and the like.
- ``Cluster``: brokers and topic metadata (partitions, leaders), refreshed on demand with a
  METADATA request; ``connect`` opens (or reuses) the producer's and consumer's connection
  to a broker by its node id. **Thread-safe**: ``refresh`` and ``request`` serialize on a lock and use
  a private connection; the snapshot attributes (``brokers``, ``topics``) are replaced whole,
  so readers in other threads see either the old or the new map, never a half-built one.

Errors: a lost connection fails every request in flight on it with NETWORK_EXCEPTION
(retriable: the outcome is unknown); a request unanswered after ``request_timeout_ms``
closes the connection the same way (as Kafka does). A top-level error body becomes the
``OdradekError`` subclass for its code.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

from odradek.core import codec
from odradek.network.clientauth import ClientSecurity
from odradek.network.connection import Connection as _Connection, parse_bootstrap
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.errors import error_for
from odradek.types import BrokerMetadata, PartitionMetadata

log = logging.getLogger("odradek.cluster")


class Connection(_Connection):
    """``network.connection.Connection`` raising the ``odradek.errors`` class of each code."""

    def __init__(self, host: str, port: int, client_id: str = "odradek-client", request_timeout_ms: int = 30000,
                 connect_timeout_ms: int = 10000, max_response_bytes: int = 1 << 31,
                 security: ClientSecurity | None = None):
        super().__init__(host, port, client_id, request_timeout_ms, connect_timeout_ms, max_response_bytes,
                         security, error_for)


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
        # Called with the new ``topics`` after every metadata answer is merged (on the thread
        # that asked): caches derived from the metadata drop what it changed.
        self.on_topics: list[Callable[[dict], None]] = []

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

    def connect(self, conns: dict, node: int, client_id: str, request_timeout_ms: int,
                logger: logging.Logger = log) -> "Connection | None":
        """The producer's and consumer's connection to broker ``node``, kept in their ``conns``
        (node -> Connection; not thread-safe: the caller's own thread): reused while connected,
        made anew when the node moved; None if the node is unknown or cannot be reached (then
        marked failed)."""
        conn = conns.get(node)
        if conn is not None and conn.connected:
            return conn
        broker = self.broker(node)
        if broker is None:
            return None
        if conn is None or (conn.host, conn.port) != (broker.host, broker.port):
            conn = conns[node] = Connection(broker.host, broker.port, client_id, request_timeout_ms,
                                            security=self.security)
        try:
            conn.connect()
        except OdradekError as exc:
            logger.info("cannot connect to broker %s: %s", node, exc)
            self.node_failed((broker.host, broker.port))
            return None
        return conn

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
        for hook in self.on_topics:
            hook(topics)

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
