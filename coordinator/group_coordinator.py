"""The group coordinator actor: consumer groups and their committed offsets.

Process: ``group_coordinator`` (one per broker), started after the fetch actor and before
the request handlers.
Owns: the ``ConsumerGroup``s (``coordinator.group``, the pure state machine) and the cache
of committed offsets of the groups this broker coordinates: as in Kafka, the coordinator of
group G is the leader of ``__consumer_offsets`` partition ``partition_for(G)``. Their
durable form is that compacted internal topic (records: ``coordinator.offsets``), written
through the log actor hosting each partition like any produce; the coordinator is the only
writer of the partitions it leads.

Ownership follows the metadata snapshot (docs/REPLICATION.md): fetched from the controller
at start (``get_metadata``), pushed by it on every change (``metadata``), polled every
``METADATA_REFRESH``. This broker leads partition p iff ``state[p].leader`` is its
``broker_id``; a snapshot without ``state`` (single-broker mode) makes it the leader of
every partition. Gaining a partition loads it; losing one unloads it (its groups and
offsets leave memory, its held heartbeats are answered NOT_COORDINATOR).

Loading replays a partition from its files read-only (``log.reader.LogReader``, up to the
log end the hosting log actor reports with ``get_bounds``: on a new leader everything it
has becomes committed). At start the partitions led then are loaded before the actor
reports ready, so no request sees a half-loaded coordinator. A partition gained later is
loaded asynchronously: ``get_bounds`` is a request with a callback, the replay runs in
slices between other messages, and requests for its groups are answered
COORDINATOR_LOAD_IN_PROGRESS until it is done. Reading the files directly, not through the
fetch actor, keeps loading independent of the fetch actor. Requests for a group whose
partition another broker leads: NOT_COORDINATOR, naming the partition and its leader.

The topic is created through the controller on the first heartbeat or commit (as Kafka
does), so a broker that never serves a group shows no internal topic; in cluster mode
(``zookeeper.connect`` set) a FIND_COORDINATOR creates it too, as clients only ever reach a
coordinator through one. Its replication factor is ``offsets.topic.replication.factor``
(the controller caps it at the live brokers). If the controller cannot (NOT_CONTROLLER in
cluster mode, or any error) the waiting requests get COORDINATOR_NOT_AVAILABLE and the next
request tries again.

Accepts:
  group_request {api, body, client, peer, metadata_version}  forwarded by a request handler;
        answered straight to the client's processor (``_reply {body}`` or ``_error``):
        CONSUMER_GROUP_HEARTBEAT, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR (key_type 0,
        and 1 for transactional ids: this broker's transaction coordinator), LIST_GROUPS,
        DESCRIBE_GROUPS, CONSUMER_GROUP_DESCRIBE, DELETE_GROUPS, LEAVE_GROUP (administrative
        removal; a classic member's leave), and the classic protocol: JOIN_GROUP, SYNC_GROUP,
        HEARTBEAT (``coordinator.classic_group``; a JoinGroup or SyncGroup that must wait is
        held in ``held_classic`` and answered when the group moves on, SyncGroup answers
        after the group's record is stored)
  metadata {snapshot}  pushed by the controller; replies ``{version}`` (the version it holds)
  txn_offsets_end {producer_id, commit, offsets}  from the transaction coordinator: the
        offsets a committed transaction carried (TXN_OFFSET_COMMIT) are stored; replies
        ``{error_code, message}`` once they are
Sends: ``produce`` to log actors (offsets and group records, acks=-1 with ``timeout_ms`` =
``COMMIT_TIMEOUT_MS``), ``get_bounds`` to log actors (loading), ``list_offsets`` to the
fetch actor (a commit beyond the high watermark is refused), ``get_metadata`` and
``create_topics`` to the controller, ``status`` to the supervisor (its own advertised
address when the snapshot has no port for it yet, for FindCoordinator).

Durability before answers: a commit is answered once its record is replicated to the ISR
(the log actor answers an acks=-1 produce when the high watermark passes it: at once on one
broker); a heartbeat that changed its group is answered once the group's record is, so a
new coordinator never hands out an epoch an older one had already given to someone else.
A failed write fails the request with a retriable code, as Kafka maps them: leadership lost
(NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, KAFKA_STORAGE_ERROR) -> NOT_COORDINATOR;
NOT_ENOUGH_REPLICAS -> COORDINATOR_NOT_AVAILABLE; REQUEST_TIMED_OUT -> REQUEST_TIMED_OUT for
a commit, COORDINATOR_NOT_AVAILABLE for a heartbeat (``commit_error``, ``group_write_error``).

Classic groups (``self.classic``) and KIP-848 groups (``self.groups``) share one name space:
a group id is one group of one kind. A classic JoinGroup to a KIP-848 group with members is
INCONSISTENT_GROUP_PROTOCOL, a ConsumerGroupHeartbeat to a classic group with members
GROUP_ID_NOT_FOUND (Kafka's answers without online migration); an empty group of one kind
becomes the other. A classic group's record (``{"classic": ClassicGroup.to_record()}`` under
the same ``["g", group]`` key) is written when a generation completes (Stable, with the
assignments) and when the group empties, as Kafka writes its GroupMetadata; a new
coordinator resumes it Stable at that generation, members keep heartbeating.

Heartbeats long-poll: a heartbeat with ``wait_ms`` that brings no news for its member is
held up to ``wait_ms`` (a purgatory, as the fetch actor holds fetches) and answered as soon
as the group changes for that member, so a rebalance takes round trips, not heartbeat
intervals. A newer heartbeat of the same member answers the held one at once.
"""
from __future__ import annotations

import itertools
import logging
import re
import time

from odradek.actors.message import Message
from odradek.actors.names import CONTROLLER, FETCH_ACTOR, LogBounds, PartitionBounds, log_host, partition_dir
from odradek.actors.runtime import Actor
from odradek.coordinator.classic_group import ClassicConfig, ClassicGroup, JoinRequest
from odradek.coordinator.group import (EMPTY, ConsumerGroup, GroupConfig, GroupError, HeartbeatRequest, tps_of)
from odradek.coordinator.offsets import (OFFSETS_TOPIC, Committed, OffsetsView, group_record, led_partitions,
                                 offset_record, offsets_leaders, partition_for)
from odradek.coordinator.offsets import expired as expired_offsets
from odradek.log.reader import LATEST_TIMESTAMP, LogReader
from odradek.log.records import decode_batch, encode_batch, iter_batches
from odradek.network.kafka.groups import decode_assignment, decode_subscription, kafka_topic_id
from odradek.network.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.groups")

TICK_INTERVAL = 0.05  # seconds between session/rebalance deadline checks
METADATA_REFRESH = 2.0  # seconds between topic-metadata refreshes (also on a newer version hint)
COMMIT_TIMEOUT_MS = 5000  # Kafka's offsets.commit.timeout.ms: an acks=-1 write waits this long for the ISR
WRITE_TIMEOUT = 30.0  # seconds before an unanswered produce counts as failed (the log actor's own limit is above)
LOAD_RETRY = 0.05  # seconds between get_bounds attempts while the log actor does not lead the partition yet
LOAD_SLICE_BYTES = 4 << 20  # bytes replayed per turn of the loop while loading asynchronously
READ_BYTES = 1 << 20
CREATED_WAIT = 10.0  # seconds requests queued for the topic's creation wait for its partitions to load
MAX_WAIT_MS = 30_000  # a heartbeat is held at most this long
# need __consumer_offsets to exist
WRITERS = (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.OFFSET_COMMIT, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP)
BY_GROUP = (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.LEAVE_GROUP,
            ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT)
CLASSIC_MARGIN_MS = 2000  # a held JoinGroup/SyncGroup is answered this long before the processor's request.timeout.ms
GROUP_ID = re.compile(r"[\x21-\x7e]{1,255}")  # always fullmatch: "$" matches before a final newline

# Write errors meaning "this broker no longer leads the partition".
LEADERSHIP_LOST = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                             ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.NOT_COORDINATOR})
NO_QUORUM = frozenset({ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                       ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
TOO_LARGE = frozenset({ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE})


def commit_error(code: int) -> ErrorCode:
    """A failed write of committed offsets -> the commit's error (Kafka's storeOffsets)."""
    code = ErrorCode.of(code)
    if code in LEADERSHIP_LOST:
        return ErrorCode.NOT_COORDINATOR
    if code in NO_QUORUM:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code == ErrorCode.REQUEST_TIMED_OUT:
        return ErrorCode.REQUEST_TIMED_OUT
    if code in TOO_LARGE:
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return ErrorCode.COORDINATOR_NOT_AVAILABLE


def group_write_error(code: int) -> ErrorCode:
    """A failed write of a group record -> the heartbeat's error (KIP-848's coordinator:
    leadership lost is NOT_COORDINATOR, anything else COORDINATOR_NOT_AVAILABLE)."""
    return ErrorCode.NOT_COORDINATOR if ErrorCode.of(code) in LEADERSHIP_LOST else ErrorCode.COORDINATOR_NOT_AVAILABLE


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
    if not isinstance(gid, str) or not GROUP_ID.fullmatch(gid):
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


class Loading:
    """A ``__consumer_offsets`` partition being replayed into an ``OffsetsView``."""

    __slots__ = ("partition", "token", "epoch", "view", "reader", "bounds", "offset", "end", "records",
                 "attempts", "started")

    def __init__(self, partition: int, token: int, epoch: int):
        self.partition, self.token, self.epoch = partition, token, epoch
        self.view, self.reader, self.bounds = OffsetsView(), None, None
        self.offset = self.end = self.records = self.attempts = 0
        self.started = time.monotonic()


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
        self.classic_config = ClassicConfig(
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"],
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            max_size=config["group.max.size"],
            join_wait_cap_ms=max(1000, config["request.timeout.ms"] - CLASSIC_MARGIN_MS),
            max_metadata_bytes=config["group.classic.max.metadata.bytes"])
        self.classic: dict[str, ClassicGroup] = {}  # classic groups; self.groups: KIP-848 ones (one id, one kind)
        self.held_classic: dict[tuple[str, str, str], Message] = {}  # (group, "join"|"sync", member) -> request
        self.retention_ms = config["offsets.retention.minutes"] * 60_000
        self.metadata_max = config["offset.metadata.max.bytes"]
        self.cluster_mode = bool(config.get("zookeeper.connect"))
        self.groups: dict[str, ConsumerGroup] = {}
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self.empty_since: dict[str, int] = {}
        self.held: dict[tuple[str, str], Held] = {}
        self.topics: dict[str, int] = {}
        self.topic_ids: dict[str, str] = {}  # name -> the hex of its Kafka topic id (KIP-848 requests name topics by id)
        self.topic_names: dict[str, str] = {}
        self.metadata_version = -1
        self.snapshot: dict = {}
        self.broker_id = int(self.args.get("broker_id", config["broker.id"]))
        self.partitions = 0  # of __consumer_offsets; 0: it does not exist (yet)
        self.offsets_topic_id = None
        self.leaders: list[tuple[int, int]] = []  # (leader, leader_epoch) per partition
        self.owned: dict[int, int] = {}  # loaded partitions this broker leads -> load token
        self.loading: dict[int, Loading] = {}
        self._tokens = itertools.count(1)
        self._on_loaded: list = []  # callbacks waiting for every load to finish
        self.address: tuple[str, int] | None = None
        self.commits = self.heartbeats = 0
        self._queued: list[Message] = []  # requests waiting for the topic to be created
        self._creating = False
        self._adopt(self.call(CONTROLLER, "get_metadata", timeout=60.0).fields, starting=True)
        self.call_every(TICK_INTERVAL, self._tick)
        self.call_every(METADATA_REFRESH, self._refresh_metadata)
        self.call_every(config["offsets.retention.check.interval.ms"] / 1000, self._expire_offsets)

    def _create_topic(self, replication_factor: int | None = None) -> None:
        """Create ``__consumer_offsets`` through the controller, on the first request that
        needs it (as Kafka does): a broker that never serves a group lists no internal topic.
        Requests arriving meanwhile wait in ``_queued`` and run, in order, once it exists and
        its partitions led here are loaded (``_creating`` until then)."""
        n = self.config["offsets.topic.num.partitions"]
        rf = replication_factor or self.config["offsets.topic.replication.factor"]
        self._creating = True

        def created(reply: Message) -> None:
            result = {} if reply.is_error else reply.fields["body"]["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            why = reply.error_message if reply.is_error else result.get("error_message")
            fallback = max(1, len(self.snapshot.get("brokers") or {}))
            if code == ErrorCode.INVALID_REPLICATION_FACTOR and rf > fallback:
                # A controller that refuses instead of capping: ask for what the cluster has.
                log.info("%s: replication factor %d refused (%s); asking for %d", OFFSETS_TOPIC, rf, why, fallback)
                self._create_topic(fallback)
                return
            if code not in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                if code == ErrorCode.NOT_CONTROLLER:
                    why = f"the active controller is another broker and could not be reached ({why})"
                log.log(logging.INFO if code == ErrorCode.NOT_CONTROLLER else logging.ERROR,
                        "cannot create %s: %s", OFFSETS_TOPIC, why)
                self._run_queued(f"cannot create {OFFSETS_TOPIC} yet: {why}; retry")
                return
            log.info("created %s (%d partitions, replication factor %d)", OFFSETS_TOPIC, n, rf)
            self._refresh_metadata(then=lambda: self._when_loaded(self._run_queued, CREATED_WAIT))

        self.request(CONTROLLER, "create_topics", {"body": {"topics": [{
            "name": OFFSETS_TOPIC, "num_partitions": n, "replication_factor": rf,
            "configs": {"cleanup.policy": "compact", "segment.bytes": self.config["offsets.topic.segment.bytes"]}}]}},
            callback=created, timeout=60.0)

    def _run_queued(self, why: str = f"{OFFSETS_TOPIC} was created but is not in this broker's metadata "
                                       f"yet; retry") -> None:
        """The creation is over: run what waited for it; writers fail (``why``) if the topic
        is still unknown here."""
        self._creating = False
        queued, self._queued = self._queued, []
        for msg in queued:
            if not self.partitions and msg.get("api") in WRITERS:
                self.reply_error(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE, why)
            else:
                self._dispatch_group(msg)

    def _when_loaded(self, then, timeout: float) -> None:
        """Run ``then`` once no partition is loading, or after ``timeout`` seconds."""
        if not self.loading:
            then()
            return
        entry = {"fn": then}

        def fire() -> None:
            fn, entry["fn"] = entry["fn"], None
            if fn is not None:
                fn()
        entry["timer"] = self.call_later(timeout, fire)
        self._on_loaded.append((entry, fire))

    # ---- loading and unloading partitions ------------------------------------------------
    def _host(self, partition: int) -> str:
        return log_host(OFFSETS_TOPIC, partition, self.log_hosts)

    @staticmethod
    def _bounds_of(fields: dict, partition: int) -> LogBounds | None:
        """The partition's bounds in a ``get_bounds`` answer; None if the log actor does not
        host it, or hosts it but (still) as a follower."""
        for part in fields.get("parts") or ():
            part = PartitionBounds(*part)
            if part.topic == OFFSETS_TOPIC and part.partition == partition:
                return part.bounds if part.leader else None  # a follower: not the leader yet
        return None

    def _load_at_start(self, led: dict[int, int]) -> None:
        """Load the partitions led at start before reporting ready (blocking calls)."""
        by_host: dict[str, list[int]] = {}
        for p in sorted(led):
            by_host.setdefault(self._host(p), []).append(p)
        for host, parts in by_host.items():
            try:
                fields = self.call(host, "get_bounds", timeout=60.0).fields
            except OdradekError as exc:
                log.warning("%s: no bounds from %s at start (%s); loading in the background", OFFSETS_TOPIC,
                            host, exc.message)
                fields = {}
            for p in parts:
                ld = self.loading[p] = Loading(p, next(self._tokens), led[p])
                bounds = self._bounds_of(fields, p)
                if bounds is None:
                    self._ask_bounds(ld)
                    continue
                self._begin_replay(ld, bounds)
                while not self._replay_some(ld, None):
                    pass
                self._install(ld)

    def _start_load(self, partition: int, epoch: int) -> None:
        ld = self.loading[partition] = Loading(partition, next(self._tokens), epoch)
        log.info("loading %s-%d (leader epoch %d)", OFFSETS_TOPIC, partition, epoch)
        self._ask_bounds(ld)

    def _ask_bounds(self, ld: Loading) -> None:
        def answered(reply: Message) -> None:
            if self.loading.get(ld.partition) is not ld:
                return  # unloaded meanwhile
            bounds = None if reply.is_error else self._bounds_of(reply.fields, ld.partition)
            if bounds is None:
                ld.attempts += 1
                if ld.attempts % 200 == 20:  # quiet for the first second (a topic being opened)
                    why = reply.error_message if reply.is_error else "not in its bounds, or not as leader"
                    log.warning("loading %s-%d: %s does not lead it yet (%s); retrying", OFFSETS_TOPIC,
                                ld.partition, self._host(ld.partition), why)
                self.call_later(LOAD_RETRY, lambda: self.loading.get(ld.partition) is ld and self._ask_bounds(ld))
                return
            self._begin_replay(ld, bounds)
            self._replay_slice(ld)

        self.request(self._host(ld.partition), "get_bounds", callback=answered, timeout=60.0)

    def _begin_replay(self, ld: Loading, bounds: LogBounds) -> None:
        ld.bounds, ld.offset, ld.end = bounds, bounds.log_start_offset, bounds.log_end_offset
        if ld.offset < ld.end:
            ld.reader = LogReader(partition_dir(self.data_dir, OFFSETS_TOPIC, ld.partition), bounds)

    def _replay_some(self, ld: Loading, budget: int | None) -> bool:
        """Replay up to ``budget`` bytes (None: all); True once the partition is replayed.
        Up to the log end: on a new leader everything it has becomes committed."""
        read, retries = 0, 0
        while ld.offset < ld.end and (budget is None or read < budget):
            result = ld.reader.read(ld.offset, READ_BYTES, upper_bound=ld.end)
            if not result.slices:
                return True
            try:
                data = result.read_bytes()
            except OdradekError:  # compacted under us: list the files again and retry
                retries += 1
                if retries > 10:
                    raise
                ld.reader.update(ld.bounds._replace(generation=-1))
                continue
            read += len(data)
            for pos, h in iter_batches(data):
                for r in decode_batch(memoryview(data)[pos:pos + h.size]):
                    if r.offset >= ld.offset:
                        ld.view.apply(r.key, r.value)
                        ld.records += 1
                ld.offset = max(ld.offset, h.next_offset)
        return ld.offset >= ld.end

    def _replay_slice(self, ld: Loading) -> None:
        """One slice of an asynchronous load; the next one runs after pending messages."""
        if self.loading.get(ld.partition) is not ld:
            return
        try:
            done = self._replay_some(ld, LOAD_SLICE_BYTES)
        except (OdradekError, OSError) as exc:
            log.error("loading %s-%d failed (%s); starting over", OFFSETS_TOPIC, ld.partition, exc)
            self._close_reader(ld)
            ld.view, ld.records = OffsetsView(), 0
            self.call_later(1.0, lambda: self.loading.get(ld.partition) is ld and self._ask_bounds(ld))
            return
        if done:
            self._install(ld)
        else:
            self.call_later(0, lambda: self._replay_slice(ld))

    @staticmethod
    def _close_reader(ld: Loading) -> None:
        if ld.reader is not None:
            ld.reader.close()
            ld.reader = None

    def _install(self, ld: Loading) -> None:
        """A replayed partition: its groups and offsets join memory; it is served from now."""
        self._close_reader(ld)
        del self.loading[ld.partition]
        now, wall, view = self._now(), _wall_ms(), ld.view
        self.offsets.update(view.offsets)
        for gid, rec in view.groups.items():
            if isinstance(rec["group"], dict) and "classic" in rec["group"]:
                self.classic[gid] = ClassicGroup.from_record(gid, rec["group"]["classic"], now, self.classic_config)
            else:
                self.groups[gid] = ConsumerGroup.from_record(gid, rec["group"], now, self.group_config)
            if rec.get("empty_since_ms") is not None:
                self.empty_since[gid] = rec["empty_since_ms"]
        for gid in view.offsets:
            self.empty_since.setdefault(gid, wall)
        self.owned[ld.partition] = ld.token
        log.info("loaded %s-%d: %d groups and %d committed offsets from %d records in %.3f s", OFFSETS_TOPIC,
                 ld.partition, len(view.groups), sum(len(o) for o in view.offsets.values()), ld.records,
                 time.monotonic() - ld.started)
        self._loads_settled()

    def _loads_settled(self) -> None:
        if not self.loading:
            waiting, self._on_loaded = self._on_loaded, []
            for entry, fire in waiting:
                entry["timer"].cancel()
                fire()

    def _unload(self, partition: int, why: str) -> None:
        """This broker stopped leading ``partition``: forget its groups and offsets."""
        ld = self.loading.pop(partition, None)
        if ld is not None:
            self._close_reader(ld)
        was_owned = self.owned.pop(partition, None) is not None
        n = self.partitions
        mine = lambda gid: partition_for(gid, n) == partition  # noqa: E731
        for key in [k for k in self.held if mine(k[0])]:
            held = self.held.pop(key)
            held.timer.cancel()
            self.reply_error(held.msg, ErrorCode.NOT_COORDINATOR,
                             f"group '{key[0]}' moved: this broker no longer leads {OFFSETS_TOPIC}-{partition} ({why})")
        for key in [k for k in self.held_classic if mine(k[0])]:
            self.reply_error(self.held_classic.pop(key), ErrorCode.NOT_COORDINATOR,
                             f"group '{key[0]}' moved: this broker no longer leads {OFFSETS_TOPIC}-{partition} ({why})")
        gids = [gid for gid in set(self.groups) | set(self.classic) | set(self.offsets) | set(self.empty_since)
                if mine(gid)]
        for gid in gids:
            self.groups.pop(gid, None)
            self.classic.pop(gid, None)
            self.offsets.pop(gid, None)
            self.empty_since.pop(gid, None)
        if was_owned or ld is not None:
            log.info("unloaded %s-%d (%d groups): %s", OFFSETS_TOPIC, partition, len(gids), why)
        if ld is not None:
            self._loads_settled()

    def on_stop(self) -> None:
        for held in list(self.held.values()):
            held.timer.cancel()
        self.held.clear()
        self.held_classic.clear()
        for ld in self.loading.values():
            self._close_reader(ld)

    def stats(self) -> dict:
        return {"groups": len(self.groups) + len(self.classic),
                "members": sum(len(g.members) for g in (*self.groups.values(), *self.classic.values())),
                "commits": self.commits, "heartbeats": self.heartbeats, "held": len(self.held),
                "partitions_led": len(self.owned), "partitions_loading": len(self.loading),
                "metadata_version": self.metadata_version}

    def metric_gauges(self) -> list:
        """Each group's state and size, and every committed offset (the metrics actor
        subtracts them from the high watermarks for the lag); read at scrape time."""
        out = [["group_members", [gid, g.state], len(g.members)]
               for gid, g in (*self.groups.items(), *self.classic.items())]
        for gid, offsets in self.offsets.items():
            out += [["committed_offset", [gid, topic, partition], c.offset]
                    for (topic, partition), c in offsets.items()]
        return out

    # ---- metadata -------------------------------------------------------------------------
    def on_metadata(self, msg: Message) -> None:
        """The controller's push: adopt the snapshot (a newer version than ours) at once."""
        self._adopt_and_react(msg.fields or {})
        self.reply(msg, {"version": self.metadata_version})

    def _adopt(self, snapshot: dict, starting: bool = False) -> bool:
        """Take a snapshot unless it is older than ours; True if topics changed."""
        version = snapshot.get("version", -1)
        if not isinstance(version, int) or version < self.metadata_version:
            return False
        self.metadata_version = version
        self.snapshot = snapshot
        if isinstance(snapshot.get("broker_id"), int):
            self.broker_id = snapshot["broker_id"]
        before = self.topics
        self.topics = {n: t["partitions"] for n, t in (snapshot.get("topics") or {}).items()}
        self.topic_ids = {n: kafka_topic_id(t.get("id")) for n, t in (snapshot.get("topics") or {}).items()}
        self.topic_names = {i: n for n, i in self.topic_ids.items()}
        self._follow_leadership(snapshot, starting)
        return self.topics != before

    def _follow_leadership(self, snapshot: dict, starting: bool) -> None:
        meta = (snapshot.get("topics") or {}).get(OFFSETS_TOPIC) or {}
        n, topic_id = meta.get("partitions") or 0, meta.get("id")
        if self.partitions and (n != self.partitions or topic_id != self.offsets_topic_id):
            for p in sorted(set(self.owned) | set(self.loading)):
                self._unload(p, f"{OFFSETS_TOPIC} was deleted or recreated")
        self.partitions, self.offsets_topic_id = n, topic_id
        self.leaders = offsets_leaders(snapshot, self.broker_id)
        led = led_partitions(snapshot, self.broker_id)
        for p in sorted(set(self.owned) | set(self.loading)):
            if p not in led:
                self._unload(p, f"broker {self.leaders[p][0]} leads it now (leader epoch {self.leaders[p][1]})")
        for p in self.owned:
            led.pop(p, None)  # still led: a newer leader epoch alone (an ISR change) needs no reload
        for p in self.loading:
            led.pop(p, None)
        if starting:
            self._load_at_start(led)
        else:
            for p, epoch in sorted(led.items()):
                self._start_load(p, epoch)

    def _adopt_and_react(self, snapshot: dict) -> None:
        if self._adopt(snapshot):
            for g in list(self.groups.values()):
                if g.members and g.maybe_rebalance(self.topics):
                    self._changed(g)

    def _refresh_metadata(self, then=None) -> None:
        def adopt(reply: Message) -> None:
            if not reply.is_error:
                self._adopt_and_react(reply.fields)
            if then is not None:
                then()
        self.request(CONTROLLER, "get_metadata", callback=adopt, timeout=10.0)

    def _coordinator_error(self, gid: str) -> OdradekError | None:
        """Why this broker cannot serve group ``gid`` now (None: it can)."""
        if not self.partitions:
            return None  # no offsets topic yet: no group exists anywhere
        p = partition_for(gid, self.partitions)
        if p in self.owned:
            return None
        if p in self.loading:
            return OdradekError(f"group '{gid}': {OFFSETS_TOPIC}-{p} is being loaded on broker {self.broker_id}; "
                                f"retry", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        leader, epoch = self.leaders[p] if p < len(self.leaders) else (-1, -1)
        where = f"led by broker {leader} (leader epoch {epoch})" if leader >= 0 else "without a leader"
        return OdradekError(f"broker {self.broker_id} is not the coordinator of group '{gid}': its partition "
                            f"{OFFSETS_TOPIC}-{p} is {where}; find the coordinator again", ErrorCode.NOT_COORDINATOR)

    # ---- the entry point --------------------------------------------------------------------
    def on_group_request(self, msg: Message) -> None:
        version = msg.get("metadata_version")
        if isinstance(version, int) and version > self.metadata_version:
            self._refresh_metadata()
        if self._creating or (not self.partitions and msg.get("api") in WRITERS):
            self._queued.append(msg)  # in order, behind the creation of the topic
            if not self._creating:
                self._create_topic()
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
            ApiKey.JOIN_GROUP: self.join_group,
            ApiKey.SYNC_GROUP: self.sync_group,
            ApiKey.HEARTBEAT: self.classic_heartbeat,
        }.get(api)
        if method is None:
            raise BadRequest(f"the group coordinator does not serve API {api!r}")
        if api in BY_GROUP and not (api == ApiKey.OFFSET_FETCH and "groups" in body):
            error = self._coordinator_error(_group_id(body))
            if error is not None:
                raise error
        method(msg, body)

    def _now(self) -> float:
        return self.clock() * 1000

    # ---- heartbeats -------------------------------------------------------------------------
    def heartbeat(self, msg: Message, body: dict) -> None:
        self.heartbeats += 1
        gid = _group_id(body)
        owned_entries = _get(body, "topic_partitions", list, None)
        if owned_entries is not None and body.get("topic_ids"):  # Kafka's KIP-848: topics by id
            owned_entries = self._named(owned_entries)
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
        classic = self.classic.get(gid)
        if classic is not None:
            if classic.members or classic.pending:
                raise OdradekError(f"group '{gid}' is a classic group with {len(classic.members)} members: a "
                                   f"consumer-protocol (KIP-848) member cannot join it; use another group id, or "
                                   f"the classic protocol", ErrorCode.GROUP_ID_NOT_FOUND)
            del self.classic[gid]  # an empty classic group becomes a consumer group, as Kafka converts it
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
        self._after_write(g, lambda: self.reply(msg, {"body": {"error_code": 0, **self._with_ids(resp)}}), msg)

    def _named(self, entries: list) -> list:
        """``[{"topic_id", "partitions"}]`` -> ``[{"topic", "partitions"}]``; ids of topics
        that no longer exist are dropped (the member owns nothing there)."""
        out = []
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("topic_id"), str):
                raise BadRequest("each entry of 'topic_partitions' must be a map with 'topic_id' and 'partitions'")
            name = self.topic_names.get(e["topic_id"])
            if name is not None:
                out.append({"topic": name, "partitions": e.get("partitions")})
        return out

    def _with_ids(self, resp: dict) -> dict:
        """The answer's assignment with each topic's id beside its name."""
        if resp.get("assignment") is None:
            return resp
        return {**resp, "assignment": self._ids(resp["assignment"])}

    def _ids(self, entries) -> list:
        return [{**e, "topic_id": self.topic_ids.get(e["topic"])} for e in entries or ()]

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
        self._after_write(g, lambda: self.reply(held.msg, {"body": {"error_code": 0, **self._with_ids(resp)}}),
                          held.msg)

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

    def _after_write(self, g: ConsumerGroup, then, msg: Message | None = None) -> None:
        """Append the group's record if it changed, then run ``then`` (answers wait for it).
        If the write fails, ``msg`` (the request waiting for it) gets the retriable error
        instead (the member retries with the epoch it had, which the group accepts), and the
        group stays marked changed so that its next operation writes the record again."""
        if not g.changed:
            then()
            return
        g.changed = False
        state = None if g.deleted else g.to_record()
        key, value = group_record(g.group_id, state, self.empty_since.get(g.group_id))

        def done(code: int, error: str) -> None:
            if not code:
                then()
                return
            log.warning("group %s: its record was not written: %s", g.group_id, error)
            if self.groups.get(g.group_id) is g:
                g.changed = True
            if msg is None:
                then()
            else:
                self.reply_error(msg, group_write_error(code), f"group '{g.group_id}': its new state was not "
                                                               f"stored ({error}); retry")

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
        for cg in list(self.classic.values()):
            deadline = cg.next_deadline()
            if deadline is None or deadline > now:
                continue
            for member_id, why in cg.expire(now):
                log.info("group %s: removed member %s: %s", cg.group_id, member_id, why)
            self._classic_changed(cg)
            self._classic_drop_if_unused(cg.group_id)  # only member ids handed out, never used: forgotten

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
        cg = self.classic.get(gid)
        try:
            if cg is not None:
                cg.check_commit(member_id, epoch, _get(body, "group_instance_id", str, None))
            elif g is None and member_id:
                raise GroupError(f"member {member_id!r} is not in group '{gid}' (the group does not exist): "
                                 f"commit refused", ErrorCode.UNKNOWN_MEMBER_ID)
            problems = g.check_commit(member_id, epoch, list(wanted)) if g is not None and cg is None else {}
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
        """Refuse offsets beyond a partition's high watermark (what no consumer can have read),
        for the partitions this broker leads (the local fetch actor knows only those)."""
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
                        if p.get("error_code") == ErrorCode.NOT_LEADER_OR_FOLLOWER or (
                                p.get("error_code") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                                and tp[1] < self.topics.get(tp[0], 0)):
                            continue  # led by another broker, or hosted elsewhere (cluster mode): not checkable here
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

        def done(code: int, error: str) -> None:
            for tp, c in wanted.items():
                if code:
                    results[tp] = (int(commit_error(code)), f"the commit was not stored: {error}")
                else:
                    self.offsets.setdefault(gid, {})[tp] = c
                    results[tp] = (0, "")
            if not code:
                self.commits += 1
                if not self._has_members(gid):
                    self.empty_since.setdefault(gid, _wall_ms())
            self._commit_reply(msg, results)

        self._append(gid, recs, done)

    # ---- a committed transaction's offsets ------------------------------------------------------
    def on_txn_offsets_end(self, msg: Message) -> None:
        """From the transaction coordinator: {producer_id, commit, offsets: {group: [[topic,
        partition, offset, leader_epoch, metadata]]}}, the offsets a committed transaction
        carried (TxnOffsetCommit). Stored (acks=all) like an OffsetCommit, then answered
        {error_code, message}; a failure is retried by the transaction coordinator."""
        offsets = msg.get("offsets") or {}
        if not msg.get("commit") or not offsets:
            self.reply(msg, {"error_code": 0, "message": ""})
            return
        if not self.partitions:
            if not self._creating:
                self._create_topic()
            self.reply(msg, {"error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                             "message": f"{OFFSETS_TOPIC} is being created"})
            return
        left = {"n": len(offsets), "code": 0, "why": ""}
        now_ms = _wall_ms()

        def one_done(code: int = 0, why: str = "") -> None:
            if code:
                left["code"], left["why"] = code, why
            left["n"] -= 1
            if left["n"] <= 0:
                self.reply(msg, {"error_code": left["code"], "message": left["why"]})

        for gid, entries in offsets.items():
            wanted = {(str(t), int(p)): Committed(int(o), int(e), str(m or ""), now_ms) for t, p, o, e, m in entries}

            def done(code: int, error: str, gid=gid, wanted=wanted) -> None:
                if not code:
                    self.offsets.setdefault(gid, {}).update(wanted)
                    self.commits += 1
                one_done(code, error)
            self._append(gid, [offset_record(gid, t, p, c) for (t, p), c in wanted.items()], done)

    def _commit_reply(self, msg: Message, results: dict) -> None:
        by_topic: dict[str, list] = {}
        for (t, p), (code, message) in sorted(results.items()):
            entry = {"partition_index": p, "error_code": code}
            if code:
                entry["error_message"] = message
            by_topic.setdefault(t, []).append(entry)
        self.reply(msg, {"body": {"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}})

    def offset_fetch(self, msg: Message, body: dict) -> None:
        """One group (``group_id``, ``topics``), or several (``groups``: OffsetFetch v8+)."""
        groups = _get(body, "groups", list, None)
        if groups is None:
            self.reply(msg, {"body": self._fetched(_group_id(body), _get(body, "topics", list, None))})
            return
        out = []
        for entry in groups:
            if not isinstance(entry, dict):
                raise BadRequest("each entry of 'groups' must be a map with 'group_id' and 'topics'")
            try:
                gid = _group_id(entry)
                error = self._coordinator_error(gid)
                if error is not None:
                    raise error
                out.append(self._fetched(gid, _get(entry, "topics", list, None)))
            except OdradekError as exc:
                out.append({"group_id": entry.get("group_id"), "error_code": int(exc.code),
                            "error_message": exc.message, "topics": []})
        self.reply(msg, {"body": {"groups": out}})

    def _fetched(self, gid: str, topics: list | None) -> dict:
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
        return {"error_code": 0, "group_id": gid, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

    def _expire_offsets(self, now_ms: int | None = None) -> None:
        """``offsets.retention.minutes``: offsets of a group without members expire."""
        now_ms = _wall_ms() if now_ms is None else now_ms
        for gid, committed in list(self.offsets.items()):
            if self._has_members(gid):
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
                self.classic.pop(gid, None)
                self.empty_since.pop(gid, None)
                recs.append(group_record(gid, None))
            self._append(gid, recs, lambda code, error: code and log.error("expiry not stored: %s", error))

    # ---- administration --------------------------------------------------------------------------
    def find_coordinator(self, msg: Message, body: dict) -> None:
        """The leader of the group's ``__consumer_offsets`` partition, with its address from
        the snapshot's ``brokers``. This broker's own address comes from the snapshot, or,
        while the snapshot has no port for it (single-broker mode), from the listener.
        ``keys`` (FindCoordinator v4+) asks for several groups at once: answered
        ``{"coordinators": [{key, node_id, host, port, error_code, error_message}]}``."""
        key_type = body.get("key_type", 0)
        if key_type == 1:
            self._find_txn_coordinator(msg, body)
            return
        if key_type != 0:
            raise OdradekError(f"key_type {key_type!r}: 0 (group) or 1 (transaction)", ErrorCode.INVALID_REQUEST)
        keys = body.get("keys")
        if keys is None:
            key = body.get("key")
            node_id, _ = self._coordinator_of(key, None)  # raises before waiting for an address

            def answer(own) -> None:
                try:
                    node_id, (host, port) = self._coordinator_of(key, own)
                except OdradekError as exc:
                    self.reply_error(msg, exc.code, exc.message)
                    return
                self.reply(msg, {"body": {"error_code": 0, "node_id": node_id, "host": host, "port": port,
                                          "key": key}})
            self._own_address(answer)
            return
        if not isinstance(keys, list):
            raise BadRequest("'keys' must be a list of group ids")

        def answer_all(own) -> None:
            out = []
            for key in keys:
                try:
                    node_id, (host, port) = self._coordinator_of(key, own)
                    out.append({"key": key, "node_id": node_id, "host": host, "port": port, "error_code": 0})
                except OdradekError as exc:
                    out.append({"key": key, "node_id": -1, "host": "", "port": -1, "error_code": int(exc.code),
                                "error_message": exc.message})
            self.reply(msg, {"body": {"coordinators": out}})
        self._own_address(answer_all)

    def _find_txn_coordinator(self, msg: Message, body: dict) -> None:
        """FindCoordinator key_type 1 (transactional ids): the transaction coordinator is
        this broker's in single-broker mode; in cluster mode transactions are not served yet
        (COORDINATOR_NOT_AVAILABLE; docs/TRANSACTIONS.md)."""
        keys = body.get("keys")
        if keys is not None and not isinstance(keys, list):
            raise BadRequest("'keys' must be a list of transactional ids")
        if self.cluster_mode:
            raise OdradekError("transactions are not supported in cluster mode yet (docs/TRANSACTIONS.md)",
                               ErrorCode.COORDINATOR_NOT_AVAILABLE)

        def answer(own) -> None:
            host, port = own
            if keys is None:
                self.reply(msg, {"body": {"error_code": 0, "node_id": self.broker_id, "host": host, "port": port,
                                          "key": body.get("key")}})
            else:
                self.reply(msg, {"body": {"coordinators": [
                    {"key": k, "node_id": self.broker_id, "host": host, "port": port, "error_code": 0}
                    for k in keys]}})
        self._own_address(answer)

    def _coordinator_of(self, key, own) -> tuple[int, tuple | None]:
        """``(node_id, (host, port))`` of group ``key``'s coordinator (``own``: this broker's
        address, None while not known yet); raises why there is none."""
        if not self.partitions:
            if self.cluster_mode:  # clients reach a coordinator only through FindCoordinator: create it now
                if not self._creating:
                    self._create_topic()
                raise OdradekError(f"{OFFSETS_TOPIC} is being created; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return self.broker_id, own  # created on the first write
        gid = _group_id({"key": key}, "key")
        p = partition_for(gid, self.partitions)
        leader = self.leaders[p][0] if p < len(self.leaders) else -1
        if leader == self.broker_id:
            return self.broker_id, own
        entry = (self.snapshot.get("brokers") or {}).get(str(leader)) if leader >= 0 else None
        if not entry or not entry[1]:
            why = "has no leader" if leader < 0 else f"is led by broker {leader}, whose address is unknown here"
            raise OdradekError(f"the coordinator of group '{gid}' is not available: {OFFSETS_TOPIC}-{p} {why}; retry",
                               ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return leader, (entry[0], entry[1])

    def _own_address(self, then) -> None:
        entry = (self.snapshot.get("brokers") or {}).get(str(self.broker_id))
        if entry and entry[1]:
            then((entry[0], entry[1]))
        else:
            self._with_address(then)

    def _with_address(self, then) -> None:
        if self.address is not None:
            then(self.address)
            return
        from odradek.network.protocol import parse_listener
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
        return sorted(set(self.groups) | set(self.classic) | set(self.offsets))

    def _has_members(self, gid: str) -> bool:
        g = self.groups.get(gid)
        cg = self.classic.get(gid)
        return bool((g is not None and g.members) or (cg is not None and cg.members))

    def _state_of(self, gid: str) -> str:
        g = self.groups.get(gid)
        return g.state if g is not None else EMPTY

    def list_groups(self, msg: Message, body: dict) -> None:
        states = {str(s).lower() for s in _get(body, "states_filter", list, [])}
        types = {str(t).lower() for t in _get(body, "types_filter", list, [])}
        out = []
        for gid in self._known_groups():
            cg = self.classic.get(gid)
            if cg is not None:
                out.append({"group_id": gid, "protocol_type": cg.protocol_type or "", "group_type": "classic",
                            "group_state": cg.state})
            else:
                out.append({"group_id": gid, "protocol_type": "consumer", "group_type": "consumer",
                            "group_state": self._state_of(gid)})
        if states:
            out = [g for g in out if g["group_state"].lower() in states]
        if types:
            out = [g for g in out if g["group_type"] in types]
        self.reply(msg, {"body": {"error_code": 0, "groups": out}})

    def describe_groups(self, msg: Message, body: dict) -> None:
        ids = body.get("group_ids", body.get("groups"))
        if not isinstance(ids, list):
            raise BadRequest("missing field 'group_ids' (a list of group ids)")
        out = []
        for gid in ids:
            error = self._coordinator_error(gid) if isinstance(gid, str) and GROUP_ID.fullmatch(gid) else None
            if error is not None:
                out.append({"group_id": gid, "error_code": int(error.code), "error_message": error.message})
                continue
            if not isinstance(gid, str) or (gid not in self.groups and gid not in self.offsets
                                            and gid not in self.classic):
                out.append({"group_id": gid, "error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                            "error_message": f"group {gid!r} does not exist"})
                continue
            if gid in self.classic:
                if msg.get("api") == ApiKey.CONSUMER_GROUP_DESCRIBE:
                    out.append({"group_id": gid, "error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                                "error_message": f"group '{gid}' is a classic group, not a consumer group"})
                else:
                    out.append({"error_code": 0, **self._describe_classic(self.classic[gid])})
                continue
            g = self.groups.get(gid)
            d = g.describe() if g is not None else {"group_id": gid, "group_state": EMPTY, "group_epoch": 0,
                                                     "assignment_epoch": 0, "assignor_name": "", "members": []}
            d["members"] = [{**m, "assignment": self._ids(m["assignment"]),
                             "target_assignment": self._ids(m["target_assignment"])} for m in d["members"]]
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
            error = self._coordinator_error(gid) if isinstance(gid, str) and GROUP_ID.fullmatch(gid) else None
            if error is not None:
                results.append({"group_id": gid, "error_code": int(error.code), "error_message": error.message})
                continue
            g = (self.groups.get(gid) or self.classic.get(gid)) if isinstance(gid, str) else None
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
            self.classic.pop(gid, None)
            self.empty_since.pop(gid, None)
            entry = {"group_id": gid, "error_code": 0}
            results.append(entry)
            pending["n"] += 1

            def stored(code, error, entry=entry) -> None:
                if code:
                    entry.update(error_code=int(group_write_error(code)),
                                 error_message=f"deleted here, but the tombstones were not stored: {error}")
                finish()
            self._append(gid, recs, stored)
        finish()

    def leave_group(self, msg: Message, body: dict) -> None:
        """Remove members by id (a tool's forced removal; KIP-848 members leave by heartbeat,
        classic members by this request, by member id or ``group_instance_id``)."""
        gid = _group_id(body)
        if gid in self.classic:
            self._classic_leave(msg, body, self.classic[gid])
            return
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
        self._after_write(g, lambda: self.reply(msg, {"body": {"error_code": 0, "members": out}}), msg)

    # ---- the classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) ----------------------
    # The state machine is coordinator.classic_group; here: parsing, the held requests (a
    # JoinGroup or SyncGroup that waits is kept in ``held_classic`` and answered from the
    # group's outbox), and the group's record, written before SyncGroup answers go out.

    def _classic_for_join(self, gid: str) -> ClassicGroup:
        g = self.classic.get(gid)
        if g is not None:
            return g
        other = self.groups.get(gid)
        if other is not None:
            if other.members:
                raise GroupError(f"group '{gid}' is a consumer group (KIP-848) with {len(other.members)} members: "
                                 f"a classic JoinGroup cannot join it; use group.protocol=consumer, or another "
                                 f"group id", ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            del self.groups[gid]  # an empty consumer group becomes a classic one, as Kafka converts it
        g = self.classic[gid] = ClassicGroup(gid, self.classic_config)
        return g

    def _classic_drop_if_unused(self, gid: str) -> None:
        """A refused first join leaves no trace."""
        g = self.classic.get(gid)
        if g is not None and not g.members and not g.pending and g.generation_id == 0 and gid not in self.offsets:
            del self.classic[gid]

    @staticmethod
    def _classic_error(exc: OdradekError, member_id: str = "") -> dict:
        return {"error_code": int(exc.code), "error_message": exc.message, "generation_id": -1,
                "member_id": member_id, "leader": "", "members": [], "assignment": b""}

    def _hold_classic(self, key: tuple[str, str, str], msg: Message) -> None:
        old = self.held_classic.pop(key, None)
        if old is not None:  # the member asked again: its older request is superseded
            self.reply(old, {"body": self._classic_error(GroupError(
                "superseded by a newer request of the same member", ErrorCode.REBALANCE_IN_PROGRESS), key[2])})
        self.held_classic[key] = msg

    def join_group(self, msg: Message, body: dict) -> None:
        gid = _group_id(body)
        member_id = _get(body, "member_id", str, "")
        entries = _get(body, "protocols", list)
        protocols = []
        for p in entries:
            if not isinstance(p, dict) or not isinstance(p.get("name"), str) or \
                    not isinstance(p.get("metadata"), (bytes, type(None))):
                raise BadRequest("each protocol must be a map with a string 'name' and bytes 'metadata'")
            protocols.append((p["name"], bytes(p.get("metadata") or b"")))
        req = JoinRequest(member_id=member_id, instance_id=_get(body, "group_instance_id", str, None),
                          session_timeout_ms=_get(body, "session_timeout_ms", int),
                          rebalance_timeout_ms=_get(body, "rebalance_timeout_ms", int, -1),
                          protocol_type=_get(body, "protocol_type", str), protocols=protocols,
                          client_id=str(msg.get("client") or ""),
                          client_host=str(msg.get("peer") or "").rpartition(":")[0],
                          require_known_member_id=bool(body.get("require_known_member_id", True)))
        try:
            g = self._classic_for_join(gid)
            new_id, answer = g.join(req, self._now())
        except GroupError as exc:
            self._classic_drop_if_unused(gid)
            self.reply(msg, {"body": self._classic_error(exc, member_id)})
            return
        if answer is not None:
            self.reply(msg, {"body": answer})
        else:
            self._hold_classic((gid, "join", new_id), msg)
        self._classic_changed(g)

    def sync_group(self, msg: Message, body: dict) -> None:
        gid = _group_id(body)
        member_id = _get(body, "member_id", str)
        assignments = {}
        for a in _get(body, "assignments", list, []):
            if not isinstance(a, dict) or not isinstance(a.get("member_id"), str) or \
                    not isinstance(a.get("assignment"), (bytes, type(None))):
                raise BadRequest("each assignment must be a map with a string 'member_id' and bytes 'assignment'")
            data = bytes(a.get("assignment") or b"")
            if len(data) > self.classic_config.max_metadata_bytes:
                raise BadRequest(f"the assignment of member {a['member_id']} is {len(data)} bytes; at most "
                                 f"{self.classic_config.max_metadata_bytes} (group.classic.max.metadata.bytes)")
            assignments[a["member_id"]] = data
        g = self.classic.get(gid)
        try:
            if g is None:
                raise GroupError(f"member {member_id!r} is not in group '{gid}' (no classic group of that id): "
                                 f"join first", ErrorCode.UNKNOWN_MEMBER_ID)
            answer = g.sync(member_id, _get(body, "generation_id", int), _get(body, "group_instance_id", str, None),
                            assignments, self._now(), _get(body, "protocol_type", str, None),
                            _get(body, "protocol_name", str, None))
        except GroupError as exc:
            self.reply(msg, {"body": self._classic_error(exc, member_id)})
            return
        if answer is not None:
            self.reply(msg, {"body": answer})
        else:
            self._hold_classic((gid, "sync", member_id), msg)
        self._classic_changed(g)

    def classic_heartbeat(self, msg: Message, body: dict) -> None:
        self.heartbeats += 1
        gid = _group_id(body)
        member_id = _get(body, "member_id", str)
        g = self.classic.get(gid)
        try:
            if g is None:
                raise GroupError(f"member {member_id!r} is not in group '{gid}' (no classic group of that id): "
                                 f"join first", ErrorCode.UNKNOWN_MEMBER_ID)
            g.heartbeat(member_id, _get(body, "generation_id", int), _get(body, "group_instance_id", str, None),
                        self._now())
            self.reply(msg, {"body": {"error_code": 0}})
        except GroupError as exc:
            self.reply(msg, {"body": {"error_code": int(exc.code), "error_message": exc.message}})
        if g is not None:
            self._classic_changed(g)

    def _classic_leave(self, msg: Message, body: dict, g: ClassicGroup) -> None:
        out = []
        for m in _get(body, "members", list):
            if not isinstance(m, dict):
                raise BadRequest("each member must be a map with 'member_id' and/or 'group_instance_id'")
            member_id, instance_id = m.get("member_id") or "", m.get("group_instance_id")
            if not isinstance(member_id, str) or not isinstance(instance_id, (str, type(None))):
                raise BadRequest("'member_id' and 'group_instance_id' must be strings")
            try:
                left = g.leave(member_id, instance_id, self._now())
                log.info("group %s: member %s left", g.group_id, left)
                out.append({"member_id": left, "group_instance_id": instance_id, "error_code": 0})
            except GroupError as exc:
                out.append({"member_id": member_id, "group_instance_id": instance_id, "error_code": int(exc.code),
                            "error_message": exc.message})
        self.reply(msg, {"body": {"error_code": 0, "members": out}})
        self._classic_changed(g)

    def _classic_changed(self, g: ClassicGroup) -> None:
        """After any operation on ``g``: answer what its outbox holds (JoinGroup answers at
        once; SyncGroup answers once the group's record is stored, as Kafka's storeGroup),
        note emptiness, write the record if the durable state moved."""
        syncs = []
        for kind, member_id, body in g.take_outbox():
            key = (g.group_id, kind, member_id)
            if kind == "sync" and not body.get("error_code"):
                syncs.append((key, body))
                continue
            held = self.held_classic.pop(key, None)
            if held is not None:
                self.reply(held, {"body": body})
        if g.members:
            self.empty_since.pop(g.group_id, None)
        elif g.generation_id:
            self.empty_since.setdefault(g.group_id, _wall_ms())

        def answer(code: int = 0, error: str = "") -> None:
            for key, body in syncs:
                held = self.held_classic.pop(key, None)
                if held is None:
                    continue
                if code:
                    body = self._classic_error(GroupError(f"group '{g.group_id}': its new generation was not stored "
                                                          f"({error}); rejoin", group_write_error(code)), key[2])
                self.reply(held, {"body": body})

        if not g.changed:
            answer()
            return
        g.changed = False
        state = None if g.deleted else {"classic": g.to_record()}
        key, value = group_record(g.group_id, state, self.empty_since.get(g.group_id))

        def done(code: int, error: str) -> None:
            if code:
                log.warning("group %s: its record was not written: %s", g.group_id, error)
                if self.classic.get(g.group_id) is g:
                    g.changed = True
            answer(code, error)
        self._append(g.group_id, [(key, value)], done)

    def _describe_classic(self, g: ClassicGroup) -> dict:
        """A classic group in DESCRIBE_GROUPS' shape: Kafka's classic fields (``protocol_type``,
        ``protocol_data``, member metadata and assignment bytes) and, for consumers, the same
        fields a KIP-848 group has (assignment and subscription decoded), so tools show both."""
        d = g.describe()
        consumer = g.protocol_type == "consumer"
        members = [{**m, "instance_id": m["group_instance_id"], "member_epoch": g.generation_id,
                    "state": "stable" if g.state == "Stable" else "reconciling",
                    "subscribed_topic_names": decode_subscription(m["member_metadata"]) if consumer else [],
                    "subscribed_topic_regex": None,
                    "assignment": decode_assignment(m["member_assignment"]) if consumer else [],
                    "pending_revocation": [], "target_assignment": [], "left": False} for m in d["members"]]
        return {**d, "group_type": "classic", "group_epoch": g.generation_id, "assignment_epoch": g.generation_id,
                "assignor_name": g.protocol_name or "", "members": members}

    # ---- writing records ---------------------------------------------------------------------------
    def _append(self, gid: str, recs: list, done) -> None:
        """Append ``[(key, value)]`` to the group's partition with acks=-1; ``done(0, "")``
        once the ISR has it, else ``done(error_code, message)`` with the write's own code
        (callers map it: ``commit_error``, ``group_write_error``). A partition unloaded
        while the write was in flight answers NOT_COORDINATOR: its state here is gone."""
        if not self.partitions:
            done(int(ErrorCode.COORDINATOR_NOT_AVAILABLE), f"{OFFSETS_TOPIC} does not exist")
            return
        partition = partition_for(gid, self.partitions)
        token = self.owned.get(partition)
        if token is None:
            done(int(ErrorCode.NOT_COORDINATOR), f"broker {self.broker_id} does not lead {OFFSETS_TOPIC}-{partition}")
            return
        batch = encode_batch(recs)

        def answered(reply: Message) -> None:
            if self.owned.get(partition) != token:
                done(int(ErrorCode.NOT_COORDINATOR), f"broker {self.broker_id} stopped leading "
                                                     f"{OFFSETS_TOPIC}-{partition} during the write")
                return
            if reply.is_error:
                code, why = reply.error_code or int(ErrorCode.UNKNOWN_SERVER_ERROR), reply.error_message
            else:
                try:
                    p = reply.fields["body"]["topics"][0]["partitions"][0]
                    code, why = p.get("error_code") or 0, p.get("error_message") or ""
                except (KeyError, IndexError, TypeError):
                    code, why = int(ErrorCode.UNKNOWN_SERVER_ERROR), "malformed answer from the log actor"
            if code:
                why = f"{OFFSETS_TOPIC}-{partition}: {ErrorCode.of(code).name}" + (f": {why}" if why else "")
                if ErrorCode.of(code) in LEADERSHIP_LOST:
                    self._refresh_metadata()  # learn the new leader; the push may be on its way too
            done(code, why)

        self.request(self._host(partition), "produce",
                     {"acks": -1, "timeout_ms": COMMIT_TIMEOUT_MS, "parts": [[OFFSETS_TOPIC, partition, 0]]},
                     [batch], callback=answered, timeout=WRITE_TIMEOUT)


def _wall_ms() -> int:
    return int(time.time() * 1000)
