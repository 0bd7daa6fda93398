"""Client side of a consumer group: membership, assignment reconciliation, commits.

Threads. ``GroupMembership`` runs one daemon thread, the **heartbeat thread**, which owns its
own connection to the group coordinator and nothing else: it heartbeats (held by the
coordinator until something changes for this member, at most ``heartbeat_interval_ms``),
records the assignment the coordinator sends, and leaves the group when the application
stops calling ``poll`` for ``max_poll_interval_ms``. Everything that touches the consumer
(revoking, assigning, callbacks, auto-commits) runs in the **poll thread** — the thread
that calls ``Consumer.poll`` — in ``on_poll``; the two threads share only the fields under
``self._lock`` and a wake-up pipe each way.

Reconciliation (KIP-848, incremental): when the coordinator's assignment differs from what
this member owns, the poll thread first revokes what is no longer assigned (auto-commit of
their positions, then ``on_revoke``), reports that, and only then receives and starts new
partitions (positions from the committed offsets, else ``auto_offset_reset``; then
``on_assign``). Partitions that stay assigned are never paused.

Losing the membership (session expired, fenced): the poll thread drops every partition
without committing (``on_revoke`` is told ``lost=True`` if it accepts the keyword) and the
member rejoins. A replaced static member (``FENCED_INSTANCE_ID``) stops: ``poll`` raises.

Commits carry the member id and epoch; the coordinator accepts them only for partitions
this member owns (see ``coordinator.group``). Auto-commit (Kafka's at-least-once meaning):
at the start of ``poll``, every ``auto_commit_interval_ms``, the positions of the records
returned by earlier polls are committed; also before a revocation and on ``close``.
"""
from __future__ import annotations

import inspect
import logging
import os
import re
import select
import threading
import time
from typing import Callable, Iterable, Optional

from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.network.connection import wait_any
from odradek.cluster import NETWORK_ERRORS, Connection
from odradek.errors import error_for
from odradek.types import TopicPartition

log = logging.getLogger("odradek.group")

MIN_HEARTBEAT_GAP = 0.02  # seconds between heartbeats that report nothing new
HEARTBEAT_GRACE = 5.0  # seconds past its hold time after which a heartbeat counts as lost
COORDINATOR_ERRORS = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})
FATAL = (ErrorCode.FENCED_INSTANCE_ID, ErrorCode.GROUP_MAX_SIZE_REACHED, ErrorCode.INVALID_GROUP_ID,
         ErrorCode.UNSUPPORTED_ASSIGNOR, ErrorCode.INVALID_SESSION_TIMEOUT, ErrorCode.INVALID_REQUEST,
         ErrorCode.GROUP_AUTHORIZATION_FAILED)  # no Read on the group: poll says so (Kafka's consumer too)


def _tp_entries(tps) -> list:
    by_topic: dict[str, list] = {}
    for t, p in sorted(tps):
        by_topic.setdefault(t, []).append(p)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


def _tps(entries) -> set:
    return {TopicPartition(e["topic"], p) for e in entries or () for p in e["partitions"]}


def _partition_codes(body: dict) -> list:
    """Per-partition error codes of an OFFSET_COMMIT / OFFSET_FETCH answer."""
    return [p.get("error_code", 0) for t in body.get("topics") or () for p in t.get("partitions") or ()]


GROUP_KEY, TRANSACTION_KEY = 0, 1  # FIND_COORDINATOR's key_type


class Coordinator:
    """Where a group's (or, with ``key_type=TRANSACTION_KEY``, a transactional id's)
    coordinator is (FIND_COORDINATOR, asked of any broker) and blocking requests to it that
    follow it when it moves: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
    COORDINATOR_LOAD_IN_PROGRESS (top-level or, for offset commits and fetches, per
    partition) and a lost connection forget the address, wait ``retry_backoff_ms`` and find
    the coordinator again, until the timeout. Thread-safe (the address is one attribute)."""

    def __init__(self, cluster, group_id: str, timeout: float, key_type: int = GROUP_KEY):
        self.cluster = cluster
        self.group_id = group_id
        self.timeout = timeout
        self.key_type = key_type
        self.address: tuple[str, int] | None = None

    def find(self, timeout: float | None = None) -> tuple[str, int]:
        body = self.cluster.request(ApiKey.FIND_COORDINATOR, {"key": self.group_id, "key_type": self.key_type},
                                    timeout=self.timeout if timeout is None else timeout).header["body"]
        address = self.address = (body["host"], int(body["port"]))
        return address

    def forget(self, address=None) -> None:
        if address is None or self.address == address:
            self.address = None

    def request(self, api: int, body: dict, timeout: float | None = None, item_codes=None) -> dict:
        """The answer body; ``item_codes(body)`` lists per-item error codes to look at."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        backoff = self.cluster.retry_backoff
        answer = None
        while True:
            address = self.address
            try:
                if address is None:
                    address = self.find(max(0.1, deadline - time.monotonic()))
                answer = self.cluster.request_at(address, api, body,
                                                 timeout=max(0.1, deadline - time.monotonic())).header["body"]
                codes = item_codes(answer) if item_codes is not None else ()
                moved = next((c for c in codes if c in COORDINATOR_ERRORS), None)
                if moved is None:
                    return answer
                err = error_for(moved, f"group {self.group_id}: {ApiKey(api).name} to {address[0]}:{address[1]}")
            except OdradekError as exc:
                if exc.code not in COORDINATOR_ERRORS and exc.code not in NETWORK_ERRORS:
                    raise
                err = exc
            self.forget(address)
            if time.monotonic() + backoff >= deadline:
                if answer is not None:
                    return answer  # per-partition errors: the caller reports them
                raise err
            log.info("group %s: %s; finding the coordinator again", self.group_id, err)
            time.sleep(backoff)


class GroupMembership:
    """One consumer's membership of ``group_id``. Created by ``Consumer(group_id=...)``."""

    def __init__(self, consumer, group_id: str, *, group_instance_id: Optional[str] = None,
                 session_timeout_ms: Optional[int] = None, heartbeat_interval_ms: int = 3000,
                 max_poll_interval_ms: int = 300000, enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000, assignor: Optional[str] = None):
        if not isinstance(group_id, str) or not group_id:
            raise ValueError("group_id must be a non-empty string")
        self.consumer = consumer
        self.cluster = consumer._cluster
        self.group_id = group_id
        self.instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval = heartbeat_interval_ms / 1000
        self.max_poll_interval = max_poll_interval_ms / 1000
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval = auto_commit_interval_ms / 1000
        self.assignor = assignor
        self.request_timeout = consumer.request_timeout_ms / 1000
        self.coordinator = Coordinator(self.cluster, group_id, self.request_timeout)
        self.on_assign: Optional[Callable] = None
        self.on_revoke: Optional[Callable] = None
        self.topics: list[str] | None = None
        self.pattern: str | None = None
        # Shared between the threads, under _lock:
        self._lock = threading.Lock()
        self.member_id = ""
        self.member_epoch = 0
        self._target: set | None = None  # the coordinator's latest assignment for us
        self._owned: set = set()  # what the poll thread has made effective
        self._lost = False  # the membership is gone: drop everything, then rejoin
        self._fatal: OdradekError | None = None
        self._leave_now = False  # poll timeout: the heartbeat thread left the group
        self._last_poll = time.monotonic()
        self._next_commit = time.monotonic() + self.auto_commit_interval
        self._closed = False
        self._thread: threading.Thread | None = None
        self._hb_r, self._hb_w = os.pipe()  # wakes the heartbeat thread
        self._poll_r, self._poll_w = os.pipe()  # wakes the poll thread
        for fd in (self._hb_r, self._hb_w, self._poll_r, self._poll_w):
            os.set_blocking(fd, False)
        self.rebalances = 0
        self.joined_at: float | None = None  # first assignment received (monotonic), for benchmarks

    # ---- the application's calls (poll thread) ------------------------------------------------
    def subscribe(self, topics=None, pattern=None, on_assign=None, on_revoke=None) -> None:
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe() takes a list of topics or a pattern, not both")
        if pattern is not None:
            pattern = pattern.pattern if isinstance(pattern, re.Pattern) else pattern
            re.compile(pattern)
        else:
            topics = [topics] if isinstance(topics, str) else sorted(set(topics))
            if not topics or not all(isinstance(t, str) and t for t in topics):
                raise ValueError("subscribe() needs at least one topic name")
        with self._lock:
            changed = (topics, pattern) != (self.topics, self.pattern)
            self.topics, self.pattern = topics, pattern
            self.on_assign, self.on_revoke = on_assign, on_revoke
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"odradek-heartbeat-{self.group_id}",
                                            daemon=True)
            self._thread.start()
        elif changed:
            self._wake_heartbeat()

    def unsubscribe(self) -> None:
        self._revoke(set(self._owned), lost=False)
        self._stop_thread(leave=True)
        with self._lock:
            self.topics = self.pattern = None
            self.member_id, self.member_epoch, self._target = "", 0, None

    def assignment(self) -> set:
        return set(self._owned)

    def on_poll(self) -> None:
        """Called at the start of every ``Consumer.poll``: auto-commit, then reconcile."""
        now = time.monotonic()
        self._last_poll = now
        self._drain(self._poll_r)
        if self._fatal is not None:
            raise self._fatal
        if self.enable_auto_commit and now >= self._next_commit and self._owned:
            self._next_commit = now + self.auto_commit_interval
            self._auto_commit(self._owned)
        self._reconcile()

    def wake_fd(self) -> int:
        """Readable when the heartbeat thread has news for the poll thread."""
        return self._poll_r

    # ---- reconciliation (poll thread) ---------------------------------------------------------
    def _reconcile(self) -> None:
        with self._lock:
            lost, target, owned = self._lost, self._target, set(self._owned)
        if lost:
            self._revoke(owned, lost=True)
            with self._lock:
                self._lost = False
                self._target = None
            self._wake_heartbeat()
            return
        if target is None or target == owned:
            return
        revoked, added = owned - target, target - owned
        if revoked:
            self._revoke(revoked, lost=False)
        if added:
            self._add(added)
        self.rebalances += 1
        self._wake_heartbeat()

    def _revoke(self, tps: set, lost: bool) -> None:
        if not tps:
            return
        if not lost and self.enable_auto_commit:
            self._auto_commit(tps)
        self._call(self.on_revoke, tps, lost)
        keep = self._owned - tps
        with self._lock:
            self._owned = keep
        self.consumer._group_assign(keep)

    def _add(self, tps: set) -> None:
        committed = self._fetch_committed(tps)
        with self._lock:
            self._owned = self._owned | tps
        self.consumer._group_assign(self._owned, {tp: off for tp, off in committed.items() if off >= 0})
        if self.joined_at is None:
            self.joined_at = time.monotonic()
        self._call(self.on_assign, tps, False)

    @staticmethod
    def _call(callback, tps: set, lost: bool) -> None:
        if callback is None:
            return
        try:
            params = inspect.signature(callback).parameters
            if "lost" in params:
                callback(set(tps), lost=lost)
            else:
                callback(set(tps))
        except Exception:
            log.exception("rebalance callback %r failed", callback)

    # ---- commits (poll thread, or any thread for commit_async's callback) ----------------------
    def positions(self, tps: Iterable) -> dict:
        """Known positions of owned partitions: what an auto-commit would store."""
        out = {}
        for tp in tps:
            p = self.consumer._parts.get(tp)
            if p is not None and p.position is not None:
                out[tp] = p.position
        return out

    def _auto_commit(self, tps) -> None:
        offsets = self.positions(tps)
        if not offsets:
            return
        try:
            self.commit(offsets)
        except OdradekError as exc:
            log.warning("auto-commit of %d partitions failed: %s", len(offsets), exc)

    def commit(self, offsets: dict | None = None) -> None:
        """Commit ``{tp: offset}`` (default: the positions of every owned partition) and wait.
        Raises the first partition's error (e.g. ``StaleMemberEpochError`` for a partition
        no longer assigned to this member)."""
        if offsets is None:
            offsets = self.positions(self._owned)
        if not offsets:
            return
        errors = self._commit(offsets)
        if errors:
            tp, (code, message) = next(iter(errors.items()))
            raise error_for(code, f"commit of {tp.topic}-{tp.partition}: {message}")

    def _commit(self, offsets: dict) -> dict:
        by_topic: dict[str, list] = {}
        for tp, off in offsets.items():
            tp = TopicPartition(*tp)
            off = off.offset if hasattr(off, "offset") else off
            by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition, "committed_offset": off})
        with self._lock:
            member_id, epoch = self.member_id, self.member_epoch
        body = {"group_id": self.group_id, "member_id": member_id,
                "generation_id_or_member_epoch": epoch if member_id else -1,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
        resp = self.coordinator.request(ApiKey.OFFSET_COMMIT, body, item_codes=_partition_codes)
        return {TopicPartition(t["name"], p["partition_index"]): (p["error_code"], p.get("error_message", ""))
                for t in resp.get("topics", []) for p in t.get("partitions", []) if p.get("error_code")}

    def commit_async(self, offsets: dict | None = None, callback: Callable | None = None) -> threading.Thread:
        """Commit without waiting; ``callback(offsets, error_or_None)`` runs in a helper thread."""
        if offsets is None:
            offsets = self.positions(self._owned)

        def run() -> None:
            err = None
            try:
                self.commit(offsets)
            except OdradekError as exc:
                err = exc
            if callback is not None:
                callback(offsets, err)

        t = threading.Thread(target=run, name="odradek-commit", daemon=True)
        t.start()
        return t

    def committed(self, tps: Iterable) -> dict:
        return self._fetch_committed(set(TopicPartition(*tp) for tp in tps))

    def _fetch_committed(self, tps: set) -> dict:
        """``{tp: committed offset or -1}``."""
        by_topic: dict[str, list] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        body = {"group_id": self.group_id, "topics": [{"name": t, "partition_indexes": ps}
                                                      for t, ps in by_topic.items()]}
        resp = self.coordinator.request(ApiKey.OFFSET_FETCH, body, item_codes=_partition_codes)
        for t in resp.get("topics", []):
            for p in t.get("partitions", []):
                if p.get("error_code") in COORDINATOR_ERRORS:  # still, after request_timeout_ms
                    raise error_for(p["error_code"], f"committed offset of {t['name']}-{p['partition_index']}: "
                                    f"{p.get('error_message') or ErrorCode.of(p['error_code']).meaning}")
        return {TopicPartition(t["name"], p["partition_index"]): p["committed_offset"]
                for t in resp.get("topics", []) for p in t.get("partitions", [])}

    # ---- close ------------------------------------------------------------------------------------
    def close(self, autocommit: bool = True) -> None:
        if self._closed:
            return
        if self._fatal is None and self._owned:
            # As Kafka does on close: auto-commit what was returned, then on_revoke.
            if autocommit and self.enable_auto_commit:
                self._auto_commit(self._owned)
            self._call(self.on_revoke, set(self._owned), False)
        self._stop_thread(leave=True)
        self._closed = True
        for fd in (self._hb_r, self._hb_w, self._poll_r, self._poll_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _stop_thread(self, leave: bool) -> None:
        t, self._thread = self._thread, None
        if t is None:
            return
        self._stopping = True
        self._wake_heartbeat()
        t.join(self.request_timeout + 5)
        self._stopping = False
        if leave:
            self._send_leave()

    def _send_leave(self) -> None:
        with self._lock:
            member_id, epoch = self.member_id, self.member_epoch
        if not member_id or epoch <= 0:
            return
        body = {"group_id": self.group_id, "member_id": member_id, "instance_id": self.instance_id,
                "member_epoch": -2 if self.instance_id else -1}
        try:
            self.coordinator.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, body, timeout=min(self.request_timeout, 5.0))
        except OdradekError as exc:
            log.info("leaving group %s: %s", self.group_id, exc)
        with self._lock:
            self.member_epoch = 0

    # ---- the heartbeat thread ---------------------------------------------------------------------
    _stopping = False

    def _wake_heartbeat(self) -> None:
        try:
            os.write(self._hb_w, b"x")
        except OSError:
            pass

    def _wake_poll(self) -> None:
        try:
            os.write(self._poll_w, b"x")
        except OSError:
            pass

    @staticmethod
    def _drain(fd: int) -> None:
        try:
            while os.read(fd, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def _run(self) -> None:
        conn: Connection | None = None
        last_sent = 0.0
        while not self._stopping:
            try:
                if conn is None or not conn.connected:
                    conn = self._connect()
                if time.monotonic() - self._last_poll > self.max_poll_interval and self.member_epoch > 0:
                    self._leave_for_poll_timeout(conn)
                    continue
                with self._lock:
                    waiting_for_poll = self._lost or (self._target is not None and self._target != self._owned)
                if waiting_for_poll:  # the poll thread has work to do before we report again
                    self._sleep(self.heartbeat_interval)
                    continue
                gap = MIN_HEARTBEAT_GAP - (time.monotonic() - last_sent)
                if gap > 0:
                    self._sleep(gap)
                last_sent = time.monotonic()
                self._heartbeat(conn)
            except OdradekError as exc:
                if exc.code in FATAL:
                    log.error("group %s: %s; this consumer stops", self.group_id, exc)
                    with self._lock:
                        self._fatal = exc
                        self._lost = True
                    self._wake_poll()
                    return
                log.info("group %s: heartbeat failed (%s); retrying", self.group_id, exc)
                if conn is not None:
                    conn.close("heartbeat failed")
                    if exc.code in COORDINATOR_ERRORS or exc.code in NETWORK_ERRORS:
                        self.coordinator.forget((conn.host, conn.port))  # find it again
                conn = None
                self._sleep(self.consumer.retry_backoff)
            except Exception:
                log.exception("group %s: heartbeat thread error", self.group_id)
                self._sleep(1.0)
        if conn is not None:
            conn.close("consumer closed")

    def _sleep(self, seconds: float) -> None:
        try:
            select.select([self._hb_r], [], [], max(0.0, seconds))
        except (OSError, ValueError):
            time.sleep(max(0.0, seconds))
        self._drain(self._hb_r)

    def _connect(self) -> Connection:
        """A connection of the heartbeat thread's own to the coordinator (found again after it
        moved: NOT_COORDINATOR and lost connections forget the address)."""
        address = self.coordinator.address or self.coordinator.find()
        conn = Connection(address[0], address[1], self.consumer.client_id, int(self.request_timeout * 1000),
                          security=self.consumer._cluster.security)
        try:
            conn.connect()
        except OdradekError:
            self.coordinator.forget(address)
            self.cluster.node_failed(address)
            raise
        return conn

    def _request_body(self) -> tuple[dict, float]:
        with self._lock:
            epoch, owned = self.member_epoch, sorted(self._owned)
            body = {"group_id": self.group_id, "member_id": self.member_id, "member_epoch": epoch,
                    "instance_id": self.instance_id, "topic_partitions": _tp_entries(owned)}
            if epoch == 0:
                body.update(subscribed_topic_names=self.topics, subscribed_topic_regex=self.pattern,
                            rebalance_timeout_ms=int(self.max_poll_interval * 1000),
                            session_timeout_ms=self.session_timeout_ms, server_assignor=self.assignor)
                wait = 0.0
            else:
                body.update(subscribed_topic_names=self.topics, subscribed_topic_regex=self.pattern or "")
                wait = self.heartbeat_interval
        body["wait_ms"] = int(wait * 1000)
        return body, wait

    def _heartbeat(self, conn: Connection) -> None:
        body, wait = self._request_body()
        result: list = []
        conn.send(ApiKey.CONSUMER_GROUP_HEARTBEAT, body, (), lambda frame, err: result.append((frame, err)))
        # A held heartbeat is answered within ``wait``; one still silent well after that went to
        # a coordinator that died (its processor would wait request.timeout.ms): reconnect
        # sooner than a session timeout, so a restarted coordinator sees us in time.
        deadline = time.monotonic() + wait + min(self.request_timeout, HEARTBEAT_GRACE)
        while not result:
            left = deadline - time.monotonic()
            if left <= 0:
                conn.close("heartbeat timed out")
                raise error_for(ErrorCode.REQUEST_TIMED_OUT, "no answer to a heartbeat")
            woke = wait_any([conn], min(left, 1.0), self._hb_r)
            if woke:
                self._drain(self._hb_r)
                if self._stopping or self._has_news(body):
                    # Something to report (or we stop): send a fresh heartbeat; the coordinator
                    # answers the held one at once. Its answer is stale: dropped.
                    return
            if time.monotonic() - self._last_poll > self.max_poll_interval:
                return
        frame, err = result[0]
        self._handle(body, frame, err)

    def _has_news(self, sent: dict) -> bool:
        with self._lock:
            return (_tp_entries(sorted(self._owned)) != sent["topic_partitions"]
                    or self.topics != sent.get("subscribed_topic_names")
                    or (self.pattern or "") != (sent.get("subscribed_topic_regex") or ""))

    def _handle(self, sent: dict, frame, err: OdradekError | None) -> None:
        if err is not None:
            if err.code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH):
                log.warning("group %s: %s; giving up every partition and rejoining", self.group_id, err.message)
                with self._lock:
                    self._lost = bool(self._owned)
                    self.member_epoch = 0
                    if err.code == ErrorCode.UNKNOWN_MEMBER_ID:
                        self.member_id = ""
                    self._target = None
                self._wake_poll()
                return
            raise err
        body = frame.header["body"]
        with self._lock:
            if sent["member_epoch"] != self.member_epoch or sent["member_id"] != self.member_id:
                return  # the membership changed meanwhile (lost, left): a stale answer
            self.member_id = body["member_id"]
            self.member_epoch = body["member_epoch"]
            target = _tps(body.get("assignment"))
            news = target != self._owned
            self._target = target
        if news:
            self._wake_poll()

    def _leave_for_poll_timeout(self, conn: Connection) -> None:
        log.warning("group %s: poll() was not called for %.0f ms (max_poll_interval_ms): leaving the group so "
                    "its partitions move; the next poll rejoins", self.group_id, self.max_poll_interval * 1000)
        with self._lock:
            member_id = self.member_id
        body = {"group_id": self.group_id, "member_id": member_id, "instance_id": self.instance_id,
                "member_epoch": -1}
        try:
            conn.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, body, timeout=self.request_timeout)
        except OdradekError as exc:
            log.info("leave after poll timeout: %s", exc)
        with self._lock:
            self._lost = bool(self._owned)
            self.member_epoch = 0
            self.member_id = ""
            self._target = None
        self._wake_poll()
        while not self._stopping and time.monotonic() - self._last_poll > self.max_poll_interval:
            self._sleep(0.1)


# ---- administration: what ``odradek groups`` and tools use (any thread; blocking calls) ------------
class GroupAdmin:
    """List, describe (with lag), reset and delete groups. Blocking; one ``Cluster``."""

    def __init__(self, bootstrap_servers, client_id: str = "odradek-groups", request_timeout_ms: int = 30000,
                 **security):
        from odradek.cluster import Cluster
        from odradek.network.clientauth import ClientSecurity
        self.cluster = Cluster(bootstrap_servers, client_id, request_timeout_ms,
                               security=ClientSecurity.from_options(security))  # TLS/SASL: kafka-python's names
        self.timeout = request_timeout_ms / 1000
        self._coordinators: dict[str, Coordinator] = {}

    def close(self) -> None:
        self.cluster.close()

    def __enter__(self) -> "GroupAdmin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _body(self, api: int, body: dict) -> dict:
        return self.cluster.request(api, body, timeout=self.timeout).header["body"]

    def _coordinator(self, group: str) -> Coordinator:
        c = self._coordinators.get(group)
        if c is None:
            c = self._coordinators[group] = Coordinator(self.cluster, group, self.timeout)
        return c

    def _group_body(self, group: str, api: int, body: dict, item_codes=None) -> dict:
        """A request to the group's coordinator (followed when it moves)."""
        return self._coordinator(group).request(api, body, item_codes=item_codes)

    def list(self) -> list[dict]:
        """Every group of the cluster: each broker lists those it coordinates (Kafka's way);
        a broker that cannot be reached is skipped as long as one answers. States are spelled
        as Kafka spells them for both kinds of group (``kafka_state``)."""
        return [{**g, "group_state": kafka_state(g.get("group_state"))} for g in self._list()]

    def _list(self) -> list[dict]:
        self.cluster.refresh([])
        brokers = sorted(self.cluster.brokers.values())
        if len(brokers) <= 1:
            return self._body(ApiKey.LIST_GROUPS, {})["groups"]
        groups: dict[str, dict] = {}
        failed, answered = None, 0
        for b in brokers:
            try:
                answer = self.cluster.request_at((b.host, b.port), ApiKey.LIST_GROUPS, {},
                                                 timeout=self.timeout).header["body"]
            except OdradekError as exc:
                failed = exc
                log.info("list groups: broker %s: %s", b.node_id, exc)
                continue
            answered += 1
            for g in answer.get("groups", []):
                groups.setdefault(g["group_id"], g)
        if not answered:
            raise failed
        return sorted(groups.values(), key=lambda g: g["group_id"])

    def committed(self, group: str) -> dict:
        body = self._group_body(group, ApiKey.OFFSET_FETCH, {"group_id": group, "topics": None},
                                item_codes=_partition_codes)
        return {TopicPartition(t["name"], p["partition_index"]): p["committed_offset"]
                for t in body.get("topics", []) for p in t.get("partitions", []) if p["committed_offset"] >= 0}

    def offsets(self, tps, timestamp: int, isolation_level: int = 0) -> dict:
        """ListOffsets for ``tps``: ``timestamp`` -1 latest (the last stable offset with
        ``isolation_level`` 1), -2 earliest, else ms."""
        from odradek.admin import list_offsets
        return list_offsets(self.cluster, list(tps), timestamp, self.timeout, isolation_level)

    def describe(self, group: str, isolation: str = "read_uncommitted") -> dict:
        """The group's state and members, and per partition: owner, committed, log end (the
        high watermark), last stable offset and lag: to the log end for ``isolation``
        "read_uncommitted" (what Kafka's tool reports), to the last stable offset for
        "read_committed" (how far a read_committed consumer can actually get: records of open
        transactions are not counted). ``lag_to`` in the answer says which."""
        if isolation not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"isolation {isolation!r}: read_uncommitted or read_committed")
        d = self._describe(group)
        if d.get("error_code"):
            raise error_for(d["error_code"], d.get("error_message"))
        d = {**d, "group_state": kafka_state(d.get("group_state"))}
        committed = self.committed(group)
        owner = {}
        topics = set()
        for m in d.get("members", []):
            for tp in _tps(m.get("assignment")) | _tps(m.get("pending_revocation")):
                owner[tp] = m
            topics |= set(m.get("subscribed_topic_names") or ())
        meta = self.cluster.refresh(sorted(topics | {tp.topic for tp in committed}) or None)
        tps = set(committed) | set(owner)
        existing = set()  # offsets of a deleted topic stay committed: shown, without log end or lag
        for t in meta.get("topics", []):
            if not t.get("error_code"):
                existing |= {TopicPartition(t["name"], p["index"]) for p in t.get("partitions", [])}
                if t["name"] in topics:
                    tps |= {TopicPartition(t["name"], p["index"]) for p in t.get("partitions", [])}
        ends = self.offsets(sorted(tps & existing), -1)
        stable = self.offsets(sorted(tps & existing), -1, isolation_level=1)
        rows = []
        for tp in sorted(tps):
            m = owner.get(tp)
            c = committed.get(tp)
            end = (stable if isolation == "read_committed" else ends).get(tp)
            rows.append({"topic": tp.topic, "partition": tp.partition, "committed": c, "log_end": ends.get(tp),
                         "last_stable": stable.get(tp),
                         "lag": max(end - c, 0) if c is not None and end is not None else None,
                         "member_id": m["member_id"] if m else None,
                         "host": m.get("client_host") if m else None,
                         "client_id": m.get("client_id") if m else None})
        return {**d, "partitions": rows, "lag_to": "last_stable" if isolation == "read_committed" else "log_end"}

    def reset_offsets(self, group: str, topics: list[str] | None, *, to: str, value=None,
                      execute: bool = False) -> dict:
        """New committed offsets for an inactive group. ``topics``: names, each ``T`` (every
        partition) or ``T:P,P`` (those partitions, Kafka's ``--topic`` spelling); None: every
        topic the group committed. ``to``: "earliest", "latest", "datetime" (``value`` in ms
        since the epoch), "shift" (``value``: +/- N), "offset" (``value``: N, clamped to each
        log's range as Kafka's ``--to-offset``: above the log end it becomes the log end,
        below the log start the log start) or "current" (the committed offsets). Without
        ``execute`` nothing is committed (a dry run, as Kafka's tool)."""
        d = self._describe(group)
        if not d.get("error_code") and d.get("members"):
            raise error_for(ErrorCode.NON_EMPTY_GROUP, f"group '{group}' has {len(d['members'])} active members; "
                            f"offsets can be reset only while it is inactive (stop its consumers)")
        committed = self.committed(group)
        if topics:
            chosen = parse_topics(topics)
            meta = self.cluster.refresh(sorted(chosen))
            tps = set()
            for t in meta.get("topics", []):
                if t.get("error_code"):
                    raise error_for(t["error_code"], f"topic '{t['name']}': {t.get('error_message', '')}")
                have = {p["index"] for p in t.get("partitions", [])}
                wanted = chosen[t["name"]] or have
                if wanted - have:
                    raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"topic '{t['name']}' has no partition {min(wanted - have)} (it has {len(have)})")
                tps |= {TopicPartition(t["name"], p) for p in wanted}
        else:
            tps = set(committed)
        if not tps:
            raise ValueError(f"group '{group}' has no committed offsets: name the topics with --topic")
        earliest, latest = self.offsets(sorted(tps), -2), self.offsets(sorted(tps), -1)
        if to == "earliest":
            new = earliest
        elif to == "latest":
            new = latest
        elif to == "datetime":
            found = self.offsets(sorted(tps), int(value))
            new = {tp: (off if off >= 0 else latest[tp]) for tp, off in found.items()}
        elif to == "shift":
            new = {tp: min(max(committed.get(tp, earliest[tp]) + int(value), earliest[tp]), latest[tp]) for tp in tps}
        elif to == "offset":  # Kafka's --to-offset: the same offset everywhere, kept inside each log
            new = {tp: min(max(int(value), earliest[tp]), latest[tp]) for tp in tps}
        elif to == "current":  # Kafka's --to-current: the committed offset (the log end where none)
            new = {tp: committed.get(tp, latest[tp]) for tp in tps}
        else:
            raise ValueError(f"unknown reset target {to!r}")
        if execute:
            by_topic: dict[str, list] = {}
            for tp, off in sorted(new.items()):
                by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition, "committed_offset": off})
            body = self._group_body(group, ApiKey.OFFSET_COMMIT, {
                "group_id": group, "member_id": "", "generation_id_or_member_epoch": -1,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}, item_codes=_partition_codes)
            for t in body.get("topics", []):
                for p in t.get("partitions", []):
                    if p.get("error_code"):
                        raise error_for(p["error_code"], f"{t['name']}-{p['partition_index']}: "
                                        f"{p.get('error_message', '')}")
        return {tp: (committed.get(tp), off) for tp, off in sorted(new.items())}

    def delete_offsets(self, group: str, tps) -> dict:
        """Delete the group's committed offsets of ``tps`` (OffsetDelete): ``{tp: None | error}``
        (GROUP_SUBSCRIBED_TO_TOPIC while a member subscribes to the topic)."""
        by_topic: dict[str, list] = {}
        for tp in sorted(set(tps)):
            by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition})
        body = self._group_body(group, ApiKey.OFFSET_DELETE, {
            "group_id": group, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]},
            item_codes=_partition_codes)
        if body.get("error_code"):
            raise error_for(body["error_code"], body.get("error_message"))
        return {TopicPartition(t["name"], p["partition_index"]):
                error_for(p["error_code"], f"{t['name']}-{p['partition_index']}") if p.get("error_code") else None
                for t in body.get("topics", []) for p in t.get("partitions", [])}

    def delete(self, group: str) -> None:
        r = self._group_body(group, ApiKey.DELETE_GROUPS, {"groups_names": [group]},
                             item_codes=lambda b: [x.get("error_code", 0) for x in b.get("results", [])])["results"][0]
        if r.get("error_code"):
            raise error_for(r["error_code"], r.get("error_message"))

    def _describe(self, group: str) -> dict:
        return self._group_body(group, ApiKey.DESCRIBE_GROUPS, {"group_ids": [group]},
                                item_codes=lambda b: [g.get("error_code", 0) for g in b.get("groups", [])])["groups"][0]


def parse_topics(topics: list[str]) -> dict[str, set[int]]:
    """``["t", "u:0,2"]`` -> ``{"t": set(), "u": {0, 2}}`` (an empty set: every partition),
    as kafka-consumer-groups reads ``--topic``."""
    out: dict[str, set[int]] = {}
    for item in topics:
        name, colon, parts = item.partition(":")
        try:
            indexes = {int(p) for p in parts.split(",") if p.strip()} if colon else set()
        except ValueError:
            raise error_for(ErrorCode.INVALID_REQUEST, f"--topic {item!r}: partitions are numbers (T:0,1)") from None
        if colon and not indexes:
            raise error_for(ErrorCode.INVALID_REQUEST, f"--topic {item!r}: name the partitions (T:0,1) or none (T)")
        if name in out and (not out[name] or not indexes):
            out[name] = set()  # the whole topic named once covers it
        else:
            out[name] = out.get(name, set()) | indexes
    return out


# KIP-848 groups' states as the coordinator names them -> Kafka's spelling (ConsumerGroupState);
# classic groups' states (Empty, PreparingRebalance, CompletingRebalance, Stable, Dead) already are
KAFKA_STATES = {"empty": "Empty", "assigning": "Assigning", "reconciling": "Reconciling", "stable": "Stable",
                "dead": "Dead"}


def kafka_state(state):
    return KAFKA_STATES.get(state, state) if isinstance(state, str) else state

