"""The replica fetcher: a follower's pull of each partition it follows from the partition's leader.

Process: ``replica_fetcher`` (one per broker, cluster mode only). Owns, per leader broker, a
fetch session: a worker thread holding a blocking ``network.client.BrokerConnection`` to its
inter-broker listener (TLS, SASL, BROKER_PROOF); per followed partition, its leader, leader
epoch, fetch offset and the leader's high watermark; the follower-side replication throttle.
Accepts:
  follow {parts, brokers}: from the controller (broker agent): add or update partitions;
      answered ``Done`` at once, the work is asynchronous
  unfollow {parts}: likewise
  broker_epochs {epochs}: from the broker agent: this broker's epoch goes with every FETCH
  throttle {rate, parts}: from the controller: the followed partitions throttled here
  fsynced {parts}: one-way, from the log actors: a followed partition's group commit ended;
      told to the leader at once (a ``progress_only`` FETCH) if the session's FETCH waits there
Sends: ``follower_state``, ``truncate``, ``truncate_fully`` and ``replicate`` to the log actor
hosting a partition (shapes: docs/REPLICATION.md); OFFSET_FOR_LEADER_EPOCH and FETCH (with
``replica_id``) to the leader over TCP; ``get_broker_epochs`` to the controller at start.
Invariants: worker threads never touch the actor's sockets (answers come back by ``post``); a
partition truncates before it fetches (newly followed, new leader or epoch, or
OFFSET_OUT_OF_RANGE: where the leader says our latest epoch ends, KIP-101/KIP-279); per leader
one FETCH in flight, the next once the log actors appended the last one's batches, not after
their fsync; FENCED_LEADER_EPOCH stops a partition until the next ``follow``;
NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH and a corrupt batch (logged) retry after
``replica.fetch.backoff.ms``; a failed connection backs the session off and reconnects.
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from typing import Any, Callable, NamedTuple

from odradek.actors.message import Message
from odradek.actors.messages import (Done, FollowerState, FollowerStatePart, GetBrokerEpochs, ReplicaEnd,
                                     Replicate, ReplicatePart, Truncate, TruncateFully, TruncateFullyPart, TruncatePart)
from odradek.actors.names import CONTROLLER, log_host
from odradek.actors.runtime import Actor
from odradek.core import records as fmt
from odradek.core.errors import CorruptRecordError
from odradek.log.throttle import UNLIMITED, Quota
from odradek.network.client import BrokerConnection
from odradek.network.clientauth import ClientSecurity
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.replica_fetcher")

REQUEST_TIMEOUT = 30.0  # at most this many seconds a leader may take beyond the fetch's own max wait (less: replica.lag.time.max.ms)
CONNECT_TIMEOUT_MS = 1000  # per connection attempt; bounds how long a stop waits for a worker
LOCAL_TIMEOUT = 30.0  # seconds for a local log actor's answer
STOP_JOIN_TIMEOUT = 5.0  # seconds on_stop waits for the worker threads, all together

# Partition states.
TRUNCATE = "truncate"  # must truncate before fetching (waits for retry_at)
TRUNCATING = "truncating"  # follower_state / OFFSET_FOR_LEADER_EPOCH / truncate under way
FETCHING = "fetching"  # in the leader's fetch loop (waits for retry_at after an error)
STOPPED = "stopped"  # fenced: waits for the next follow

# What a fetch answer means for one partition (``decide``).
APPEND = "append"  # whole batches to append (and watermarks)
WATERMARKS = "watermarks"  # no data, but the leader's high watermark or log start moved
NOTHING = "nothing"
STOP = "stop"
BACKOFF = "backoff"
TRUNCATION_DOUBLINGS = 3  # a truncation refused again and again is retried at most every 2**3 backoffs
RETRUNCATE = "retruncate"
TRUNCATE_FULLY = "truncate_fully"
CORRUPT = "corrupt"

STOP_ERRORS = frozenset({ErrorCode.FENCED_LEADER_EPOCH})


# ---- pure decision logic (tested without I/O) ----------------------------------------------
def setting(config: dict, name: str, default: int) -> int:
    value = config.get(name, default) if config else default
    return default if value is None else int(value)


def fetch_body(replica_id: int, config: dict, parts, broker_epoch: int = -1, progress_only: bool = False) -> dict:
    """The FETCH body for ``parts`` = ``[(topic, partition, fetch_offset, leader_epoch,
    fsynced_offset)]``; ``broker_epoch`` (the czxid of this broker's registration) proves
    ``replica_id``. ``fsynced_offset`` (not in Kafka's Fetch): how much of the log below
    ``fetch_offset`` this follower has on its disk, all the leader counts towards its high
    watermark under ``log.flush.before.ack`` (docs/REPLICATION.md). ``progress_only`` (not in
    Kafka's Fetch either): a progress report, answered at once with no data."""
    topics: dict[str, list] = {}
    part_max = setting(config, "replica.fetch.max.bytes", 1048576)
    for topic, partition, offset, epoch, fsynced in parts:
        topics.setdefault(topic, []).append({"index": partition, "fetch_offset": offset,
                                             "partition_max_bytes": part_max, "current_leader_epoch": epoch,
                                             "fsynced_offset": fsynced})
    body = {"replica_id": replica_id, "broker_epoch": broker_epoch,
            "max_wait_ms": 0 if progress_only else setting(config, "replica.fetch.wait.max.ms", 500),
            "min_bytes": setting(config, "replica.fetch.min.bytes", 1),
            "max_bytes": setting(config, "replica.fetch.response.max.bytes", 10485760),
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
    if progress_only:
        body["progress_only"] = True
    return body


def epoch_body(replica_id: int, parts) -> dict:
    """The OFFSET_FOR_LEADER_EPOCH body for ``[(topic, partition, current_leader_epoch, latest_epoch)]``."""
    topics: dict[str, list] = {}
    for topic, partition, current, latest in parts:
        topics.setdefault(topic, []).append({"index": partition, "current_leader_epoch": current,
                                             "leader_epoch": latest})
    return {"replica_id": replica_id, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}


def epoch_answers(body: dict) -> dict:
    """OFFSET_FOR_LEADER_EPOCH answer -> ``{(topic, partition): (error_code, leader_epoch, end_offset)}``."""
    out = {}
    for t in (body or {}).get("topics") or ():
        for p in t.get("partitions") or ():
            out[(t.get("name"), p.get("index"))] = (int(p.get("error_code", 0) or 0), p.get("leader_epoch", -1),
                                                    p.get("end_offset", -1))
    return out


def truncate_entry(topic: str, partition: int, latest_epoch: int, answer) -> tuple[str, Any]:
    """What to do with one partition once its log actor's state and (when asked) the leader's
    answer are known. ``answer`` is ``(error_code, leader_epoch, end_offset)`` or None when the
    leader was not asked (an empty epoch cache). Returns ``("truncate", TruncatePart)`` for the
    log actor, or ``("error", code)``."""
    if latest_epoch < 0:
        return "truncate", TruncatePart(topic, partition, -1, -1)  # nothing to compare: the log actor decides
    if answer is None:
        return "error", int(ErrorCode.UNKNOWN_SERVER_ERROR)
    code, epoch, end = answer
    if code:
        return "error", code
    return "truncate", TruncatePart(topic, partition, epoch if isinstance(epoch, int) else -1,
                                    end if isinstance(end, int) else -1)


class Payload:
    """The record bytes of a FETCH answer: its frames, in order, seen as one byte string.
    ``slice(start, end)`` is zero-copy when the range lies in one frame (the usual case:
    one file region per partition), else a copy of just that range."""

    def __init__(self, frames):
        self.frames = [f if isinstance(f, memoryview) else memoryview(f) for f in frames]
        self.starts = []
        at = 0
        for f in self.frames:
            self.starts.append(at)
            at += f.nbytes
        self.size = at

    def slice(self, start: int, end: int) -> memoryview:
        end = min(end, self.size)
        if end <= start:
            return memoryview(b"")
        pieces = []
        for base, f in zip(self.starts, self.frames):
            lo, hi = max(start, base), min(end, base + f.nbytes)
            if lo < hi:
                pieces.append(f[lo - base:hi - base])
        if len(pieces) == 1:
            return pieces[0]
        return memoryview(b"".join(pieces))


class PartitionData(NamedTuple):
    """One partition's entry in a FETCH answer and its bytes."""

    error_code: int
    error_message: str
    high_watermark: int
    log_start_offset: int
    records: memoryview


def split_fetch_answer(body: dict, frames) -> dict:
    """FETCH answer -> ``{(topic, partition): PartitionData}``. Record bytes follow the
    partitions' order, ``records_size`` bytes each (as the consumer reads them)."""
    payload = Payload(frames)
    out = {}
    at = 0
    for t in (body or {}).get("topics") or ():
        for p in t.get("partitions") or ():
            size = p.get("records_size", 0) or 0
            out[(t.get("name"), p.get("index"))] = PartitionData(
                int(p.get("error_code", 0) or 0), p.get("error_message") or "", _int(p.get("high_watermark")),
                _int(p.get("log_start_offset")), payload.slice(at, at + size))
            at += size
    return out


def _int(value, default: int = -1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class Batches(NamedTuple):
    """The whole batches at the front of a partition's bytes (headers read, CRC not checked:
    the log actor checks it on append)."""

    length: int  # bytes of whole batches
    count: int
    next_offset: int  # after the last whole batch; -1 if none
    problem: str | None  # why the walk stopped before the end, None if every byte was used


def whole_batches(view) -> Batches:
    """Walk ``view`` header by header. A torn or zero-padded tail (a file region that shrank
    under the leader's sendfile) ends the walk; an impossible header is reported as corrupt."""
    pos, count, next_offset, n = 0, 0, -1, len(view)
    while pos < n:
        if n - pos < fmt.HEADER_SIZE:
            return Batches(pos, count, next_offset, "partial header")
        h = fmt.BatchHeader.read(view, pos)
        try:
            fmt.check_header(h, pos)
        except CorruptRecordError as exc:
            padding = not any(bytes(view[pos:pos + fmt.HEADER_SIZE]))
            return Batches(pos, count, next_offset, "zero padding" if padding else f"corrupt: {exc.message}")
        if pos + h.size > n:
            return Batches(pos, count, next_offset, "partial batch")
        pos += h.size
        count += 1
        next_offset = h.next_offset
    return Batches(pos, count, next_offset, None)


class Action(NamedTuple):
    kind: str
    records: Any = None  # APPEND: the bytes of whole batches
    batches: int = 0
    offset: int = -1  # TRUNCATE_FULLY: where to start
    why: str = ""


def decide(fetch_offset: int, known_hw: int, known_log_start: int, data: PartitionData) -> Action:
    """What one partition's FETCH entry means, given what we last told the log actor."""
    code = data.error_code
    if code:
        err = ErrorCode.of(code)
        why = f"{err.name}: {data.error_message or err.meaning}"
        if err in STOP_ERRORS:
            return Action(STOP, why=why)
        if err is ErrorCode.OFFSET_OUT_OF_RANGE:
            if 0 <= fetch_offset < data.log_start_offset:
                return Action(TRUNCATE_FULLY, offset=data.log_start_offset, why=why)
            return Action(RETRUNCATE, why=why)
        if err is ErrorCode.CORRUPT_MESSAGE:
            return Action(CORRUPT, why=why)
        return Action(BACKOFF, why=why)
    moved = (data.high_watermark >= 0 and data.high_watermark != known_hw) or \
        (data.log_start_offset >= 0 and data.log_start_offset != known_log_start)
    if len(data.records) == 0:
        return Action(WATERMARKS) if moved else Action(NOTHING)
    found = whole_batches(data.records)
    if found.count == 0:
        return Action(CORRUPT, why=f"no whole batch in {len(data.records)} bytes at offset {fetch_offset} "
                                   f"({found.problem})")
    if found.problem is not None and found.problem.startswith("corrupt"):
        log.warning("the leader's answer is corrupt after %d good batches: %s", found.count, found.problem)
    return Action(APPEND, records=data.records[:found.length], batches=found.count)


def group_by_host(items, hosts: int, key=lambda item: (item[0], item[1])) -> dict:
    """``{log actor name: [item, ...]}`` by each item's (topic, partition)."""
    out: dict[str, list] = {}
    for item in items:
        topic, partition = key(item)
        out.setdefault(log_host(topic, partition, hosts), []).append(item)
    return out


def _synced(value, end: int) -> int:
    """The log actor's ``fsynced_offset`` (``ReplicaEnd``), at most ``end``; -1 (nothing
    vouched for) when it is not an offset."""
    return min(value, end) if isinstance(value, int) and not isinstance(value, bool) else -1


# ---- the worker thread ---------------------------------------------------------------------
class LeaderSession:
    """One leader's fetch session. The worker thread runs requests one at a time on its own
    ``BrokerConnection`` and posts each outcome, ``done(body, frames, error)``, to the actor's
    loop. Everything else here belongs to the actor's loop."""

    def __init__(self, leader: int, host: str, port: int, client_id: str, post: Callable, security=None,
                 role: str = ""):
        self.leader, self.host, self.port = leader, host, int(port)
        self.security = security
        # progress reports (``fsynced``): their own connection and thread, made when first needed,
        # since this one's FETCH may be parked at the leader
        self.reporter: LeaderSession | None = None
        self.reporting = False
        self.parts: set[tuple[str, int]] = set()
        self.busy = False  # a FETCH is in flight or its batches are being appended
        self.retry_at = 0.0  # the session backs off until then (connection failures)
        self.timer = None
        self.state = "idle"
        self.fetches = 0
        self.errors = 0
        self.last_error = ""
        self.connected = False
        self._post = post
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = threading.Event()
        self.conn = BrokerConnection(host, port, client_id=client_id, connect_timeout_ms=CONNECT_TIMEOUT_MS,
                                     reconnect_backoff_ms=50, reconnect_backoff_max_ms=200, security=security)
        self.thread = threading.Thread(target=self._run, name=f"replica-fetcher-{leader}{role}", daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def submit(self, api: int, body: dict, timeout: float, done: Callable) -> None:
        self._jobs.put((api, body, timeout, done))

    def report(self, body: dict, timeout: float, done: Callable) -> None:
        """Send a progress report on the second connection."""
        if self.reporter is None:
            self.reporter = LeaderSession(self.leader, self.host, self.port, self.conn.client_id, self._post,
                                          self.security, role="-report")
        self.reporting = True
        self.reporter.submit(ApiKey.FETCH, body, timeout, done)

    @property
    def threads(self) -> list:
        return [self.thread] + ([self.reporter.thread] if self.reporter is not None else [])

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                job = self._jobs.get()
                if job is None or self._closing.is_set():
                    break
                api, body, timeout, done = job
                try:
                    response = self.conn.request(api, body, timeout=timeout)
                    outcome = (response.body, response.frames, None)
                except OdradekError as exc:
                    outcome = (None, [], exc)
                except Exception as exc:  # a bug or an odd socket error: report it, keep the thread
                    outcome = (None, [], OdradekError(f"{type(exc).__name__}: {exc}", ErrorCode.UNKNOWN_SERVER_ERROR))
                if outcome[2] is not None:
                    self.conn.close()  # start clean: a timed-out answer may still be on its way
                if self._closing.is_set():
                    break
                self._post(lambda outcome=outcome, done=done: done(*outcome))
        finally:
            self.conn.close()

    def close(self) -> None:
        """Ask the thread to finish now: no new job, and a blocked read wakes at once."""
        if self.reporter is not None:
            self.reporter.close()
        self._closing.set()
        self._jobs.put(None)
        if self.timer is not None:
            self.timer.cancel()
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Followed:
    """What the fetcher knows of one followed partition."""

    __slots__ = ("topic", "partition", "leader", "leader_epoch", "state", "gen", "fetch_offset", "fsynced_offset",
                 "told", "high_watermark", "log_start_offset", "retry_at", "why", "out_of_range", "failed_truncations",
                 "bytes", "batches")

    def __init__(self, topic: str, partition: int, leader: int, leader_epoch: int):
        self.topic, self.partition, self.leader, self.leader_epoch = topic, partition, leader, leader_epoch
        self.state = TRUNCATE
        self.gen = 0  # bumped whenever in-flight answers about this partition become stale
        self.fetch_offset = -1
        self.fsynced_offset = -1  # how much of the log below fetch_offset is on the disk (the log actor says)
        self.told = -1  # the fsynced offset the last FETCH or progress report carried
        self.high_watermark = -1  # as last told to the log actor
        self.log_start_offset = -1
        self.retry_at = 0.0
        self.why = ""
        self.out_of_range = 0  # OFFSET_OUT_OF_RANGE answers in a row
        self.failed_truncations = 0  # in a row, at this leader epoch: the retry backs off further
        self.bytes = 0
        self.batches = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


# ---- the actor -----------------------------------------------------------------------------
class ReplicaFetcher(Actor):
    def on_start(self) -> None:
        config = self.args.get("config") or {}
        self.config = config
        self.broker_id = int(self.args["broker_id"])
        self.log_hosts = int(self.args.get("log_hosts", config.get("num.log.threads", 1)))
        self.backoff = setting(config, "replica.fetch.backoff.ms", 1000) / 1000
        # A follower with no answer for replica.lag.time.max.ms is out of the ISR already: waiting
        # longer on that connection (a request lost in a network partition that has healed since)
        # only keeps it out, and with one more broker down stalls acks=all (docs/RELIABILITY.md).
        self.answer_timeout = min(REQUEST_TIMEOUT, max(setting(config, "replica.lag.time.max.ms", 30000) / 1000, 1.0))
        self.fetch_timeout = setting(config, "replica.fetch.wait.max.ms", 500) / 1000 + self.answer_timeout
        self.brokers: dict[int, tuple[str, int]] = {}  # the leaders' inter-broker listener addresses
        self.security = ClientSecurity.inter_broker(config, self.broker_id, self.args["data_dir"])  # TLS/SASL, proof
        self.parts: dict[tuple[str, int], Followed] = {}
        self.sessions: dict[int, LeaderSession] = {}
        self.closed_sessions: list[LeaderSession] = []
        self.replicated_bytes = 0
        self.replicated_batches = 0
        self.truncations = 0
        self.progress_reports = 0
        self.quota = Quota(setting(config, "follower.replication.throttled.rate", UNLIMITED), self.clock())
        self.throttled: set[tuple[str, int]] = set()
        self.throttled_bytes = 0
        self.closing = False
        self.broker_epoch = -1  # the czxid of our registration: proves our replica_id to leaders
        self.request(CONTROLLER, GetBrokerEpochs(), callback=self._learn_broker_epoch, timeout=LOCAL_TIMEOUT)
        self.call_every(1.0, self._reap)

    def on_stop(self) -> None:
        self.closing = True  # the runtime fails our outstanding requests next: ignore those answers
        sessions = list(self.sessions.values()) + self.closed_sessions
        self.sessions.clear()
        for s in sessions:
            s.close()
        deadline = time.monotonic() + STOP_JOIN_TIMEOUT
        for s in sessions:
            for thread in s.threads:
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    log.error("the fetch thread %s did not stop within %gs", thread.name, STOP_JOIN_TIMEOUT)
        self.closed_sessions = []

    def stats(self) -> dict:
        states: dict[str, int] = {}
        for p in self.parts.values():
            states[p.state] = states.get(p.state, 0) + 1
        return {"partitions": len(self.parts), "partition_states": states,
                "replicated_bytes": self.replicated_bytes, "replicated_batches": self.replicated_batches,
                "truncations": self.truncations, "progress_reports": self.progress_reports,
                "throttle": {"rate": self.quota.rate, "partitions": len(self.throttled),
                             "bytes": self.throttled_bytes, "at": self.clock()},
                "leaders": {str(s.leader): {"address": s.address, "state": s.state, "connected": s.connected,
                                            "partitions": len(s.parts), "fetches": s.fetches, "errors": s.errors,
                                            "last_error": s.last_error}
                            for s in self.sessions.values()}}

    # ---- from the log actors ------------------------------------------------------------
    def on_fsynced(self, msg: Message) -> None:
        """A group commit ended: tell the leaders whose FETCH is in flight at once (a progress
        report), as that FETCH may wait at the leader for data until its max wait; a session
        between fetches carries it in its next one."""
        sessions = set()
        for topic, partition, end in msg.fields.parts:
            p = self.parts.get((topic, partition))
            if p is None or p.state != FETCHING or not isinstance(end, int):
                continue  # a truncation under way answers with its own fsynced offset
            synced = min(end, p.fetch_offset)
            if synced > p.fsynced_offset:
                p.fsynced_offset = synced
                s = self.sessions.get(p.leader)
                if s is not None and p.key in s.parts:
                    sessions.add(s)
        for s in sessions:
            self._report(s)

    def _report(self, s: LeaderSession) -> None:
        """One progress report at a time per leader, while its FETCH is in flight: the
        partitions whose fsynced offset passed what the leader was last told."""
        if self.closing or not self._current(s) or s.reporting or s.state != "fetching":
            return
        due = [p for p in (self.parts.get(k) for k in s.parts) if p is not None and p.state == FETCHING
               and p.fsynced_offset > p.told]
        if not due:
            return
        body = fetch_body(self.broker_id, self.config,
                          [(p.topic, p.partition, p.fetch_offset, p.leader_epoch, p.fsynced_offset) for p in due],
                          self.broker_epoch, progress_only=True)
        for p in due:
            p.told = p.fsynced_offset
        self.progress_reports += 1
        s.report(body, self.answer_timeout, lambda body, frames, err, s=s: self._on_reported(s, err))

    def _on_reported(self, s: LeaderSession, err: OdradekError | None) -> None:
        s.reporting = False
        if err is not None:  # the next FETCH says it anyway
            log.debug("a progress report to broker %d failed: %s", s.leader, err)
            return
        self._report(s)  # more came meanwhile

    # ---- from the controller -----------------------------------------------------------
    def on_broker_epochs(self, msg: Message) -> None:
        self._learn_broker_epoch(msg)
        self.reply(msg, Done())

    def _learn_broker_epoch(self, msg: Message) -> None:
        if not msg.is_error:
            self.broker_epoch = int((msg.fields.epochs or {}).get(str(self.broker_id), -1))

    def on_follow(self, msg: Message) -> None:
        for broker, address in (msg.fields.brokers or {}).items():
            self._set_broker(int(broker), address)
        for topic, partition, leader, leader_epoch in msg.fields.parts:
            self._follow(topic, partition, int(leader), int(leader_epoch))
        self.reply(msg, Done())
        self._attach_waiting()
        for s in list(self.sessions.values()):
            self._kick(s)

    def on_throttle(self, msg: Message) -> None:
        self.quota.set_rate(int(msg.fields.rate or UNLIMITED), self.clock())
        self.throttled = {(t, p) for t, p in msg.fields.parts}
        self.reply(msg, Done())
        for s in list(self.sessions.values()):
            self._kick(s)

    def on_unfollow(self, msg: Message) -> None:
        for topic, partition in msg.fields.parts:
            p = self.parts.pop((topic, partition), None)
            if p is not None:
                self._leave_session(p)
        self.reply(msg, Done())

    def _set_broker(self, broker: int, address) -> None:
        host, port = address[0], int(address[1])
        if self.brokers.get(broker) == (host, port):
            return
        self.brokers[broker] = (host, port)
        old = self.sessions.pop(broker, None)
        if old is not None:  # the leader moved to a new address: a new session, truncate again
            self._close_session(old)
            for key in list(old.parts):
                p = self.parts.get(key)
                if p is not None:
                    self._needs_truncation(p, "the leader's address changed")
                    self._join_session(p)

    def _follow(self, topic: str, partition: int, leader: int, epoch: int) -> None:
        p = self.parts.get((topic, partition))
        if p is None:
            p = self.parts[(topic, partition)] = Followed(topic, partition, leader, epoch)
        elif p.leader == leader and p.leader_epoch == epoch and p.state != STOPPED:
            return  # the controller repeating itself
        else:
            if p.leader != leader:
                self._leave_session(p)
            p.leader, p.leader_epoch = leader, epoch
            p.failed_truncations = 0
        if leader == self.broker_id or leader < 0:
            self._leave_session(p)
            p.state, p.why = STOPPED, ("this broker leads it" if leader >= 0 else "no leader")
            return
        self._needs_truncation(p, "followed at a new leader epoch")
        self._join_session(p)

    def _needs_truncation(self, p: Followed, why: str, delay: float = 0.0) -> None:
        p.state, p.why = TRUNCATE, why
        p.gen += 1
        p.retry_at = self.clock() + delay

    # ---- sessions ------------------------------------------------------------------------
    def _join_session(self, p: Followed) -> None:
        s = self.sessions.get(p.leader)
        if s is None:
            address = self.brokers.get(p.leader)
            if address is None:
                log.warning("%s-%d: no address for its leader, broker %d; waiting for one", p.topic,
                            p.partition, p.leader)
                return
            s = self.sessions[p.leader] = LeaderSession(p.leader, address[0], address[1],
                                                        f"odradek-replica-{self.broker_id}", self.post,
                                                        self.security)
        s.parts.add(p.key)

    def _leave_session(self, p: Followed) -> None:
        p.gen += 1
        s = self.sessions.get(p.leader)
        if s is None:
            return
        s.parts.discard(p.key)
        if not s.parts:
            del self.sessions[p.leader]
            self._close_session(s)

    def _close_session(self, s: LeaderSession) -> None:
        s.close()
        self.closed_sessions.append(s)

    def _reap(self) -> None:
        self.closed_sessions = [s for s in self.closed_sessions if any(t.is_alive() for t in s.threads)]

    def _attach_waiting(self) -> None:
        """Partitions whose leader had no known address join its session once it has one."""
        for p in self.parts.values():
            if p.state != STOPPED and p.leader in self.brokers and p.key not in \
                    getattr(self.sessions.get(p.leader), "parts", ()):
                self._join_session(p)

    def _current(self, s: LeaderSession) -> bool:
        return self.sessions.get(s.leader) is s

    def _kick(self, s: LeaderSession) -> None:
        """Start whatever the session can do now; wake up later for what must wait."""
        if self.closing or not self._current(s):
            return
        now = self.clock()
        members = [self.parts[k] for k in s.parts if k in self.parts]
        due = [p for p in members if p.state == TRUNCATE and p.retry_at <= now]
        if due:
            self._truncate(s, due)
        held = []  # throttled partitions over the rate
        if not s.busy and s.retry_at <= now:
            ready = [p for p in members if p.state == FETCHING and p.retry_at <= now]
            if self.throttled and not self.quota.allows(now):
                held = [p for p in ready if p.key in self.throttled]
                ready = [p for p in ready if p.key not in self.throttled]
            if ready:
                self._fetch(s, ready)
            else:
                s.state = "throttled" if held else "idle"
        wake = [p.retry_at for p in members if p.state in (TRUNCATE, FETCHING) and p.retry_at > now]
        if held and not s.busy:
            wake.append(now + self.quota.wait(now))
        if s.retry_at > now:
            wake.append(s.retry_at)
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        if wake:
            s.timer = self.call_later(max(0.0, min(wake) - now), lambda: self._kick(s))

    def _session_failed(self, s: LeaderSession, err: OdradekError, what: str) -> None:
        s.errors += 1
        s.connected = False
        s.state = "backoff"
        s.retry_at = self.clock() + self.backoff
        if s.last_error != err.message:
            log.warning("%s to broker %d (%s) failed: %s; retrying every %gs", what, s.leader, s.address,
                        err, self.backoff)
        s.last_error = err.message

    # ---- truncation ----------------------------------------------------------------------
    def _truncate(self, s: LeaderSession, parts: list) -> None:
        for p in parts:
            p.state = TRUNCATING
        for host, group in group_by_host([(p.topic, p.partition, p.gen) for p in parts], self.log_hosts).items():
            self.request(host, FollowerState([[t, q] for t, q, _ in group]), timeout=LOCAL_TIMEOUT,
                         callback=lambda reply, s=s, group=group: self._on_follower_state(s, group, reply))

    def _still(self, topic: str, partition: int, gen: int, state: str) -> Followed | None:
        if self.closing:
            return None
        p = self.parts.get((topic, partition))
        return p if p is not None and p.gen == gen and p.state == state else None

    def _retry_truncation(self, p: Followed, why: str) -> None:
        """The leader refused (a deposed leader answers NOT_LEADER_OR_FOLLOWER until the
        controller tells us who leads now): try again later, doubling the wait each time in a
        row up to 2**TRUNCATION_DOUBLINGS backoffs. A new leader or epoch retries at once."""
        delay = self.backoff * (1 << min(p.failed_truncations, TRUNCATION_DOUBLINGS))
        p.failed_truncations += 1
        log.info("%s-%d: truncation failed (%s); retrying in %gs", p.topic, p.partition, why, delay)
        self._needs_truncation(p, why, delay)

    def _on_follower_state(self, s: LeaderSession, group: list, reply: Message) -> None:
        gens = {(t, q): g for t, q, g in group}
        if reply.is_error:
            for t, q, g in group:
                p = self._still(t, q, g, TRUNCATING)
                if p is not None:
                    self._retry_truncation(p, f"follower_state: {reply.error_message}")
            self._kick(s)
            return
        ask, direct = [], []
        for part in reply.fields.parts:
            t, q, code, latest_epoch, _end = FollowerStatePart._make(part)
            p = self._still(t, q, gens.pop((t, q), -1), TRUNCATING)
            if p is None:
                continue
            if code:
                self._retry_truncation(p, f"follower_state: {ErrorCode.of(code).name}")
            elif latest_epoch < 0:
                direct.append((p, truncate_entry(t, q, latest_epoch, None)[1]))
            else:
                ask.append((p, latest_epoch))
        self._unanswered_parts(gens, FollowerState.TYPE)
        if direct:
            self._send_truncate(s, direct)
        if ask and self._current(s):
            sent = [(p.topic, p.partition, p.gen, latest) for p, latest in ask]
            body = epoch_body(self.broker_id, [(p.topic, p.partition, p.leader_epoch, latest) for p, latest in ask])
            s.submit(ApiKey.OFFSET_FOR_LEADER_EPOCH, body, self.answer_timeout,
                     lambda body, frames, err, s=s, sent=sent: self._on_epochs(s, sent, body, err))
        self._kick(s)

    def _on_epochs(self, s: LeaderSession, sent: list, body: dict | None, err: OdradekError | None) -> None:
        if not self._current(s):
            return
        if err is not None:
            self._session_failed(s, err, "OFFSET_FOR_LEADER_EPOCH")
            for t, q, g, _ in sent:
                p = self._still(t, q, g, TRUNCATING)
                if p is not None:
                    self._needs_truncation(p, f"OFFSET_FOR_LEADER_EPOCH: {err.message}", self.backoff)
            self._kick(s)
            return
        s.connected = True
        answers = epoch_answers(body)
        todo = []
        for t, q, g, latest in sent:
            p = self._still(t, q, g, TRUNCATING)
            if p is None:
                continue
            what, value = truncate_entry(t, q, latest, answers.get((t, q)))
            if what == "truncate":
                todo.append((p, value))
            elif ErrorCode.of(value) in STOP_ERRORS:
                self._stop_partition(p, f"OFFSET_FOR_LEADER_EPOCH: {ErrorCode.of(value).name}")
            else:
                self._retry_truncation(p, f"the leader answered {ErrorCode.of(value).name}")
        if todo:
            self._send_truncate(s, todo)
        self._kick(s)

    def _send_truncate(self, s: LeaderSession, todo: list, kind: type = Truncate) -> None:
        """``todo`` = ``[(Followed, TruncatePart or TruncateFullyPart)]`` -> one ``kind``
        (``Truncate``, ``TruncateFully``) per log actor."""
        for host, group in group_by_host(todo, self.log_hosts, key=lambda item: item[0].key).items():
            sent = {(p.topic, p.partition): p.gen for p, _ in group}
            self.request(host, kind([entry for _, entry in group]), timeout=LOCAL_TIMEOUT,
                         callback=lambda reply, s=s, sent=sent, type_=kind.TYPE: self._on_truncated(s, sent, reply,
                                                                                                   type_))

    def _on_truncated(self, s: LeaderSession, sent: dict, reply: Message, type_: str) -> None:
        if reply.is_error:
            for (t, q), g in sent.items():
                p = self._still(t, q, g, TRUNCATING)
                if p is not None:
                    self._retry_truncation(p, f"{type_}: {reply.error_message}")
            self._kick(s)
            return
        sent = dict(sent)
        for part in reply.fields.parts:
            t, q, code, end, fsynced = ReplicaEnd._make(part)
            p = self._still(t, q, sent.pop((t, q), -1), TRUNCATING)
            if p is None:
                continue
            if code or not isinstance(end, int) or end < 0:
                err = ErrorCode.of(code)
                if err in STOP_ERRORS:
                    self._stop_partition(p, f"{type_}: {err.name}")
                else:
                    self._retry_truncation(p, f"{type_}: {err.name}")
                continue
            self.truncations += 1
            p.state, p.why, p.fetch_offset, p.retry_at, p.failed_truncations = FETCHING, "", end, 0.0, 0
            p.fsynced_offset = _synced(fsynced, end)
            p.high_watermark = p.log_start_offset = -1  # tell the log actor the leader's again
            log.info("%s-%d: fetching from broker %d at offset %d (leader epoch %d)", t, q, p.leader, end,
                     p.leader_epoch)
        self._unanswered_parts(sent, type_)
        self._kick(s)

    def _unanswered_parts(self, gens: dict, what: str) -> None:
        """Partitions a log actor's reply left out: try their truncation again."""
        for (t, q), g in gens.items():
            p = self._still(t, q, g, TRUNCATING)
            if p is not None:
                self._retry_truncation(p, f"{what}: no answer for it")

    def _stop_partition(self, p: Followed, why: str) -> None:
        log.warning("%s-%d: stopped fetching from broker %d at leader epoch %d (%s); waiting for the controller",
                    p.topic, p.partition, p.leader, p.leader_epoch, why)
        p.state, p.why = STOPPED, why
        p.gen += 1

    # ---- the fetch loop ------------------------------------------------------------------
    def _fetch(self, s: LeaderSession, parts: list) -> None:
        s.busy, s.state = True, "fetching"
        s.fetches += 1
        sent = [(p.topic, p.partition, p.gen, p.fetch_offset) for p in parts]
        body = fetch_body(self.broker_id, self.config,
                          [(p.topic, p.partition, p.fetch_offset, p.leader_epoch, p.fsynced_offset) for p in parts],
                          self.broker_epoch)
        for p in parts:
            p.told = p.fsynced_offset
        s.submit(ApiKey.FETCH, body, self.fetch_timeout,
                 lambda body, frames, err, s=s, sent=sent: self._on_fetch(s, sent, body, frames, err))

    def _on_fetch(self, s: LeaderSession, sent: list, body: dict | None, frames: list,
                  err: OdradekError | None) -> None:
        if not self._current(s):
            return
        if err is not None:
            s.busy = False
            self._session_failed(s, err, "FETCH")
            self._kick(s)
            return
        s.connected = True
        answers = split_fetch_answer(body, frames)
        now = self.clock()
        todo, fully = [], []
        for t, q, g, offset in sent:
            p = self._still(t, q, g, FETCHING)
            data = answers.get((t, q))
            if p is None or data is None:
                continue
            action = decide(offset, p.high_watermark, p.log_start_offset, data)
            if action.kind == APPEND or action.kind == WATERMARKS:
                todo.append((p, action, data))
                p.out_of_range = 0
            elif action.kind == STOP:
                self._stop_partition(p, action.why)
            elif action.kind == TRUNCATE_FULLY:
                log.info("%s-%d: offset %d is below the leader's log start %d: starting empty there", t, q,
                         offset, action.offset)
                p.state, p.gen = TRUNCATING, p.gen + 1
                fully.append((p, TruncateFullyPart(t, q, action.offset)))
            elif action.kind == RETRUNCATE:
                p.out_of_range += 1
                log.info("%s-%d: offset %d is out of range at the leader; truncating again", t, q, offset)
                self._needs_truncation(p, action.why, 0.0 if p.out_of_range == 1 else self.backoff)
            elif action.kind == CORRUPT:
                log.error("%s-%d: bad data from broker %d at offset %d: %s; refetching in %gs", t, q, p.leader,
                          offset, action.why, self.backoff)
                p.retry_at, p.why = now + self.backoff, action.why
            elif action.kind == BACKOFF:
                if p.why != action.why:
                    log.info("%s-%d: broker %d answered %s; retrying every %gs", t, q, p.leader, action.why,
                             self.backoff)
                p.retry_at, p.why = now + self.backoff, action.why
        if fully:
            self._send_truncate(s, fully, TruncateFully)
        if not todo:
            s.busy = False
            self._kick(s)
            return
        s.state = "appending"
        self._replicate(s, todo)

    def _replicate(self, s: LeaderSession, todo: list) -> None:
        hosts = group_by_host(todo, self.log_hosts, key=lambda item: item[0].key)
        pending = {"hosts": len(hosts)}
        for host, group in hosts.items():
            parts, frames, sent = [], [], {}
            for p, action, data in group:
                frame = -1
                if action.kind == APPEND:
                    frame = len(frames)
                    frames.append(action.records)
                parts.append(ReplicatePart(p.topic, p.partition, frame, p.leader_epoch, data.high_watermark,
                                           data.log_start_offset))
                sent[p.key] = (p.gen, data, action)
            self.request(host, Replicate(parts), frames=frames, timeout=LOCAL_TIMEOUT,
                         callback=lambda reply, s=s, sent=sent: self._on_replicated(s, sent, reply, pending))

    def _on_replicated(self, s: LeaderSession, sent: dict, reply: Message, pending: dict) -> None:
        now = self.clock()
        if reply.is_error:  # appended or not? Only the log actor knows: ask it again
            for (t, q), (g, _, _) in sent.items():
                p = self._still(t, q, g, FETCHING)
                if p is not None:
                    self._retry_truncation(p, f"replicate: {reply.error_message}")
        else:
            for part in reply.fields.parts:
                t, q, code, end, fsynced = ReplicaEnd._make(part)
                g, data, action = sent.get((t, q), (-1, None, None))
                p = self._still(t, q, g, FETCHING)
                if p is None:
                    continue
                if code == 0 and isinstance(end, int) and end >= 0:
                    # an ``fsynced`` message may have come first (the log end only grew since)
                    p.fetch_offset, p.fsynced_offset = end, max(p.fsynced_offset, _synced(fsynced, end))
                    p.high_watermark, p.log_start_offset = data.high_watermark, data.log_start_offset
                    p.why = ""
                    if action.kind == APPEND:
                        if p.key in self.throttled:
                            self.quota.record(len(action.records), now)
                            self.throttled_bytes += len(action.records)
                        p.bytes += len(action.records)
                        p.batches += action.batches
                        self.replicated_bytes += len(action.records)
                        self.replicated_batches += action.batches
                    continue
                err = ErrorCode.of(code)
                if err in STOP_ERRORS:
                    self._stop_partition(p, f"replicate: {err.name}")
                elif err is ErrorCode.CORRUPT_MESSAGE:
                    log.error("%s-%d: the log refused the leader's batches at offset %d as corrupt; refetching "
                              "in %gs", t, q, p.fetch_offset, self.backoff)
                    p.retry_at, p.why = now + self.backoff, "corrupt batch from the leader"
                else:  # offsets that do not follow on, a disk error, ...: learn the log end again
                    self._retry_truncation(p, f"replicate: {err.name}")
        pending["hosts"] -= 1
        if pending["hosts"] == 0 and self._current(s):
            s.busy = False
            self._kick(s)
