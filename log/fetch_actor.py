"""The fetch actor: serves reads of every partition, with long polls, without touching a byte.

Process: ``fetch`` (one). Owns a read-only ``LogReader`` per partition, kept current by the log
actors' ``bounds``; the leases of the partitions it watches; the purgatory of fetches waiting
for data; the leader-side replication throttle; the live brokers' epochs (cluster mode).
Accepts (bodies: ``odradek.actors.messages``):
  fetch (Fetch): from a handler; answered straight to the client's processor (``Response``,
      with file regions)
  list_offsets (ListOffsets): likewise (a new leader below its floor: OFFSET_NOT_AVAILABLE,
      KIP-207); from the group coordinator also ``readable``: "latest" is then the highest
      offset a consumer may have read
  bounds (Bounds: [PartitionBounds], closed, host, opening): from the log actors, one-way
      after appends (a request when partitions open or close)
  broker_epochs {epochs}: from the broker agent (cluster mode), when ``/brokers/ids`` changes
  throttle {rate, parts: [ThrottledReplica]}: from the controller (broker agent)
Sends: ``get_bounds`` to every log actor when it (re)starts; ``watch`` to a log actor before
serving a partition not watched (or with less than half its lease left); ``replica_progress``
to the leader's log actor when a follower fetched; ``get_broker_epochs`` to the controller.
Invariants: no record byte passes through here (the processor sends the regions with
``os.sendfile``); only a partition's leader serves it; a consumer reads up to the high
watermark (``read_committed``: the last stable offset, with the aborted transactions it
overlaps), a follower up to the log end; a long poll is answered before its processor gives up
(``max_wait_ms`` capped below ``request.timeout.ms``); a ``replica_id`` is a claim: it needs
that broker's live ``broker_epoch`` (else STALE_BROKER_EPOCH) and a place in the replica set
(else REPLICA_NOT_AVAILABLE), and only an offset inside the leader's log is progress.
"""
from __future__ import annotations

import logging
import os
import time

from odradek.actors.message import Message
from odradek.actors.runtime import Actor, MailboxFull
from odradek.log.epochs import epoch_mismatch
from odradek.core.errors import OffsetOutOfRangeError
from odradek.actors.names import CONTROLLER, LOG, partition_dir
from odradek.actors.messages import Done, FollowersFetched, GetBounds, GetBrokerEpochs, LogBounds, Response, Watch
from odradek.log import txn_index
from odradek.log.txn_index import TxnIndex
from odradek.log.reader import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, LogReader
from odradek.log.throttle import BURST_SECONDS, UNLIMITED, Quota
from odradek.core.protocol import ErrorCode, OdradekError

log = logging.getLogger("odradek.fetch")

MAX_WAIT_MS = 60_000  # a longer max_wait_ms is capped, as a request must not hold forever
ANSWER_MARGIN_MS = 1_000  # and the wait ends this long before the processor's request.timeout.ms
THROTTLE_WAIT = 2.0  # seconds replica fetches wait for the broker agent's first word on throttles
# Seconds a log actor tells us of a partition's appends once asked (``watch``); renewed when
# less than half is left, so a fetch held for MAX_WAIT_MS never outlives its lease.
WATCH_LEASE = 150.0
WATCH_MARGIN = 1.0  # our end of a lease is this much before the log actor's (it starts later)
assert WATCH_LEASE / 2 > MAX_WAIT_MS / 1000 + WATCH_MARGIN


class FetchRequest:
    """One parsed fetch: ``parts`` is a list of (topic, partition, offset, partition_max_bytes)."""

    __slots__ = ("msg", "parts", "min_bytes", "max_bytes", "timer", "replica", "since", "committed")

    def __init__(self, msg: Message, parts, min_bytes: int, max_bytes: int, replica: int = -1,
                 committed: bool = False):
        self.msg, self.parts, self.min_bytes, self.max_bytes, self.timer = msg, parts, min_bytes, max_bytes, None
        self.replica = replica
        self.committed = committed  # isolation_level 1 (read_committed)
        self.since: float | None = None  # when it began to wait (Kafka's remote time)


def _int(body: dict, key: str, default: int, lo: int = 0) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise OdradekError(f"'{key}' must be an integer >= {lo}, got {value!r}", ErrorCode.INVALID_REQUEST)
    return value


class FetchActor(Actor):
    def on_start(self) -> None:
        self.data_dir = self.args["data_dir"]
        request_timeout = int((self.args.get("config") or {}).get("request.timeout.ms", 30000))
        self.max_wait_ms = max(min(MAX_WAIT_MS, request_timeout - ANSWER_MARGIN_MS), 0)
        self.readers: dict[tuple[str, int], LogReader] = {}
        self.roles: dict[tuple[str, int], tuple] = {}  # leader epoch, leading here, log actor, replicas
        self.stable: dict[tuple[str, int], int] = {}  # last stable offsets (read_committed reads up to them)
        # partitions led here whose high watermark has not reached its floor yet (a new leader):
        # partition -> the floor (``PartitionBounds.high_watermark_floor``)
        self.unsettled: dict[tuple[str, int], int] = {}
        self.txn_indexes: dict[tuple[str, int], tuple[int, TxnIndex]] = {}  # (file size, index) per partition
        self.waiting: dict[tuple[str, int], set[FetchRequest]] = {}
        self.opening: dict[tuple[str, int], str] = {}  # not yet opened by its log actor (named) after a start
        self.watch_until: dict[tuple[str, int], float] = {}  # partition -> when its watch lease ends (monotonic)
        self.broker_epochs: dict[int, int] = {}  # live broker id -> the czxid of its registration
        self.served_bytes = 0
        self.refused_replica_fetches = 0
        self.quota = Quota(int((self.args.get("config") or {}).get("leader.replication.throttled.rate", UNLIMITED)),
                           time.monotonic())
        self.throttled: set[tuple[str, int, int]] = set()  # (topic, partition, replica)
        self.first_throttle = True  # the next throttle word is the first since this start
        # replica fetches held until the throttles are known (None: known, or no replicas here)
        self.before_throttles: list[Message] | None = None
        if self.args["config"].get("zookeeper.connect"):  # cluster mode: who may fetch as a replica
            self.request(CONTROLLER, GetBrokerEpochs(), callback=self._learn_broker_epochs, timeout=30.0)
            self.before_throttles = []
            self.call_later(THROTTLE_WAIT, self._no_throttle_word)

    def on_stop(self) -> None:
        for reader in self.readers.values():
            reader.close()

    def stats(self) -> dict:
        return {"partitions": len(self.readers), "delayed": sum(len(w) for w in self.waiting.values()),
                "served_bytes": self.served_bytes, "refused_replica_fetches": self.refused_replica_fetches}

    # ---- bounds from the log actors ----------------------------------------------------
    def on_members(self, role: str, members: list[str], retired: list[str]) -> None:
        if role == LOG:  # after our own restart, or a log actor's: learn every partition
            self.watch_until.clear()  # a restarted log actor watches nothing
            for host in members:
                self.request(host, GetBounds(), callback=self._bounds_reply, timeout=30.0)

    def _bounds_reply(self, reply: Message) -> None:
        if not reply.is_error:
            parts, _closed, host, opening = reply.fields
            self._apply(parts, [], host, opening)

    def on_bounds(self, msg: Message) -> None:
        """One-way after appends; a request (answered) when a log actor opens or closes
        partitions, so the controller hears of a new topic only after we can serve it."""
        self._apply(*msg.fields)
        self.reply(msg, Done())

    def _apply(self, parts, closed, host, opening=()) -> None:
        for topic, partition in opening:
            if (topic, partition) not in self.readers:
                self.opening[(topic, partition)] = host
        for topic, partition in closed:
            self.opening.pop((topic, partition), None)
            reader = self.readers.pop((topic, partition), None)
            self.roles.pop((topic, partition), None)
            self.stable.pop((topic, partition), None)
            self.unsettled.pop((topic, partition), None)
            self.txn_indexes.pop((topic, partition), None)
            self.watch_until.pop((topic, partition), None)
            if reader is not None:
                reader.close()
        touched, new_roles = [], False
        # each part a PartitionBounds, unpacked by position (no constructor per part per batch)
        for topic, partition, *bounds, leader_epoch, leader, replicas, last_stable_offset, floor in parts:
            key = (topic, partition)
            self.opening.pop(key, None)
            bounds = LogBounds(*bounds)
            self.stable[key] = bounds.high_watermark if last_stable_offset is None else last_stable_offset
            if floor > bounds.high_watermark:
                self.unsettled[key] = floor
            else:
                self.unsettled.pop(key, None)
            role = (leader_epoch, leader, host, tuple(replicas))
            new_roles |= self.roles.get(key) != role
            self.roles[key] = role
            reader = self.readers.get(key)
            try:
                if reader is None:
                    self.readers[key] = LogReader(partition_dir(self.data_dir, topic, partition), bounds)
                else:
                    reader.update(bounds)
            except (OSError, OdradekError) as exc:
                log.error("cannot read %s-%d: %s", topic, partition, exc)
                continue
            touched.append(key)
        for key in touched:
            for req in list(self.waiting.get(key, ())):
                self._try(req, final=False)
        if new_roles:
            # A leadership changed here: followers' long polls end now, so that their next
            # fetch can include the partitions they must now fetch from this broker.
            for req in {r for waiting in self.waiting.values() for r in waiting if r.replica >= 0}:
                self._try(req, final=True)

    def on_broker_epochs(self, msg: Message) -> None:
        self._learn_broker_epochs(msg)
        self.reply(msg, Done())

    def _learn_broker_epochs(self, msg: Message) -> None:
        if not msg.is_error:
            self.broker_epochs = {int(b): int(e) for b, e in (msg.fields.epochs or {}).items()}

    # ---- fetch -------------------------------------------------------------------------
    def on_throttle(self, msg: Message) -> None:
        self.quota.set_rate(int(msg.fields.rate or UNLIMITED), time.monotonic())
        if self.first_throttle:  # after a start: what the predecessor owed is not known, assume a full burst
            self.first_throttle = False
            self.quota.owe(BURST_SECONDS)
        self.throttled = {(t, p, r) for t, p, r in msg.fields.parts}
        self.reply(msg, Done())
        self._serve_held_replica_fetches()

    def _no_throttle_word(self) -> None:
        if self.before_throttles is not None:
            log.warning("no word on replication throttles from the controller in %.0fs: serving %d held replica "
                        "fetches unthrottled until it comes", THROTTLE_WAIT, len(self.before_throttles))
            self._serve_held_replica_fetches()

    def _serve_held_replica_fetches(self) -> None:
        """The throttles are known (or ``THROTTLE_WAIT`` passed without a word: serve anyway)."""
        held, self.before_throttles = self.before_throttles, None
        for msg in held or ():
            try:
                self.on_fetch(msg)
            except OdradekError as exc:
                self.reply_error(msg, exc.code, exc.message)

    def on_fetch(self, msg: Message) -> None:
        body = msg.fields.body or {}
        max_wait = min(_int(body, "max_wait_ms", 500), self.max_wait_ms)
        parts = []
        for t in body.get("topics") or []:
            for p in (t.get("partitions") or []) if isinstance(t, dict) else []:
                if not isinstance(p, dict):
                    raise OdradekError("each partition must be a map", ErrorCode.INVALID_REQUEST)
                parts.append((t.get("name"), p.get("index"), p.get("fetch_offset"),
                              p.get("partition_max_bytes", 1048576), p.get("current_leader_epoch", -1)))
        replica = _int(body, "replica_id", -1, lo=-1)
        if replica >= 0:
            self._check_broker_epoch(replica, body.get("broker_epoch"))
            if self.before_throttles is not None:
                self.before_throttles.append(msg)
                return
        isolation = body.get("isolation_level", 0)
        if isolation not in (0, 1):
            raise OdradekError(f"isolation_level {isolation!r}: 0 (read_uncommitted) or 1 (read_committed)",
                               ErrorCode.INVALID_REQUEST)
        if self._fresh_first(msg, [(p[0], p[1]) for p in parts], self.on_fetch):
            return
        req = FetchRequest(msg, parts, _int(body, "min_bytes", 1), _int(body, "max_bytes", 52428800, lo=1), replica,
                           committed=isolation == 1 and replica < 0)
        if replica >= 0:
            self._tell_progress(replica, parts, body)
        if body.get("progress_only") is True:  # a follower's progress report: nothing to read
            if replica < 0:
                raise OdradekError("progress_only is a follower's progress report (replica_id >= 0)",
                                   ErrorCode.INVALID_REQUEST)
            self.reply(msg, Response({"error_code": 0, "topics": []}))
            return
        if self._try(req, final=max_wait == 0):
            return
        req.since = time.monotonic()
        req.timer = self.call_later(max_wait / 1000, lambda: self._try(req, final=True))
        for topic, partition, *_ in parts:
            self.waiting.setdefault((topic, partition), set()).add(req)

    def _fresh_first(self, msg: Message, keys, serve) -> bool:
        """True if some of ``keys`` are not watched (or still opening in their log actor
        after its start): their log actors are asked to ``watch`` them (opening them), and
        ``serve(msg)`` runs again once they answered (the fresh bounds are here by then).
        Leases with less than half left are renewed on the way, without waiting. Never
        answered UNKNOWN_TOPIC_OR_PARTITION for a partition still opening."""
        now = time.monotonic()
        need: dict[str, list] = {}
        renew: dict[str, list] = {}
        for key in set(keys):
            host = self.opening.get(key)
            if host is not None:
                need.setdefault(host, []).append(key)
                continue
            role = self.roles.get(key)
            if role is None:
                continue  # not here: answered as such
            left = self.watch_until.get(key, 0.0) - now
            if left <= 0:
                need.setdefault(role[2], []).append(key)
            elif left < WATCH_LEASE / 2:
                renew.setdefault(role[2], []).append(key)
        for host, wanted in renew.items():
            try:
                self.send(host, _watch(wanted))
            except MailboxFull:
                continue  # asked again by the next fetch; the lease still holds
            for key in wanted:
                self.watch_until[key] = now + WATCH_LEASE - WATCH_MARGIN
        if not need:
            return False
        left = [len(need)]

        def watched(reply: Message, wanted: list) -> None:
            # Not watched (the log actor down, a timeout): serve what we know, ask again in a second.
            until = now + (WATCH_LEASE - WATCH_MARGIN if not reply.is_error else 1.0)
            for key in wanted:  # opened, or failed to (offline): not asked again either way
                self.opening.pop(key, None)
                if key in self.roles:
                    self.watch_until[key] = until
            left[0] -= 1
            if left[0]:
                return
            try:
                serve(msg)
            except OdradekError as exc:
                self.reply_error(msg, exc.code, exc.message)

        for host, wanted in need.items():
            self.request(host, _watch(wanted),
                         callback=lambda reply, wanted=wanted: watched(reply, wanted), timeout=60.0)
        return True

    def _try(self, req: FetchRequest, final: bool) -> bool:
        """Answer if enough data (or an error, or the wait is over); True if answered."""
        topics: dict[str, list] = {}
        # the answer's topics in the request's order, a topic named twice apart (A, B, A, as
        # librdkafka sends when a subscription grows) twice: its files follow that order
        answer_topics: list[tuple[str, list]] = []
        files: list[list] = []
        records: dict[str, int] = {}  # per topic: offsets served (records_out)
        total, errors = 0, False
        for topic, partition, offset, part_max, epoch in req.parts:
            entry, slices, served = self._read(topic, partition, offset, part_max, req.max_bytes - total,
                                               total == 0, epoch, req.replica, req.committed)
            errors |= entry["error_code"] != 0
            total += entry["records_size"]
            files += slices
            topics.setdefault(topic, []).append(entry)
            if not answer_topics or answer_topics[-1][0] != topic:
                answer_topics.append((topic, []))
            answer_topics[-1][1].append(entry)
            if served:
                records[topic] = records.get(topic, 0) + served
        if not (final or errors or total >= req.min_bytes):
            return False
        self._forget(req)
        self.served_bytes += total
        self._count_out(req.replica, topics, records)
        body = {"error_code": 0, "topics": [{"name": t, "partitions": ps} for t, ps in answer_topics]}
        self.reply(req.msg, tuple.__new__(Response, (
            body, files, 0.0 if req.since is None else (time.monotonic() - req.since) * 1000)))
        return True

    def _check_broker_epoch(self, replica: int, claimed) -> None:
        """A fetch as broker ``replica`` must prove it: the broker epoch of its live registration."""
        known = self.broker_epochs.get(replica)
        if known is not None and claimed == known and not isinstance(claimed, bool):
            return
        self.refused_replica_fetches += 1
        why = ("is not a live broker of this cluster" if known is None else
               f"sent broker epoch {claimed!r}, not that of its registration")
        raise OdradekError(f"a fetch as replica {replica} refused: broker {replica} {why}; only a live "
                           f"broker's replica fetcher may fetch as a replica (consumers use replica_id -1)",
                           ErrorCode.STALE_BROKER_EPOCH)

    def _count_out(self, replica: int, topics: dict, records: dict) -> None:
        """Bytes served per topic: to consumers (Kafka's BytesOut) or to followers
        (ReplicationBytesOut); and the records served to consumers."""
        name = "bytes_out" if replica < 0 else "replication_bytes_out"
        for topic, entries in topics.items():
            self.metrics.inc(name, (topic,), sum(e["records_size"] for e in entries))
        if replica < 0:
            for topic, n in records.items():
                self.metrics.inc("records_out", (topic,), n)

    def metric_gauges(self) -> list:
        return [["delayed_fetches", [], sum(len(w) for w in self.waiting.values())]]

    def _tell_progress(self, replica: int, parts, body: dict) -> None:
        """A follower's fetch offset is its log end: the leader's log actor needs it now, with
        the follower's ``fsynced_offset`` when the fetch says it (Odradek's replica fetcher
        does; a Kafka Fetch cannot, and then the whole log end is vouched for). Only an offset
        this leader could have served counts, from a replica of the partition."""
        fsynced = {(t.get("name"), q.get("index")): q["fsynced_offset"] for t in body.get("topics") or ()
                   for q in t.get("partitions") or () if "fsynced_offset" in q}
        per_host: dict[str, list] = {}
        for topic, partition, offset, _max, epoch in parts:
            key = (topic, partition)
            role, reader = self.roles.get(key), self.readers.get(key)
            if role is None or reader is None or self._role_problem(key, epoch, replica) is not None:
                continue
            b = reader.bounds
            if isinstance(offset, int) and not isinstance(offset, bool) and \
                    b.log_start_offset <= offset <= b.log_end_offset:
                synced = fsynced.get(key)
                per_host.setdefault(role[2], []).append(  # a ReplicaProgress
                    [topic, partition, replica, offset] if synced is None else [topic, partition, replica, offset, synced])
        for host, progress in per_host.items():
            self.send(host, FollowersFetched(progress))

    def _read(self, topic, partition, offset, part_max, budget: int, first: bool, epoch=-1,
              replica: int = -1, committed: bool = False) -> tuple[dict, list, int]:
        """A partition's entry of the answer, its file regions, and the records they serve
        (from ``offset`` to the end of the last batch: offsets, so control records and
        compacted-away offsets count too; 0 when unknown)."""
        entry = {"index": partition, "error_code": 0, "high_watermark": -1, "last_stable_offset": -1,
                 "log_start_offset": -1, "records_size": 0}
        key = (topic, partition)
        reader = self.readers.get(key)
        if reader is None:
            return _fail(entry, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist here"), [], 0
        problem = self._role_problem(key, epoch, replica)
        if problem is not None:
            return _fail(entry, *problem), [], 0
        b = reader.bounds
        stable = min(self.stable.get(key, b.high_watermark), b.high_watermark)
        entry.update(high_watermark=b.high_watermark, last_stable_offset=stable,
                     log_start_offset=b.log_start_offset)
        if not isinstance(offset, int) or isinstance(offset, bool) or not isinstance(part_max, int) or part_max < 1:
            return _fail(entry, ErrorCode.INVALID_REQUEST,
                         f"{topic}-{partition}: fetch_offset must be an integer and partition_max_bytes >= 1"), [], 0
        limit = min(part_max, budget)
        throttled = replica >= 0 and (topic, partition, replica) in self.throttled
        if (limit <= 0 and not first) or (throttled and not self.quota.allows(time.monotonic())):
            return entry, [], 0
        try:
            upper = b.log_end_offset if replica >= 0 else stable if committed else b.high_watermark
            result = reader.read(offset, max(limit, 1), upper_bound=upper)
            if result.size > limit and not first:  # KIP-74: only the answer's first batch may pass max_bytes
                return entry, [], 0
            if committed and result.size:
                entry["aborted_transactions"] = [
                    {"producer_id": a.producer_id, "first_offset": a.first_offset}
                    for a in self._aborted(topic, partition).aborted(offset, upper)]
        except OffsetOutOfRangeError:
            return _fail(entry, ErrorCode.OFFSET_OUT_OF_RANGE,
                         f"{topic}-{partition}: offset {offset} is outside [{b.log_start_offset}, "
                         f"{b.log_end_offset}]"), [], 0
        except (OSError, OdradekError) as exc:
            return _fail(entry, ErrorCode.KAFKA_STORAGE_ERROR, f"{topic}-{partition}: {exc}"), [], 0
        entry["records_size"] = result.size
        if throttled:
            self.quota.record(result.size, time.monotonic())
        served = sum(s.next_offset - max(offset, s.first_offset) for s in result.slices if s.next_offset > offset)
        return entry, [[s.path, s.position, s.length] for s in result.slices], served

    def _aborted(self, topic: str, partition: int) -> TxnIndex:
        """The partition's aborted-transactions index, re-read when its file grew."""
        directory = partition_dir(self.data_dir, topic, partition)
        try:
            size = os.stat(os.path.join(directory, txn_index.NAME)).st_size
        except OSError:
            size = -1
        cached = self.txn_indexes.get((topic, partition))
        if cached is None or cached[0] != size:
            cached = self.txn_indexes[(topic, partition)] = (size, TxnIndex(directory))
        return cached[1]

    def _role_problem(self, key: tuple[str, int], epoch, replica: int = -1) -> tuple[int, str] | None:
        leader_epoch, leading, _, replicas = self.roles.get(key, (-1, False, "", ()))
        if not leading:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{key[0]}-{key[1]}: this broker is not its leader"
        if replica >= 0 and replica not in replicas:
            return (ErrorCode.REPLICA_NOT_AVAILABLE,
                    f"{key[0]}-{key[1]}: broker {replica} is not one of its replicas {list(replicas)}")
        code = epoch_mismatch(epoch, leader_epoch)
        if code is not None:
            return code, f"{key[0]}-{key[1]}: leader epoch {epoch} requested, the leader is at {leader_epoch}"
        return None

    def _forget(self, req: FetchRequest) -> None:
        if req.timer is not None:
            req.timer.cancel()
        for topic, partition, *_ in req.parts:
            waiting = self.waiting.get((topic, partition))
            if waiting is not None:
                waiting.discard(req)
                if not waiting:
                    del self.waiting[(topic, partition)]

    # ---- list offsets --------------------------------------------------------------------
    def on_list_offsets(self, msg: Message) -> None:
        body, readable = msg.fields
        body = body or {}
        keys = [(t.get("name"), p.get("index")) for t in body.get("topics") or [] if isinstance(t, dict)
                for p in t.get("partitions") or [] if isinstance(p, dict)]
        if self._fresh_first(msg, keys, self.on_list_offsets):
            return
        topics = []
        committed = body.get("isolation_level") == 1  # read_committed: "latest" is the last stable offset
        readable = readable is True  # the group coordinator's check of a commit (never a client's)
        for t in body.get("topics") or []:
            parts = []
            for p in t.get("partitions") or []:
                parts.append(self._offset_for(t.get("name"), p.get("index"), p.get("timestamp", LATEST_TIMESTAMP),
                                              p.get("current_leader_epoch", -1), committed, readable))
            topics.append({"name": t.get("name"), "partitions": parts})
        self.reply(msg, Response({"topics": topics}))

    def _offset_for(self, topic, partition, ts, epoch=-1, committed: bool = False, readable: bool = False) -> dict:
        """ListOffsets of one partition. ``readable``: "latest" is the highest offset a consumer
        may have read, which for a new leader whose high watermark has not reached its floor yet
        is the floor (its predecessor may have let them read that far) instead of an error."""
        entry = {"index": partition, "error_code": 0, "timestamp": -1, "offset": -1}
        reader = self.readers.get((topic, partition))
        if reader is None:
            return _fail(entry, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist here")
        problem = self._role_problem((topic, partition), epoch)
        if problem is not None:
            return _fail(entry, *problem)
        if not isinstance(ts, int) or isinstance(ts, bool) or ts < MAX_TIMESTAMP:
            return _fail(entry, ErrorCode.INVALID_REQUEST, f"timestamp must be -1 (latest), -2 (earliest), "
                                                           f"-3 (max timestamp) or a time in ms, got {ts!r}")
        b = reader.bounds
        floor = self.unsettled.get((topic, partition))
        if ts == LATEST_TIMESTAMP:
            if floor is not None:
                if not readable:
                    return _unsettled(entry, topic, partition, b.high_watermark, floor)
                entry["offset"] = floor
                return entry
            entry["offset"] = min(self.stable.get((topic, partition), b.high_watermark), b.high_watermark) \
                if committed else b.high_watermark
        elif ts == EARLIEST_TIMESTAMP:
            entry["offset"] = b.log_start_offset
        else:
            try:  # one batch's offsets and timestamps, streamed and bounded (records.record_times)
                found = reader.offset_for_max_timestamp() if ts == MAX_TIMESTAMP else reader.offset_for_time(ts)
            except OdradekError as exc:  # an unreadable batch, or one inflating beyond the bound
                return _fail(entry, exc.code, f"{topic}-{partition}: {exc.message}")
            if found is not None and found.offset < b.high_watermark:
                entry.update(timestamp=found.timestamp, offset=max(found.offset, b.log_start_offset))
            elif floor is not None:  # it may lie between the high watermark and the floor
                return _unsettled(entry, topic, partition, b.high_watermark, floor)
        return entry


def _watch(keys: list) -> Watch:
    return Watch([list(k) for k in keys], WATCH_LEASE)


def _unsettled(entry: dict, topic: str, partition: int, high_watermark: int, floor: int) -> dict:
    """KIP-207: a new leader's high watermark may still trail records its predecessor
    acknowledged; answering it would move "latest" backwards. Retriable: it catches up as
    soon as the followers fetch from the new leader."""
    return _fail(entry, ErrorCode.OFFSET_NOT_AVAILABLE,
                 f"{topic}-{partition}: this new leader's high watermark {high_watermark} has not reached "
                 f"{floor}, where its leader epoch began; retry")


def _fail(entry: dict, code: int, message: str) -> dict:
    entry.update(error_code=int(code), error_message=message)
    return entry
