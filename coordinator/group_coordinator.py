"""The group coordinator actor: consumer groups and their committed offsets.

Process: ``group_coordinator`` (one per broker), started after the fetch actor and before
the request handlers.
Owns: every ``ConsumerGroup`` (``coordinator.group``, the pure state machine) and the cache
of committed offsets. Their durable form is the compacted internal topic
``__consumer_offsets`` (records: ``coordinator.offsets``), written through its log actors
like any produce; this actor is the topic's only writer.

Start: if ``__consumer_offsets`` exists, rebuilds the cache and the groups by reading the
topic's partition directories read-only
(``log.reader.LogReader``, bounded by the ``get_bounds`` the log actors report). It reports
ready only once loaded, so no request sees a half-loaded coordinator (requests that arrive
meanwhile wait in the mailbox). Reading the files directly, not through the fetch actor,
keeps the start independent of the fetch actor's own (asynchronous) start-up. The topic is
created through the controller on the first heartbeat or commit (as Kafka does), so a broker
that never serves a group shows no internal topic.

Accepts ``group_request {api, body, client, peer, metadata_version}`` forwarded by a
request handler and answers the client's processor directly with ``_reply {body}``:
CONSUMER_GROUP_HEARTBEAT, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, LIST_GROUPS,
DESCRIBE_GROUPS, CONSUMER_GROUP_DESCRIBE, DELETE_GROUPS, LEAVE_GROUP (administrative
removal). Sends ``produce`` to log actors (offsets and group records, acks=1),
``list_offsets`` to the fetch actor (a commit beyond the high watermark is refused),
``get_metadata`` to the controller (topics for assignment) and ``status`` to the supervisor
(the advertised address, for FindCoordinator).

Durability before answers: a commit is answered once its record is appended; a heartbeat
that changed its group is answered once the group's record is appended, so a restarted
coordinator never hands out an epoch it had already given to someone else.

Heartbeats long-poll: a heartbeat with ``wait_ms`` that brings no news for its member is
held up to ``wait_ms`` (a purgatory, as the fetch actor holds fetches) and answered as soon
as the group changes for that member, so a rebalance takes round trips, not heartbeat
intervals. A newer heartbeat of the same member answers the held one at once.
"""
from __future__ import annotations

import logging
import os
import re
import time

from actors.message import Message
from actors.runtime import Actor
from coordinator.group import (EMPTY, ConsumerGroup, GroupConfig, GroupError, HeartbeatRequest, tps_of)
from coordinator.offsets import (OFFSETS_TOPIC, Committed, OffsetsView, group_record, offset_record,
                                 partition_for)
from coordinator.offsets import expired as expired_offsets
from coordinator.topics import placement
from log.log_actor import partition_dir
from log.reader import LATEST_TIMESTAMP, LogBounds, LogReader
from log.records import decode_batch, encode_batch, iter_batches
from network.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.groups")

CONTROLLER = "controller"
FETCH_ACTOR = "fetch"
TICK_INTERVAL = 0.05  # seconds between session/rebalance deadline checks
METADATA_REFRESH = 2.0  # seconds between topic-metadata refreshes (also on a newer version hint)
WRITE_TIMEOUT = 30.0
MAX_WAIT_MS = 30_000  # a heartbeat is held at most this long
WRITERS = (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.OFFSET_COMMIT)  # need __consumer_offsets to exist
GROUP_ID = re.compile(r"^[\x21-\x7e]{1,255}$")


class BadRequest(OdradekError):
    code = ErrorCode.INVALID_REQUEST


def _get(body: dict, name: str, kind, default=...):
    if name not in body or body[name] is None:
        if default is ...:
            raise BadRequest(f"missing field '{name}'")
        return default
    value = body[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int,))):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRequest(f"field '{name}' must be {names}, got {type(value).__name__}")
    return value


def _group_id(body: dict, name: str = "group_id") -> str:
    gid = body.get(name)
    if not isinstance(gid, str) or not GROUP_ID.match(gid):
        raise OdradekError(f"group id must be 1 to 255 printable ASCII characters without spaces, got {gid!r}",
                           ErrorCode.INVALID_GROUP_ID)
    return gid


def _tp_pairs(entries, what: str) -> list[tuple[str, int]]:
    """``[{"topic", "partitions": [int]}]`` checked -> ``[(topic, partition)]``."""
    if not isinstance(entries, list):
        raise BadRequest(f"'{what}' must be a list of {{topic, partitions}} maps")
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("topic"), str) or not isinstance(e.get("partitions"), list):
            raise BadRequest(f"each entry of '{what}' must be a map with 'topic' and a list of 'partitions'")
        for p in e["partitions"]:
            if not isinstance(p, int) or isinstance(p, bool):
                raise BadRequest(f"'{what}': partitions must be integers, got {p!r}")
            out.append((e["topic"], p))
    return out


class Held:
    """A heartbeat held in purgatory."""

    __slots__ = ("msg", "timer", "epoch", "owned")

    def __init__(self, msg: Message, timer, epoch: int, owned: set):
        self.msg, self.timer, self.epoch, self.owned = msg, timer, epoch, owned


class GroupCoordinator(Actor):
    # ---- start -------------------------------------------------------------------------
    def on_start(self) -> None:
        config = self.args["config"]
        self.config = config
        self.data_dir = self.args["data_dir"]
        self.log_hosts = int(self.args.get("log_hosts", config["num.log.threads"]))
        self.group_config = GroupConfig(
            session_timeout_ms=config["group.consumer.session.timeout.ms"],
            min_session_timeout_ms=config["group.consumer.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.consumer.max.session.timeout.ms"],
            heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
            max_size=config["group.max.size"],
            assignors=tuple(a.strip() for a in config["group.consumer.assignors"].split(",") if a.strip()))
        self.retention_ms = config["offsets.retention.minutes"] * 60_000
        self.metadata_max = config["offset.metadata.max.bytes"]
        self.groups: dict[str, ConsumerGroup] = {}
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self.empty_since: dict[str, int] = {}
        self.held: dict[tuple[str, str], Held] = {}
        self.topics: dict[str, int] = {}
        self.metadata_version = -1
        self.address: tuple[str, int] | None = None
        self.commits = self.heartbeats = 0
        self._adopt(self.call(CONTROLLER, "get_metadata", timeout=60.0).fields)
        self.partitions = self.topics.get(OFFSETS_TOPIC, 0)
        self._queued: list[Message] = []  # requests waiting for the topic to be created
        if self.partitions:
            self._load()
        self.call_every(TICK_INTERVAL, self._tick)
        self.call_every(METADATA_REFRESH, self._refresh_metadata)
        self.call_every(config["offsets.retention.check.interval.ms"] / 1000, self._expire_offsets)

    def _create_topic(self) -> None:
        """Create ``__consumer_offsets`` through the controller, on the first request that
        writes (as Kafka does): a broker that never serves a group lists no internal topic.
        Requests arriving meanwhile wait in ``_queued`` and run, in order, once it exists."""
        n = self.config["offsets.topic.num.partitions"]

        def created(reply: Message) -> None:
            result = {} if reply.is_error else reply.fields["body"]["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            if code not in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                why = reply.error_message if reply.is_error else result.get("error_message")
                log.error("cannot create %s: %s", OFFSETS_TOPIC, why)
                queued, self._queued = self._queued, []
                for msg in queued:
                    self.reply_error(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE, f"cannot create {OFFSETS_TOPIC}: {why}")
                return
            self.partitions = n
            log.info("created %s with %d partitions", OFFSETS_TOPIC, n)
            queued, self._queued = self._queued, []
            for msg in queued:
                self._dispatch_group(msg)

        self.request(CONTROLLER, "create_topics", {"body": {"topics": [{
            "name": OFFSETS_TOPIC, "num_partitions": n,
            "configs": {"cleanup.policy": "compact", "segment.bytes": self.config["offsets.topic.segment.bytes"]}}]}},
            callback=created, timeout=60.0)

    def _load(self) -> None:
        """Replay ``__consumer_offsets`` from its files (read-only; see the module doc)."""
        started = time.monotonic()
        view, records = OffsetsView(), 0
        for i in range(self.log_hosts):
            parts = self.call(f"log-{i}", "get_bounds", timeout=60.0).get("parts") or []
            for topic, partition, *b in parts:
                if topic == OFFSETS_TOPIC:
                    records += self._replay(partition, LogBounds(*b), view)
        now, wall = self._now(), _wall_ms()
        self.offsets = view.offsets
        for gid, rec in view.groups.items():
            self.groups[gid] = ConsumerGroup.from_record(gid, rec["group"], now, self.group_config)
            if rec.get("empty_since_ms") is not None:
                self.empty_since[gid] = rec["empty_since_ms"]
        for gid in self.offsets:
            self.empty_since.setdefault(gid, wall)
        log.info("loaded %d groups and %d committed offsets from %d records of %s in %.3f s", len(self.groups),
                 sum(len(o) for o in self.offsets.values()), records, OFFSETS_TOPIC, time.monotonic() - started)

    def _replay(self, partition: int, bounds: LogBounds, view: OffsetsView) -> int:
        reader = LogReader(partition_dir(self.data_dir, OFFSETS_TOPIC, partition), bounds)
        count, offset, attempts = 0, bounds.log_start_offset, 0
        try:
            while offset < bounds.high_watermark:
                result = reader.read(offset, 1 << 20, upper_bound=bounds.high_watermark)
                if not result.slices:
                    break
                try:
                    data = result.read_bytes()
                except OdradekError:  # compacted under us: list the files again and retry
                    attempts += 1
                    if attempts > 10:
                        raise
                    reader.update(bounds._replace(generation=-1))
                    continue
                for pos, h in iter_batches(data):
                    for r in decode_batch(memoryview(data)[pos:pos + h.size]):
                        if r.offset >= offset:
                            view.apply(r.key, r.value)
                            count += 1
                    offset = max(offset, h.next_offset)
        finally:
            reader.close()
        return count

    def on_stop(self) -> None:
        for held in list(self.held.values()):
            held.timer.cancel()
        self.held.clear()

    def stats(self) -> dict:
        return {"groups": len(self.groups), "members": sum(len(g.members) for g in self.groups.values()),
                "commits": self.commits, "heartbeats": self.heartbeats, "held": len(self.held)}

    # ---- metadata -------------------------------------------------------------------------
    def _adopt(self, snapshot: dict) -> None:
        if snapshot.get("version", -1) >= self.metadata_version:
            self.metadata_version = snapshot["version"]
            self.topics = {n: t["partitions"] for n, t in snapshot["topics"].items()}

    def _refresh_metadata(self) -> None:
        def adopt(reply: Message) -> None:
            if not reply.is_error:
                before = self.topics
                self._adopt(reply.fields)
                if self.topics != before:
                    for g in list(self.groups.values()):
                        if g.members and g.maybe_rebalance(self.topics):
                            self._changed(g)
        self.request(CONTROLLER, "get_metadata", callback=adopt, timeout=10.0)

    # ---- the entry point --------------------------------------------------------------------
    def on_group_request(self, msg: Message) -> None:
        version = msg.get("metadata_version")
        if isinstance(version, int) and version > self.metadata_version:
            self._refresh_metadata()
        if not self.partitions and msg.get("api") in WRITERS:
            if not self._queued:
                self._create_topic()
            self._queued.append(msg)
            return
        self._dispatch_group(msg)

    def _dispatch_group(self, msg: Message) -> None:
        try:
            self._serve(msg)
        except OdradekError as exc:
            self.reply_error(msg, exc.code, exc.message)

    def _serve(self, msg: Message) -> None:
        api, body = msg.get("api"), msg.get("body")
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a map")
        method = {
            ApiKey.CONSUMER_GROUP_HEARTBEAT: self.heartbeat,
            ApiKey.OFFSET_COMMIT: self.offset_commit,
            ApiKey.OFFSET_FETCH: self.offset_fetch,
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.LIST_GROUPS: self.list_groups,
            ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            ApiKey.CONSUMER_GROUP_DESCRIBE: self.describe_groups,
            ApiKey.DELETE_GROUPS: self.delete_groups,
            ApiKey.LEAVE_GROUP: self.leave_group,
        }.get(api)
        if method is None:
            raise BadRequest(f"the group coordinator does not serve API {api!r}")
        method(msg, body)

    def _now(self) -> float:
        return self.clock() * 1000

    # ---- heartbeats -------------------------------------------------------------------------
    def heartbeat(self, msg: Message, body: dict) -> None:
        self.heartbeats += 1
        gid = _group_id(body)
        owned_entries = _get(body, "topic_partitions", list, None)
        names = _get(body, "subscribed_topic_names", list, None)
        if names is not None and not all(isinstance(n, str) for n in names):
            raise BadRequest("'subscribed_topic_names' must be a list of strings")
        req = HeartbeatRequest(
            member_id=_get(body, "member_id", str, ""), member_epoch=_get(body, "member_epoch", int),
            instance_id=_get(body, "instance_id", str, None),
            rebalance_timeout_ms=_get(body, "rebalance_timeout_ms", int, None),
            session_timeout_ms=_get(body, "session_timeout_ms", int, None),
            subscribed_topic_names=names, subscribed_topic_regex=_get(body, "subscribed_topic_regex", str, None),
            server_assignor=_get(body, "server_assignor", str, None),
            owned=None if owned_entries is None else _tp_pairs(owned_entries, "topic_partitions"),
            client_id=str(msg.get("client") or ""), client_host=str(msg.get("peer") or "").rpartition(":")[0])
        wait_ms = min(max(_get(body, "wait_ms", int, 0), 0), MAX_WAIT_MS)
        g = self.groups.get(gid)
        if g is None:
            if req.member_epoch != 0:
                raise OdradekError(f"member {req.member_id!r} is not in group '{gid}' (the group does not exist)",
                                   ErrorCode.UNKNOWN_MEMBER_ID)
            g = self.groups[gid] = ConsumerGroup(gid, self.group_config)
        self._release_held(gid, req.member_id)
        now = self._now()
        try:
            resp = g.heartbeat(req, now, self.topics)
        except GroupError:
            if not g.members and g.group_epoch == 0 and gid not in self.offsets:
                del self.groups[gid]  # a refused first join leaves no trace
            raise
        finally:
            self._changed(g)  # a refused request changed nothing; a removal by it did
        owned = set(req.owned or ())
        # Nothing new for the member (even one waiting for partitions to be released): hold it.
        quiet = (resp["member_epoch"] == req.member_epoch and tps_of(resp["assignment"]) == owned
                 and req.owned is not None)
        if wait_ms > 0 and quiet and req.member_epoch > 0:
            key = (gid, resp["member_id"])
            timer = self.call_later(wait_ms / 1000, lambda: self._answer_held(key))
            self.held[key] = Held(msg, timer, req.member_epoch, owned)
            return
        self._after_write(g, lambda: self.reply(msg, {"body": {"error_code": 0, **resp}}))

    def _release_held(self, gid: str, member_id: str) -> None:
        """A member's newer heartbeat supersedes its held one: answer that one now."""
        if member_id and (gid, member_id) in self.held:
            self._answer_held((gid, member_id))

    def _answer_held(self, key: tuple[str, str]) -> None:
        held = self.held.pop(key, None)
        if held is None:
            return
        held.timer.cancel()
        g = self.groups.get(key[0])
        resp = g.refresh(key[1], self._now()) if g is not None else None
        if resp is None:
            self.reply(held.msg, {"body": {"error_code": int(ErrorCode.UNKNOWN_MEMBER_ID),
                                           "error_message": f"member {key[1]} was removed from group '{key[0]}'"}})
            return
        self._after_write(g, lambda: self.reply(held.msg, {"body": {"error_code": 0, **resp}}))

    def _wake_held(self, g: ConsumerGroup) -> None:
        """The group changed: answer each held heartbeat whose member has news."""
        now = self._now()
        for key in [k for k in self.held if k[0] == g.group_id]:
            held = self.held[key]
            resp = g.refresh(key[1], now)
            if resp is None or resp["member_epoch"] != held.epoch or tps_of(resp["assignment"]) != held.owned:
                self._answer_held(key)

    def _changed(self, g: ConsumerGroup) -> None:
        """After any operation on ``g``: wake held heartbeats, note emptiness."""
        if not g.changed:
            return
        if not g.members:
            self.empty_since.setdefault(g.group_id, _wall_ms())
        else:
            self.empty_since.pop(g.group_id, None)
        self._wake_held(g)

    def _after_write(self, g: ConsumerGroup, then) -> None:
        """Append the group's record if it changed, then run ``then`` (answers wait for it)."""
        if not g.changed:
            then()
            return
        g.changed = False
        state = None if g.deleted else g.to_record()
        key, value = group_record(g.group_id, state, self.empty_since.get(g.group_id))

        def done(error: str | None) -> None:
            if error:
                log.error("group %s: its record was not written (%s); a coordinator restart would resume "
                          "from an older state", g.group_id, error)
            then()

        self._append(g.group_id, [(key, value)], done)

    def _tick(self) -> None:
        now = self._now()
        for g in list(self.groups.values()):
            deadline = g.next_deadline()
            if deadline is None or deadline > now:
                continue
            for member_id, why in g.expire(now, self.topics):
                log.info("group %s: removed member %s: %s", g.group_id, member_id, why)
                self._answer_held((g.group_id, member_id))
            self._changed(g)
            self._after_write(g, lambda: None)

    # ---- offsets ------------------------------------------------------------------------------
    def offset_commit(self, msg: Message, body: dict) -> None:
        gid = _group_id(body)
        member_id = _get(body, "member_id", str, "")
        epoch = _get(body, "generation_id_or_member_epoch", int, -1)
        topics = _get(body, "topics", list)
        results: dict[tuple[str, int], tuple[int, str]] = {}
        wanted: dict[tuple[str, int], Committed] = {}
        now_ms = _wall_ms()
        for t in topics:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("partitions"), list):
                raise BadRequest("each topic must be a map with 'name' and a list of 'partitions'")
            for p in t["partitions"]:
                if not isinstance(p, dict) or not isinstance(p.get("partition_index"), int):
                    raise BadRequest("each partition must be a map with an integer 'partition_index'")
                tp = (t["name"], p["partition_index"])
                problem = self._offset_problem(tp, p)
                if problem:
                    results[tp] = problem
                else:
                    wanted[tp] = Committed(p["committed_offset"], p.get("committed_leader_epoch", -1) or -1,
                                           p.get("committed_metadata") or "", now_ms)
        g = self.groups.get(gid)
        try:
            if g is None and member_id:
                raise GroupError(f"member {member_id!r} is not in group '{gid}' (the group does not exist): "
                                 f"commit refused", ErrorCode.UNKNOWN_MEMBER_ID)
            problems = g.check_commit(member_id, epoch, list(wanted)) if g is not None else {}
        except GroupError as exc:  # the whole commit is refused: said per partition, as Kafka does
            problems = {tp: exc for tp in wanted}
        for tp, err in problems.items():
            results[tp] = (int(err.code), err.message)
            del wanted[tp]
        if not wanted:
            self._commit_reply(msg, results)
            return
        self._check_high_watermarks(wanted, results, lambda: self._write_commit(msg, gid, wanted, results))

    def _offset_problem(self, tp: tuple[str, int], p: dict) -> tuple[int, str] | None:
        topic, partition = tp
        n = self.topics.get(topic)
        if n is None or not 0 <= partition < n:
            return int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), f"{topic}-{partition} does not exist"
        offset = p.get("committed_offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            return int(ErrorCode.INVALID_REQUEST), f"{topic}-{partition}: committed_offset must be an integer >= 0, " \
                                                   f"got {offset!r}"
        meta = p.get("committed_metadata")
        if meta is not None and not isinstance(meta, str):
            return int(ErrorCode.INVALID_REQUEST), f"{topic}-{partition}: committed_metadata must be a string"
        if meta is not None and len(meta.encode()) > self.metadata_max:
            return int(ErrorCode.OFFSET_METADATA_TOO_LARGE), f"{topic}-{partition}: committed_metadata is " \
                f"{len(meta.encode())} bytes; offset.metadata.max.bytes is {self.metadata_max}"
        le = p.get("committed_leader_epoch", -1)
        if le is not None and (not isinstance(le, int) or isinstance(le, bool)):
            return int(ErrorCode.INVALID_REQUEST), f"{topic}-{partition}: committed_leader_epoch must be an integer"
        return None

    def _check_high_watermarks(self, wanted: dict, results: dict, then) -> None:
        """Refuse offsets beyond a partition's high watermark (what no consumer can have read)."""
        by_topic: dict[str, list] = {}
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append({"index": partition, "timestamp": LATEST_TIMESTAMP})
        body = {"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

        def checked(reply: Message) -> None:
            if reply.is_error:
                for tp in list(wanted):
                    results[tp] = (int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                                   f"cannot check the offset against the log: {reply.error_message}")
                    del wanted[tp]
            else:
                for t in reply.fields["body"]["topics"]:
                    for p in t["partitions"]:
                        tp = (t["name"], p["index"])
                        if tp not in wanted:
                            continue
                        if p.get("error_code"):
                            results[tp] = (p["error_code"], p.get("error_message") or "")
                            del wanted[tp]
                        elif wanted[tp].offset > p["offset"]:
                            results[tp] = (int(ErrorCode.OFFSET_OUT_OF_RANGE),
                                           f"{tp[0]}-{tp[1]}: offset {wanted[tp].offset} is beyond the high "
                                           f"watermark {p['offset']}: no consumer can have read that far")
                            del wanted[tp]
            then()

        self.request(FETCH_ACTOR, "list_offsets", {"body": body}, callback=checked, timeout=WRITE_TIMEOUT)

    def _write_commit(self, msg: Message, gid: str, wanted: dict, results: dict) -> None:
        if not wanted:
            self._commit_reply(msg, results)
            return
        recs = [offset_record(gid, t, p, c) for (t, p), c in wanted.items()]

        def done(error: str | None) -> None:
            for tp, c in wanted.items():
                if error:
                    results[tp] = (int(ErrorCode.COORDINATOR_NOT_AVAILABLE), f"the commit was not stored: {error}")
                else:
                    self.offsets.setdefault(gid, {})[tp] = c
                    results[tp] = (0, "")
            if not error:
                self.commits += 1
                if gid not in self.groups or not self.groups[gid].members:
                    self.empty_since.setdefault(gid, _wall_ms())
            self._commit_reply(msg, results)

        self._append(gid, recs, done)

    def _commit_reply(self, msg: Message, results: dict) -> None:
        by_topic: dict[str, list] = {}
        for (t, p), (code, message) in sorted(results.items()):
            entry = {"partition_index": p, "error_code": code}
            if code:
                entry["error_message"] = message
            by_topic.setdefault(t, []).append(entry)
        self.reply(msg, {"body": {"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}})

    def offset_fetch(self, msg: Message, body: dict) -> None:
        gid = _group_id(body)
        topics = _get(body, "topics", list, None)
        committed = self.offsets.get(gid, {})
        if topics is None:
            wanted = sorted(committed)
        else:
            wanted = []
            for t in topics:
                if not isinstance(t, dict) or not isinstance(t.get("name"), str) or \
                        not isinstance(t.get("partition_indexes"), list):
                    raise BadRequest("each topic must be a map with 'name' and a list of 'partition_indexes'")
                wanted += [(t["name"], p) for p in t["partition_indexes"]]
        by_topic: dict[str, list] = {}
        for tp in wanted:
            c = committed.get(tp)
            by_topic.setdefault(tp[0], []).append({
                "partition_index": tp[1], "committed_offset": c.offset if c else -1,
                "committed_leader_epoch": c.leader_epoch if c else -1, "metadata": c.metadata if c else "",
                "error_code": 0})
        self.reply(msg, {"body": {"error_code": 0, "group_id": gid,
                                  "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}})

    def _expire_offsets(self, now_ms: int | None = None) -> None:
        """``offsets.retention.minutes``: offsets of a group without members expire."""
        now_ms = _wall_ms() if now_ms is None else now_ms
        for gid, committed in list(self.offsets.items()):
            g = self.groups.get(gid)
            if g is not None and g.members:
                continue
            since = self.empty_since.get(gid, now_ms)
            expired = expired_offsets(committed, since, self.retention_ms, now_ms)
            if not expired:
                continue
            log.info("group %s: %d committed offsets expired (offsets.retention.minutes)", gid, len(expired))
            for tp in expired:
                del committed[tp]
            recs = [offset_record(gid, t, p, None) for t, p in expired]
            if not committed:
                del self.offsets[gid]
                self.groups.pop(gid, None)
                self.empty_since.pop(gid, None)
                recs.append(group_record(gid, None))
            self._append(gid, recs, lambda error: error and log.error("expiry not stored: %s", error))

    # ---- administration --------------------------------------------------------------------------
    def find_coordinator(self, msg: Message, body: dict) -> None:
        def answer(address) -> None:
            host, port = address
            self.reply(msg, {"body": {"error_code": 0, "node_id": self.config["broker.id"], "host": host,
                                      "port": port, "key": body.get("key")}})
        self._with_address(answer)

    def _with_address(self, then) -> None:
        if self.address is not None:
            then(self.address)
            return
        from network.protocol import parse_listener
        cfg = self.config
        host, port = parse_listener(cfg.get("advertised.listeners") or cfg["listeners"])
        if port != 0 or not self.supervisor:
            self.address = (host, port)
            then(self.address)
            return

        def learned(status: Message) -> None:
            addr = (status.fields or {}).get("supervisor", {}).get("address") if not status.is_error else None
            if addr:
                h, _, p = str(addr).rpartition(":")
                self.address = (host if cfg.get("advertised.listeners") else h, int(p))
                then(self.address)
            else:
                then((host, port))
        self.request(self.supervisor, "status", callback=learned, timeout=5.0)

    def _known_groups(self) -> list[str]:
        return sorted(set(self.groups) | set(self.offsets))

    def _state_of(self, gid: str) -> str:
        g = self.groups.get(gid)
        return g.state if g is not None else EMPTY

    def list_groups(self, msg: Message, body: dict) -> None:
        states = _get(body, "states_filter", list, [])
        out = [{"group_id": gid, "protocol_type": "consumer", "group_type": "consumer",
                "group_state": self._state_of(gid)} for gid in self._known_groups()]
        if states:
            out = [g for g in out if g["group_state"] in states]
        self.reply(msg, {"body": {"error_code": 0, "groups": out}})

    def describe_groups(self, msg: Message, body: dict) -> None:
        ids = body.get("group_ids", body.get("groups"))
        if not isinstance(ids, list):
            raise BadRequest("missing field 'group_ids' (a list of group ids)")
        out = []
        for gid in ids:
            if not isinstance(gid, str) or (gid not in self.groups and gid not in self.offsets):
                out.append({"group_id": gid, "error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                            "error_message": f"group {gid!r} does not exist"})
                continue
            g = self.groups.get(gid)
            d = g.describe() if g is not None else {"group_id": gid, "group_state": EMPTY, "group_epoch": 0,
                                                     "assignment_epoch": 0, "assignor_name": "", "members": []}
            out.append({"error_code": 0, **d})
        self.reply(msg, {"body": {"groups": out}})

    def delete_groups(self, msg: Message, body: dict) -> None:
        names = body.get("groups_names", body.get("group_ids"))
        if not isinstance(names, list):
            raise BadRequest("missing field 'groups_names' (a list of group ids)")
        results, pending = [], {"n": 1}

        def finish() -> None:
            pending["n"] -= 1
            if pending["n"] == 0:
                self.reply(msg, {"body": {"results": results}})

        for gid in names:
            g = self.groups.get(gid) if isinstance(gid, str) else None
            if not isinstance(gid, str) or (g is None and gid not in self.offsets):
                results.append({"group_id": gid, "error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                                "error_message": f"group {gid!r} does not exist"})
                continue
            if g is not None and g.members:
                results.append({"group_id": gid, "error_code": int(ErrorCode.NON_EMPTY_GROUP),
                                "error_message": f"group '{gid}' has {len(g.members)} members; stop them first"})
                continue
            recs = [offset_record(gid, t, p, None) for t, p in self.offsets.pop(gid, {})]
            recs.append(group_record(gid, None))
            if g is not None:
                g.deleted = True
            self.groups.pop(gid, None)
            self.empty_since.pop(gid, None)
            entry = {"group_id": gid, "error_code": 0}
            results.append(entry)
            pending["n"] += 1

            def stored(error, entry=entry) -> None:
                if error:
                    entry.update(error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                                 error_message=f"deleted here, but the tombstones were not stored: {error}")
                finish()
            self._append(gid, recs, stored)
        finish()

    def leave_group(self, msg: Message, body: dict) -> None:
        """Remove members by id (a tool's forced removal; members leave by heartbeat)."""
        gid = _group_id(body)
        g = self.groups.get(gid)
        if g is None:
            raise OdradekError(f"group '{gid}' does not exist", ErrorCode.GROUP_ID_NOT_FOUND)
        out = []
        for m in _get(body, "members", list):
            member_id = m.get("member_id") if isinstance(m, dict) else None
            try:
                g.remove_member(member_id, self.topics)
                self._answer_held((gid, member_id))
                out.append({"member_id": member_id, "error_code": 0})
            except GroupError as exc:
                out.append({"member_id": member_id, "error_code": int(exc.code), "error_message": exc.message})
        self._changed(g)
        self._after_write(g, lambda: self.reply(msg, {"body": {"error_code": 0, "members": out}}))

    # ---- writing records ---------------------------------------------------------------------------
    def _append(self, gid: str, recs: list, done) -> None:
        """Append ``[(key, value)]`` to the group's partition; ``done(error or None)``."""
        partition = partition_for(gid, self.partitions)
        host = f"log-{placement(OFFSETS_TOPIC, partition, self.log_hosts)}"
        batch = encode_batch(recs)

        def answered(reply: Message) -> None:
            if reply.is_error:
                done(reply.error_message or "no answer from the log actor")
                return
            try:
                p = reply.fields["body"]["topics"][0]["partitions"][0]
            except (KeyError, IndexError, TypeError):
                done("malformed answer from the log actor")
                return
            done(p.get("error_message") or ErrorCode.of(p["error_code"]).name if p.get("error_code") else None)

        self.request(host, "produce", {"acks": 1, "parts": [[OFFSETS_TOPIC, partition, 0]]}, [batch],
                     callback=answered, timeout=WRITE_TIMEOUT)


def _wall_ms() -> int:
    return int(time.time() * 1000)
